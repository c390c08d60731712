"""Several live routers on one PostgreSQL (issue 35, item 2): ``kill -9`` of one mid-stream.

Three patched 3.x ``mineru-router`` processes share one real PostgreSQL
(``MINERU_ROUTER_HEALTH_STORE_URL``, ``conftest.postgres``), each under its own
``ROUTER_ID`` with a 3 s lease, in front of the same two remote ``mineru-api`` workers
(``--upstream-url``): a shared pool, which no router restarts and which outlives any
router, so a killed router's jobs are still running there and a survivor follows them
(the deployment of several routers; a cell's local workers die with their router). A
client spreads its submissions over the three routers and asks each job's status of
another router than the one that accepted it. Router 0 is killed with SIGKILL while its
jobs run: one survivor takes them over (its log says so), every accepted job completes
and its result downloads through a router that did not accept it, each was sent to a
worker once (``attempts`` 1: never parsed twice), and no status was ever answered 404.
Each killed router's state directory is removed with it (a lost node): then router 1
dies too, with the worker running one of its jobs; the last router takes that job over
and sends it to the other worker from its upload kept in PostgreSQL (issue 35, item 3).
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import ManagedProcess, make_pdf, wait_until
from mineru_health.demo.fleet import LINE3, Client, http
from mineru_health.demo.sandbox import Processes
from shared_routers import three_routers_on_two_workers3, wait_for_one_takeover

pytestmark = pytest.mark.integration

LEASE_S = 3.0
ROUTERS = 3


def test_a_killed_routers_jobs_are_taken_over_by_a_survivor_and_none_is_lost(
    processes: Processes,
    mineru_api_factory: Callable[..., ManagedProcess],
    patched_mineru_site: Path,
    mineru_python: str,
    fake_vlm_url: str,
    postgres: Any,
    tmp_path: Path,
) -> None:
    pytest.importorskip("psycopg", reason="psycopg is not installed")
    pytest.importorskip("reportlab")
    pdf = make_pdf(text="mineru-health several routers page")
    url = postgres.new_database()
    workers, routers = three_routers_on_two_workers3(  # each router with both in rotation
        processes,
        mineru_api_factory,
        patched_mineru_site,
        mineru_python,
        url,
        tmp_path,
        lease_s=LEASE_S,
    )
    clients = [
        Client(r.base, LINE3, engine_url=f"{fake_vlm_url}/delay/1500/", poll_s=0.2) for r in routers
    ]
    accepted: list[tuple[str, int]] = []  # (task id, the router that accepted it)
    not_found: list[tuple[str, int]] = []

    def submit(n: int) -> None:
        task_id, refusal = clients[n].submit(f"shared-{len(accepted):02d}.pdf", pdf)
        assert task_id, (n, refusal)
        accepted.append((task_id, n))

    def status_of(task_id: str, n: int) -> dict[str, Any]:
        response = http("GET", f"{routers[n].base}/tasks/{task_id}", 10.0)
        if response.status_code == 404:
            not_found.append((task_id, n))
        assert response.status_code == 200, (n, response.status_code, response.text[:300])
        body: dict[str, Any] = response.json()
        return body

    for i in range(2 * ROUTERS):  # two a router
        submit(i % ROUTERS)
    for i, (task_id, n) in enumerate(accepted):  # asked of another router than its own
        assert status_of(task_id, (n + 1 + i % 2) % ROUTERS)["task_id"] == task_id
    first_jobs = [t for t, n in accepted if n == 0]
    running = [status_of(t, 1)["status"] for t in first_jobs]
    assert any(s in ("pending", "processing") for s in running), running

    os.kill(routers[0].proc.pid, signal.SIGKILL)
    routers[0].proc.wait(30.0)
    killed_at = time.monotonic()
    shutil.rmtree(tmp_path / "state-0")  # what a lost node leaves: none of its disk
    survivors = [1, 2]
    for i in range(len(survivors)):  # the stream goes on through the survivors
        submit(survivors[i])
    for task_id in first_jobs:  # answered by the survivors before and after the takeover
        for n in survivors:
            status_of(task_id, n)

    wait_for_one_takeover(routers, survivors, "router-0", 10 * LEASE_S)
    took_s = time.monotonic() - killed_at
    print(f"router-0's jobs taken over {took_s:.1f} s after its kill -9 (lease {LEASE_S:g} s)")

    for i, (task_id, n) in enumerate(accepted):
        asker = clients[survivors[i % 2]]
        outcome = asker.wait(task_id, timeout_s=120.0)
        assert outcome.status == "completed", (task_id, n, outcome.detail)
        assert outcome.attempts == 1, outcome.detail  # sent to one worker, once
        other = clients[survivors[(i + 1) % 2]]
        result = other.result(task_id)
        assert result.status_code == 200, (task_id, n, result.text[:300])
        assert result.json().get("results"), result.text[:300]
    assert not_found == []
    for n in survivors:
        assert routers[n].metric("mineru_router_task_resubmissions_total") == 0

    # Router 1 dies with its node too, and so does the worker running one of its jobs: the
    # last router sends that job again, from its upload kept in PostgreSQL.
    # (MinerU picks a worker by the load of its last probe: which one is not the test's.)
    submit(1)
    lost = accepted[-1][0]
    tried: list[str] = []

    def sent() -> bool:
        tried[:] = status_of(lost, 1).get("workers_tried") or []
        return bool(tried)

    assert wait_until(sent, 30.0, 0.2), status_of(lost, 1)
    names = ["remote-1", "remote-2"]  # the workers, in their --upstream-url order
    assert tried[0] in names, tried
    gone = names.index(tried[0])
    os.kill(routers[1].proc.pid, signal.SIGKILL)
    routers[1].proc.wait(30.0)
    shutil.rmtree(tmp_path / "state-1")
    os.kill(workers[gone].pid, signal.SIGKILL)
    outcome = clients[2].wait(lost, timeout_s=120.0)
    log = routers[2].proc.log_tail(40000)
    assert outcome.status == "completed", (outcome.detail, log[-3000:])
    assert outcome.detail["workers_tried"] == [names[gone], names[1 - gone]], outcome.detail
    assert f"{lost}: its uploads are not on this node" in log, log[-3000:]
    assert routers[2].metric("mineru_router_task_resubmissions_total") >= 1
    result = clients[2].result(lost)
    assert result.status_code == 200 and result.json().get("results"), result.text[:300]

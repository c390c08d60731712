"""A paused router is fenced and rejoins (issue 35): ``SIGSTOP`` past its lease, then ``SIGCONT``.

Three patched 3.x ``mineru-router`` processes share one real PostgreSQL
(``conftest.postgres``), each under its own ``ROUTER_ID`` with a 3 s lease, in front of
the same two remote ``mineru-api`` workers, as in ``test_routers_shared_store.py``. A
client spreads its submissions over the three routers. Router 0 is stopped with
``SIGSTOP`` while its jobs run (a long GC, a frozen VM: the process lives, its lease is not
renewed) and the stream goes on through the two others; one of them takes router 0's
jobs over once its lease expired. Router 0 is then continued with ``SIGCONT``: its next
renewal finds its lease lost, so it lets those jobs go (its log and its audit say so).
Its clients' status questions, waiting in its socket, are answered as it goes on, racing
that renewal: a job it sees end first, it writes as ended, and that write is refused
(fenced, counted in its /metrics); either way their rows in PostgreSQL stay the
survivor's. It holds a fresh lease at once and rejoins: it accepts new submissions and
completes them. Every accepted job completes exactly once (``attempts`` 1, no router
resubmitted anything), none is lost, and each result downloads through a router that did
not accept it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import ManagedProcess, make_pdf, wait_until
from mineru_health.demo.fleet import LINE3, Client, http
from mineru_health.demo.sandbox import Processes
from shared_routers import (
    owners,
    three_routers_on_two_workers3,
    wait_for_one_takeover,
)

pytestmark = pytest.mark.integration

LEASE_S = 3.0
ROUTERS = 3
PAUSED = 0  # the router stopped and continued
SURVIVORS = (1, 2)


def test_a_paused_router_is_fenced_then_rejoins_and_no_job_is_lost_or_doubled(
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
    pdf = make_pdf(text="mineru-health paused router page")
    url = postgres.new_database()
    _, routers = three_routers_on_two_workers3(  # each router with both in rotation
        processes,
        mineru_api_factory,
        patched_mineru_site,
        mineru_python,
        url,
        tmp_path,
        lease_s=LEASE_S,
    )
    paused = routers[PAUSED]
    # Slow enough that router 0's jobs still run when it is continued.
    clients = [
        Client(r.base, LINE3, engine_url=f"{fake_vlm_url}/delay/3000/", poll_s=0.2) for r in routers
    ]
    accepted: list[tuple[str, int]] = []  # (task id, the router that accepted it)

    def submit(n: int) -> str:
        task_id, refusal = clients[n].submit(f"paused-{len(accepted):02d}.pdf", pdf)
        assert task_id, (n, refusal)
        accepted.append((task_id, n))
        return task_id

    for i in range(2 * ROUTERS):  # two a router
        submit(i % ROUTERS)
    its_jobs = [t for t, n in accepted if n == PAUSED]
    running = [clients[1].status(t)["status"] for t in its_jobs]
    assert all(s in ("pending", "processing") for s in running), running
    before = owners(url, its_jobs)
    assert {owner for owner, _, _ in before.values()} == {"router-0"}, before

    os.kill(paused.proc.pid, signal.SIGSTOP)  # a process of this test's own
    asked: list[Future[Any]] = []
    with ThreadPoolExecutor(max_workers=len(its_jobs)) as asking:
        try:
            for i in range(len(SURVIVORS)):  # the stream goes on through the others
                submit(SURVIVORS[i])

            taker = wait_for_one_takeover(routers, SURVIVORS, "router-0", 10 * LEASE_S)
            survivor = f"router-{taker}"
            taken = owners(url, its_jobs)
            assert {owner for owner, _, _ in taken.values()} == {survivor}, taken
            assert all(taken[k][1] > before[k][1] for k in its_jobs), (before, taken)
            # Its clients' questions wait in its socket: answered first thing when it goes
            # on, racing its renewal (what it learns from its workers, it may try to write).
            asked += [
                asking.submit(http, "GET", f"{paused.base}/tasks/{t}", 10 * LEASE_S)
                for t in its_jobs
            ]
        finally:
            os.kill(paused.proc.pid, signal.SIGCONT)
        answers = [future.result() for future in asked]
    assert [a.status_code for a in answers] == [200] * len(its_jobs), [a.text for a in answers]

    # Its next renewal finds its lease lost: it lets go of the jobs the survivor drives
    # (those it did not see end first), and its writes about them were refused.
    assert wait_until(
        lambda: "found its lease lapsed" in paused.proc.log_tail(40000), 10 * LEASE_S
    ), paused.proc.log_tail(5000)
    let_go = [
        key
        for record in paused.audit_records()
        if record.get("action") == "submissions_taken_over"
        for key in record["task_ids"]
    ]
    assert set(let_go) <= set(its_jobs), let_go
    fenced = paused.metric("mineru_router_store_fenced_writes_total")
    if set(let_go) != set(its_jobs):  # one it saw end: its write of that was refused
        assert fenced >= 1, paused.proc.log_tail(5000)
    assert paused.metric("mineru_router_lease_lapses_total") == 1
    after = owners(url, its_jobs)
    assert {owner for owner, _, _ in after.values()} == {survivor}, (after, fenced)

    # It holds a lease again and rejoins: new submissions through it are driven by it.
    paused.wait_in_rotation()  # probes it had under way when stopped may have timed out
    for _ in range(2):
        submit(PAUSED)
    rejoined = [t for t, n in accepted[-2:]]
    assert {owner for owner, _, _ in owners(url, rejoined).values()} == {"router-0"}

    for i, (task_id, n) in enumerate(accepted):
        asker = clients[(n + 1 + i % 2) % ROUTERS]  # another router than its own
        outcome = asker.wait(task_id, timeout_s=120.0)
        assert outcome.status == "completed", (task_id, n, outcome.detail)
        assert outcome.attempts == 1, outcome.detail  # sent to one worker, once
        result = clients[(n + 2 - i % 2) % ROUTERS].result(task_id)
        assert result.status_code == 200, (task_id, n, result.text[:300])
        assert result.json().get("results"), result.text[:300]
    for task_id in its_jobs:  # the router that let them go serves them from the row too
        result = clients[PAUSED].result(task_id)
        assert result.status_code == 200, (task_id, result.text[:300])
    ended = owners(url, [t for t, _ in accepted])
    assert len(ended) == len(accepted)  # one row each, none lost
    assert {ended[k][0] for k in its_jobs} == {survivor}, ended
    for router in routers:
        assert router.metric("mineru_router_task_resubmissions_total") == 0
    assert sum(r.metric("mineru_router_takeovers_total") for r in routers) == 1
    print(
        f"router-0 paused past its {LEASE_S:g} s lease: {survivor} took its "
        f"{len(its_jobs)} jobs; {fenced:g} of its writes fenced after SIGCONT"
    )

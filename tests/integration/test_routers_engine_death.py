"""A pool worker's engine death while three routers watch it (issue 35): one restart, not three.

Three patched 3.x ``mineru-router`` processes share one real PostgreSQL (``conftest.postgres``),
each under its own ``ROUTER_ID`` with a 3 s lease, in front of the same two remote
``mineru-api`` workers, as in ``test_routers_shared_store.py``. The workers run with
``MINERU_HEALTH_EXIT_ON_FATAL=1``: after an engine death a worker fails its tasks, answers 503
for ``EXIT_GRACE_S`` and exits 75. The engine of one worker dies (its fault plan,
``engine_dead``) while jobs from every router run there. The test stands in for Kubernetes,
the one supervisor a pool worker has: when the process exits it starts it again, once, on the
same port.

What we chose (docs/architecture.md, "Who owns which worker"): no router restarts a pool
worker, each ejects it on its own view, and a job is sent again only by the router that owns
its row. So: the worker exited once (75); every router's restart counter stays 0 and each
took the worker out of rotation itself; every job that was on the dead engine was sent again
once, by its owner (attempts 2, its row's owner unchanged, that router's resubmission
counter), none was lost and the other worker ran each job once; after the restart every
router admits the worker again and sends it new work.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import ManagedProcess, Router, make_pdf, submit_task, wait_until
from mineru_health.demo.faults import FAULT_PLAN_ENV, write_plan
from mineru_health.demo.fleet import LINE3, Client, http
from mineru_health.demo.sandbox import Processes
from shared_routers import three_routers_on_two_workers3

pytestmark = pytest.mark.integration

LEASE_S = 3.0
ROUTERS = 3
#: Jobs before the death (two a router) and while the worker is dead (one a router).
BEFORE, DURING = 2 * ROUTERS, ROUTERS
VICTIM, OTHER = "remote-1", "remote-2"  # MinerU names --upstream-url workers by position


def _health(url: str) -> dict[str, Any]:
    """A worker's ``/health`` body ({} while it does not answer)."""
    try:
        response = http("GET", f"{url}/health", 5.0)
        body = response.json()
    except Exception:  # noqa: BLE001 -- not answering (yet, or any more) is an answer here
        return {}
    return body if isinstance(body, dict) else {}


def _by_reason(router: Router, name: str, **labels: str) -> dict[str, float]:
    """A counter's non-zero samples with these labels, by their ``reason``."""
    return {
        s.labels["reason"]: s.value
        for s in router.metric_samples(name)
        if s.value and all(s.labels.get(k) == v for k, v in labels.items())
    }


def test_a_pool_workers_engine_death_is_one_restart_and_each_job_is_sent_again_by_its_owner(
    processes: Processes,
    mineru_api_factory: Callable[..., ManagedProcess],
    patched_mineru_site: Path,
    mineru_python: str,
    fake_vlm_url: str,
    postgres: Any,
    tmp_path: Path,
) -> None:
    psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed")
    pytest.importorskip("reportlab")
    pdf = make_pdf(text="mineru-health engine death under three routers")
    plans = [tmp_path / f"plan-{n}" for n in (0, 1)]

    def worker_env(n: int) -> dict[str, str]:
        return {
            FAULT_PLAN_ENV: str(plans[n]),
            "MINERU_HEALTH_EXIT_ON_FATAL": "1",
            "MINERU_HEALTH_EXIT_GRACE_S": "2",
        }

    url = postgres.new_database()
    workers, routers = three_routers_on_two_workers3(  # each router with both in rotation
        processes,
        mineru_api_factory,
        patched_mineru_site,
        mineru_python,
        url,
        tmp_path,
        lease_s=LEASE_S,
        worker_env=worker_env,
    )
    engine = f"{fake_vlm_url}/delay/800/"
    clients = [Client(r.base, LINE3, engine_url=engine, poll_s=0.2) for r in routers]
    accepted: list[tuple[str, int]] = []  # (task id, the router that accepted it)

    def submit(n: int) -> None:
        task_id, refusal = clients[n].submit(f"death-{len(accepted):02d}.pdf", pdf)
        assert task_id, (n, refusal)
        accepted.append((task_id, n))

    victim = workers[0]
    for i in range(BEFORE):
        submit(i % ROUTERS)
    assert wait_until(lambda: _health(victim.base_url).get("processing_tasks", 0) > 0, 60.0, 0.1), (
        victim.log_tail(3000)
    )
    write_plan(plans[0], "engine_dead")  # its next engine call raises EngineDeadError
    assert wait_until(lambda: not plans[0].exists(), 30.0, 0.05), victim.log_tail(3000)
    for n in range(DURING):  # the stream goes on while the worker dies
        submit(n)

    # Kubernetes' part: the process exits once, and is started again, once, on its port.
    assert victim.wait(60.0) == 75, victim.log_tail(3000)
    exited_at = time.monotonic()
    assert "exiting with status 75" in victim.log()
    scratch0 = tmp_path / "mineru-api-0"
    restarted = processes.start(
        "mineru-api-0",
        [str(a) for a in victim.popen.args],
        env=LINE3.env(patched_mineru_site, scratch0, mineru_python, worker_env(0)),
        log_path=scratch0 / "mineru-api-restarted.log",
        cwd=scratch0,
    )
    restarted.base_url = victim.base_url

    outcomes = []
    for task_id, n in accepted:
        outcome = clients[n].wait(task_id, timeout_s=120.0)
        assert outcome.status == "completed", (task_id, n, outcome.detail)  # none lost
        outcomes.append((outcome, n))
        other = clients[(n + 1) % ROUTERS].wait(task_id, timeout_s=30.0)  # any router answers
        assert other.status == "completed", (task_id, n, other.detail)

    resent = [(o, n) for o, n in outcomes if o.attempts > 1]
    assert resent, [o.detail for o, _ in outcomes]  # the death met running jobs
    for outcome, _ in outcomes:
        tried = outcome.detail["workers_tried"]
        assert outcome.attempts == len(tried) <= 2, outcome.detail  # sent again once at most
        assert outcome.attempts == 1 or tried == [VICTIM, OTHER], outcome.detail
    with psycopg.connect(url) as db:
        rows = dict(db.execute("SELECT key, owner FROM submissions").fetchall())
    for outcome, n in outcomes:  # nobody took a row over: its acceptor drove it
        assert rows[outcome.task_id] == f"router-{n}", (outcome.task_id, rows)
    for n, router in enumerate(routers):
        own = sum(1 for _, owner in resent if owner == n)
        assert router.metric("mineru_router_task_resubmissions_total") == own, n
    ran_on_other = sum(1 for o, _ in outcomes if o.detail["workers_tried"][-1] == OTHER)
    other_health = _health(workers[1].base_url)
    assert other_health.get("completed_tasks") == ran_on_other, other_health  # each job once
    assert other_health.get("failed_tasks") == 0, other_health

    # No router restarted anything; each ejected the dead worker on its own view.
    for router in routers:
        assert router.metric("mineru_router_restarts_total") == 0, router.proc.log_tail(3000)
        assert router.metric("mineru_router_ejections_total", worker=VICTIM) >= 1
        actions = {r["action"] for r in router.audit_records() if r.get("worker_id") == VICTIM}
        assert "ejected" in actions and not any("restart" in a for a in actions), actions

    # Back: every router admits it again and sends it new work while the other is busy.
    def back_everywhere() -> bool:
        return all(r.servers().get(VICTIM, {}).get("in_rotation") for r in routers)

    assert wait_until(back_everywhere, 120.0, 0.2), (restarted.log_tail(3000), routers[0].servers())
    back_s = time.monotonic() - exited_at
    # The other worker's every slot taken (MinerU's default: 3), so that whatever the new jobs
    # of the other routers add to the restarted one, it is each router's least loaded.
    slots = int(_health(workers[1].base_url).get("max_concurrent_requests", 3))
    for _ in range(slots):
        busy = submit_task(workers[1].base_url, pdf, f"{fake_vlm_url}/delay/5000/")
        assert busy.status_code == 202, busy.text

    def other_full_everywhere() -> bool:
        return all(r.servers().get(OTHER, {}).get("processing_tasks", 0) >= slots for r in routers)

    assert wait_until(other_full_everywhere, 30.0, 0.1), [r.servers() for r in routers]
    new = [clients[n].submit(f"after-{n}.pdf", pdf)[0] for n in range(ROUTERS)]
    for n, task_id in enumerate(new):
        outcome = clients[n].wait(task_id, timeout_s=60.0)
        assert outcome.status == "completed", outcome.detail
        assert outcome.detail["workers_tried"] == [VICTIM], outcome.detail
    assert restarted.poll() is None, restarted.log_tail(3000)  # one restart: it stayed up
    by_owner = {f"router-{n}": sum(1 for _, owner in resent if owner == n) for n in range(3)}
    print(
        f"{len(outcomes)} jobs, sent again by their owners {by_owner}; seen back in every router's "
        f"rotation {back_s:.1f} s after its exit; ejections of {VICTIM} by reason, per router: "
        f"{[_by_reason(r, 'mineru_router_ejections_total', worker=VICTIM) for r in routers]}"
    )

"""No document lost to a dead, stalled or killed worker: the patched router with two real workers.

Each test starts the real ``mineru-router`` (patched copy of MinerU 3.4.4)
with two real local ``mineru-api`` workers, sends a steady stream of tasks
through it, injects one fault mid-stream and then requires every task to
reach a terminal state within a bound (none hung) and, except the poison
document, to complete (none failed):

- an engine death (fault plan ``engine_dead`` aimed at one worker): its tasks
  are resubmitted; afterwards every result completed *before* the death is
  still downloadable through the router (the restarted worker restored it
  from its task store);
- an engine stall (``engine_stall``, with ``MINERU_HEALTH_STALL_S`` passed
  to the workers through the router's environment): the stall watchdog fails
  its tasks as collateral, and they are resubmitted;
- a poison document (``poison <name>``: every worker that parses it dies):
  it is quarantined after killing two different workers, with the error,
  the audit record and the metric; every other task completes;
- ``kill -9`` of one worker process: its tasks are resubmitted; some of the
  stream goes through ``/file_parse``, which gets the same behaviour.

Only the router's endpoints, its audit file and ``/proc`` (to find the
worker to kill) are used. Waits are bounded; nothing asserts on timings.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from conftest import Router, make_pdf, wait_until
from mineru_health.demo.fleet import Client, Outcome, Stream

pytestmark = pytest.mark.integration

STREAM_TASKS = 14
STREAM_PERIOD_S = 0.6

# Two workers: when one dies, about half the tasks in flight need a
# resubmission at once, more than the production budget's floor (3); over it
# they would wait their turn, which only makes the test slower. The budget's
# pacing has its own unit tests, and the demo runs with the default floor.
BASE_ENV = {
    "MINERU_ROUTER_HEALTH_PRESET": "fast",
    "MINERU_ROUTER_HEALTH_RETRY_BUDGET_MIN": "12",
}


@pytest.fixture
def start_healing_router(launch_router: Callable[..., Router]) -> Callable[..., Router]:
    """Starts the router with BASE_ENV and waits for both workers."""

    def start(extra_env: dict[str, str], **kwargs: Any) -> Router:
        router = launch_router({**BASE_ENV, **extra_env}, **kwargs)
        router.wait_in_rotation()
        return router

    return start


def _stream(
    client: Client, pdf: bytes, *, count: int = STREAM_TASKS, file_parse_every: int = 0
) -> Stream:
    """``count`` tasks, one every STREAM_PERIOD_S, each followed to its end."""
    return Stream(
        client,
        lambda n: (f"stream-{n:03d}.pdf", pdf),
        every_s=STREAM_PERIOD_S,
        count=count,
        file_parse_every=file_parse_every,
    )


def _urls(router: Router) -> dict[str, str]:
    return {sid: s["base_url"] for sid, s in router.servers().items()}


def _assert_none_lost(outcomes: list[Outcome], router: Router) -> None:
    bad = [(o.name, o.status, o.detail) for o in outcomes if o.status != "completed"]
    assert not bad, (bad, router.proc.log_tail(6000))


def _warm(client: Client, pdf: bytes) -> list[Outcome]:
    """Tasks until each worker completed at least one (first parses load a lot); bounded.

    Two at a time (one a worker while both are idle): four cold parses at once
    on two cores passed a short MINERU_HEALTH_TASK_HANG_S in some runs here.
    """
    done: list[Outcome] = []
    with ThreadPoolExecutor(max_workers=2) as pool:
        for round_ in range(6):
            names = [f"warm-{round_}-{i}.pdf" for i in range(2)]
            batch = list(pool.map(lambda name: client.run(name, pdf), names))
            assert all(o.status == "completed" for o in batch), [o.detail for o in batch]
            done += batch
            if len({o.detail["workers_tried"][-1] for o in done}) == 2:
                return done
    pytest.fail(f"warm-up never reached both workers: {[o.detail for o in done]}")


@pytest.fixture(scope="module")
def pdf() -> bytes:
    pytest.importorskip("reportlab")
    return make_pdf(text="mineru-health resubmission test page")


# --- the scenarios ------------------------------------------------------------------------------


def test_engine_death_mid_stream_loses_nothing_and_results_survive_restart(
    start_healing_router: Callable[..., Router],
    fake_vlm_url: str,
    pdf: bytes,
) -> None:
    router = start_healing_router({}, fault_plan="plan-{port}")
    client = Client(router.base, router.line, engine_url=fake_vlm_url)
    before = _warm(client, pdf)
    urls = _urls(router)
    victim = before[0].detail["workers_tried"][-1]
    done_on_victim = [o for o in before if o.detail["workers_tried"][-1] == victim]

    with _stream(client, pdf) as stream:
        stream.wait_submitted(3)
        router.write_plan("engine_dead", urls[victim])
        outcomes = stream.outcomes()

    _assert_none_lost(outcomes, router)
    resubmitted = [o for o in outcomes if o.attempts > 1]
    assert resubmitted, [o.detail for o in outcomes]
    for outcome in resubmitted:
        tried = outcome.detail["workers_tried"]
        assert tried[0] == victim and len(tried) == outcome.attempts, outcome.detail
    assert router.metric("mineru_router_task_resubmissions_total") >= len(resubmitted)

    # Results completed on the victim before its engine died, downloaded only
    # now, from the restarted instance (a new process on a new URL).
    router.wait_restarted(victim, urls[victim])
    for outcome in before:
        response = client.result(outcome.task_id)
        assert response.status_code == 200, (outcome.detail, response.text[:500])
        assert response.json().get("results"), response.text[:500]
        assert client.status(outcome.task_id)["status"] == "completed"
    assert done_on_victim


def test_engine_stall_tasks_are_resubmitted(
    start_healing_router: Callable[..., Router],
    fake_vlm_url: str,
    pdf: bytes,
) -> None:
    # Passed to the workers through the router's environment; a tiny task
    # makes progress well within it on this machine.
    router = start_healing_router({"MINERU_HEALTH_STALL_S": "4"}, fault_plan="plan-{port}")
    client = Client(router.base, router.line, engine_url=fake_vlm_url)
    _warm(client, pdf)
    urls = _urls(router)
    victim = min(urls)

    with _stream(client, pdf) as stream:
        stream.wait_submitted(2)
        router.write_plan("engine_stall", urls[victim])
        outcomes = stream.outcomes()

    _assert_none_lost(outcomes, router)
    stalled = [o for o in outcomes if o.attempts > 1]
    assert stalled and all(o.detail["workers_tried"][0] == victim for o in stalled), [
        o.detail for o in outcomes
    ]
    assert router.metric("mineru_router_task_resubmissions_total", reason="engine_dead") >= 1


def test_poison_document_is_quarantined_after_two_engine_deaths(
    start_healing_router: Callable[..., Router],
    fake_vlm_url: str,
    pdf: bytes,
) -> None:
    router = start_healing_router({}, fault_plan="fault-plan")
    client = Client(router.base, router.line, engine_url=fake_vlm_url)
    _warm(client, pdf)
    router.write_plan("poison poison.pdf")  # every worker reads it; none consumes it
    poison = make_pdf(text="a document that kills inference engines")

    with _stream(client, pdf, count=10) as stream:
        stream.wait_submitted(2)
        poisoned = client.run("poison.pdf", poison)
        outcomes = stream.outcomes()

    assert poisoned.status == "failed", poisoned.detail
    error = poisoned.detail["error"]
    workers = set(router.servers())
    assert "Not sent again" in error and all(w in error for w in workers), error
    assert sorted(poisoned.detail["workers_tried"]) == sorted(workers), poisoned.detail
    _assert_none_lost(outcomes, router)

    records = [r for r in router.audit_records() if r["action"] == "poison_document_quarantined"]
    assert len(records) == 1, router.audit_records()
    assert sorted(records[0]["workers"]) == sorted(workers)
    assert records[0]["file_names"] == ["poison.pdf"] and records[0]["rules"]
    assert router.metric("mineru_router_poison_documents_total") == 1

    # The same bytes are refused at once, whatever their name.
    task_id, answer = client.submit("renamed.pdf", poison)
    assert not task_id and answer["code"] == 422 and "Not sent again" in answer["body"], answer


def test_a_server_url_that_never_answers_restarts_nothing_and_quarantines_nothing(
    start_healing_router: Callable[..., Router],
    fake_vlm_url: str,
    pdf: bytes,
) -> None:
    """Issue 24: a user whose tasks name a server that answers nothing, with the task
    watchdog's bound (MINERU_HEALTH_TASK_HANG_S) far below MinerU's client timeout.

    The tasks wait on their server, the watchdog never calls them hung, no
    worker leaves rotation or restarts, and the same bytes from an honest
    user parse (the poison guard counts only the workers' own engines).
    Issue 32: past TASK_HANG_S of their server's silence they fail, alone.
    """
    hang_s = 8.0  # past it a task of the worker's own engine would be hung
    router = start_healing_router(
        {"MINERU_HEALTH_TASK_HANG_S": str(hang_s), "MINERU_HEALTH_STALL_S": str(hang_s)}
    )
    honest = Client(router.base, router.line, engine_url=fake_vlm_url)
    _warm(honest, pdf)
    public = make_pdf(text="a public document anyone may send")
    hostile = Client(router.base, router.line, engine_url=f"{fake_vlm_url}/tarpit/60000/")
    waiting = [hostile.submit(f"bait-{n}.pdf", public)[0] for n in range(2)]
    assert all(waiting), waiting
    # Two bounds and a watcher's second later: still waiting, nobody ejected.
    deadline = time.monotonic() + 2 * hang_s + 3.0
    while time.monotonic() < deadline:
        statuses = [hostile.status(task_id).get("status") for task_id in waiting]
        assert all(status in ("pending", "processing", "failed") for status in statuses), (
            statuses,
            router.proc.log_tail(6000),
        )
        assert all(s["in_rotation"] for s in router.servers().values()), router.servers()
        time.sleep(0.5)
    parsed = honest.run("public.pdf", public)
    assert parsed.status == "completed", parsed.detail
    for task_id in waiting:
        ended = hostile.wait(task_id, timeout_s=30.0)
        assert ended.status == "failed" and "sent nothing" in ended.detail["error"], ended.detail
    assert router.metric("mineru_router_ejections_total") == 0
    assert router.metric("mineru_router_restarts_total") == 0
    assert router.metric("mineru_router_poison_documents_total") == 0
    actions = {r["action"] for r in router.audit_records()}
    assert not actions & {"ejected", "restart_scheduled", "poison_document_quarantined"}, actions


def test_kill_9_of_a_worker_mid_stream_loses_nothing(
    start_healing_router: Callable[..., Router],
    fake_vlm_url: str,
    pdf: bytes,
) -> None:
    router = start_healing_router({})
    _warm(Client(router.base, router.line, engine_url=fake_vlm_url), pdf)
    # A slow engine (1.5 s per page, the fake VLM's /delay/<ms>/): each worker
    # always holds tasks when the kill comes.
    client = Client(router.base, router.line, engine_url=f"{fake_vlm_url}/delay/1500/")
    urls = _urls(router)
    victim = min(urls)
    pid = router.worker_pid(urls[victim])
    assert pid is not None, urls

    def victim_just_started() -> bool:
        # A task the victim began parsing under a second ago, by its own status fresh from
        # the worker (the router refreshes it on each request): its parse takes at least
        # two 1.5 s engine calls, so the kill still finds it running on a loaded machine.
        # (Any task in processing could be in its last moments, done before the kill.)
        for status in map(client.status, reversed(client.task_ids)):
            started = status.get("started_at")
            if (
                status.get("status") == "processing"
                and (status.get("workers_tried") or [""])[-1] == victim
                and started
                and datetime.now(timezone.utc) - datetime.fromisoformat(started)
                < timedelta(seconds=1.0)
            ):
                return True
        return False

    with _stream(client, pdf, file_parse_every=4) as stream:
        stream.wait_submitted(4)
        assert wait_until(victim_just_started, 30.0, 0.05), router.servers()
        os.kill(pid, signal.SIGKILL)
        outcomes = stream.outcomes()

    _assert_none_lost(outcomes, router)
    assert any(o.attempts > 1 for o in outcomes), [o.detail for o in outcomes]
    router.wait_restarted(victim, urls[victim])


@pytest.fixture(autouse=True)
def _no_leftover_threads() -> Iterator[None]:
    before = threading.active_count()
    yield
    # Stream threads end with their tasks; give daemon pools a moment, bounded.
    wait_until(lambda: threading.active_count() <= before + 1, 10.0, 0.1)

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

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from conftest import (
    ManagedProcess,
    http_get,
    make_pdf,
    router_servers,
    wait_both_in_rotation,
    wait_restarted,
    wait_until,
    worker_pids,
)
from mineru_health.testing.faults import write_plan
from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    from typing_extensions import Self

pytestmark = pytest.mark.integration

TASK_TIMEOUT_S = 180.0  # a task not terminal by then is hung
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


# --- the router and its workers ---------------------------------------------------------------


@pytest.fixture
def start_healing_router(
    launch_router: Callable[..., ManagedProcess],
    tmp_path: Path,
) -> Callable[[dict[str, str]], ManagedProcess]:
    """Starts the router with BASE_ENV, its audit in tmp_path, and waits for both workers."""

    def start(extra_env: dict[str, str]) -> ManagedProcess:
        env = {**BASE_ENV, "MINERU_ROUTER_HEALTH_AUDIT_PATH": str(tmp_path / "audit.jsonl"),
               **extra_env}
        proc = launch_router(env)
        wait_both_in_rotation(proc)
        return proc

    return start


def _worker_pid(base_url: str) -> int | None:
    pids = worker_pids({base_url.rsplit(":", 1)[1]})
    return min(pids) if pids else None


def _metric(base: str, name: str, **labels: str) -> float:
    response = http_get(f"{base}/metrics", 5.0)
    assert response is not None and response.status_code == 200
    total = 0.0
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def _audit(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "audit.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --- clients ----------------------------------------------------------------------------------


@dataclass
class Outcome:
    name: str
    status: str  # completed | failed | hung | rejected
    task_id: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def attempts(self) -> int:
        return int(self.detail.get("attempts", 1))


class Client:
    def __init__(self, base: str, vlm_url: str, *, engine_delay_ms: int = 0) -> None:
        self.base = base
        # The fake VLM answers after engine_delay_ms under /delay/<ms>/: tasks stay in flight.
        server_url = f"{vlm_url}/delay/{engine_delay_ms}/" if engine_delay_ms else vlm_url
        self._form = {"backend": "vlm-http-client", "server_url": server_url}
        self.task_ids: list[str] = []  # every task submitted through /tasks, in order

    def submit(self, name: str, pdf: bytes) -> tuple[str, dict[str, Any]]:
        response = httpx.post(f"{self.base}/tasks", files={"files": (name, pdf, "application/pdf")},
                              data=self._form, timeout=60.0)
        if response.status_code == 202:
            self.task_ids.append(str(response.json().get("task_id", "")))
        return str(response.json().get("task_id", "")) if response.status_code == 202 else "", \
            {"code": response.status_code, "body": response.text[:2000]}

    def status(self, task_id: str) -> dict[str, Any]:
        response = http_get(f"{self.base}/tasks/{task_id}", 10.0)
        return response.json() if response is not None and response.status_code == 200 else {}

    def wait(self, task_id: str, name: str) -> Outcome:
        deadline = time.monotonic() + TASK_TIMEOUT_S
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            status = self.status(task_id) or status
            if status.get("status") in ("completed", "failed"):
                return Outcome(name, status["status"], task_id, status)
            time.sleep(0.25)
        return Outcome(name, "hung", task_id, status)

    def run(self, name: str, pdf: bytes) -> Outcome:
        task_id, answer = self.submit(name, pdf)
        if not task_id:
            return Outcome(name, "rejected", "", answer)
        return self.wait(task_id, name)

    def file_parse(self, name: str, pdf: bytes) -> Outcome:
        response = httpx.post(f"{self.base}/file_parse",
                              files={"files": (name, pdf, "application/pdf")},
                              data=self._form, timeout=TASK_TIMEOUT_S)
        task_id = response.headers.get("X-MinerU-Task-Id", "")
        if response.status_code == 200:
            return Outcome(name, "completed", task_id, self.status(task_id))
        return Outcome(name, "failed", task_id, {"code": response.status_code,
                                                "body": response.text[:2000]})

    def result(self, task_id: str) -> httpx.Response:
        return httpx.get(f"{self.base}/tasks/{task_id}/result", timeout=60.0)


class Stream:
    """Submits ``count`` tasks, one every ``period_s``, each waited for on its own thread."""

    def __init__(self, client: Client, pdf: bytes, *, count: int = STREAM_TASKS,
                 period_s: float = STREAM_PERIOD_S, file_parse_every: int = 0) -> None:
        self.client = client
        self.pdf = pdf
        self.count = count
        self.period_s = period_s
        self.file_parse_every = file_parse_every
        self.started = threading.Event()
        self.submitted = 0
        self._pool = ThreadPoolExecutor(max_workers=count + 4)
        self._futures: list[Future[Outcome]] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        for index in range(self.count):
            name = f"stream-{index:03d}.pdf"
            use_file_parse = self.file_parse_every and index % self.file_parse_every == 1
            run = self.client.file_parse if use_file_parse else self.client.run
            self._futures.append(self._pool.submit(run, name, self.pdf))
            self.submitted = index + 1
            self.started.set()
            time.sleep(self.period_s)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def wait_submitted(self, count: int) -> None:
        assert wait_until(lambda: self.submitted >= count, 60.0, 0.05)

    def outcomes(self) -> list[Outcome]:
        self._thread.join(self.count * self.period_s + 60.0)
        return [f.result(timeout=TASK_TIMEOUT_S + 120.0) for f in self._futures]

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _assert_none_lost(outcomes: list[Outcome], proc: ManagedProcess) -> None:
    bad = [(o.name, o.status, o.detail) for o in outcomes if o.status != "completed"]
    assert not bad, (bad, proc.log_tail(6000))


def _warm(client: Client, pdf: bytes) -> list[Outcome]:
    """Tasks until each worker completed at least one (first parses load a lot); bounded."""
    done: list[Outcome] = []
    with ThreadPoolExecutor(max_workers=4) as pool:
        for round_ in range(4):
            names = [f"warm-{round_}-{i}.pdf" for i in range(4)]
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
    start_healing_router: Callable[[dict[str, str]], ManagedProcess], fake_vlm_url: str, pdf: bytes,
    tmp_path: Path,
) -> None:
    plans = tmp_path / "plans"
    plans.mkdir()
    proc = start_healing_router({"MINERU_HEALTH_FAULT_PLAN": str(plans / "plan-{port}")})
    client = Client(proc.base_url, fake_vlm_url)
    before = _warm(client, pdf)
    urls = {sid: s["base_url"] for sid, s in router_servers(proc.base_url).items()}
    victim = before[0].detail["workers_tried"][-1]
    done_on_victim = [o for o in before if o.detail["workers_tried"][-1] == victim]

    with Stream(client, pdf) as stream:
        stream.wait_submitted(3)
        write_plan(plans / f"plan-{urls[victim].rsplit(':', 1)[1]}", "engine_dead")
        outcomes = stream.outcomes()

    _assert_none_lost(outcomes, proc)
    resubmitted = [o for o in outcomes if o.attempts > 1]
    assert resubmitted, [o.detail for o in outcomes]
    for outcome in resubmitted:
        tried = outcome.detail["workers_tried"]
        assert tried[0] == victim and len(tried) == outcome.attempts, outcome.detail
    assert _metric(proc.base_url, "mineru_router_task_resubmissions_total") >= len(resubmitted)

    # Results completed on the victim before its engine died, downloaded only
    # now, from the restarted instance (a new process on a new URL).
    wait_restarted(proc, victim, urls[victim])
    for outcome in before:
        response = client.result(outcome.task_id)
        assert response.status_code == 200, (outcome.detail, response.text[:500])
        assert response.json().get("results"), response.text[:500]
        assert client.status(outcome.task_id)["status"] == "completed"
    assert done_on_victim


def test_engine_stall_tasks_are_resubmitted(
    start_healing_router: Callable[[dict[str, str]], ManagedProcess], fake_vlm_url: str, pdf: bytes,
    tmp_path: Path,
) -> None:
    plans = tmp_path / "plans"
    plans.mkdir()
    proc = start_healing_router({
        "MINERU_HEALTH_FAULT_PLAN": str(plans / "plan-{port}"),
        # Passed to the workers through the router's environment; a tiny task
        # makes progress well within it on this machine.
        "MINERU_HEALTH_STALL_S": "4",
    })
    client = Client(proc.base_url, fake_vlm_url)
    _warm(client, pdf)
    urls = {sid: s["base_url"] for sid, s in router_servers(proc.base_url).items()}
    victim = min(urls)

    with Stream(client, pdf) as stream:
        stream.wait_submitted(2)
        write_plan(plans / f"plan-{urls[victim].rsplit(':', 1)[1]}", "engine_stall")
        outcomes = stream.outcomes()

    _assert_none_lost(outcomes, proc)
    stalled = [o for o in outcomes if o.attempts > 1]
    assert stalled and all(o.detail["workers_tried"][0] == victim for o in stalled), (
        [o.detail for o in outcomes])
    assert _metric(proc.base_url, "mineru_router_task_resubmissions_total",
                   reason="engine_dead") >= 1


def test_poison_document_is_quarantined_after_two_engine_deaths(
    start_healing_router: Callable[[dict[str, str]], ManagedProcess], fake_vlm_url: str, pdf: bytes,
    tmp_path: Path,
) -> None:
    plan = tmp_path / "fault-plan"
    proc = start_healing_router({"MINERU_HEALTH_FAULT_PLAN": str(plan)})
    client = Client(proc.base_url, fake_vlm_url)
    _warm(client, pdf)
    write_plan(plan, "poison poison.pdf")  # every worker reads it; none consumes it
    poison = make_pdf(text="a document that kills inference engines")

    with Stream(client, pdf, count=10) as stream:
        stream.wait_submitted(2)
        poisoned = client.run("poison.pdf", poison)
        outcomes = stream.outcomes()

    assert poisoned.status == "failed", poisoned.detail
    error = poisoned.detail["error"]
    workers = set(router_servers(proc.base_url))
    assert "Not sent again" in error and all(w in error for w in workers), error
    assert sorted(poisoned.detail["workers_tried"]) == sorted(workers), poisoned.detail
    _assert_none_lost(outcomes, proc)

    records = [r for r in _audit(tmp_path) if r["action"] == "poison_document_quarantined"]
    assert len(records) == 1, _audit(tmp_path)
    assert sorted(records[0]["workers"]) == sorted(workers)
    assert records[0]["file_names"] == ["poison.pdf"] and records[0]["rules"]
    assert _metric(proc.base_url, "mineru_router_poison_documents_total") == 1

    # The same bytes are refused at once, whatever their name.
    task_id, answer = client.submit("renamed.pdf", poison)
    assert not task_id and answer["code"] == 422 and "Not sent again" in answer["body"], answer


def test_kill_9_of_a_worker_mid_stream_loses_nothing(
    start_healing_router: Callable[[dict[str, str]], ManagedProcess], fake_vlm_url: str, pdf: bytes,
) -> None:
    proc = start_healing_router({})
    _warm(Client(proc.base_url, fake_vlm_url), pdf)
    # A slow engine (1.5 s per page): each worker always holds tasks when the kill comes.
    client = Client(proc.base_url, fake_vlm_url, engine_delay_ms=1500)
    urls = {sid: s["base_url"] for sid, s in router_servers(proc.base_url).items()}
    victim = min(urls)
    pid = _worker_pid(urls[victim])
    assert pid is not None, urls

    def victim_processing() -> bool:
        # The task's own status, fresh from the worker (the router refreshes it on
        # each request): a task the victim is parsing now is lost to the kill.
        # (The load figures of the router's /health are one probe old.)
        return any(status.get("status") == "processing"
                   and (status.get("workers_tried") or [""])[-1] == victim
                   for status in map(client.status, list(client.task_ids)))

    with Stream(client, pdf, file_parse_every=4) as stream:
        stream.wait_submitted(4)
        assert wait_until(victim_processing, 30.0, 0.05), router_servers(proc.base_url)
        os.kill(pid, signal.SIGKILL)
        outcomes = stream.outcomes()

    _assert_none_lost(outcomes, proc)
    assert any(o.attempts > 1 for o in outcomes), [o.detail for o in outcomes]
    wait_restarted(proc, victim, urls[victim])


@pytest.fixture(autouse=True)
def _no_leftover_threads() -> Iterator[None]:
    before = threading.active_count()
    yield
    # Stream threads end with their tasks; give daemon pools a moment, bounded.
    wait_until(lambda: threading.active_count() <= before + 1, 10.0, 0.1)

"""The supervisor with MinerU 3.x's task line against a fake pool, registry and workers.

Each fake worker answers ``GET /tasks/{id}`` from a table the test fills;
submissions go through a fake ``submit_payload_to_upstream``. The tests drive
the line the way the router's endpoints do (a client's status refresh) and
the supervisor the way the fleet does (a poller event), and check what
MinerU's task record ends up as. No processes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from mineru_health import _native
from mineru_health.mineru3.router.endpoints import _following_restarts
from mineru_health.mineru3.router.tasks import TaskLine, workers_tried
from mineru_health.runtime.router.admission import Refused
from mineru_health.runtime.router.poison import content_digest
from mineru_health.runtime.router.policy import Action, Answer, AnswerKind, Step
from mineru_health.runtime.router.store import RouterStore
from mineru_health.runtime.router.supervisor import Supervisor
from mineru_health.runtime.settings import HealthSettings
from mineru_health.runtime.worker import store

P = _native.WorkerPhase
DEAD = {
    "status": "failed",
    "error": "EngineDeadError: EngineCore encountered an issue.",
    "engine_dead": True,
    "verdict": {
        "fatal": True,
        "engine_dead": True,
        "role": "trigger",
        "rule": "vllm.engine_dead",
        "category": "engine_dead",
    },
}
COLLATERAL = {
    **DEAD,
    "error": "engine unusable",
    "verdict": {**DEAD["verdict"], "fatal": False, "role": "collateral"},
}


class Unavailable(Exception):
    pass


class Rejected(Exception):
    """MinerU's UpstreamSubmissionRejected, and FastAPI's HTTPException in its place."""

    def __init__(
        self, status_code: int, detail: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(detail)
        self.status_code, self.detail, self.headers = status_code, detail, headers or {}


class Fleet:
    """Workers w0 and w1: their health, their answers, the submissions they receive.

    Both MinerU's pool (what the task line calls) and the runtime's fleet (what
    the supervisor calls), reduced to what they use.
    """

    def __init__(self) -> None:
        self.servers = {
            sid: SimpleNamespace(server_id=sid, base_url=f"http://{sid}:1", local_server=object())
            for sid in ("w0", "w1")
        }
        self.phase = {"w0": P.HEALTHY, "w1": P.HEALTHY}
        self.answers: dict[str, Any] = {}  # url -> payload dict, 404, or an exception
        self.submitted: list[tuple[str, str]] = []  # (server, upstream task id)
        self.passive: list[tuple[str, str]] = []  # (worker, reason) reported to the policy
        self.dead_processes: set[str] = set()
        self.client = SimpleNamespace(get=self._get)
        self.fleet = self
        self.local = self  # the fleet's LocalWorkers too (check_process)
        self.audit = Audit()
        self.state_dirs = SimpleNamespace(state_dir=lambda sid: Path("/nonexistent"))

    # The runtime's Fleet surface
    def status(self, sid: str) -> Any:
        return SimpleNamespace(
            id=sid,
            phase=self.phase[sid],
            in_rotation=self.phase[sid] == P.HEALTHY,
            restartable=True,
            ejection_suppressed=False,
        )

    def statuses(self) -> list[Any]:
        return [self.status(sid) for sid in self.servers]

    def base_url(self, sid: str) -> str:
        return str(self.servers[sid].base_url)

    def member(self, sid: str) -> Any:
        return SimpleNamespace(id=sid, local=True)

    def check_process(self, sid: str) -> None:
        if sid in self.dead_processes:
            self.phase[sid] = P.FAILED  # as the fleet reports an exit

    def report_passive(self, sid: str, reason: str) -> None:
        self.passive.append((sid, reason))

    async def _get(self, url: str, timeout: float) -> Any:
        answer = self.answers.get(url, httpx.ConnectError("refused"))
        if isinstance(answer, Exception):
            raise answer
        if answer == 404:
            return httpx.Response(404, json={"detail": "Task not found"})
        return httpx.Response(200, json=answer)

    # MinerU's WorkerPool surface
    def get_server(self, sid: str) -> Any:
        return self.servers.get(sid)

    async def acquire_submission_server(self, excluded_server_ids: set[str]) -> Any:
        for sid, server in self.servers.items():
            if self.phase[sid] == P.HEALTHY and sid not in excluded_server_ids:
                return server
        return None

    async def release_submission_server(self, sid: str) -> None:
        pass

    async def mark_submission_failure(self, sid: str, error: str) -> None:
        self.phase[sid] = P.UNHEALTHY

    async def submit(self, base_url: str, payload: Any) -> dict[str, Any]:
        sid = base_url.split("//")[1].split(":")[0]
        task_id = f"up-{len(self.submitted) + 1}"
        self.submitted.append((sid, task_id))
        return {"task_id": task_id, "status": "pending", "started_at": None, "queued_ahead": 0}


class Registry:
    """MinerU's RouterTaskRegistry, reduced to what the supervisor calls."""

    async def update_from_upstream_payload(self, task_id: str, payload: dict[str, Any]) -> Any:
        record = RECORDS[task_id]
        record.status = payload.get("status", record.status)
        record.error = payload.get("error")
        record.upstream_error_count = 0
        return record

    async def increment_upstream_error(self, task_id: str, error: str) -> Any:
        record = RECORDS[task_id]
        record.upstream_error_count += 1
        return record

    async def mark_failed(self, task_id: str, error: str) -> Any:
        record = RECORDS[task_id]
        record.status, record.error = "failed", error
        return record

    async def register(self, **fields: Any) -> Any:
        record = new_record(f"held-{len(RECORDS)}", fields["upstream_server_id"])
        return record


RECORDS: dict[str, Any] = {}


def new_record(task_id: str, server: str) -> Any:
    record = SimpleNamespace(
        task_id=task_id,
        upstream_server_id=server,
        upstream_task_id=f"first-{task_id}",
        upstream_base_url=f"http://{server}:1" if server else "",
        status="pending",
        created_at="2026-01-01T00:00:00+00:00",
        started_at=None,
        completed_at=None,
        error=None,
        queued_ahead=None,
        upstream_error_count=0,
    )
    RECORDS[task_id] = record
    return record


class Payload:
    def __init__(self) -> None:
        self.uploads = [SimpleNamespace(upload_name="doc.pdf", path="/nonexistent")]
        self.retained = False
        self.released = 0

    def release(self) -> None:
        self.released += 1

    def get_field_value(self, name: str) -> str:
        return "vlm-http-client" if name == "backend" else ""


class Audit:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def write_record(self, action: str, **fields: Any) -> dict[str, Any]:
        self.records.append({"action": action, **fields})
        return self.records[-1]


class SteppingClock:
    """A monotonic clock that moves ``step_s`` per reading: deadlines pass without waiting."""

    def __init__(self, step_s: float) -> None:
        self.now, self.step_s = 0.0, step_s

    def __call__(self) -> float:
        self.now += self.step_s
        return self.now


def line_for(
    fleet: Fleet,
    clock: Callable[[], float] | None = None,
    store: Any = None,
    **settings: Any,
) -> TaskLine:
    """MinerU 3.x's task line with its supervisor, as the healing pool builds them."""
    base = HealthSettings.preset("fast").replace(
        interval_s=0.05, probe_timeout_s=0.02, connect_timeout_s=0.01, boot_timeout_s=1.0
    )
    namespace = {
        "submit_payload_to_upstream": fleet.submit,
        "UpstreamSubmissionUnavailable": Unavailable,
        "UpstreamSubmissionRejected": Rejected,
        "normalize_upload_filename": lambda name: name,
        "utc_now_iso": lambda: "2026-01-01T00:00:00+00:00",
    }
    pool = SimpleNamespace(
        **{
            name: getattr(fleet, name)
            for name in (
                "fleet",
                "client",
                "get_server",
                "acquire_submission_server",
                "release_submission_server",
                "mark_submission_failure",
            )
        }
    )
    line = TaskLine(pool, namespace)
    pool.supervisor = Supervisor(
        fleet,
        line,
        base.replace(**settings) if settings else base,  # type: ignore[arg-type]
        **({"clock": clock} if clock is not None else {}),
        store=store,
    )
    return line


def run(test: Callable[[Fleet], Awaitable[None]]) -> None:
    RECORDS.clear()

    async def main() -> None:
        await test(Fleet())

    asyncio.run(main())


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition never held")


async def settle(line: TaskLine) -> None:
    for _ in range(200):
        pending = [t for t in line.supervisor.background.tasks if not t.done()]
        if not pending:
            return
        await asyncio.wait(pending, timeout=0.5)
    raise AssertionError("background work never settled")


async def track(
    line: TaskLine, task_id: str, server: str = "w0", digest: str | None = "digest"
) -> tuple[Any, Payload]:
    record, payload = new_record(task_id, server), Payload()
    await line.track(record, payload, digest, Registry())
    return record, payload


def test_engine_death_is_resubmitted_under_the_same_task_id() -> None:
    async def scenario(fleet: Fleet) -> None:
        line = line_for(fleet)
        record, payload = await track(line, "t1")
        assert payload.retained and workers_tried(record) == ["w0"]
        fleet.answers["http://w0:1/tasks/first-t1"] = DEAD
        await line.refresh(record)
        assert record.status == "pending"  # never shown failed
        await settle(line)
        assert fleet.submitted == [("w1", "up-1")]
        assert (record.upstream_server_id, record.upstream_task_id) == ("w1", "up-1")
        assert record.upstream_base_url == "http://w1:1" and record.status == "pending"
        assert workers_tried(record) == ["w0", "w1"]
        # Passive ejection saw the worker's verdict (its rule, never the task's text).
        assert fleet.passive == [("w0", "a task failed with a fatal error (rule vllm.engine_dead)")]
        assert payload.released == 0

        fleet.answers["http://w1:1/tasks/up-1"] = {"status": "completed", "error": None}
        await line.refresh(record)
        assert record.status == "completed" and payload.released == 1
        assert not line.tracks(record)

    run(scenario)


def test_retries_then_a_clear_failure() -> None:
    async def scenario(fleet: Fleet) -> None:
        line = line_for(fleet, task_retries=1)
        record, payload = await track(line, "t1")
        fleet.answers["http://w0:1/tasks/first-t1"] = COLLATERAL
        await line.refresh(record)
        await settle(line)
        fleet.answers["http://w1:1/tasks/up-1"] = COLLATERAL
        await line.refresh(record)
        await settle(line)
        assert record.status == "failed" and payload.released == 1
        assert record.error.startswith("engine unusable [mineru-health: not resubmitted")
        assert "MINERU_ROUTER_HEALTH_TASK_RETRIES" in record.error and "w0, w1" in record.error
        assert fleet.audit.records == []  # collateral deaths never quarantine

    run(scenario)


def test_retry_budget_delays_a_resubmission_until_an_earlier_one_ends() -> None:
    async def scenario(fleet: Fleet) -> None:
        line = line_for(fleet, retry_budget_percent=0.0, retry_budget_min=1)
        first, _ = await track(line, "t1")
        second, _ = await track(line, "t2")
        for record in (first, second):
            fleet.answers[f"http://w0:1/tasks/first-{record.task_id}"] = COLLATERAL
            await line.refresh(record)
        await until(lambda: bool(fleet.submitted))  # the second waits meanwhile, pending
        assert workers_tried(first) == ["w0", "w1"] and fleet.submitted == [("w1", "up-1")]
        assert second.status == "pending" and workers_tried(second) == ["w0"]

        fleet.answers["http://w1:1/tasks/up-1"] = {"status": "completed", "error": None}
        await line.refresh(first)  # the first resubmission ends: room for the second
        await settle(line)
        assert first.status == "completed"
        assert second.status == "pending" and workers_tried(second) == ["w0", "w1"]
        assert fleet.submitted == [("w1", "up-1"), ("w1", "up-2")]

    run(scenario)


def test_retry_budget_spent_for_the_whole_wait_fails_the_task_clearly() -> None:
    async def scenario(fleet: Fleet) -> None:
        # BOOT_TIMEOUT_S (1 s, its floor) passes on the clock, not in real time.
        line = line_for(fleet, SteppingClock(0.5), retry_budget_percent=0.0, retry_budget_min=1)
        first, _ = await track(line, "t1")
        second, _ = await track(line, "t2")
        for record in (first, second):
            fleet.answers[f"http://w0:1/tasks/first-{record.task_id}"] = COLLATERAL
            await line.refresh(record)
            await settle(line)
        assert first.status == "pending" and workers_tried(first) == ["w0", "w1"]
        assert second.status == "failed" and "retry budget stayed spent for 1 s" in second.error
        assert "RETRY_BUDGET_MIN=1" in second.error

    run(scenario)


class ReadClock:
    """A clock the test sets; counts its readings (a waiter's loop reads it once a turn)."""

    def __init__(self) -> None:
        self.now, self.reads = 0.0, 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


def test_a_resubmission_over_the_budget_waits_while_earlier_ones_keep_ending() -> None:
    """A backlog on a slow fleet turns the budget over slowly: a task waits past
    BOOT_TIMEOUT_S as long as resubmissions keep ending, and fails only after one
    BOOT_TIMEOUT_S in which none did (the test above)."""

    async def scenario(fleet: Fleet) -> None:
        clock = ReadClock()
        line = line_for(fleet, clock, retry_budget_percent=0.0, retry_budget_min=1)
        records = [(await track(line, f"t{n}"))[0] for n in range(3)]
        for record in records:
            fleet.answers[f"http://w0:1/tasks/first-{record.task_id}"] = COLLATERAL
            await line.refresh(record)
        await until(lambda: len(fleet.submitted) == 1)
        by_upstream = {r.upstream_task_id: r for r in records}

        async def end(upstream_id: str) -> Any:
            record = by_upstream.get(upstream_id) or next(
                r for r in records if r.upstream_task_id == upstream_id
            )
            fleet.answers[f"http://w1:1/tasks/{upstream_id}"] = {
                "status": "completed",
                "error": None,
            }
            await line.refresh(record)
            return record

        clock.now = 0.9  # within BOOT_TIMEOUT_S (1 s): the first ends, the second goes
        first = await end(fleet.submitted[0][1])
        await until(lambda: len(fleet.submitted) == 2)
        clock.now = 1.5  # past the first deadline of the one still waiting
        reads = clock.reads
        await until(lambda: clock.reads >= reads + 3)  # its loop looked at the clock since
        waiting = [r for r in records if workers_tried(r) == ["w0"]]
        assert len(waiting) == 1 and waiting[0].status == "pending", [
            (r.status, r.error) for r in records
        ]
        await end(fleet.submitted[1][1])  # the budget turns over again: it goes
        await until(lambda: len(fleet.submitted) == 3)
        assert first.status == "completed" and workers_tried(waiting[0]) == ["w0", "w1"]
        await settle(line)

    run(scenario)


def test_poison_document_quarantined_after_two_workers() -> None:
    async def scenario(fleet: Fleet) -> None:
        line = line_for(fleet)
        record, payload = await track(line, "t1", digest="poison")
        fleet.answers["http://w0:1/tasks/first-t1"] = DEAD
        await line.refresh(record)
        await settle(line)
        fleet.answers["http://w1:1/tasks/up-1"] = DEAD
        await line.refresh(record)
        await settle(line)
        assert record.status == "failed" and "Not sent again: doc.pdf" in record.error
        assert "w0 (vllm.engine_dead)" in record.error and "w1 (vllm.engine_dead)" in record.error
        (entry,) = fleet.audit.records
        assert entry["action"] == "poison_document_quarantined"
        assert entry["workers"] == ["w0", "w1"] and entry["file_names"] == ["doc.pdf"]
        assert line.supervisor.poison.quarantined("poison") is not None
        assert payload.released == 1

    run(scenario)


def test_a_death_another_router_sharing_the_store_saw_counts() -> None:
    """Issue 35: two routers on one database each saw the document kill one of their own
    workers: quarantined fleet-wide at the second, each local worker named with its router."""
    shared = RouterStore(":memory:")
    shared.router_id = "router-a"
    assert shared.add_poison_death("poison", "router-b/local-gpu-0", "cuda.sticky")

    async def scenario(fleet: Fleet) -> None:
        line = line_for(fleet, store=shared)
        record, _payload = await track(line, "t1", digest="poison")
        fleet.answers["http://w0:1/tasks/first-t1"] = DEAD
        await line.refresh(record)
        await settle(line)
        assert record.status == "failed" and "Not sent again: doc.pdf" in record.error
        assert "router-b/local-gpu-0 (cuda.sticky)" in record.error
        assert "router-a/w0 (vllm.engine_dead)" in record.error
        assert workers_tried(record) == ["w0"]  # never sent to a third engine
        (held,) = shared.poison()
        assert [w for w, _ in held[1]] == ["router-b/local-gpu-0", "router-a/w0"]

    run(scenario)


def test_a_document_is_hashed_only_when_a_trigger_death_needs_it(tmp_path: Path) -> None:
    document = tmp_path / "doc.pdf"
    document.write_bytes(b"%PDF-1.7 poison")

    async def scenario(fleet: Fleet) -> None:
        line = line_for(fleet)
        record, payload = await track(line, "t1", digest=None)
        payload.uploads[0].path = str(document)
        tracked = line.supervisor.find("t1")
        assert tracked is not None
        assert tracked.digest is None  # submission: a healthy fleet hashes nothing
        fleet.answers["http://w0:1/tasks/first-t1"] = DEAD
        await line.refresh(record)
        await settle(line)
        assert tracked.digest == content_digest([str(document)])
        assert line.supervisor.poison.suspects() == 1 and workers_tried(record) == ["w0", "w1"]

    run(scenario)


def test_worker_declared_failed_resubmits_without_any_client() -> None:
    async def scenario(fleet: Fleet) -> None:
        line = line_for(fleet)
        record, _ = await track(line, "t1")
        record.status = "processing"
        fleet.phase["w0"] = P.FAILED  # process exited: nothing answers on its URL
        line.supervisor.on_event(
            SimpleNamespace(
                kind=_native.PollerEventKind.AUDIT,
                worker_id="w0",
                audit=SimpleNamespace(to_phase=P.FAILED),
            )
        )
        await settle(line)
        assert fleet.submitted == [("w1", "up-1")] and record.status == "pending"

    run(scenario)


def test_a_killed_worker_is_seen_by_the_first_status_request() -> None:
    async def scenario(fleet: Fleet) -> None:
        line = line_for(fleet)
        record, _ = await track(line, "t1")
        fleet.dead_processes.add("w0")  # kill -9: the policy has not seen it yet
        await line.refresh(record)
        await settle(line)
        assert fleet.submitted == [("w1", "up-1")] and record.upstream_error_count == 0

    run(scenario)


def test_restart_requested_resubmits_what_the_old_instance_holds() -> None:
    async def scenario(fleet: Fleet) -> None:
        line = line_for(fleet)
        record, _ = await track(line, "t1")
        fleet.answers["http://w0:1/tasks/first-t1"] = {"status": "processing"}
        fleet.phase["w0"] = P.RESTARTING  # the pool is stopping this instance
        line.supervisor.on_event(
            SimpleNamespace(kind=_native.PollerEventKind.RESTART_REQUESTED, worker_id="w0")
        )
        await settle(line)
        assert fleet.submitted == [("w1", "up-1")] and workers_tried(record) == ["w0", "w1"]

    run(scenario)


def test_a_task_the_dead_worker_finished_is_kept_not_run_again(tmp_path: Path) -> None:
    async def scenario(fleet: Fleet) -> None:
        line = line_for(fleet)
        done, _ = await track(line, "t1")
        lost, _ = await track(line, "t2")
        # The worker finished t1 (in its store) and died before the router saw it.
        kept = store.Store(tmp_path / store.DB_NAME)
        kept.save(
            "first-t1",
            {
                "task_id": "first-t1",
                "status": "completed",
                "output_dir": "/o",
                "backend": "vlm-http-client",
                "file_names": ["doc"],
                "error": None,
                "started_at": "s",
                "completed_at": "c",
            },
        )
        kept.close()
        fleet.state_dirs = SimpleNamespace(state_dir=lambda sid: tmp_path)
        fleet.phase["w0"] = P.FAILED
        for record in (done, lost):
            await line.refresh(record)
        await settle(line)
        assert done.status == "completed" and workers_tried(done) == ["w0"]
        assert fleet.submitted == [("w1", "up-1")] and workers_tried(lost) == ["w0", "w1"]

    run(scenario)


def test_slow_worker_is_left_alone() -> None:
    async def scenario(fleet: Fleet) -> None:
        line = line_for(fleet)
        record, _ = await track(line, "t1")
        fleet.phase["w0"] = P.UNHEALTHY  # ejected on timeouts, below the failure threshold
        for _ in range(5):
            await line.refresh(record)
        await settle(line)
        assert fleet.submitted == [] and record.status == "pending"
        assert record.upstream_error_count == 0  # MinerU would fail it after 3

    run(scenario)


def test_restarted_worker_that_restored_the_task_keeps_it() -> None:
    async def scenario(fleet: Fleet) -> None:
        line = line_for(fleet)
        record, payload = await track(line, "t1")
        fleet.servers["w0"].base_url = "http://w0:2"  # a new instance after a restart
        fleet.answers["http://w0:2/tasks/first-t1"] = {"status": "completed", "error": None}
        line.supervisor.on_event(
            SimpleNamespace(
                kind=_native.PollerEventKind.AUDIT,
                worker_id="w0",
                audit=SimpleNamespace(to_phase=P.HEALTHY),
            )
        )
        await settle(line)
        assert fleet.submitted == []  # adopted, not duplicated
        assert record.status == "completed" and record.upstream_base_url == "http://w0:2"
        assert payload.released == 1

        # A finished task's result request follows a later restart too.
        fleet.servers["w0"].base_url = "http://w0:3"
        assert line.follow_restart(record)
        assert record.upstream_base_url == "http://w0:3"
        fleet.phase["w0"] = P.RESTARTING  # booting: 503 + Retry-After, no upstream error counted
        assert not line.follow_restart(record)

    run(scenario)


def test_a_verdict_restored_by_a_new_instance_never_ejects_it() -> None:
    """Issue 32: the new instance restored the task as its previous instance failed it
    (engine_dead, trigger): the task is sent again, the healthy instance stays in rotation."""

    async def scenario(fleet: Fleet) -> None:
        line = line_for(fleet)
        record, payload = await track(line, "t1")
        fleet.servers["w0"].base_url = "http://w0:2"
        restored = {**DEAD, "verdict": {**DEAD["verdict"], "restored": True}}
        fleet.answers["http://w0:2/tasks/first-t1"] = restored
        line.supervisor.on_event(
            SimpleNamespace(
                kind=_native.PollerEventKind.AUDIT,
                worker_id="w0",
                audit=SimpleNamespace(to_phase=P.HEALTHY),
            )
        )
        await settle(line)
        assert fleet.passive == []  # nothing the current instance did
        assert fleet.submitted == [("w1", "up-1")] and record.status == "pending"
        # The trigger still counts once against the document, on the worker it killed.
        assert [d.worker_id for d in line.supervisor.poison.deaths("digest")] == ["w0"]
        fleet.answers["http://w1:1/tasks/up-1"] = {"status": "completed", "error": None}
        await line.refresh(record)
        assert record.status == "completed" and payload.released == 1

    run(scenario)


def test_a_dead_workers_store_never_reports_the_worker_again() -> None:
    """What a dead process's store says is about an instance already declared failed."""

    async def scenario(fleet: Fleet) -> None:
        line = line_for(fleet)
        record, _ = await track(line, "t1")
        kept = line.supervisor.find("t1")
        assert kept is not None
        line.supervisor._lost(
            kept,
            Step(Action.RESUBMIT, "engine_dead"),
            Answer(AnswerKind.STATUS, payload=DEAD, from_store=True),
        )
        await settle(line)
        assert fleet.passive == [] and fleet.submitted == [("w1", "up-1")]
        assert record.upstream_server_id == "w1"

    run(scenario)


def test_file_parse_waits_for_the_restarted_instance_a_result_request_does_not() -> None:
    async def scenario(fleet: Fleet) -> None:
        line = line_for(fleet, clock=SteppingClock(0.01))  # BOOT_TIMEOUT_S: 100 readings
        record, _payload = await track(line, "t1")
        record.status = "completed"
        fleet.phase["w0"] = P.RESTARTING
        request = SimpleNamespace(
            app=SimpleNamespace(state=SimpleNamespace(worker_pool=SimpleNamespace(task_line=line)))
        )

        async def proxy(request: Any, task: Any) -> str:
            return f"result of {task.task_id} from {task.upstream_base_url}"

        result_request = _following_restarts(proxy, Rejected, synchronous=False)
        file_parse = _following_restarts(proxy, Rejected, synchronous=True)
        with pytest.raises(Rejected) as refused:  # the client polls: 503 + Retry-After at once
            await result_request(request, record)
        assert refused.value.status_code == 503 and int(refused.value.headers["Retry-After"]) > 0

        waiting = asyncio.ensure_future(file_parse(request, record))
        await asyncio.sleep(0.02)
        assert not waiting.done()  # holds the caller's connection while the worker boots
        fleet.phase["w0"], fleet.servers["w0"].base_url = P.HEALTHY, "http://w0:2"
        line.supervisor.on_event(
            SimpleNamespace(
                kind=_native.PollerEventKind.AUDIT,
                worker_id="w0",
                audit=SimpleNamespace(to_phase=P.HEALTHY),
            )
        )
        assert await asyncio.wait_for(waiting, 5.0) == "result of t1 from http://w0:2"

        fleet.phase["w0"] = P.GAVE_UP  # never back: 503 once BOOT_TIMEOUT_S has passed
        with pytest.raises(Rejected) as refused:
            await asyncio.wait_for(file_parse(request, record), 30.0)
        assert refused.value.status_code == 503

    run(scenario)


def test_restarted_worker_that_does_not_know_the_task_gets_it_again() -> None:
    async def scenario(fleet: Fleet) -> None:
        line = line_for(fleet)
        record, _ = await track(line, "t1")
        fleet.servers["w0"].base_url = "http://w0:2"
        fleet.answers["http://w0:2/tasks/first-t1"] = 404
        fleet.phase["w1"] = P.FAILED  # only the restarted worker is healthy
        await line.refresh(record)
        await settle(line)
        assert fleet.submitted == [("w0", "up-1")] and workers_tried(record) == ["w0", "w0"]

    run(scenario)


def test_no_healthy_worker_holds_then_fails_with_a_clear_error() -> None:
    async def scenario(fleet: Fleet) -> None:
        line = line_for(fleet)
        fleet.phase = {"w0": P.RESTARTING, "w1": P.FAILED}
        assert line.supervisor.healing()
        held = await line.hold(Payload(), "d", Registry())
        assert held.status == "pending" and workers_tried(held) == []
        await asyncio.sleep(0.1)
        fleet.phase["w1"] = P.HEALTHY  # back: the held task goes out
        line.supervisor.on_event(
            SimpleNamespace(
                kind=_native.PollerEventKind.AUDIT,
                worker_id="w1",
                audit=SimpleNamespace(to_phase=P.HEALTHY),
            )
        )
        await settle(line)
        assert fleet.submitted == [("w1", "up-1")] and workers_tried(held) == ["w1"]

        fleet.phase = {"w0": P.GAVE_UP, "w1": P.UNHEALTHY}
        assert line.supervisor.healing()  # ejected a moment before it is declared failed
        fleet.phase = {"w0": P.GAVE_UP, "w1": P.GAVE_UP}
        assert not line.supervisor.healing()  # nothing is coming back: MinerU's 503 stands
        record, _ = await track(line, "t2", server="w1")
        fleet.answers["http://w1:1/tasks/first-t2"] = DEAD
        await line.refresh(record)
        await settle(line)  # waits BOOT_TIMEOUT_S (1 s here), then gives up
        assert record.status == "failed" and "no healthy worker" in record.error

    run(scenario)


def test_close_releases_every_upload() -> None:
    async def scenario(fleet: Fleet) -> None:
        line = line_for(fleet)
        payloads = [(await track(line, f"t{i}"))[1] for i in range(3)]
        await line.supervisor.close()
        assert [p.released for p in payloads] == [1, 1, 1] and line.supervisor.in_flight == 0

    run(scenario)


def test_kept_uploads_are_capped_in_count_and_bytes(tmp_path: Path) -> None:
    """Issue 17: 2,000 tasks at once held 1,961 uploads on disk and doubled the router's RSS."""

    async def scenario(fleet: Fleet) -> None:
        line = line_for(fleet, max_kept_tasks=2)
        line.supervisor.admit(0).close()
        await track(line, "t0")
        await track(line, "t1")
        with pytest.raises(Refused) as refused:
            line.supervisor.admit(0)
        assert refused.value.status == 503 and refused.value.headers["Retry-After"]
        assert "MINERU_ROUTER_HEALTH_MAX_KEPT_TASKS=2" in refused.value.detail
        await line.supervisor.close()
        line.supervisor.admit(0).close()  # released uploads free their place
        # Issue 24: a burst is counted as it is admitted, before any of it is kept.
        first, second = line.supervisor.admit(0), line.supervisor.admit(0)
        with pytest.raises(Refused):
            line.supervisor.admit(0)
        first.close()
        first.close()  # idempotent: gives its place back once
        third = line.supervisor.admit(0)
        second.close()
        third.close()

        by_size = line_for(fleet, max_kept_mb=1)
        big = tmp_path / "big.pdf"
        big.write_bytes(b"\0" * (1024 * 1024))
        record, payload = new_record("t2", "w0"), Payload()
        payload.uploads = [SimpleNamespace(upload_name="big.pdf", path=str(big))]
        await by_size.track(record, payload, "digest", Registry())
        with pytest.raises(Refused) as refused:
            by_size.supervisor.admit(1)
        assert "MINERU_ROUTER_HEALTH_MAX_KEPT_MB=1" in refused.value.detail
        await by_size.supervisor.close()

    run(scenario)

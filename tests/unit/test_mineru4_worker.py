"""The MinerU 4.0 worker adapter against stand-in modules and a real FastAPI app (no MinerU)."""

from __future__ import annotations

import asyncio
import dataclasses
import http.server
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.responses import JSONResponse
from mineru_health.demo.faults import make_engine_dead_error
from mineru_health.mineru4.worker import fatal_check, gate, job_store
from mineru_health.runtime.settings import WorkerSettings
from mineru_health.runtime.worker.worker_runtime import WorkerRuntime


def _upstream(error: BaseException) -> bool:
    return type(error).__name__ == "UpstreamOnly"


class UpstreamOnly(Exception):
    """An error only MinerU's own check calls fatal."""


@pytest.fixture
def modules() -> Iterator[list[types.ModuleType]]:
    made = []
    for name in fatal_check.MODULES:
        module = types.ModuleType(name)
        module.is_fatal_engine_error = _upstream  # type: ignore[attr-defined]
        made.append(module)
    saved = {name: sys.modules.get(name) for name in fatal_check.MODULES}
    sys.modules.update({m.__name__: m for m in made})
    yield made
    for name, previous in saved.items():
        if previous is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = previous


def test_rebind_reaches_every_namespace_and_records_natively(
    runtime: WorkerRuntime, modules: list[types.ModuleType]
) -> None:
    namespace: dict[str, Any] = {"is_fatal_engine_error": _upstream}
    assert fatal_check.rebind(runtime, namespace) == 4
    checks = [m.is_fatal_engine_error for m in modules] + [namespace["is_fatal_engine_error"]]
    assert all(check is checks[0] and check is not _upstream for check in checks)
    assert fatal_check.rebind(runtime, namespace) == 4  # again: replaced in place, upstream kept

    assert checks[0](ValueError("corrupt page")) is False
    assert runtime.health.healthy
    error = make_engine_dead_error()
    assert checks[0](error) is True
    assert checks[0](error) is True  # asked twice for one failure: recorded once
    snapshot = runtime.health.snapshot()
    assert not snapshot.healthy and snapshot.fatal_count == 1
    assert snapshot.first_fatal is not None and snapshot.first_fatal.rule == "vllm.engine_dead"


def test_upstream_verdict_is_kept(runtime: WorkerRuntime, modules: list[types.ModuleType]) -> None:
    fatal_check.rebind(runtime)
    assert modules[0].is_fatal_engine_error(UpstreamOnly("dead")) is True
    first = runtime.health.snapshot().first_fatal
    assert first is not None and first.rule == "mineru.is_fatal_engine_error"


def test_a_remote_engines_error_never_condemns_the_worker_while_its_server_answers(
    runtime: WorkerRuntime, modules: list[types.ModuleType]
) -> None:
    asked = threading.Event()

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            asked.set()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        app = FastAPI()
        url = f"http://127.0.0.1:{server.server_address[1]}"
        app.state.vlm_config = types.SimpleNamespace(server_url=url)
        app.state.job_store = types.SimpleNamespace(runtime_owner=object())
        runtime.apps.append(app)
        fatal_check.rebind(runtime)
        assert modules[0].is_fatal_engine_error(UpstreamOnly("remote says dead")) is False
        assert asked.wait(10.0)  # the worker's own server was asked, and answered
        assert runtime.health.healthy
    finally:
        server.shutdown()
        server.server_close()


class _JobStore:
    def __init__(self) -> None:
        self.failed_with: list[str] = []
        self._jobs: dict[str, Any] = {}
        self.runtime_owner = types.SimpleNamespace(engine_error=None)

    def fail_engine(self, message: str) -> None:
        self.failed_with.append(message)
        self.runtime_owner.engine_error = message


def _app(runtime: WorkerRuntime) -> FastAPI:
    app = FastAPI()
    app.add_middleware(GZipMiddleware, minimum_size=1000)

    @app.middleware("http")
    async def streaming(request: Any, call_next: Any) -> Any:  # 4.0's BaseHTTPMiddleware
        return await call_next(request)

    @app.get("/v1/health")
    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.post("/v1/tasks")
    async def tasks() -> JSONResponse:
        return JSONResponse({"accepted": True}, status_code=202)

    app.add_middleware(gate.Gate, runtime=runtime)
    app.state.job_store = _JobStore()
    runtime.apps.append(app)
    return app


def _call(app: FastAPI, method: str, path: str) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://w") as client:
            return await client.request(method, path)

    return asyncio.run(go())


def test_gate_advertises_then_refuses_once_dead(runtime: WorkerRuntime) -> None:
    app = _app(runtime)
    runtime.advertised_port = 4321
    healthy = _call(app, "GET", "/v1/health")
    assert healthy.status_code == 200
    assert healthy.json() == {"status": "ok", "native_health_port": 4321}
    assert _call(app, "POST", "/v1/tasks").status_code == 202

    runtime.health.record(make_engine_dead_error())
    dead = _call(app, "GET", "/v1/health")
    assert dead.status_code == 503
    assert dead.json()["engine_dead"] is True and dead.json()["rule"] == "vllm.engine_dead"
    refused = _call(app, "POST", "/v1/tasks")
    assert refused.status_code == 503 and int(refused.headers["retry-after"]) > 0


def test_a_full_disk_is_named_507_and_leaves_the_worker_healthy(runtime: WorkerRuntime) -> None:
    """Issue 24: a full output directory answered a bare 500, which a client cannot tell
    from a bug."""
    import errno

    app = _app(runtime)

    @app.post("/v1/file_parse")
    async def parse() -> JSONResponse:
        raise OSError(errno.ENOSPC, "No space left on device", "/out/job/a.pdf")

    full = _call(app, "POST", "/v1/file_parse")
    assert full.status_code == 507 and int(full.headers["retry-after"]) > 0
    assert full.json()["error"] == "insufficient_storage"
    assert "No space left on device (/out/job/a.pdf)" in full.json()["message"]
    assert runtime.health.healthy
    assert runtime.health.snapshot().storage_full_count == 1  # the metric's source
    assert _call(app, "GET", "/v1/health").status_code == 200


def test_act_on_fatal_fails_every_app_once(runtime: WorkerRuntime) -> None:
    stores = [_app(runtime).state.job_store, _app(runtime).state.job_store]
    gate.act_on_fatal(runtime)
    assert all(not s.failed_with for s in stores)
    runtime.health.record(make_engine_dead_error())
    gate.act_on_fatal(runtime)
    gate.act_on_fatal(runtime)
    assert all(len(s.failed_with) == 1 and "vllm.engine_dead" in s.failed_with[0] for s in stores)
    gate.report_jobs(runtime)  # MinerU's own error is pushed with the figures


def test_act_on_fatal_leaves_jobs_mineru_failed_itself(runtime: WorkerRuntime) -> None:
    mine, theirs = _app(runtime).state.job_store, _app(runtime).state.job_store
    theirs.runtime_owner.engine_error = "EngineDeadError: gone"  # _run_job's fail_engine ran
    runtime.health.record(make_engine_dead_error())
    gate.act_on_fatal(runtime)
    assert len(mine.failed_with) == 1 and theirs.failed_with == []  # failed once each


def _failed_job(job_id: str, code: str = "engine_dead") -> Any:
    error = types.SimpleNamespace(code=code)
    return types.SimpleNamespace(
        id=job_id, status="failed", files=[types.SimpleNamespace(error=error)]
    )


def test_the_job_whose_failure_was_first_fatal_is_the_trigger(
    runtime: WorkerRuntime, modules: list[types.ModuleType]
) -> None:
    """Issue 24: 4.0 fails every job of a dead engine alike; the worker tells the trigger."""
    from mineru_health.runtime.worker import engine_calls

    fatal_check.rebind(runtime)
    error = make_engine_dead_error()
    assert modules[0].is_fatal_engine_error(error) is True  # the parse thread: no job here
    with engine_calls.task_context("job_a"):  # then _run_job asks, in its job's context
        assert modules[2].is_fatal_engine_error(error) is True
    with engine_calls.task_context("job_b"):  # another job's later failure: not first
        assert modules[2].is_fatal_engine_error(make_engine_dead_error()) is True
    trigger = fatal_check.job_verdict(runtime, _failed_job("job_a"))
    collateral = fatal_check.job_verdict(runtime, _failed_job("job_b"))
    assert trigger is not None and trigger["role"] == "trigger" and trigger["fatal"] is True
    assert trigger["rule"] == "vllm.engine_dead" and trigger["engine_dead"] is True
    assert collateral is not None and collateral["role"] == "collateral"
    assert fatal_check.job_verdict(runtime, _failed_job("job_c", code="parse_failed")) is None


def test_a_job_status_answer_carries_the_verdict(runtime: WorkerRuntime) -> None:
    app = _app(runtime)

    @app.get("/v1/tasks/{job_id}")
    async def job(job_id: str) -> JSONResponse:
        return JSONResponse({"job_id": job_id, "status": "failed"})

    app.state.job_store._jobs["job_a"] = _failed_job("job_a")
    assert "verdict" not in _call(app, "GET", "/v1/tasks/job_a").json()  # no fatal yet
    runtime.health.record(make_engine_dead_error())
    runtime.trigger_task = "job_a"
    answer = _call(app, "GET", "/v1/tasks/job_a").json()
    assert answer["verdict"]["role"] == "trigger", answer
    assert "verdict" not in _call(app, "GET", "/v1/tasks/job_z").json()  # not a job here


class _Model:
    """4.0's pydantic models, as far as the job store uses them."""

    def __init__(self, /, **fields: Any) -> None:
        self.__dict__.update(fields)

    @classmethod
    def model_validate(cls, data: dict[str, Any]) -> Any:
        return cls(**data)

    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        return dict(self.__dict__)


@dataclasses.dataclass
class _FileRecord:
    id: str
    sha256sum: str | None = None
    expires_at: int | None = None
    job_id: str | None = None


@dataclasses.dataclass
class _JobRecord:
    id: str
    status: str = "queued"
    progress: Any = None
    files: list[Any] = dataclasses.field(default_factory=list)
    links: Any = None
    input_blobs: dict[str, str] = dataclasses.field(default_factory=dict)
    file_store: Any = None
    usage_counted: bool = False


class _Jobs:
    """4.0's JobStore: ``_record_usage`` once a job is done, ``collect_expired``."""

    def __init__(self) -> None:
        self._jobs: dict[str, _JobRecord] = {}
        self.expired: set[str] = set()

    def _record_usage(self, record: _JobRecord) -> None:
        record.usage_counted = True

    def collect_expired(self) -> None:
        for job_id in self.expired:
            self._jobs.pop(job_id, None)


class _Files:
    def __init__(self, blobs: set[str]) -> None:
        self._files: dict[str, _FileRecord] = {}
        self.blobs = blobs

    def blob_exists(self, sha256: str) -> bool:
        return sha256 in self.blobs


@pytest.fixture
def api_server(
    runtime: WorkerRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """This module stands in for 4.0's api_server (the job store looks its classes up there)."""
    settings = WorkerSettings.from_env({"MINERU_HEALTH_STATE_DIR": str(tmp_path)})
    runtime.defer_store(settings, tmp_path)
    assert runtime.open_store() is not None
    module = sys.modules[__name__]
    for name in ("JobProgress", "JobFileResult", "JobLinks"):
        monkeypatch.setattr(module, name, _Model, raising=False)
    yield
    if runtime.store is not None:
        runtime.store.close()


def _finish(jobs: _Jobs, files: _Files, job_id: str, status: str, **file: Any) -> None:
    output = _FileRecord(f"file-{job_id}", job_id=job_id, **file)
    files._files[output.id] = output
    record = _JobRecord(
        job_id,
        status,
        _Model(total=1),
        [_Model(name="a.pdf", status=status)],
        _Model(self=f"/v1/parse/jobs/{job_id}"),
        file_store=files,
    )
    jobs._jobs[job_id] = record
    jobs._record_usage(record)


def test_finished_jobs_come_back_when_their_blobs_do(
    runtime: WorkerRuntime, api_server: None
) -> None:
    jobs, files = _Jobs(), _Files(set())
    assert (
        job_store.attach(
            runtime,
            types.SimpleNamespace(state=types.SimpleNamespace(job_store=jobs, file_store=files)),
        )
        == 0
    )
    _finish(jobs, files, "done", "completed", sha256sum="s1")
    _finish(jobs, files, "no-blob", "completed", sha256sum="s2")
    _finish(jobs, files, "expired", "failed", sha256sum="s1", expires_at=int(time.time()) - 1)
    _finish(jobs, files, "running", "running", sha256sum="s1")
    current = runtime.store
    assert current is not None and current.count() == 3  # never the running one

    restarted, restarted_files = _Jobs(), _Files({"s1"})
    app = types.SimpleNamespace(
        state=types.SimpleNamespace(job_store=restarted, file_store=restarted_files)
    )
    assert job_store.attach(runtime, app) == 1
    back = restarted._jobs["done"]
    assert back.status == "completed" and back.usage_counted and back.file_store is restarted_files
    assert back.files[0].status == "completed" and back.links.self == "/v1/parse/jobs/done"
    assert restarted_files._files["file-done"] == files._files["file-done"]
    assert [row[0] for row in current.rows()] == ["done"]  # rows that cannot come back dropped
    assert job_store.attach(runtime, app) == 0  # once per job store

    restarted.expired = {"done"}
    restarted.collect_expired()
    assert current.count() == 0


def test_a_restored_jobs_verdict_is_marked_an_earlier_instances(
    runtime: WorkerRuntime, api_server: None
) -> None:
    """Issue 32: a job that failed engine_dead comes back with a ``restored`` verdict, also
    when none was kept (its error code alone must not read as this instance's death)."""
    jobs, files = _Jobs(), _Files(set())
    job_store.attach(
        runtime,
        types.SimpleNamespace(state=types.SimpleNamespace(job_store=jobs, file_store=files)),
    )
    for job_id in ("judged", "unjudged"):
        _finish(jobs, files, job_id, "failed", sha256sum="s1")
        jobs._jobs[job_id].files[0].error = {"code": "engine_dead", "message": "dead"}
    trigger = {
        "version": 2,
        "kind": "engine_dead",
        "role": "trigger",
        "rule": "r",
        "engine_dead": True,
    }
    setattr(jobs._jobs["judged"], fatal_check.VERDICT_ATTR, trigger)
    for job_id in ("judged", "unjudged"):
        jobs._record_usage(jobs._jobs[job_id])
    restarted = _Jobs()
    assert (
        job_store.attach(
            runtime,
            types.SimpleNamespace(
                state=types.SimpleNamespace(job_store=restarted, file_store=_Files({"s1"}))
            ),
        )
        == 2
    )
    judged = fatal_check.job_verdict(runtime, restarted._jobs["judged"])
    assert judged == {**trigger, "restored": True}
    unjudged = fatal_check.job_verdict(runtime, restarted._jobs["unjudged"])
    assert unjudged is not None and unjudged["restored"] is True
    assert unjudged["engine_dead"] is True and unjudged["role"] == "collateral"


def test_jobs_its_shutdown_canceled_are_not_kept(runtime: WorkerRuntime, api_server: None) -> None:
    """4.0 cancels what is queued or running when it stops; no client canceled those."""
    jobs, files = _Jobs(), _Files(set())
    job_store.attach(
        runtime,
        types.SimpleNamespace(state=types.SimpleNamespace(job_store=jobs, file_store=files)),
    )
    _finish(jobs, files, "client-canceled", "canceled", sha256sum="s1")
    jobs._closing = True  # type: ignore[attr-defined]  # 4.0's JobStore.shutdown set it
    _finish(jobs, files, "shutdown-canceled", "canceled", sha256sum="s1")
    _finish(jobs, files, "done-while-stopping", "completed", sha256sum="s1")
    current = runtime.store
    assert current is not None
    assert sorted(row[0] for row in current.rows()) == ["client-canceled", "done-while-stopping"]

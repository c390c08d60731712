"""The worker hooks against a stand-in task manager and a real FastAPI app (no MinerU)."""

from __future__ import annotations

import asyncio
import json
import sys
import types
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from mineru_health.demo.faults import make_engine_dead_error
from mineru_health.mineru3 import worker as hooks
from mineru_health.mineru3.worker import tasks
from mineru_health.runtime.verdict import VERSION
from mineru_health.runtime.worker import judge, log, threads
from mineru_health.runtime.worker.worker_runtime import STATE_ATTR, WorkerRuntime


class _Task:
    def __init__(self, task_id: str, status: str = "pending") -> None:
        self.task_id = task_id
        self.status = status
        self.error: str | None = None
        self.completed_at: str | None = None


def _app_of(runtime: WorkerRuntime) -> Any:
    """An app ``install`` put ``runtime`` on (the state's attribute)."""
    return types.SimpleNamespace(state=types.SimpleNamespace(**{STATE_ATTR: runtime}))


class _Manager:
    """The attributes of MinerU's AsyncTaskManager that the hooks use."""

    def __init__(self, runtime: WorkerRuntime) -> None:
        self.app = _app_of(runtime)  # MinerU's AsyncTaskManager(app)
        self.tasks: dict[str, _Task] = {}
        self.task_events: dict[str, asyncio.Event] = {}
        self.queue: asyncio.Queue[str] = asyncio.Queue()
        self.active_tasks: set[asyncio.Task[Any]] = set()
        self.last_worker_error: str | None = None
        self.manager_wakeup = asyncio.Event()

    def _wake_waiters(self) -> None:
        self.manager_wakeup.set()
        for event in self.task_events.values():
            event.set()


def test_fatal_failure_fails_every_other_task_and_wakes_waiters(runtime: WorkerRuntime) -> None:
    async def scenario() -> None:
        manager = _Manager(runtime)
        semaphore = asyncio.Semaphore(1)
        started = asyncio.Event()
        for name in ("running", "queued1", "queued2", "not-dispatched"):
            manager.tasks[name] = _Task(name)
            manager.task_events[name] = asyncio.Event()

        async def hold(task_id: str) -> None:
            async with semaphore:
                manager.tasks[task_id].status = "processing"
                started.set()
                await asyncio.sleep(3600)

        for name in ("running", "queued1", "queued2"):
            manager.active_tasks.add(asyncio.create_task(hold(name)))
        await manager.queue.put("not-dispatched")
        await asyncio.wait_for(started.wait(), 10)

        failing = manager.tasks["failing"] = _Task("failing", "processing")
        outcome = await hooks.on_task_failed(manager, failing, make_engine_dead_error())
        assert outcome is not None and outcome.fatal and outcome.first
        assert failing.status == "processing"  # MinerU marks its own task failed afterwards
        assert failing._mineru_health_verdict == {  # type: ignore[attr-defined]
            "version": VERSION,
            "kind": "engine_dead",
            "fatal": True,
            "engine_dead": True,
            "role": "trigger",
            "rule": outcome.rule,
            "category": outcome.category,
            "ambiguous": False,
            "remote_engine": False,
            "restored": False,  # this instance's own verdict
        }
        assert manager.last_worker_error is not None
        assert outcome.rule in manager.last_worker_error
        for name in ("running", "queued1", "queued2", "not-dispatched"):
            task = manager.tasks[name]
            assert task.status == "failed", name
            assert task.error is not None and "inference engine" in task.error
            assert "EngineCore" not in task.error  # never another task's text
            assert task._mineru_health_verdict["role"] == "collateral"  # type: ignore[attr-defined]
            assert task._mineru_health_verdict["engine_dead"] is True  # type: ignore[attr-defined]
            assert task.completed_at
            assert manager.task_events[name].is_set()
        assert manager.manager_wakeup.is_set()
        assert manager.queue.empty()
        results = await asyncio.wait_for(
            asyncio.gather(*manager.active_tasks, return_exceptions=True), 10
        )
        assert all(isinstance(r, asyncio.CancelledError) for r in results)
        assert not runtime.health.healthy

    asyncio.run(scenario())


def test_the_watcher_acting_first_leaves_the_trigger_to_its_hook(
    runtime: WorkerRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The watcher's tick can run between the classifier thread recording the
    # death and the hook resuming on the loop (CI saw it on a loaded machine).
    async def scenario() -> None:
        manager = _Manager(runtime)
        loop = asyncio.get_running_loop()
        record = judge.judge

        def record_then_watcher_acts(*args: Any, **kwargs: Any) -> Any:
            outcome = record(*args, **kwargs)
            acted = asyncio.run_coroutine_threadsafe(_watcher_tick(), loop)
            acted.result(10)
            return outcome

        async def _watcher_tick() -> None:
            tasks.act_on_fatal(runtime)

        monkeypatch.setattr(judge, "judge", record_then_watcher_acts)
        runtime.apps.append(
            types.SimpleNamespace(state=types.SimpleNamespace(task_manager=manager))
        )
        failing = manager.tasks["failing"] = _Task("failing", "processing")
        manager.tasks["queued"] = _Task("queued")

        async def process() -> Any:
            return await hooks.on_task_failed(manager, failing, make_engine_dead_error())

        processor = asyncio.create_task(process(), name="mineru-task-failing")
        manager.active_tasks.add(processor)
        outcome = await asyncio.wait_for(processor, 10)  # not cancelled by the watcher
        assert outcome is not None and outcome.first
        assert failing._mineru_health_verdict["role"] == "trigger"  # type: ignore[attr-defined]
        assert failing.status == "processing"  # MinerU marks it failed with its own text
        queued = manager.tasks["queued"]
        assert queued._mineru_health_verdict["role"] == "collateral"  # type: ignore[attr-defined]
        assert queued.status == "failed"

    asyncio.run(scenario())


def test_task_local_failure_touches_nothing_else(runtime: WorkerRuntime) -> None:
    async def scenario() -> None:
        manager = _Manager(runtime)
        manager.tasks["other"] = _Task("other")
        failing = _Task("failing", "failed")
        failing.error = "MinerU's text"
        outcome = await hooks.on_task_failed(manager, failing, ValueError("corrupt"))
        assert outcome is not None and not outcome.fatal
        assert failing._mineru_health_verdict["engine_dead"] is False  # type: ignore[attr-defined]
        assert failing.error == "MinerU's text"
        assert manager.tasks["other"].status == "pending"
        assert manager.last_worker_error is None
        assert runtime.health.healthy
        assert runtime.health.snapshot().task_local_count == 1

    asyncio.run(scenario())


def test_hook_never_raises(runtime: WorkerRuntime) -> None:
    class Hostile:
        app = _app_of(runtime)

        @property
        def tasks(self) -> dict[str, Any]:
            raise RuntimeError("hostile")

        def __setattr__(self, name: str, value: Any) -> None:
            raise RuntimeError("read-only")

    outcome = asyncio.run(hooks.on_task_failed(Hostile(), None, make_engine_dead_error()))
    assert outcome is not None and outcome.fatal  # recorded, although the manager is hostile


def _app(runtime: WorkerRuntime) -> FastAPI:
    app = FastAPI()
    app.state.task_manager = None

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "healthy"}

    @app.post("/tasks")
    async def tasks() -> dict[str, str]:
        return {"accepted": "yes"}

    @app.post("/file_parse")
    async def file_parse() -> dict[str, str]:
        return {"parsed": "yes"}

    app.add_middleware(hooks.Gate, runtime=runtime)
    runtime.apps.append(app)
    return app


async def _request(app: FastAPI, method: str, path: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
        return await client.request(method, path)


def test_gate_passes_through_while_healthy(runtime: WorkerRuntime) -> None:
    app = _app(runtime)
    response = asyncio.run(_request(app, "GET", "/health"))
    assert response.status_code == 200 and response.json() == {"status": "healthy"}
    assert asyncio.run(_request(app, "POST", "/tasks")).status_code == 200


def test_gate_reports_a_dead_engine_and_refuses_work(runtime: WorkerRuntime) -> None:
    app = _app(runtime)
    runtime.health.record(make_engine_dead_error(), unix_time=1_700_000_000.0)
    response = asyncio.run(_request(app, "GET", "/health"))
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unhealthy" and body["engine_dead"] is True
    assert body["rule"] and body["category"]
    assert body["since"] == "2023-11-14T22:13:20.000000+00:00"
    assert body["exception_type"] == "vllm.v1.engine.exceptions.EngineDeadError"
    # The message can quote a user's document: not published unless opted in.
    assert "EngineCore" not in body["error"]
    status, native = runtime.health.answer("/health")
    assert (status, json.loads(native)) == (503, body)
    for path in ("/tasks", "/file_parse", "/tasks/"):
        refused = asyncio.run(_request(app, "POST", path))
        assert refused.status_code == 503
        assert int(refused.headers["retry-after"]) >= 1
        assert "engine" in refused.json()["message"]
    # Status and result endpoints stay reachable.
    assert asyncio.run(_request(app, "GET", "/tasks/some-id")).status_code == 404


def test_gate_advertises_the_native_port(runtime: WorkerRuntime) -> None:
    app = _app(runtime)
    runtime.advertised_port = 9123
    try:
        response = asyncio.run(_request(app, "GET", "/health"))
    finally:
        runtime.advertised_port = None
    assert response.json() == {"status": "healthy", "native_health_port": 9123}
    assert int(response.headers["content-length"]) == len(response.content)


class _Errored:
    errored = True  # vLLM's AsyncLLM after its engine core died


def test_liveness_failure_turns_health_unhealthy_without_a_task(
    runtime: WorkerRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    vlm = types.ModuleType("mineru.backend.vlm.vlm_analyze")
    predictor = types.SimpleNamespace(_mineru_runtime_handles={"vllm_async_llm": _Errored()})
    vlm.ModelSingleton = types.SimpleNamespace(  # type: ignore[attr-defined]
        _models={("vllm-async-engine", "/m", None): predictor}
    )
    monkeypatch.setitem(sys.modules, vlm.__name__, vlm)
    app = _app(runtime)

    async def scenario() -> httpx.Response:
        manager = _Manager(runtime)
        manager.tasks["waiting"] = _Task("waiting")
        manager.task_events["waiting"] = asyncio.Event()
        app.state.task_manager = manager
        assert threads.check_liveness(runtime.health)  # the liveness thread's step
        tasks.act_on_fatal(runtime)  # the loop watcher's step
        assert manager.tasks["waiting"].status == "failed"
        assert manager.last_worker_error is not None
        return await _request(app, "GET", "/health")

    response = asyncio.run(scenario())
    assert response.status_code == 503
    body = response.json()
    assert body["rule"] == "liveness:mineru-engines"
    assert body["category"] == "engine_dead"


def test_worker_log_lines_escape_task_text(monkeypatch: pytest.MonkeyPatch) -> None:
    from loguru import logger

    lines: list[str] = []
    sink = logger.add(lambda message: lines.append(str(message)), format="{message}")
    try:
        log.log("INFO", "task failed: line one\nforged \x1b[31mred")
    finally:
        logger.remove(sink)
    assert lines and "\x1b" not in lines[0] and lines[0].count("\n") == 1  # loguru's own newline


def test_two_apps_installed_in_one_process_have_a_runtime_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing holds the runtime at module level: install builds one per app and hands it to
    the app's gate and /metrics; one engine's death is that app's alone."""
    from mineru_health.runtime.worker.install import begin_install
    from mineru_health.runtime.worker.worker_runtime import runtime_of

    for variable in ("MINERU_HEALTH_PORT", "MINERU_HEALTH_RULES"):
        monkeypatch.delenv(variable, raising=False)
    apps = []
    for _ in range(2):
        app = FastAPI()

        @app.get("/health")
        async def health() -> dict[str, str]:
            return {"status": "healthy"}

        runtime = begin_install(app, hooks.Gate)
        assert runtime is not None and runtime_of(app) is runtime
        assert begin_install(app, hooks.Gate) is None  # an app seen before
        apps.append(app)
    dead, alive = (runtime_of(app) for app in apps)
    assert dead is not None and alive is not None and dead is not alive
    dead.health.record(make_engine_dead_error())
    assert asyncio.run(_request(apps[0], "GET", "/health")).status_code == 503
    assert asyncio.run(_request(apps[1], "GET", "/health")).status_code == 200
    scraped = [asyncio.run(_request(app, "GET", "/metrics")).text for app in apps]
    assert "mineru_worker_healthy 0.0" in scraped[0]
    assert "mineru_worker_healthy 1.0" in scraped[1]

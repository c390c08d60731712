"""The worker hooks against a stand-in task manager and a real FastAPI app (no MinerU)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from mineru_health import liveness
from mineru_health.integration import worker as hooks
from mineru_health.testing.faults import make_engine_dead_error
from mineru_health.worker import worker_health


class _Task:
    def __init__(self, task_id: str, status: str = "pending") -> None:
        self.task_id = task_id
        self.status = status
        self.error: str | None = None
        self.completed_at: str | None = None


class _Manager:
    """The attributes of MinerU's AsyncTaskManager that the hooks use."""

    def __init__(self) -> None:
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


@pytest.fixture(autouse=True)
def _fresh_state() -> Iterator[None]:
    worker_health().reset()
    saved_checks = dict(liveness._checks)
    liveness._checks.clear()
    liveness.clear_cache()
    yield
    worker_health().reset()
    liveness._checks.update(saved_checks)
    liveness.clear_cache()
    hooks._runtime.apps.clear()


def test_fatal_failure_fails_every_other_task_and_wakes_waiters() -> None:
    async def scenario() -> None:
        manager = _Manager()
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

        failing = _Task("failing", "failed")
        verdict = hooks.on_task_failed(manager, failing, make_engine_dead_error())
        assert verdict is not None and verdict.fatal
        assert failing.error is not None and failing.error.startswith("EngineDeadError:")
        assert manager.last_worker_error is not None
        assert "EngineDeadError" in manager.last_worker_error
        for name in ("running", "queued1", "queued2", "not-dispatched"):
            task = manager.tasks[name]
            assert task.status == "failed", name
            assert task.error is not None and "inference engine" in task.error
            assert task.completed_at
            assert manager.task_events[name].is_set()
        assert manager.manager_wakeup.is_set()
        assert manager.queue.empty()
        results = await asyncio.wait_for(
            asyncio.gather(*manager.active_tasks, return_exceptions=True), 10)
        assert all(isinstance(r, asyncio.CancelledError) for r in results)
        assert not worker_health().healthy

    asyncio.run(scenario())


def test_task_local_failure_touches_nothing_else() -> None:
    async def scenario() -> None:
        manager = _Manager()
        manager.tasks["other"] = _Task("other")
        failing = _Task("failing", "failed")
        failing.error = "MinerU's text"
        verdict = hooks.on_task_failed(manager, failing, ValueError("corrupt"))
        assert verdict is not None and not verdict.fatal
        assert failing.error == "MinerU's text"
        assert manager.tasks["other"].status == "pending"
        assert manager.last_worker_error is None
        assert worker_health().healthy
        assert worker_health().snapshot().task_local_count == 1

    asyncio.run(scenario())


def test_hook_never_raises() -> None:
    class Hostile:
        @property
        def tasks(self) -> dict[str, Any]:
            raise RuntimeError("hostile")

        def __setattr__(self, name: str, value: Any) -> None:
            raise RuntimeError("read-only")

    assert hooks.on_task_failed(Hostile(), None, make_engine_dead_error()) is None


def _app() -> FastAPI:
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

    app.add_middleware(hooks.HealthGate)
    hooks._runtime.apps.append(app)
    return app


async def _request(app: FastAPI, method: str, path: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
        return await client.request(method, path)


def test_gate_passes_through_while_healthy() -> None:
    app = _app()
    response = asyncio.run(_request(app, "GET", "/health"))
    assert response.status_code == 200 and response.json() == {"status": "healthy"}
    assert asyncio.run(_request(app, "POST", "/tasks")).status_code == 200


def test_gate_reports_a_dead_engine_and_refuses_work() -> None:
    app = _app()
    worker_health().record(make_engine_dead_error(), unix_time=1_700_000_000.0)
    response = asyncio.run(_request(app, "GET", "/health"))
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unhealthy" and body["engine_dead"] is True
    assert body["rule"] and body["category"]
    assert body["since"] == "2023-11-14T22:13:20+00:00"
    assert body["error"].startswith("EngineDeadError:")
    assert set(body) >= {"version", "error", "rule", "category", "since", "engine_dead"}
    for path in ("/tasks", "/file_parse", "/tasks/"):
        refused = asyncio.run(_request(app, "POST", path))
        assert refused.status_code == 503
        assert int(refused.headers["retry-after"]) >= 1
        assert "engine" in refused.json()["message"]
    # Status and result endpoints stay reachable.
    assert asyncio.run(_request(app, "GET", "/tasks/some-id")).status_code == 404


def test_liveness_failure_turns_health_unhealthy_without_a_task() -> None:
    app = _app()

    async def scenario() -> httpx.Response:
        manager = _Manager()
        manager.tasks["waiting"] = _Task("waiting")
        manager.task_events["waiting"] = asyncio.Event()
        app.state.task_manager = manager
        liveness.register("fake-engine", lambda: (False, "engine handle errored"))
        response = await _request(app, "GET", "/health")
        assert manager.tasks["waiting"].status == "failed"
        assert manager.last_worker_error is not None
        return response

    response = asyncio.run(scenario())
    assert response.status_code == 503
    body = response.json()
    assert body["rule"] == "liveness:fake-engine"
    assert body["category"] == "engine_dead"
    assert "engine handle errored" in body["error"]

"""Engine call tracking: the post-import hook, in-flight counts, progress, local failures."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mineru_health.demo import fault_plugin
from mineru_health.demo.faults import FaultInjector, write_plan
from mineru_health.runtime.worker import engine_calls


def _package(tmp_path: Path, name: str, source: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")


@pytest.fixture
def importable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_on_import_runs_now_or_after_the_import(importable: Path) -> None:
    seen: list[str] = []
    _package(importable, "mh_late_module", "VALUE = 1\n")
    engine_calls.on_import("mh_late_module", lambda m: seen.append(f"late:{m.VALUE}"))
    assert seen == []
    importlib.import_module("mh_late_module")
    assert seen == ["late:1"]
    engine_calls.on_import("mh_late_module", lambda m: seen.append("now"))
    assert seen == ["late:1", "now"]
    sys.modules.pop("mh_late_module", None)


class _Health:
    """Stands in for WorkerHealth: counts what the wrappers report."""

    def __init__(self) -> None:
        self.started = self.finished = self.progress_calls = 0
        self.task_progress_for: list[str] = []
        self.remote_waits: list[str] = []

    def engine_call_started(self) -> None:
        self.started += 1

    def engine_call_finished(self) -> None:
        self.finished += 1

    def progress(self) -> None:
        self.progress_calls += 1

    def task_progress(self, task_id: str) -> None:
        self.task_progress_for.append(task_id)

    @contextlib.contextmanager
    def remote_wait(self, task_id: str, server: str = "") -> Iterator[None]:
        self.remote_waits.append(task_id)
        yield

    def remote_wait_status(self, task_id: str) -> None:
        return None  # no bound (remote_waits' tests have theirs)


def test_engine_calls_are_counted_and_the_fault_plugin_raises_in_one(tmp_path: Path) -> None:
    class Client:
        def __init__(self) -> None:
            self.seen: list[Any] = []

        async def aio_batch_two_step_extract(self, images: list[Any]) -> list[Any]:
            self.seen.append(images)
            return ["ok"]

        def batch_two_step_extract(self, images: list[Any]) -> list[Any]:
            self.seen.append(images)
            return ["sync"]

    module = type(sys)("fake_mineru_client")
    module.MinerUClient = Client  # type: ignore[attr-defined]
    health = _Health()
    plan = tmp_path / "plan"
    injector = FaultInjector(plan)
    plugin = lambda fn: fault_plugin.faulted(
        fn, parse=False, engine=True, plan=lambda: injector, health=lambda: health
    )
    make = lambda fn: engine_calls._engine_call(fn, lambda: health)
    methods = ("aio_batch_two_step_extract", "batch_two_step_extract", "missing")
    # The sandbox loads the plugin first: its wrapper is the inner one.
    fault_plugin._wrap_methods(module, "MinerUClient", methods, plugin)
    engine_calls._wrap_class(module, "MinerUClient", methods, make)
    engine_calls._wrap_class(module, "MinerUClient", methods, make)  # idempotent
    fault_plugin._wrap_methods(module, "MinerUClient", methods, plugin)  # idempotent
    client = Client()
    assert asyncio.run(client.aio_batch_two_step_extract([1])) == ["ok"]
    assert client.batch_two_step_extract([2]) == ["sync"]
    # Each call: the engine call, and inside it the plugin's turn (a local engine call too).
    assert (health.started, health.finished) == (4, 4)
    write_plan(plan, "engine_dead")
    with pytest.raises(Exception, match="EngineCore encountered an issue") as raised:
        asyncio.run(client.aio_batch_two_step_extract([3]))
    assert client.seen == [[1], [2]]
    assert (health.started, health.finished) == (6, 6)  # a failed call still ends, both of it
    assert engine_calls.raised_by_local_engine(raised.value)  # a local engine's, for the worker


def test_a_failure_escaping_a_local_engine_call_is_the_engines() -> None:
    class Client:
        def __init__(self, backend: str) -> None:
            self.backend = backend

        def batch_two_step_extract(self, images: list[Any]) -> list[Any]:
            raise RuntimeError(f"{self.backend} failed")

    module = type(sys)("fake_mineru_client_failing")
    module.MinerUClient = Client  # type: ignore[attr-defined]
    health = _Health()
    engine_calls._wrap_class(
        module,
        "MinerUClient",
        ("batch_two_step_extract",),
        lambda fn: engine_calls._engine_call(fn, lambda: health),
    )
    with pytest.raises(RuntimeError) as local:
        Client("vllm-async-engine").batch_two_step_extract([])
    with pytest.raises(RuntimeError) as remote:
        Client("http-client").batch_two_step_extract([])
    assert engine_calls.raised_by_local_engine(local.value)
    assert not engine_calls.raised_by_local_engine(remote.value)  # the server's, not ours
    assert not engine_calls.raised_by_local_engine(ValueError("never in an engine call"))
    try:
        raise RuntimeError("the task failed") from local.value
    except RuntimeError as wrapper:
        assert engine_calls.raised_by_local_engine(wrapper)  # through the chain


def test_a_local_engine_failure_is_judged_where_it_escapes_off_the_loop() -> None:
    """4.0 asks on its loop; the judge gets the failure first on the parse thread, not on a loop."""
    judged: list[BaseException] = []
    health = _Health()
    with (
        pytest.raises(RuntimeError) as off_loop,
        engine_calls.local_engine_call(health, judged.append),
    ):  # type: ignore[arg-type]
        raise RuntimeError("engine released")

    async def on_loop() -> None:
        with engine_calls.local_engine_call(health, judged.append):  # type: ignore[arg-type]
            raise RuntimeError("on the loop")

    with pytest.raises(RuntimeError):
        asyncio.run(on_loop())
    with (
        pytest.raises(asyncio.CancelledError),
        engine_calls.local_engine_call(health, judged.append),
    ):  # type: ignore[arg-type]
        raise asyncio.CancelledError
    assert judged == [off_loop.value]


def test_calls_to_a_remote_server_are_never_in_flight() -> None:
    """Issue 17: a user's server_url that never answers made workers "stalled"."""

    class Client:
        def __init__(self, backend: str) -> None:
            self.backend = backend

        async def aio_batch_two_step_extract(self, images: list[Any]) -> list[Any]:
            return ["ok"]

        def batch_two_step_extract(self, images: list[Any]) -> list[Any]:
            return ["sync"]

    module = type(sys)("fake_mineru_client_remote")
    module.MinerUClient = Client  # type: ignore[attr-defined]
    health = _Health()
    make = lambda fn: engine_calls._engine_call(fn, lambda: health)
    engine_calls._wrap_class(
        module, "MinerUClient", ("aio_batch_two_step_extract", "batch_two_step_extract"), make
    )
    remote, local = Client("http-client"), Client("vllm-async-engine")
    with engine_calls.task_context("task-remote"):
        assert asyncio.run(remote.aio_batch_two_step_extract([1])) == ["ok"]
        assert remote.batch_two_step_extract([1]) == ["sync"]
    assert (health.started, health.finished) == (0, 0)
    # Issue 24: the task waits on the server meanwhile, never hung.
    assert health.remote_waits == ["task-remote", "task-remote"]
    assert asyncio.run(local.aio_batch_two_step_extract([1])) == ["ok"]
    assert local.batch_two_step_extract([1]) == ["sync"]
    assert (health.started, health.finished) == (2, 2)
    assert len(health.remote_waits) == 2


def test_the_http_clients_construction_is_a_remote_wait() -> None:
    """Issue 24: it asks the server for its model name, which may never answer."""

    class HttpVlmClient:
        def __init__(self, server_url: str) -> None:
            self.server_url = server_url

    module = type(sys)("fake_http_client")
    module.HttpVlmClient = HttpVlmClient  # type: ignore[attr-defined]
    health = _Health()
    site = next(s for s in engine_calls.REMOTE_SITES if s[1] == "HttpVlmClient")
    engine_calls._wrap_class(
        module, "HttpVlmClient", site[2], lambda fn: engine_calls._remote_wait(fn, lambda: health)
    )
    with engine_calls.task_context("task-1"):
        assert HttpVlmClient("http://127.0.0.1:1").server_url == "http://127.0.0.1:1"
    assert health.remote_waits == ["task-1"]


def test_requests_are_progress_only() -> None:
    class VlmClient:
        async def aio_predict(self, image: Any) -> str:
            return "text"

        def predict(self, image: Any) -> str:
            raise RuntimeError("server said no")

    module = type(sys)("fake_vlm_client")
    module.HttpVlmClient = VlmClient  # type: ignore[attr-defined]
    health = _Health()
    engine_calls._wrap_class(
        module,
        "HttpVlmClient",
        ("predict", "aio_predict"),
        lambda fn: engine_calls._engine_request(fn, lambda: health),
    )
    client = VlmClient()
    assert asyncio.run(client.aio_predict(None)) == "text"
    with pytest.raises(RuntimeError):
        client.predict(None)
    assert health.progress_calls == 2 and health.started == 0


def test_progress_is_attributed_to_the_task_in_context() -> None:
    """The task watchdog: each engine call or request's end is its own task's progress."""

    class Client:
        backend = "http-client"

        async def aio_batch_two_step_extract(self, images: list[Any]) -> list[Any]:
            return ["ok"]

    module = type(sys)("fake_mineru_client_tasks")
    module.MinerUClient = Client  # type: ignore[attr-defined]
    health = _Health()
    engine_calls._wrap_class(
        module,
        "MinerUClient",
        ("aio_batch_two_step_extract",),
        lambda fn: engine_calls._engine_call(fn, lambda: health),
    )

    class Manager:
        async def _run_task(self, task: Any) -> Any:
            return await Client().aio_batch_two_step_extract([task.task_id])

    class Task:
        task_id = "t-1"
        upload_names = ("a.pdf",)

    class TaskHealth(_Health):
        def __init__(self) -> None:
            super().__init__()
            self.tracked: list[str] = []

        def task_started(self, task_id: str) -> None:
            self.tracked.append(f"+{task_id}")

        def task_finished(self, task_id: str) -> None:
            self.tracked.append(f"-{task_id}")

    tracker = TaskHealth()
    manager = Manager()
    engine_calls.follow_tasks(manager, lambda: tracker)
    assert asyncio.run(manager._run_task(Task())) == ["ok"]
    assert tracker.tracked == ["+t-1", "-t-1"]
    assert health.task_progress_for == ["t-1"]
    assert asyncio.run(Client().aio_batch_two_step_extract([])) == ["ok"]
    assert health.task_progress_for == ["t-1", ""]  # outside a task: nobody's

"""The fault plan: consumption, effects, and the wrapper around the engine call."""

from __future__ import annotations

import asyncio
import sys
import types
from pathlib import Path

import pytest
from mineru_health.testing import faults
from mineru_health.testing.faults import ENGINE_DEAD_MESSAGE, FaultInjector, write_plan


def test_write_plan_is_atomic_and_validated(tmp_path: Path) -> None:
    plan = tmp_path / "plan"
    write_plan(plan, "engine_dead")
    assert plan.read_text(encoding="utf-8").strip() == "engine_dead"
    assert list(tmp_path.iterdir()) == [plan]
    with pytest.raises(ValueError, match="unknown fault plan"):
        write_plan(plan, "explode")


def test_engine_dead_is_consumed_and_sticks(tmp_path: Path) -> None:
    plan = tmp_path / "plan"
    injector = FaultInjector(plan)
    injector.before_engine_call()  # no plan: nothing happens
    write_plan(plan, "engine_dead")
    for _ in range(3):
        with pytest.raises(Exception) as info:
            injector.before_engine_call()
        assert type(info.value).__name__ == "EngineDeadError"
        assert type(info.value).__module__ == "vllm.v1.engine.exceptions"
        assert str(info.value) == ENGINE_DEAD_MESSAGE
    assert not plan.exists()
    assert injector.applied == ["engine_dead"]


def test_task_local_fails_one_call(tmp_path: Path) -> None:
    plan = tmp_path / "plan"
    injector = FaultInjector(plan)
    write_plan(plan, "task_local")
    with pytest.raises(ValueError, match="corrupt"):
        injector.before_engine_call()
    injector.before_engine_call()  # the next call is fine again


def test_unknown_word_is_ignored(tmp_path: Path) -> None:
    plan = tmp_path / "plan"
    plan.write_text("nonsense\n", encoding="utf-8")
    injector = FaultInjector(plan)
    assert injector.poll() is None
    assert not plan.exists()
    injector.before_engine_call()


def test_hang_sleeps_for_the_configured_time(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(faults.time, "sleep", slept.append)
    plan = tmp_path / "plan"
    injector = FaultInjector(plan, hang_s=12.5)
    write_plan(plan, "hang")
    assert injector.poll() == "hang"
    assert slept == [12.5]


def test_engine_dead_idle_adds_an_errored_handle(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    module = types.ModuleType("mineru.backend.vlm.vlm_analyze")
    singleton = type("ModelSingleton", (), {"_models": {}, "_lock": threading.RLock()})
    module.ModelSingleton = singleton  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mineru.backend.vlm.vlm_analyze", module)
    plan = tmp_path / "plan"
    write_plan(plan, "engine_dead_idle")
    FaultInjector(plan).poll()
    (predictor,) = singleton._models.values()  # type: ignore[attr-defined]
    handle = predictor._mineru_runtime_handles["vllm_async_llm"]
    assert handle.errored is True
    assert type(handle.dead_error).__name__ == "EngineDeadError"

    from mineru_health import liveness

    result = liveness.engine_handles_check()
    assert result is not None and result[0] is False


def test_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(faults.FAULT_PLAN_ENV, raising=False)
    assert FaultInjector.from_env() is None
    monkeypatch.setenv(faults.FAULT_PLAN_ENV, str(tmp_path / "p"))
    monkeypatch.setenv(faults.HANG_S_ENV, "7")
    injector = FaultInjector.from_env()
    assert injector is not None and injector.hang_s == 7.0


def test_plan_words_and_arguments() -> None:
    assert faults.parse_plan("engine_dead") == ("engine_dead", None)
    assert faults.parse_plan(" hang 2.5 \n") == ("hang", 2.5)
    assert faults.parse_plan("hang") == ("hang", None)
    for bad in ("", "explode", "engine_dead 3", "hang soon", "hang -1", "hang 1e9", "hang 1 2"):
        assert faults.parse_plan(bad) is None, bad


def test_timed_hang_sleeps_for_its_own_time(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(faults.time, "sleep", slept.append)
    plan = tmp_path / "plan"
    injector = FaultInjector(plan, hang_s=3600)
    write_plan(plan, "hang 4")
    assert injector.poll() == "hang"
    assert slept == [4.0]


def test_engine_stall_never_returns_until_its_bound(tmp_path: Path) -> None:
    plan = tmp_path / "plan"
    injector = FaultInjector(plan, hang_s=0.05)
    write_plan(plan, "engine_stall")
    injector.before_engine_call()  # waits hang_s (bounded here), raises nothing
    assert injector.engine_stall

    async def call() -> None:
        await injector.before_engine_call_async()

    async def stalled() -> bool:
        slow = FaultInjector(plan, hang_s=3600)
        slow.engine_stall = True
        try:
            await asyncio.wait_for(slow.before_engine_call_async(), timeout=0.05)
        except asyncio.TimeoutError:
            return True
        return False

    asyncio.run(call())
    assert asyncio.run(stalled())

"""The fault plan: consumption, effects, and the plugin that wraps MinerU's calls."""

from __future__ import annotations

import asyncio
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from mineru_health.demo import faults
from mineru_health.demo.faults import ENGINE_DEAD_MESSAGE, FaultInjector, write_plan


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


def test_a_shared_plan_is_applied_by_one_worker_only(tmp_path: Path) -> None:
    """Workers of one router share a plan file: the first to claim it is the only victim
    (two reading it at once both died, which looked like a poison document)."""
    plan = tmp_path / "plan"
    write_plan(plan, "engine_dead")
    first, second = FaultInjector(plan), FaultInjector(plan)
    assert first.poll() == "engine_dead" and first.engine_dead
    assert second.poll() is None and not second.engine_dead
    assert list(tmp_path.iterdir()) == []  # claimed and deleted


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


def test_hang_sleeps_for_the_configured_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slept: list[float] = []
    monkeypatch.setattr(faults.time, "sleep", slept.append)
    plan = tmp_path / "plan"
    injector = FaultInjector(plan, hang_s=12.5)
    write_plan(plan, "hang")
    assert injector.poll() == "hang"
    assert slept == [12.5]


def test_engine_dead_idle_adds_an_errored_handle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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

    from mineru_health.runtime.worker import verification

    assert verification.errored_engine() is not None  # what the liveness thread reads


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


def test_timed_hang_sleeps_for_its_own_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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


@pytest.mark.parametrize("value", ["-1", "inf", "nan", "86401", "soon"])
def test_a_bad_hang_time_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, value: str
) -> None:
    from mineru_health.demo import fault_plugin

    monkeypatch.setenv(faults.FAULT_PLAN_ENV, str(tmp_path / "p"))
    monkeypatch.setenv(faults.HANG_S_ENV, value)
    with pytest.raises(ValueError, match=faults.HANG_S_ENV):
        FaultInjector.from_env()
    with pytest.raises(ValueError, match=faults.HANG_S_ENV):
        fault_plugin.load()  # refused before anything is wrapped


def test_hang_time_bounds_and_default() -> None:
    assert faults.hang_s_from_env({}) == faults.DEFAULT_HANG_S == 3600.0
    assert faults.hang_s_from_env({faults.HANG_S_ENV: " "}) == 3600.0
    assert faults.hang_s_from_env({faults.HANG_S_ENV: "0"}) == 0.0
    assert faults.hang_s_from_env({faults.HANG_S_ENV: "86400"}) == 86400.0


# --- the plugin the sandboxes load ---------------------------------------------------------------


class _Health:
    def __init__(self) -> None:
        self.started = self.finished = 0

    def engine_call_started(self) -> None:
        self.started += 1

    def engine_call_finished(self) -> None:
        self.finished += 1


def test_plugin_wraps_3x_parse_functions_wherever_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mineru_health.demo import fault_plugin

    def do_parse(name: str) -> str:
        return f"parsed {name}"

    common, server = types.ModuleType("mh_fake_common"), types.ModuleType("mh_fake_server")
    common.do_parse = server.do_parse = do_parse  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, common.__name__, common)
    monkeypatch.setitem(sys.modules, server.__name__, server)
    plan = tmp_path / "plan"
    injector = FaultInjector(plan, hang_s=0.01)
    make = lambda fn: fault_plugin.faulted(fn, parse=True, engine=False, plan=lambda: injector)
    fault_plugin._wrap_functions(common, ("do_parse", "aio_do_parse"), make)
    wrapped = common.do_parse  # type: ignore[attr-defined]
    assert wrapped is not do_parse and server.do_parse is wrapped  # type: ignore[attr-defined]
    fault_plugin._wrap_functions(common, ("do_parse",), make)  # idempotent
    assert common.do_parse is wrapped  # type: ignore[attr-defined]

    write_plan(plan, "parse_hang")
    assert wrapped("a.pdf") == "parsed a.pdf"  # after blocking hang_s (bounded here)
    assert injector.applied == ["parse_hang"] and injector.parse_hang_pending == 0
    write_plan(plan, "engine_dead")
    assert wrapped("b.pdf") == "parsed b.pdf"  # 3.x's parse call is no engine call


def test_plugin_makes_4x_parse_call_an_engine_call(tmp_path: Path) -> None:
    from mineru_health.demo import fault_plugin
    from mineru_health.runtime.worker import engine_calls

    class MinerUParser:
        async def _arun_analysis(self) -> str:
            return "parsed"

    module = types.ModuleType("mh_fake_parser")
    module.MinerUParser = MinerUParser  # type: ignore[attr-defined]
    plan, health = tmp_path / "plan", _Health()
    injector = FaultInjector(plan)
    make = lambda fn: fault_plugin.faulted(
        fn, parse=True, engine=True, plan=lambda: injector, health=lambda: health
    )  # type: ignore[arg-type,return-value]
    fault_plugin._wrap_methods(module, "MinerUParser", fault_plugin.PARSER_CALLS, make)
    assert asyncio.run(MinerUParser()._arun_analysis()) == "parsed"
    write_plan(plan, "engine_dead")
    with pytest.raises(Exception, match="EngineCore") as raised:
        asyncio.run(MinerUParser()._arun_analysis())
    assert (health.started, health.finished) == (2, 2)  # in flight while it ran, both times
    assert engine_calls.raised_by_local_engine(raised.value)


def test_plugin_reads_the_plan_on_the_loop_while_the_watcher_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mineru_health.demo import fault_plugin

    plan = tmp_path / "plan"
    injector = FaultInjector(plan)
    monkeypatch.setattr(fault_plugin, "injector", lambda: injector)
    write_plan(plan, "task_local")
    reads: list[asyncio.Task[Any]] = []

    async def watch_loop(report: Any) -> str:
        await asyncio.sleep(0)  # the plan's reader runs once
        reads.extend(t for t in asyncio.all_tasks() if t.get_name() == "mineru-health-fault-plan")
        assert injector.task_local_pending == 1 and not plan.exists()
        return report

    assert asyncio.run(fault_plugin._reading_the_plan(watch_loop)("figures")) == "figures"
    assert len(reads) == 1 and reads[0].cancelled()  # ended with the watcher

"""Verification after an undecided failure: each verifier on fake handles of the real API shapes."""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

import pytest
from harness import fake_engines as fe
from mineru_health.classifier import Rule, RuleKind, Rules
from mineru_health.runtime.worker import verification
from mineru_health.runtime.worker.health import WorkerHealth
from mineru_health.runtime.worker.judge import confirm
from mineru_health.runtime.worker.verification import Handle, Verification, Verifier

TIMEOUT_S = 0.3  # a bound on hanging fakes; never a measured timing


@pytest.fixture
def hang() -> Iterator[fe.Hang]:
    h = fe.Hang()
    yield h
    h.release()  # let every stuck check thread finish


def _verify(*handles: Handle, busy: bool = False, timeout_s: float = TIMEOUT_S) -> Verification:
    return Verifier(timeout_s=timeout_s, find=lambda: list(handles)).verify(busy=lambda: busy)


# --- vLLM ----------------------------------------------------------------------------------------


def test_vllm_async_dead_alive_hanging(hang: fe.Hang) -> None:
    dead = _verify(Handle("vllm", "h", fe.FakeAsyncLLM("dead")))
    assert dead.outcome == "dead" and dead.rule == "verify.vllm"
    assert "errored" in dead.detail
    alive_engine = fe.FakeAsyncLLM("alive")
    alive = _verify(Handle("vllm", "h", alive_engine))
    assert alive.outcome == "alive" and alive_engine.health_calls == 1  # check_health() awaited
    hung = _verify(Handle("vllm", "h", fe.FakeAsyncLLM("hanging", hang)))
    assert hung.outcome == "dead" and hung.rule == "verify.timeout"  # idle: no call in flight


def test_vllm_check_health_raising_is_dead() -> None:
    engine = fe.FakeAsyncLLM("alive")

    async def check_health() -> None:
        raise engine.dead_error

    engine.check_health = check_health  # type: ignore[method-assign]
    result = _verify(Handle("vllm", "h", engine))
    assert result.dead and "check_health() raised EngineDeadError" in result.detail


def test_vllm_sync_llm_reads_the_core_flag() -> None:
    assert _verify(Handle("vllm", "h", fe.FakeLLM("dead"))).dead
    assert _verify(Handle("vllm", "h", fe.FakeLLM("alive"))).outcome == "alive"


# --- lmdeploy, llama.cpp, MinerU 4.0's runtime ---------------------------------------------------


def test_lmdeploy_loop_tasks(hang: fe.Hang) -> None:
    dead = _verify(Handle("lmdeploy", "h", fe.FakeLmdeployEngine("dead")))
    assert dead.rule == "verify.lmdeploy" and "main loop failed" in dead.detail
    assert _verify(Handle("lmdeploy", "h", fe.FakeLmdeployEngine("alive"))).outcome == "alive"
    hung = _verify(Handle("lmdeploy", "h", fe.FakeLmdeployEngine("hanging", hang)))
    assert hung.rule == "verify.timeout"


def test_lmdeploy_stopped_engine_loop_task_and_process() -> None:
    engine = fe.FakeLmdeployEngine("alive")
    engine.engine._engine_loop.tasks[1].set_result(None)
    assert "engine loop task" in _verify(Handle("lmdeploy", "h", engine)).detail
    proc_engine = types.SimpleNamespace(
        engine=types.SimpleNamespace(
            proc=types.SimpleNamespace(is_alive=lambda: False, exitcode=-9)
        )
    )
    result = _verify(Handle("lmdeploy", "h", proc_engine))
    assert result.dead and "exited (-9)" in result.detail


def test_lmdeploy_loop_not_started_is_no_evidence() -> None:
    result = _verify(Handle("lmdeploy", "h", types.SimpleNamespace(engine=object())))
    assert result.outcome == "inconclusive"


@pytest.mark.parametrize("mode", ["dead", "alive", "hanging"])
def test_llama_cpp(monkeypatch: pytest.MonkeyPatch, hang: fe.Hang, mode: fe.Mode) -> None:
    for name, module in fe.fake_llama_cpp(mode, hang).items():
        monkeypatch.setitem(sys.modules, name, module)
    engine = sys.modules["mineru_llama_cpp"].Engine()
    result = _verify(Handle("llama_cpp", "h", engine))
    # A generation that runs past the bound is model work, not evidence, even when idle.
    expected = {
        "dead": ("dead", "verify.llama_cpp"),
        "alive": ("alive", ""),
        "hanging": ("inconclusive", ""),
    }[mode]
    assert (result.outcome, result.rule) == expected
    assert engine.calls == 1  # one probe generation


def test_llama_cpp_closed_engine_needs_no_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, module in fe.fake_llama_cpp("alive").items():
        monkeypatch.setitem(sys.modules, name, module)
    engine = sys.modules["mineru_llama_cpp"].Engine()
    engine._closed = True
    assert _verify(Handle("llama_cpp", "h", engine)).detail.endswith("engine closed")
    assert engine.calls == 0


def test_mineru_runtime() -> None:
    assert _verify(Handle("mineru_runtime", "h", fe.FakeAsyncVlmPredictor("dead"))).dead
    runtime = fe.FakeAsyncVlmPredictor("alive")
    assert _verify(Handle("mineru_runtime", "h", runtime)).outcome == "alive"
    runtime._fatal_error = RuntimeError("sticky")
    assert "fatal error" in _verify(Handle("mineru_runtime", "h", runtime)).detail


# --- devices -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "hip", "name"),
    [
        ("cuda", False, "device_cuda"),
        ("cuda", True, "device_hip"),
        ("npu", False, "device_npu"),
        ("musa", False, "device_musa"),
    ],
)
def test_torch_devices(
    monkeypatch: pytest.MonkeyPatch, hang: fe.Hang, backend: str, hip: bool, name: str
) -> None:
    for mode, expected in (
        ("dead", ("dead", f"verify.{name}")),
        ("alive", ("alive", "")),
        ("hanging", ("dead", "verify.timeout")),
    ):
        torch = fe.fake_torch(mode, backend=backend, hip=hip, hang=hang)  # type: ignore[arg-type]
        monkeypatch.setitem(sys.modules, "torch", torch)
        handles = verification.device_handles()
        assert [(h.verifier, h.where) for h in handles] == [(name, f"{backend}:0")]
        result = _verify(*handles)
        assert (result.outcome, result.rule) == expected, (mode, result)
        if mode == "dead":
            assert "illegal memory access" in result.detail
            assert torch.calls == ["query"]  # the non-blocking query found it


def test_no_torch_no_device_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.delitem(sys.modules, "mlx.core", raising=False)
    assert verification.device_handles() == []


def test_mlx(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    for mode, outcome in (("dead", "dead"), ("alive", "alive")):
        monkeypatch.setitem(sys.modules, "mlx.core", fe.fake_mlx_core(mode))  # type: ignore[arg-type]
        result = _verify(*verification.device_handles())
        assert result.outcome == outcome
    assert "Command buffer" in _verify(Handle("mlx", "m", fe.fake_mlx_core("dead"))).detail


# --- finding MinerU's handles --------------------------------------------------------------------


def test_engine_handles_of_mineru_3_and_4() -> None:
    vllm = fe.FakeAsyncLLM()
    lmdeploy = fe.FakeLmdeployEngine()
    remote = fe.FakeAsyncLLM()
    inner = fe.predictor_with("vllm-async-engine", vllm_async_llm=vllm)
    models: dict[Any, Any] = {
        ("lmdeploy-engine", "/m", None): fe.predictor_with(
            "lmdeploy-engine", lmdeploy_engine=lmdeploy
        ),
        ("vllm-async-engine", "/m", None, "fp"): fe.FakeAsyncVlmPredictor("alive", inner),
        ("http-client", None, "http://x"): fe.predictor_with("http-client", vllm_async_llm=remote),
        ("vlm-http-client", None, None): fe.predictor_with("x", vllm_async_llm=remote),
    }
    handles = verification.engine_handles(models)
    assert [h.verifier for h in handles] == ["lmdeploy", "mineru_runtime", "vllm"]
    assert all(h.obj is not remote for h in handles)  # remote engines are never checked


def test_engine_handles_reads_the_fault_plans_singleton(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("mineru.backend.vlm.vlm_analyze")
    engine = fe.FakeAsyncLLM("dead")
    module.ModelSingleton = types.SimpleNamespace(  # type: ignore[attr-defined]
        _models={
            ("vllm-async-engine", "p", None): fe.predictor_with(
                "vllm-async-engine", vllm_async_llm=engine
            )
        }
    )
    monkeypatch.setitem(sys.modules, module.__name__, module)
    assert [h.obj for h in verification.engine_handles()] == [engine]


# --- the liveness thread's read: errored flags ---------------------------------------------------


class _Flag:
    def __init__(self, errored: Any) -> None:
        self.errored = errored


class _BrokenFlag:
    @property
    def errored(self) -> bool:
        raise RuntimeError("bug in a property")


def test_errored_engine_without_mineru(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in verification.MODEL_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert verification.errored_engine() is None


def test_errored_engine_alive_and_dead(monkeypatch: pytest.MonkeyPatch) -> None:
    alive = types.SimpleNamespace(
        _mineru_runtime_handles={"vllm_async_llm": _Flag(False)}, client=None
    )
    dead_client = types.SimpleNamespace(
        _mineru_runtime_handles={}, client=types.SimpleNamespace(vllm_async_llm=_Flag(True))
    )
    module = types.ModuleType("mineru.backend.vlm.vlm_analyze")
    module.ModelSingleton = types.SimpleNamespace(  # type: ignore[attr-defined]
        _models={("vllm-async-engine", None, None): alive}
    )
    monkeypatch.setitem(sys.modules, module.__name__, module)
    assert verification.errored_engine() is None
    module.ModelSingleton._models["b"] = dead_client  # type: ignore[attr-defined]
    found = verification.errored_engine()
    assert found is not None and found.obj is dead_client.client.vllm_async_llm
    assert "client.vllm_async_llm" in found.where


def test_errored_engine_needs_a_true_flag_that_reads() -> None:
    odd = types.SimpleNamespace(
        _mineru_runtime_handles={"vllm_async_llm": _Flag("yes"), "vllm_llm": _BrokenFlag()}
    )
    assert verification.errored_engine({("vllm-async-engine", "/m", None): odd}) is None


# --- bound, single flight ------------------------------------------------------------------------


def test_bound_returns_while_the_check_still_hangs(hang: fe.Hang) -> None:
    verifier = Verifier(
        timeout_s=TIMEOUT_S, find=lambda: [Handle("vllm", "h", fe.FakeAsyncLLM("hanging", hang))]
    )
    result = verifier.verify(busy=lambda: False)
    assert result.rule == "verify.timeout" and "vllm check of h" in result.detail
    assert verifier.running  # returned at the bound, not when the check did


def test_busy_engine_timeout_is_not_death(hang: fe.Hang) -> None:
    result = _verify(Handle("vllm", "h", fe.FakeAsyncLLM("hanging", hang)), busy=True)
    assert result.outcome == "inconclusive" and "busy is not dead" in result.detail


def test_never_twice_at_once(hang: fe.Hang) -> None:
    finds: list[int] = []

    def find() -> list[Handle]:
        finds.append(1)
        return [Handle("vllm", "h", fe.FakeAsyncLLM("hanging", hang))]

    verifier = Verifier(timeout_s=TIMEOUT_S, find=find)
    results: list[Verification] = []
    threads = [
        threading.Thread(target=lambda: results.append(verifier.verify(busy=lambda: True)))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10.0)
    assert verifier.started == 1 and len(finds) == 1  # the check is still stuck: none started
    assert len(results) == 4 and {r.outcome for r in results} == {"inconclusive"}


def test_a_failure_during_a_check_shares_its_answer(hang: fe.Hang) -> None:
    verifier = Verifier(
        timeout_s=10.0, find=lambda: [Handle("vllm", "h", fe.FakeAsyncLLM("hanging", hang))]
    )
    first: list[Verification] = []
    thread = threading.Thread(target=lambda: first.append(verifier.verify()))
    thread.start()
    assert hang.entered.wait(5.0)
    threading.Timer(1.0, hang.release).start()  # after this thread asks too
    second = verifier.verify()
    thread.join(10.0)
    assert (first[0].outcome, first[0].shared) == ("alive", False)
    assert (second.outcome, second.shared) == ("alive", True)
    assert verifier.started == 1


def test_a_check_stuck_past_its_bound_is_not_started_again(hang: fe.Hang) -> None:
    verifier = Verifier(
        timeout_s=TIMEOUT_S, find=lambda: [Handle("vllm", "h", fe.FakeAsyncLLM("hanging", hang))]
    )
    verifier.verify(busy=lambda: True)
    again = verifier.verify(busy=lambda: True)
    assert again.outcome == "inconclusive" and "still running" in again.detail
    assert verifier.started == 1


def test_a_broken_verifier_never_condemns() -> None:
    class Broken:
        @property
        def errored(self) -> bool:
            raise AttributeError("another version's shape")

    result = _verify(Handle("vllm", "h", Broken()))
    assert result.outcome == "inconclusive" and result.checks[0].state == "unknown"

    def find() -> list[Handle]:
        raise RuntimeError("boom")

    assert Verifier(find=find).verify().outcome == "inconclusive"


def test_nothing_local_is_inconclusive() -> None:
    assert _verify().outcome == "inconclusive"


def test_no_thread_to_verify_with_is_inconclusive_and_ends_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    engine = fe.FakeAsyncLLM("dead")
    verifier = Verifier(timeout_s=TIMEOUT_S, find=lambda: [Handle("vllm", "h", engine)])

    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    with monkeypatch.context() as patched:
        patched.setattr(threading.Thread, "start", no_thread)
        result = verifier.verify()
    assert result.outcome == "inconclusive" and "can't start new thread" in result.detail
    assert not verifier.running and verifier.verify().dead  # the next check runs for real


# --- confirm: the worker's one call --------------------------------------------------------------


def _rules() -> Rules:
    return Rules(
        [
            Rule("t.fatal", RuleKind.FATAL, "engine_dead", r"\bDeadError\b"),
            Rule("t.local", RuleKind.TASK_LOCAL, "bad_input", r"\bBadInput\b"),
            Rule("t.generic", RuleKind.GENERIC, "timeout", r"\bTimeoutError\b"),
            Rule("t.oom", RuleKind.AMBIGUOUS, "oom", r"\bOomError\b"),
        ],
        source="<test>",
    )


def _error(name: str) -> Exception:
    cls: type[Exception] = type(name, (Exception,), {"__module__": "builtins"})
    return cls("x")


def _counting(result: str) -> tuple[Verifier, list[int]]:
    calls: list[int] = []
    engine = fe.FakeAsyncLLM("dead" if result == "dead" else "alive")

    def find() -> list[Handle]:
        calls.append(1)
        return [Handle("vllm", "h", engine)]

    return Verifier(timeout_s=TIMEOUT_S, find=find), calls


@pytest.mark.parametrize(
    ("name", "checked"),
    [
        ("Unknown", True),
        ("TimeoutError", True),
        ("OomError", True),
        ("BadInput", False),
        ("DeadError", False),
    ],
)
def test_which_failures_are_verified(name: str, checked: bool) -> None:
    health = WorkerHealth(error_budget=3)
    verifier, calls = _counting("alive")
    error = _error(name)
    confirm(health, health.record(error, rules=_rules()), error, verifier)
    assert bool(calls) is checked


def test_never_for_a_remote_engine() -> None:
    health = WorkerHealth()
    verifier, calls = _counting("dead")
    error = _error("Unknown")
    outcome = confirm(
        health,
        health.record(error, rules=_rules(), remote_engine=True),
        error,
        verifier,
        remote_engine=True,
    )
    assert calls == [] and not outcome.fatal and health.healthy


def test_dead_engine_makes_the_failure_fatal() -> None:
    health = WorkerHealth()
    verifier, _ = _counting("dead")
    error = _error("Unknown")
    outcome = confirm(health, health.record(error, rules=_rules()), error, verifier)
    assert outcome.fatal and outcome.first
    assert (outcome.rule, outcome.category) == ("verify.vllm", "engine_check_failed")
    assert outcome.verification is not None and outcome.verification.dead
    first = health.snapshot().first_fatal
    assert first is not None and (first.rule, first.category) == (
        "verify.vllm",
        "engine_check_failed",
    )
    assert not health.healthy


def test_alive_engine_keeps_it_task_local() -> None:
    health = WorkerHealth()
    verifier, _ = _counting("alive")
    error = _error("Unknown")
    recorded = health.record(error, rules=_rules())
    outcome = confirm(health, recorded, error, verifier)
    assert not outcome.fatal and health.healthy
    assert outcome.verification is not None and outcome.verification.outcome == "alive"
    assert outcome.verdict is recorded.verdict


def test_ambiguous_error_on_a_broken_device_is_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", fe.fake_torch("dead"))
    health = WorkerHealth(error_budget=3)
    error = _error("OomError")
    outcome = confirm(
        health,
        health.record(error, rules=_rules()),
        error,
        Verifier(timeout_s=TIMEOUT_S, find=verification.device_handles),
    )
    assert outcome.fatal and outcome.rule == "verify.device_cuda"


def test_confirm_uses_the_health_state_for_busy(hang: fe.Hang) -> None:
    health = WorkerHealth()
    health.engine_call_started()  # another task's engine call in flight
    verifier = Verifier(
        timeout_s=TIMEOUT_S, find=lambda: [Handle("vllm", "h", fe.FakeAsyncLLM("hanging", hang))]
    )
    error = _error("Unknown")
    outcome = confirm(health, health.record(error, rules=_rules()), error, verifier)
    assert not outcome.fatal and health.healthy
    health.engine_call_finished()


def test_to_json_for_the_task_status() -> None:
    result = _verify(Handle("vllm", "h", fe.FakeAsyncLLM("dead")))
    body = result.to_json()
    assert body["outcome"] == "dead" and body["checks"][0]["state"] == "dead"


# --- the 3.x worker hook (on_task_failed) --------------------------------------------------------


@pytest.fixture
def worker_state(runtime: Any) -> WorkerHealth:
    health: WorkerHealth = runtime.health
    return health


class _HookTask:
    def __init__(self, backend: str) -> None:
        self.task_id = "t1"
        self.backend = backend
        self.status = "processing"


def _hook(runtime: Any, task: _HookTask, exc: BaseException) -> Any:
    import asyncio
    import types

    from mineru_health.mineru3.worker import tasks
    from mineru_health.runtime.worker.worker_runtime import STATE_ATTR

    app = types.SimpleNamespace(state=types.SimpleNamespace(**{STATE_ATTR: runtime}))
    return asyncio.run(tasks.on_task_failed(types.SimpleNamespace(app=app), task, exc))


def _default(runtime: Any, engine: Any) -> None:
    runtime.verifier = Verifier(timeout_s=TIMEOUT_S, find=lambda: [Handle("vllm", "h", engine)])


def test_hook_unknown_error_with_a_dead_engine_turns_the_worker_fatal(
    runtime: Any, worker_state: WorkerHealth
) -> None:
    _default(runtime, fe.FakeAsyncLLM("dead"))
    task = _HookTask("vlm-vllm-async-engine")
    outcome = _hook(runtime, task, RuntimeError("xq7 nobody knows this"))
    assert outcome.fatal and outcome.rule == "verify.vllm"
    verdict = task._mineru_health_verdict  # type: ignore[attr-defined]
    assert (verdict["rule"], verdict["category"], verdict["role"]) == (
        "verify.vllm",
        "engine_check_failed",
        "trigger",
    )
    assert verdict["verification"]["outcome"] == "dead"
    assert not worker_state.healthy


def test_hook_unknown_error_with_a_live_engine_stays_task_local(
    runtime: Any, worker_state: WorkerHealth
) -> None:
    _default(runtime, fe.FakeAsyncLLM("alive"))
    task = _HookTask("vlm-vllm-async-engine")
    outcome = _hook(runtime, task, RuntimeError("xq7 nobody knows this"))
    assert not outcome.fatal and worker_state.healthy
    assert task._mineru_health_verdict["verification"]["outcome"] == "alive"  # type: ignore[attr-defined]


def test_hook_never_verifies_a_remote_task(runtime: Any, worker_state: WorkerHealth) -> None:
    engine = fe.FakeAsyncLLM("dead")
    _default(runtime, engine)
    task = _HookTask("vlm-http-client")
    outcome = _hook(runtime, task, RuntimeError("xq7 nobody knows this"))
    assert not outcome.fatal and engine.health_calls == 0
    assert "verification" not in task._mineru_health_verdict  # type: ignore[attr-defined]


def test_hook_verifies_a_remote_task_whose_failure_escaped_a_local_engine_call(
    runtime: Any, worker_state: WorkerHealth
) -> None:
    from mineru_health.runtime.worker import engine_calls

    _default(runtime, fe.FakeAsyncLLM("dead"))
    with pytest.raises(RuntimeError) as raised, engine_calls.local_engine_call(worker_state):
        raise RuntimeError("xq7 nobody knows this")
    outcome = _hook(runtime, _HookTask("hybrid-http-client"), raised.value)
    assert outcome.fatal and outcome.rule == "verify.vllm"
    assert outcome.verification is not None and outcome.verification.outcome == "dead"


def test_fault_plan_unknown_error_stands_in_for_a_local_engine(
    runtime: Any, worker_state: WorkerHealth, tmp_path: Any
) -> None:
    from mineru_health.classifier import classify
    from mineru_health.demo.fault_plugin import faulted
    from mineru_health.demo.faults import FaultInjector, make_unknown_error

    error = make_unknown_error()
    assert not classify(error).matched  # no rule knows it
    assert not classify(error, remote_engine=True).matched
    planned = FaultInjector(tmp_path / "plan")
    planned.unknown_pending = 1  # what `unknown_error_dead` arms, without its planted engine
    remote_call = faulted(
        lambda: "parsed",
        parse=False,
        engine=True,
        plan=lambda: planned,
        health=lambda: worker_state,
    )
    with pytest.raises(RuntimeError, match="xq7") as raised:
        remote_call()
    _default(runtime, fe.FakeAsyncLLM("dead"))
    outcome = _hook(runtime, _HookTask("vlm-http-client"), raised.value)
    assert outcome.fatal and outcome.rule == "verify.vllm"


def test_zero_bound_turns_verification_off() -> None:
    health = WorkerHealth()
    verifier, calls = _counting("dead")
    verifier.timeout_s = 0.0
    error = _error("Unknown")
    outcome = confirm(health, health.record(error, rules=_rules()), error, verifier)
    assert calls == [] and outcome.verification is None and health.healthy


def test_worker_setting_bounds_the_default_verifier() -> None:
    from mineru_health.runtime.settings import WorkerSettings

    assert WorkerSettings.from_env({}).verify_s == verification.DEFAULT_TIMEOUT_S
    assert WorkerSettings.from_env({"MINERU_HEALTH_VERIFY_S": "0"}).verify_s == 0

"""The liveness registry: results, guards against broken or slow checks, the MinerU check."""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

import pytest
from mineru_health import liveness
from mineru_health.liveness import LivenessResult

_REGISTERED_AT_IMPORT = liveness.registered()


@pytest.fixture(autouse=True)
def _isolated_registry() -> Iterator[None]:
    saved = dict(liveness._checks)
    liveness._checks.clear()
    liveness.configure(timeout_s=0.5, cache_ttl_s=0.0)
    yield
    liveness._checks.clear()
    liveness._checks.update(saved)
    liveness.configure(timeout_s=0.5, cache_ttl_s=1.0)


def test_register_and_forms_of_results() -> None:
    liveness.register("bool", lambda: True)
    liveness.register("tuple", lambda: (False, "engine gone"))
    liveness.register("none", lambda: None)
    results = {r.name: r for r in liveness.check_all()}
    assert results["bool"] == LivenessResult("bool", True, "")
    assert results["tuple"] == LivenessResult("tuple", False, "engine gone")
    assert results["none"].alive
    name, alive, detail = results["tuple"]
    assert (name, alive, detail) == ("tuple", False, "engine gone")
    assert [r.name for r in liveness.dead_results()] == ["tuple"]
    assert liveness.unregister("tuple") is True
    assert liveness.unregister("tuple") is False
    assert liveness.registered() == ["bool", "none"]


def test_raising_check_counts_as_alive() -> None:
    def broken() -> bool:
        raise RuntimeError("bug in check")

    liveness.register("broken", broken)
    (result,) = liveness.check_all()
    assert result.alive and "RuntimeError" in result.detail


def test_slow_check_does_not_block_and_is_not_restarted() -> None:
    release = threading.Event()
    calls: list[int] = []

    def slow() -> bool:
        calls.append(1)
        release.wait(30)
        return False

    liveness.configure(timeout_s=0.05, cache_ttl_s=0.0)
    liveness.register("slow", slow)
    try:
        (first,) = liveness.check_all()
        assert first.alive and "still running" in first.detail
        (second,) = liveness.check_all()
        assert second.alive
        assert len(calls) == 1  # not started twice while the first run is busy
    finally:
        release.set()


def test_results_are_cached() -> None:
    calls: list[int] = []

    def counted() -> bool:
        calls.append(1)
        return True

    liveness.configure(cache_ttl_s=1.0)
    liveness.register("counted", counted)
    liveness.check_all()
    liveness.check_all()
    assert len(calls) == 1
    liveness.clear_cache()
    liveness.check_all()
    assert len(calls) == 2


def test_cache_ttl_is_capped_at_one_second() -> None:
    liveness.configure(cache_ttl_s=60.0)
    assert liveness._cache_ttl_s == 1.0


class _Handle:
    def __init__(self, errored: bool) -> None:
        self.errored = errored


def _fake_mineru(monkeypatch: pytest.MonkeyPatch, models: dict[Any, Any]) -> None:
    module = types.ModuleType(liveness.MINERU_VLM_MODULE)
    singleton = type("ModelSingleton", (), {"_models": models})
    module.ModelSingleton = singleton  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, liveness.MINERU_VLM_MODULE, module)


def test_engine_check_without_mineru(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, liveness.MINERU_VLM_MODULE, raising=False)
    assert liveness.engine_handles_check() is None


def test_engine_check_alive_and_dead(monkeypatch: pytest.MonkeyPatch) -> None:
    alive = types.SimpleNamespace(_mineru_runtime_handles={"vllm_async_llm": _Handle(False)},
                                  client=None)
    _fake_mineru(monkeypatch, {("vllm-async-engine", None, None): alive})
    result = liveness.engine_handles_check()
    assert result is not None and result[0] is True

    dead_client = types.SimpleNamespace(
        _mineru_runtime_handles={},
        client=types.SimpleNamespace(vllm_async_llm=_Handle(True)),
    )
    _fake_mineru(monkeypatch, {"a": alive, "b": dead_client})
    result = liveness.engine_handles_check()
    assert result is not None and result[0] is False
    assert "client.vllm_async_llm" in result[1]


def test_engine_check_ignores_non_bool_errored(monkeypatch: pytest.MonkeyPatch) -> None:
    odd = types.SimpleNamespace(
        _mineru_runtime_handles={"vllm_async_llm": types.SimpleNamespace(errored="yes")})
    _fake_mineru(monkeypatch, {"k": odd})
    result = liveness.engine_handles_check()
    assert result is not None and result[0] is True


def test_builtin_check_is_registered_by_default() -> None:
    assert "mineru-engines" in _REGISTERED_AT_IMPORT

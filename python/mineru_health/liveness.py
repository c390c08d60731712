"""Liveness checks: find an engine that died while the worker was idle.

A task failure tells the worker its engine is dead only when a task runs. A
liveness check looks at the engine handles directly, so ``/health`` turns
unhealthy even when no task has to fail first.

    >>> register("my-engine", lambda: (engine.ok(), "engine state"))
    >>> [r for r in check_all() if not r.alive]

A check returns ``True``/``False``, ``(alive, detail)``, or ``None`` (nothing
to check). A check that raises counts as alive (with the error as detail): a
broken check must not take a healthy worker out of rotation. Each check runs
in its own daemon thread and :func:`check_all` waits at most ``timeout_s`` for
it; a slow check reports alive and is not started again until it returns.
Results are cached for ``cache_ttl_s`` (at most 1 s).

The built-in check ``mineru-engines`` looks at the engine handles of MinerU's
``ModelSingleton`` (only if MinerU already imported it; nothing is imported
here) and reports dead when a handle's ``errored`` attribute is true, as vLLM's
``AsyncLLM`` (``EngineClient``) exposes it.

Thread-safety: every function may be called from any thread at once.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CheckFn",
    "LivenessResult",
    "check_all",
    "clear_cache",
    "configure",
    "dead_results",
    "engine_handles_check",
    "register",
    "registered",
    "unregister",
]

CheckFn = Callable[[], "bool | tuple[bool, str] | None"]

#: MinerU module holding the ``ModelSingleton`` whose predictors carry engine handles.
MINERU_VLM_MODULE = "mineru.backend.vlm.vlm_analyze"
_HANDLE_KEYS = ("vllm_async_llm", "vllm_llm", "lmdeploy_engine")


@dataclass(frozen=True, slots=True)
class LivenessResult:
    name: str
    alive: bool
    detail: str = ""

    def __iter__(self) -> Iterator[Any]:  # lets callers unpack (name, alive, detail)
        return iter((self.name, self.alive, self.detail))


@dataclass(slots=True)
class _Check:
    name: str
    fn: CheckFn
    thread: threading.Thread | None = None
    result: LivenessResult | None = None


_lock = threading.Lock()
_checks: dict[str, _Check] = {}
_cache: tuple[float, list[LivenessResult]] | None = None
_timeout_s = 0.5
_cache_ttl_s = 1.0


def configure(*, timeout_s: float | None = None, cache_ttl_s: float | None = None) -> None:
    """Sets how long :func:`check_all` waits and how long results are reused (≤ 1 s)."""
    global _timeout_s, _cache_ttl_s, _cache
    with _lock:
        if timeout_s is not None:
            _timeout_s = max(0.0, timeout_s)
        if cache_ttl_s is not None:
            _cache_ttl_s = min(max(0.0, cache_ttl_s), 1.0)
        _cache = None


def register(name: str, fn: CheckFn) -> None:
    """Adds (or replaces) the check ``name``."""
    global _cache
    with _lock:
        _checks[name] = _Check(name, fn)
        _cache = None


def unregister(name: str) -> bool:
    """Removes the check ``name``; false if there was none."""
    global _cache
    with _lock:
        _cache = None
        return _checks.pop(name, None) is not None


def registered() -> list[str]:
    with _lock:
        return list(_checks)


def clear_cache() -> None:
    global _cache
    with _lock:
        _cache = None


def _normalize(name: str, value: object) -> LivenessResult:
    if value is None:
        return LivenessResult(name, True, "nothing to check")
    if isinstance(value, tuple) and len(value) == 2:
        return LivenessResult(name, bool(value[0]), str(value[1]))
    return LivenessResult(name, bool(value), "")


def _run(check: _Check) -> None:
    try:
        result = _normalize(check.name, check.fn())
    except Exception as error:  # noqa: BLE001 - a broken check reports, never raises
        result = LivenessResult(check.name, True, f"check raised {type(error).__name__}: {error}")
    check.result = result


def check_all() -> list[LivenessResult]:
    """Runs every registered check (or returns results younger than the cache TTL)."""
    global _cache
    with _lock:
        now = time.monotonic()
        if _cache is not None and now - _cache[0] < _cache_ttl_s:
            return list(_cache[1])
        checks = list(_checks.values())
        timeout = _timeout_s
        started: list[_Check] = []
        for check in checks:
            if check.thread is not None and check.thread.is_alive():
                continue  # still busy from an earlier call: do not pile up threads
            check.result = None
            check.thread = threading.Thread(
                target=_run, args=(check,), name=f"mineru-health-liveness-{check.name}",
                daemon=True,
            )
            check.thread.start()
            started.append(check)

    deadline = time.monotonic() + timeout
    for check in started:
        assert check.thread is not None
        check.thread.join(max(0.0, deadline - time.monotonic()))

    results = []
    for check in checks:
        result = check.result
        if result is None or (check.thread is not None and check.thread.is_alive()):
            result = LivenessResult(check.name, True, f"check still running after {timeout:g}s")
        results.append(result)
    with _lock:
        _cache = (time.monotonic(), list(results))
    return results


def dead_results() -> list[LivenessResult]:
    """The failing checks of :func:`check_all`."""
    return [result for result in check_all() if not result.alive]


def _iter_engine_handles(models: dict[Any, Any]) -> Iterator[tuple[str, Any]]:
    seen: set[int] = set()
    for key, predictor in list(models.items()):
        sources: list[tuple[str, Any]] = []
        handles = getattr(predictor, "_mineru_runtime_handles", None)
        if isinstance(handles, dict):
            sources.extend((f"{key!r}[{name}]", handles.get(name)) for name in _HANDLE_KEYS)
        client = getattr(predictor, "client", None)
        if client is not None:
            sources.extend(
                (f"{key!r}.client.{name}", getattr(client, name, None)) for name in _HANDLE_KEYS
            )
        for where, handle in sources:
            if handle is None or id(handle) in seen:
                continue
            seen.add(id(handle))
            yield where, handle


def engine_handles_check() -> tuple[bool, str] | None:
    """Dead when any engine handle MinerU holds says ``errored``."""
    module = sys.modules.get(MINERU_VLM_MODULE)
    if module is None:
        return None
    singleton = getattr(module, "ModelSingleton", None)
    models = getattr(singleton, "_models", None)
    if not isinstance(models, dict) or not models:
        return None
    count = 0
    for where, handle in _iter_engine_handles(models):
        count += 1
        if getattr(handle, "errored", False) is True:
            return False, f"engine handle {where} ({type(handle).__name__}) reports errored"
    return True, f"{count} engine handle(s) alive"


register("mineru-engines", engine_handles_check)

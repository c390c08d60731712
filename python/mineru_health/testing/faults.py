"""Fault injection for tests and demos: make a MinerU worker fail like a dead vLLM engine.

No GPU or vLLM is needed. The worker integration installs this only when
``MINERU_HEALTH_FAULT_PLAN=<path>`` is set (a literal ``{port}`` in it becomes the
worker's listening port). The plan file holds one word; the
worker consumes (deletes) it and then behaves as follows:

``engine_dead``
    from then on every engine call in this process raises vLLM's
    ``EngineDeadError`` (same module path, class name, base and message).
``task_local``
    the next engine call raises one ``ValueError``, like a corrupt document.
``hang``
    the event loop thread sleeps (``MINERU_HEALTH_FAULT_HANG_S``, default
    3600 s): ``/health`` and everything else stop answering.
``engine_dead_idle``
    a fake engine handle whose ``errored`` is true is added to MinerU's
    ``ModelSingleton``, so the liveness check finds a dead engine without any
    task running.

Engine calls are ``mineru_vl_utils.MinerUClient.aio_batch_two_step_extract``,
the call in MinerU's VLM parse path through which a real EngineDeadError
surfaces. Write plans with :func:`write_plan` (atomic rename), so that the
worker never reads half a word.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

__all__ = [
    "ENGINE_DEAD_MESSAGE",
    "FAULT_PLAN_ENV",
    "HANG_S_ENV",
    "PLAN_WORDS",
    "FaultInjector",
    "engine_dead_error_class",
    "make_engine_dead_error",
    "write_plan",
]

FAULT_PLAN_ENV = "MINERU_HEALTH_FAULT_PLAN"
HANG_S_ENV = "MINERU_HEALTH_FAULT_HANG_S"
PLAN_WORDS = ("engine_dead", "task_local", "hang", "engine_dead_idle")

#: vLLM's module, class name and fixed message for a dead EngineCore (vLLM v1).
VLLM_EXCEPTIONS_MODULE = "vllm.v1.engine.exceptions"
ENGINE_DEAD_MESSAGE = (
    "EngineCore encountered an issue. See stack trace (above) for the root cause."
)
TASK_LOCAL_MESSAGE = (
    "Failed to decode page image: the document data is corrupt "
    "(injected by the mineru-health fault plan)"
)
#: Key of the fake engine entry added to MinerU's ModelSingleton by ``engine_dead_idle``.
FAKE_ENGINE_KEY = ("vllm-async-engine", "mineru-health-fault-plan", None)

_log = logging.getLogger("mineru_health.faults")
_error_class: type[Exception] | None = None
_error_class_lock = threading.Lock()


def engine_dead_error_class() -> type[Exception]:
    """vLLM's real EngineDeadError when vLLM is already imported, else a look-alike."""
    global _error_class
    real = sys.modules.get(VLLM_EXCEPTIONS_MODULE)
    if real is not None and isinstance(getattr(real, "EngineDeadError", None), type):
        cls: type[Exception] = real.EngineDeadError
        return cls
    with _error_class_lock:
        if _error_class is None:
            _error_class = type(
                "EngineDeadError",
                (Exception,),
                {
                    "__module__": VLLM_EXCEPTIONS_MODULE,
                    "__qualname__": "EngineDeadError",
                    "__doc__": "Stand-in for vLLM's error raised when the EngineCore process died.",
                },
            )
        return _error_class


def make_engine_dead_error() -> Exception:
    return engine_dead_error_class()(ENGINE_DEAD_MESSAGE)


def write_plan(path: str | os.PathLike[str], word: str) -> None:
    """Writes a plan atomically (temporary file + rename)."""
    if word not in PLAN_WORDS:
        raise ValueError(f"unknown fault plan {word!r}; expected one of {', '.join(PLAN_WORDS)}")
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(word + "\n", encoding="utf-8")
    os.replace(tmp, target)


class _FakeAsyncLLM:
    """Looks like a vLLM AsyncLLM whose engine core died: ``errored`` is true."""

    errored = True
    is_running = False

    @property
    def dead_error(self) -> BaseException:
        return make_engine_dead_error()


class _FakePredictor:
    def __init__(self) -> None:
        self._mineru_runtime_handles: dict[str, Any] = {
            "backend": "vllm-async-engine",
            "vllm_async_llm": _FakeAsyncLLM(),
        }


def _listening_port(argv: list[str]) -> int:
    """The ``--port`` mineru-api was started with (its default, 8000, otherwise)."""
    for index, arg in enumerate(argv):
        if arg == "--port" and index + 1 < len(argv):
            value = argv[index + 1]
        elif arg.startswith("--port="):
            value = arg.split("=", 1)[1]
        else:
            continue
        if value.isdigit():
            return int(value)
    return 8000


class FaultInjector:
    """Reads the plan file and injects the planned fault. Thread-safe."""

    def __init__(self, plan_path: str | os.PathLike[str], *, hang_s: float = 3600.0) -> None:
        self.plan_path = Path(plan_path)
        self.hang_s = hang_s
        self._lock = threading.Lock()
        self.engine_dead = False
        self.task_local_pending = 0
        self.applied: list[str] = []

    @classmethod
    def from_env(cls) -> FaultInjector | None:
        plan = os.environ.get(FAULT_PLAN_ENV, "").strip()
        if not plan:
            return None
        # Workers started by one router share its environment; "{port}" lets a
        # test or the demo aim a fault at one of them.
        plan = plan.replace("{port}", str(_listening_port(sys.argv)))
        try:
            hang_s = float(os.environ.get(HANG_S_ENV, "3600"))
        except ValueError:
            hang_s = 3600.0
        return cls(plan, hang_s=hang_s)

    def poll(self) -> str | None:
        """Consumes the plan file if present and applies it; returns the word applied."""
        with self._lock:
            try:
                word = self.plan_path.read_text(encoding="utf-8").strip()
            except FileNotFoundError:
                return None
            except OSError as error:
                _log.warning("cannot read fault plan %s: %s", self.plan_path, error)
                return None
            try:
                self.plan_path.unlink()
            except FileNotFoundError:
                pass
            if word not in PLAN_WORDS:
                _log.warning("ignoring unknown fault plan %r in %s", word, self.plan_path)
                return None
            self.applied.append(word)
            if word == "engine_dead":
                self.engine_dead = True
            elif word == "task_local":
                self.task_local_pending += 1
            elif word == "engine_dead_idle":
                self._add_dead_engine_handle()
        _log.warning("fault plan applied: %s", word)
        if word == "hang":
            # Called on the event loop thread: nothing else runs until this returns.
            time.sleep(self.hang_s)
        return word

    def before_engine_call(self) -> None:
        """Raises the planned failure, if any, in place of an engine call."""
        self.poll()
        with self._lock:
            if self.engine_dead:
                raise make_engine_dead_error()
            if self.task_local_pending:
                self.task_local_pending -= 1
                raise ValueError(TASK_LOCAL_MESSAGE)

    def _add_dead_engine_handle(self) -> None:
        module = sys.modules.get("mineru.backend.vlm.vlm_analyze")
        if module is None:
            import importlib

            module = importlib.import_module("mineru.backend.vlm.vlm_analyze")
        singleton = module.ModelSingleton
        with singleton._lock:
            singleton._models[FAKE_ENGINE_KEY] = _FakePredictor()

    def install(self) -> None:
        """Wraps ``MinerUClient.aio_batch_two_step_extract`` (once per process)."""
        from mineru_vl_utils import MinerUClient  # type: ignore[import-untyped]

        current = MinerUClient.aio_batch_two_step_extract
        if getattr(current, "__mineru_health_fault__", None) is not None:
            return
        original: Callable[..., Awaitable[Any]] = current
        injector = self

        async def aio_batch_two_step_extract(client: Any, *args: Any, **kwargs: Any) -> Any:
            injector.before_engine_call()
            return await original(client, *args, **kwargs)

        aio_batch_two_step_extract.__mineru_health_fault__ = self  # type: ignore[attr-defined]
        aio_batch_two_step_extract.__wrapped__ = original  # type: ignore[attr-defined]
        MinerUClient.aio_batch_two_step_extract = aio_batch_two_step_extract

"""Fault injection for tests and demos: make a MinerU worker fail like a dead vLLM engine.

No GPU or vLLM is needed, and no production code knows about it: the test
and demo sandboxes load :mod:`.fault_plugin` (a ``sitecustomize.py`` next to
their MinerU copy) when ``MINERU_HEALTH_FAULT_PLAN=<path>`` is set (a literal
``{port}`` in it becomes the worker's listening port). The plan file holds
one word, some with an argument; the worker consumes (deletes) it and then
behaves as follows:

``engine_dead``
    from then on every engine call in this process raises vLLM's
    ``EngineDeadError`` (same module path, class name, base and message).
``llama_engine_dead``
    as ``engine_dead``, with llama.cpp's ``mineru_llama_cpp.exceptions.EngineError``
    (the real class where the package is installed, raised at its engine module).
``cuda_illegal_address``
    as ``engine_dead``, with the sticky ``RuntimeError`` PyTorch raises after an
    illegal memory access (raised at a ``torch`` module, as PyTorch does).
``remote_engine_dead``
    as ``engine_dead``, with what a remote VLM server's death looks like to
    ``mineru_vl_utils``' HTTP client (a ``ServerError`` quoting vLLM's message).
``device_oom``
    the next engine call raises one device out-of-memory error (ambiguous: it
    counts against the error budget).
``task_local``
    the next engine call raises one ``ValueError``, like a corrupt document.
``engine_stall``
    from then on every engine call waits and never returns (for
    ``MINERU_HEALTH_FAULT_HANG_S``, default 3600 s): the engine makes no
    progress while the HTTP server stays responsive.
``hang`` / ``hang <seconds>``
    the event loop thread sleeps (``<seconds>``, else ``MINERU_HEALTH_FAULT_HANG_S``,
    default 3600 s): the main port answers nothing meanwhile, as when MinerU
    blocks its loop; the native health endpoint keeps answering.
``parse_hang``
    the next parse (MinerU's ``do_parse``/``aio_do_parse``) waits and never
    returns (for ``MINERU_HEALTH_FAULT_HANG_S``), before any engine call: a
    hung render pool or post-processing step, outside the stall watchdog's
    reach; later parses run normally.
``engine_dead_idle``
    a fake engine handle whose ``errored`` is true is added to MinerU's
    ``ModelSingleton``, so the liveness check finds a dead engine without any
    task running.
``unknown_error_dead``
    an engine handle shaped like lmdeploy's ``VLAsyncEngine`` whose main loop
    has stopped is added to MinerU's ``ModelSingleton``, and the next engine
    call raises one error no rule knows: only verifying the engine
    (:mod:`mineru_health.runtime.worker.verification`) can tell the worker it is dead.
``unknown_error_alive``
    as ``unknown_error_dead`` with an engine whose loops still run: the
    failure stays task-local.
``poison <file name>``
    a document that kills engines: the first engine call of a task that has
    an upload named ``<file name>`` raises ``EngineDeadError``, and from then
    on every engine call in that process does too (as ``engine_dead``). This
    word is *not* consumed: it stays in the file, so every worker that reads
    the plan (restarted ones included) is armed; writing another plan replaces
    it. The task's upload names come from ``fault_plugin.current_uploads``.

Engine calls are the call sites :mod:`mineru_health.runtime.worker.engine_calls`
tracks (``MinerUClient.aio_batch_two_step_extract`` and its siblings, the
pipeline's ``BatchAnalyze``) and 4.0's parse call: the calls through which a
real EngineDeadError surfaces and in which a stalled engine never returns.
The plugin raises every planned failure inside a local engine call, so it
stands in for a local engine whatever transport the task uses. Write plans
with :func:`write_plan` (atomic rename), so that the worker never reads half
a word.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_HANG_S",
    "ENGINE_DEAD_MESSAGE",
    "FAULT_PLAN_ENV",
    "HANG_S_ENV",
    "PLAN_WORDS",
    "FaultInjector",
    "engine_dead_error_class",
    "hang_s_from_env",
    "make_engine_dead_error",
    "make_llama_engine_error",
    "parse_plan",
    "raise_in",
    "write_plan",
]

FAULT_PLAN_ENV = "MINERU_HEALTH_FAULT_PLAN"
HANG_S_ENV = "MINERU_HEALTH_FAULT_HANG_S"
#: How long ``hang``, ``engine_stall`` and ``parse_hang`` block without ``HANG_S_ENV``.
DEFAULT_HANG_S = 3600.0
#: The longest any of them may block (the bound the config table documents).
MAX_HANG_S = 86400.0
PLAN_WORDS = (
    "engine_dead",
    "llama_engine_dead",
    "cuda_illegal_address",
    "remote_engine_dead",
    "device_oom",
    "task_local",
    "engine_stall",
    "hang",
    "engine_dead_idle",
    "poison",
    "parse_hang",
)
#: Words that take a number of seconds after a space.
_TIMED_WORDS = ("hang",)
#: Words that take the rest of the line (a file name) as their argument.
_NAMED_WORDS = ("poison",)
#: Words raising an error no rule knows, next to a planted engine handle to verify.
_UNKNOWN_WORDS = ("unknown_error_dead", "unknown_error_alive")
PLAN_WORDS = (*PLAN_WORDS, *_UNKNOWN_WORDS)  # type: ignore[assignment]  # appended apart

#: vLLM's module, class name and fixed message for a dead EngineCore (vLLM v1).
VLLM_EXCEPTIONS_MODULE = "vllm.v1.engine.exceptions"
ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
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


#: What llama.cpp's binding raises once its server loop stopped, and where.
LLAMA_MESSAGE = "no result (stopped)"
LLAMA_RAISED_IN = "mineru_llama_cpp.engine"
#: PyTorch's sticky error after an illegal memory access, and a module it raises it in.
CUDA_ILLEGAL_ADDRESS_MESSAGE = (
    "CUDA error: an illegal memory access was encountered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1"
)
DEVICE_OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "23.64 GiB of which 1.02 GiB is free."
)
TORCH_RAISED_IN = "torch.cuda"


def make_llama_engine_error() -> Exception:
    """llama.cpp's EngineError: the real class when mineru_llama_cpp is installed."""
    try:
        from mineru_llama_cpp.exceptions import (  # type: ignore[import-not-found,unused-ignore]
            EngineError,
        )
    except ImportError:
        EngineError = type(
            "EngineError", (Exception,), {"__module__": "mineru_llama_cpp.exceptions"}
        )
    error: Exception = EngineError(LLAMA_MESSAGE)
    return error


def make_remote_server_error() -> Exception:
    """mineru_vl_utils' ServerError for an HTTP 500 quoting vLLM (a look-alike without it)."""
    try:
        from mineru_vl_utils.vlm_client.base_client import (  # type: ignore[import-untyped,import-not-found,unused-ignore]
            ServerError,
        )
    except ImportError:
        ServerError = type(
            "ServerError", (RuntimeError,), {"__module__": "mineru_vl_utils.vlm_client.base_client"}
        )
    error: Exception = ServerError(f"Server returned status 500: {ENGINE_DEAD_MESSAGE}")
    return error


def _device_oom_error() -> Exception:
    try:
        import torch  # type: ignore[import-not-found]

        return torch.cuda.OutOfMemoryError(DEVICE_OOM_MESSAGE)  # type: ignore[no-any-return]
    except (ImportError, AttributeError):
        return RuntimeError(DEVICE_OOM_MESSAGE)


#: Sticky deaths: word -> (error factory, module the error is raised in).
DEATHS: dict[str, tuple[Any, str]] = {
    "engine_dead": (make_engine_dead_error, "vllm.v1.engine.async_llm"),
    "llama_engine_dead": (make_llama_engine_error, LLAMA_RAISED_IN),
    "cuda_illegal_address": (lambda: RuntimeError(CUDA_ILLEGAL_ADDRESS_MESSAGE), TORCH_RAISED_IN),
    "remote_engine_dead": (make_remote_server_error, "mineru_vl_utils.vlm_client.http_client"),
}
_raisers: dict[str, Any] = {}


def raise_in(module: str, error: BaseException) -> None:
    """Raises ``error`` from a function whose module is ``module``.

    The classifier judges an error text by where it was raised (a CUDA
    message from ``torch`` is the device's; from a document library it is
    text); the fault plan raises where the real engine would.
    """
    raiser = _raisers.get(module)
    if raiser is None:
        namespace: dict[str, Any] = {"__name__": module}
        exec(  # noqa: S102
            compile("def _raise(error):\n    raise error\n", f"<{module}>", "exec"),
            namespace,
        )
        raiser = _raisers.setdefault(module, namespace["_raise"])
    raiser(error)


def parse_plan(text: str) -> tuple[str, float | str | None] | None:
    """(word, argument) of a plan text; None when it is not a valid plan.

    The argument is the seconds of ``hang`` (or None), the file name of
    ``poison`` (required; it may hold spaces), None for the other words.
    """
    parts = text.split()
    if parts and parts[0] in _NAMED_WORDS:
        name = text.strip()[len(parts[0]) :].strip()
        return (parts[0], name) if name else None
    if not parts or parts[0] not in PLAN_WORDS or len(parts) > 2:
        return None
    if len(parts) == 1:
        return parts[0], None
    if parts[0] not in _TIMED_WORDS:
        return None
    try:
        seconds = float(parts[1])
    except ValueError:
        return None
    if not 0.0 <= seconds <= MAX_HANG_S:
        return None
    return parts[0], seconds


def hang_s_from_env(environ: Mapping[str, str] | None = None) -> float:
    """``MINERU_HEALTH_FAULT_HANG_S`` (:data:`DEFAULT_HANG_S` when unset).

    Raises ``ValueError`` unless it is a number of seconds in [0, 86400].
    """
    text = (os.environ if environ is None else environ).get(HANG_S_ENV, "").strip()
    if not text:
        return DEFAULT_HANG_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0.0 <= seconds <= MAX_HANG_S:  # nan and inf fail here too
        raise ValueError(f"{HANG_S_ENV}={text!r}: expected seconds in [0, {MAX_HANG_S:g}]")
    return seconds


def write_plan(path: str | os.PathLike[str], word: str) -> None:
    """Writes a plan atomically (temporary file + rename)."""
    if parse_plan(word) is None:
        raise ValueError(
            f"unknown fault plan {word!r}; expected one of {', '.join(PLAN_WORDS)} "
            f"({', '.join(_TIMED_WORDS)} may be followed by seconds; "
            f"{', '.join(_NAMED_WORDS)} needs a file name)"
        )
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

    def __init__(
        self, plan_path: str | os.PathLike[str], *, hang_s: float = DEFAULT_HANG_S
    ) -> None:
        self.plan_path = Path(plan_path)
        self.hang_s = hang_s
        self._lock = threading.Lock()
        self.engine_dead = False
        self.death = "engine_dead"  # which of DEATHS an engine_dead engine raises
        self.engine_stall = False
        self.task_local_pending = 0
        self.oom_pending = 0
        self.parse_hang_pending = 0
        self.poison_names: frozenset[str] = frozenset()
        self.applied: list[str] = []
        self.unknown_pending = 0

    @classmethod
    def from_env(cls) -> FaultInjector | None:
        """The plan ``MINERU_HEALTH_FAULT_PLAN`` names, if set; ``ValueError``: a bad hang time."""
        plan = os.environ.get(FAULT_PLAN_ENV, "").strip()
        if not plan:
            return None
        # Workers started by one router share its environment; "{port}" lets a
        # test or the demo aim a fault at one of them.
        plan = plan.replace("{port}", str(_listening_port(sys.argv)))
        return cls(plan, hang_s=hang_s_from_env())

    def poll(self) -> str | None:
        """Consumes the plan file if present and applies it; returns the word applied."""
        with self._lock:
            try:
                text = self.plan_path.read_text(encoding="utf-8").strip()
            except FileNotFoundError:
                return None
            except OSError as error:
                _log.warning("cannot read fault plan %s: %s", self.plan_path, error)
                return None
            plan = parse_plan(text)
            if plan is not None and plan[0] in _NAMED_WORDS:
                # Not consumed: every worker reading this plan is armed alike.
                return self._arm_poison(str(plan[1]))
            # Claimed by an atomic rename: of the workers that read a shared plan at
            # once, exactly one applies it.
            claimed = self.plan_path.with_name(f"{self.plan_path.name}.{os.getpid()}.claimed")
            try:
                os.rename(self.plan_path, claimed)
                text = claimed.read_text(encoding="utf-8").strip()
                claimed.unlink()
            except FileNotFoundError:
                return None  # another worker claimed it first
            except OSError as error:
                _log.warning("cannot claim fault plan %s: %s", self.plan_path, error)
                return None
            plan = parse_plan(text)
            if plan is None:
                _log.warning("ignoring unknown fault plan %r in %s", text, self.plan_path)
                return None
            word, seconds = plan
            self.applied.append(word)
            if word in DEATHS:
                self.engine_dead = True
                self.death = word
            elif word == "device_oom":
                self.oom_pending += 1
            elif word == "engine_stall":
                self.engine_stall = True
            elif word == "task_local":
                self.task_local_pending += 1
            elif word == "parse_hang":
                self.parse_hang_pending += 1
            elif word == "engine_dead_idle":
                self._add_dead_engine_handle()
            elif word in _UNKNOWN_WORDS:
                self._plant_engine(word == "unknown_error_alive")
                self.unknown_pending += 1
        _log.warning("fault plan applied: %s", text)
        if word == "hang":
            # Called on the event loop thread: nothing else runs until this returns.
            time.sleep(seconds if isinstance(seconds, float) else self.hang_s)
        return word

    def _arm_poison(self, name: str) -> str | None:
        """Adds a poison file name (lock held); returns "poison" the first time only."""
        if name in self.poison_names:
            return None
        self.poison_names = self.poison_names | {name}
        self.applied.append("poison")
        _log.warning("fault plan applied: poison %s", name)
        return "poison"

    def _raise_planned(self, upload_names: Sequence[str] = ()) -> bool:
        """Raises the planned failure, if any; True when the call must stall instead."""
        self.poll()
        with self._lock:
            if self.poison_names.intersection(upload_names):
                self.engine_dead = True
            if self.engine_dead:
                make, module = DEATHS[self.death]
                raise_in(module, make())
            if self.oom_pending:
                self.oom_pending -= 1
                raise_in(TORCH_RAISED_IN, _device_oom_error())
            if self.task_local_pending:
                self.task_local_pending -= 1
                raise ValueError(TASK_LOCAL_MESSAGE)
            if self.unknown_pending:
                self.unknown_pending -= 1
                raise make_unknown_error()
            return self.engine_stall

    def before_engine_call(self, upload_names: Sequence[str] = ()) -> None:
        """In a synchronous engine call (of a task with ``upload_names``): raises or stalls."""
        if self._raise_planned(upload_names):
            threading.Event().wait(self.hang_s)

    async def before_engine_call_async(self, upload_names: Sequence[str] = ()) -> None:
        """In an asynchronous engine call (of a task with ``upload_names``): raises or stalls."""
        if self._raise_planned(upload_names):
            await asyncio.sleep(self.hang_s)

    def take_parse_hang(self) -> bool:
        """True once per ``parse_hang`` planned: the caller's parse must hang."""
        self.poll()
        with self._lock:
            if self.parse_hang_pending <= 0:
                return False
            self.parse_hang_pending -= 1
            return True

    def _add_dead_engine_handle(self) -> None:
        module = sys.modules.get("mineru.backend.vlm.vlm_analyze")
        if module is None:
            import importlib

            module = importlib.import_module("mineru.backend.vlm.vlm_analyze")
        singleton = module.ModelSingleton
        with singleton._lock:
            singleton._models[FAKE_ENGINE_KEY] = _FakePredictor()

    def _plant_engine(self, alive: bool) -> None:
        # Tests only (the verification plans): the tests' fake engines are on the path.
        from harness.fake_engines import (  # type: ignore[import-not-found]
            FakeLmdeployEngine,
            predictor_with,
        )

        module = importlib.import_module("mineru.backend.vlm.vlm_analyze")
        engine = FakeLmdeployEngine("alive" if alive else "dead")
        with module.ModelSingleton._lock:
            module.ModelSingleton._models[VERIFY_ENGINE_KEY] = predictor_with(
                "lmdeploy-engine", lmdeploy_engine=engine
            )


#: What ``unknown_error_*`` raise: no rule knows it (tests/unit/test_verification.py checks it).
UNKNOWN_ERROR_MESSAGE = "xq7: request 17 came back without its pages (mineru-health fault plan)"
#: Key of the engine entry ``unknown_error_*`` add to MinerU's ModelSingleton.
VERIFY_ENGINE_KEY = ("lmdeploy-engine", "mineru-health-fault-plan-verify", None)


def make_unknown_error() -> Exception:
    return RuntimeError(UNKNOWN_ERROR_MESSAGE)

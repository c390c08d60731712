"""Fake engine handles with the real engines' API shapes, for verification tests and bench.

Each fake is ``alive``, ``dead`` or ``hanging`` (its check blocks until
:meth:`Hang.release`). The shapes follow the engines' sources:

* :class:`FakeAsyncLLM`: vLLM v1 ``AsyncLLM`` (``errored`` property, ``dead_error``,
  ``async check_health()`` raising the dead error);
* :class:`FakeLLM`: vLLM ``LLM`` (``llm_engine.engine_core.resources.engine_dead``);
* :class:`FakeLmdeployEngine`: lmdeploy ``VLAsyncEngine`` whose ``engine`` is the
  pytorch ``Engine`` (``_loop_main`` task, ``req_manager._loop_task``,
  ``_engine_loop.tasks``);
* :func:`fake_llama_cpp`: a ``mineru_llama_cpp`` package (``Engine`` with
  ``_closed``/``_core``/``generate``, ``SamplingParams``, ``EngineError``,
  ``InvalidRequestError``) to put in ``sys.modules``;
* :class:`FakeAsyncVlmPredictor`: MinerU 4.0's runtime (``_fatal_error``,
  ``_thread``, ``_loop``, ``_predictor``);
* :func:`fake_torch`: a ``torch`` module with one accelerator namespace
  (``is_initialized``, ``device_count``, ``memory_allocated``,
  ``current_device``, ``current_stream(i).query()``) and ``ones(...).add().item()``;
* :func:`fake_mlx_core`: ``mlx.core`` (``array``, ``eval``, ``synchronize``).
"""

from __future__ import annotations

import concurrent.futures
import threading
import types
from typing import Any, Literal

__all__ = [
    "ENGINE_DEAD_MESSAGE",
    "FakeAsyncLLM",
    "FakeAsyncVlmPredictor",
    "FakeLLM",
    "FakeLmdeployEngine",
    "Hang",
    "Mode",
    "fake_llama_cpp",
    "fake_mlx_core",
    "fake_torch",
    "predictor_with",
]

Mode = Literal["alive", "dead", "hanging"]
ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
STICKY_CUDA_MESSAGE = "CUDA error: an illegal memory access was encountered"
#: A hanging fake never blocks longer than this, even when nobody releases it.
MAX_HANG_S = 30.0


class Hang:
    """Where a hanging fake blocks; :meth:`release` lets every waiter go."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.entered = threading.Event()

    def wait(self) -> None:
        self.entered.set()
        self._event.wait(MAX_HANG_S)

    def release(self) -> None:
        self._event.set()


def _dead_error_class() -> type[Exception]:
    return type("EngineDeadError", (Exception,), {"__module__": "vllm.v1.engine.exceptions"})


class _Resources:
    def __init__(self, dead: bool) -> None:
        self.engine_dead = dead


class _EngineCore:
    def __init__(self, dead: bool) -> None:
        self.resources = _Resources(dead)


class FakeAsyncLLM:
    """vLLM v1 ``AsyncLLM``: ``errored`` reads the core's flag; ``check_health`` raises if dead."""

    def __init__(self, mode: Mode = "alive", hang: Hang | None = None) -> None:
        self.mode = mode
        self.hang = hang or Hang()
        self.engine_core = _EngineCore(mode == "dead")
        self.health_calls = 0

    @property
    def errored(self) -> bool:
        if self.mode == "hanging":
            self.hang.wait()
        return self.engine_core.resources.engine_dead

    @property
    def dead_error(self) -> BaseException:
        return _dead_error_class()(ENGINE_DEAD_MESSAGE)

    async def check_health(self) -> None:
        self.health_calls += 1
        if self.errored:
            raise self.dead_error


class _LLMEngine:
    def __init__(self, dead: bool) -> None:
        self.engine_core = _EngineCore(dead)


class FakeLLM:
    """vLLM's synchronous ``LLM``: the engine core client's ``resources.engine_dead``."""

    def __init__(self, mode: Mode = "alive") -> None:
        self.llm_engine = _LLMEngine(mode == "dead")


class _Tasks:
    """lmdeploy's ``EngineLoop``: ``tasks`` of asyncio tasks (futures here)."""

    def __init__(self, tasks: list[concurrent.futures.Future[None]]) -> None:
        self.tasks = tasks


class _ReqManager:
    def __init__(self, task: concurrent.futures.Future[None]) -> None:
        self._loop_task = task


class _PytorchEngine:
    def __init__(self, mode: Mode, hang: Hang) -> None:
        self._mode = mode
        self._hang = hang
        main: concurrent.futures.Future[None] = concurrent.futures.Future()
        if mode == "dead":
            main.set_exception(RuntimeError("engine main loop crashed (fake)"))
        self._main = main
        self.req_manager = _ReqManager(concurrent.futures.Future())
        self._engine_loop = _Tasks([concurrent.futures.Future(), concurrent.futures.Future()])

    @property
    def _loop_main(self) -> concurrent.futures.Future[None]:
        if self._mode == "hanging":
            self._hang.wait()
        return self._main


class FakeLmdeployEngine:
    """lmdeploy ``VLAsyncEngine``: ``engine`` is the pytorch engine whose loop tasks run."""

    def __init__(self, mode: Mode = "alive", hang: Hang | None = None) -> None:
        self.hang = hang or Hang()
        self.engine = _PytorchEngine(mode, self.hang)


def fake_llama_cpp(mode: Mode = "alive", hang: Hang | None = None) -> dict[str, types.ModuleType]:
    """``sys.modules`` entries of a fake ``mineru_llama_cpp`` whose ``Engine()`` is ``mode``."""
    hang = hang or Hang()
    package = types.ModuleType("mineru_llama_cpp")
    exceptions = types.ModuleType("mineru_llama_cpp.exceptions")
    engine_module = types.ModuleType("mineru_llama_cpp.engine")
    base = type("MineruLlamaCppError", (Exception,), {"__module__": exceptions.__name__})
    invalid = type("InvalidRequestError", (base,), {"__module__": exceptions.__name__})
    engine_error = type("EngineError", (base,), {"__module__": exceptions.__name__})
    exceptions.MineruLlamaCppError = base  # type: ignore[attr-defined]
    exceptions.InvalidRequestError = invalid  # type: ignore[attr-defined]
    exceptions.EngineError = engine_error  # type: ignore[attr-defined]

    class SamplingParams:
        def __init__(self, n_predict: int | None = None) -> None:
            self.n_predict = n_predict

    def generate(self: Any, messages: Any, sampling_params: Any = None) -> dict[str, Any]:
        self.calls += 1
        if mode == "hanging":
            hang.wait()
        if mode == "dead":
            raise engine_error("no result (stopped)")
        return {"content": "1", "finish_reason": "length"}

    def init(self: Any) -> None:
        self._closed = False
        self._core = object()
        self.calls = 0

    engine_class = type(
        "Engine", (), {"__module__": engine_module.__name__, "__init__": init, "generate": generate}
    )
    engine_module.Engine = engine_class  # type: ignore[attr-defined]
    package.Engine = engine_class  # type: ignore[attr-defined]
    package.SamplingParams = SamplingParams  # type: ignore[attr-defined]
    package.EngineError = engine_error  # type: ignore[attr-defined]
    return {
        package.__name__: package,
        exceptions.__name__: exceptions,
        engine_module.__name__: engine_module,
    }


class _Thread:
    def __init__(self, alive: bool) -> None:
        self._alive = alive

    def is_alive(self) -> bool:
        return self._alive


class FakeAsyncVlmPredictor:
    """MinerU 4.0's ``AsyncVlmPredictor``: a runtime thread, its loop, a sticky fatal error."""

    def __init__(
        self, mode: Mode = "alive", predictor: Any = None, backend: str = "vllm-async-engine"
    ) -> None:
        self.backend = backend
        self._closing = False
        self._fatal_error: BaseException | None = None
        self._thread = _Thread(mode != "dead")
        self._predictor = predictor


def predictor_with(backend: str, **handles: Any) -> Any:
    """A MinerU predictor (``MinerUClient``) holding ``_mineru_runtime_handles``."""
    predictor = types.SimpleNamespace()
    predictor._mineru_runtime_handles = {
        "backend": backend,
        "model": None,
        "processor": None,
        **handles,
    }
    return predictor


def fake_torch(
    mode: Mode = "alive", *, backend: str = "cuda", hip: bool = False, hang: Hang | None = None
) -> types.ModuleType:
    """A ``torch`` with one initialised ``backend`` device (index 0) that is ``mode``."""
    blocker = hang or Hang()
    torch = types.ModuleType("torch")
    torch.version = types.SimpleNamespace(hip="6.2" if hip else None)  # type: ignore[attr-defined]
    calls: list[str] = []
    torch.calls = calls  # type: ignore[attr-defined]

    class Stream:
        def query(self) -> bool:
            calls.append("query")
            if mode == "dead":
                raise RuntimeError(STICKY_CUDA_MESSAGE)
            return True

    class Tensor:
        def __init__(self, value: float, device: str) -> None:
            self.value = value
            self.device = device

        def add(self, other: float) -> Tensor:
            return Tensor(self.value + other, self.device)

        def item(self) -> float:
            calls.append(f"item {self.device}")
            if mode == "hanging":
                blocker.wait()
            return self.value

    namespace = types.SimpleNamespace(
        is_initialized=lambda: True,
        device_count=lambda: 1,
        memory_allocated=lambda index: 1024,
        current_device=lambda: 0,
        current_stream=lambda index=None: Stream(),
    )
    setattr(torch, backend, namespace)
    torch.ones = lambda n, device="cpu": Tensor(1.0, device)  # type: ignore[attr-defined]
    return torch


def fake_mlx_core(mode: Mode = "alive") -> types.ModuleType:
    """``mlx.core`` whose evaluation fails (``dead``) as a Metal command buffer error would."""
    mx = types.ModuleType("mlx.core")

    class Array:
        def __init__(self, value: float) -> None:
            self.value = value

        def __add__(self, other: float) -> Array:
            return Array(self.value + other)

        def item(self) -> float:
            return self.value

    def evaluate(*arrays: Any) -> None:
        if mode == "dead":
            raise RuntimeError("[METAL] Command buffer execution failed: Caused GPU Hang Error")

    mx.array = lambda values: Array(float(values[0]))  # type: ignore[attr-defined]
    mx.eval = evaluate  # type: ignore[attr-defined]
    mx.synchronize = lambda: None  # type: ignore[attr-defined]
    return mx

"""Verify, don't guess: after a failure no rule decides, ask the engine itself.

    >>> Verifier(timeout_s=10).verify(busy=lambda: False)
    Verification(outcome='dead', rule='verify.vllm', ...)

A failure that no rule decides (no rule matched, or only a generic timeout or
cancellation), and an ambiguous device error, leave the classifier without
evidence. The worker still holds the engine: the judge
(:func:`mineru_health.runtime.worker.judge.confirm`) has a :class:`Verifier` check the
handles MinerU keeps in ``ModelSingleton._models`` (3.x
``mineru.backend.vlm.vlm_analyze``, 4.0 ``mineru.model.vlm.runtime``) and the
accelerator devices torch or MLX already use, and records a dead one as fatal
(rule ``verify.<verifier>``, category ``engine_check_failed``) through
:meth:`WorkerHealth.record_fatal`. A check that passes leaves the failure
task-local.

Checks read state rather than queue work, so a busy engine answers at once:

=================  =========================================================
verifier           what is asked
=================  =========================================================
``vllm``           ``AsyncLLM.errored``, then ``check_health()``; ``LLM``:
                   ``llm_engine.engine_core.resources.engine_dead``
``lmdeploy``       the pytorch engine's main loop, request loop and engine
                   loop tasks (``done()`` means stopped), the
                   multiprocess engine's process
``llama_cpp``      ``Engine._closed``; then one one-token generation, since
                   llama.cpp exposes no state: a stopped server loop answers
                   ``EngineError`` at once (its timeout never condemns: how
                   long a generation takes is no evidence)
``mineru_runtime`` 4.0's ``AsyncVlmPredictor``: its sticky fatal error, its
                   thread, its event loop
``device_<type>``  torch devices in use (``cuda``/``hip``, ``npu``, ``musa``,
                   ``xpu``, ``mlu``, ``mps``): a non-blocking stream query,
                   then a one-element op read back, which re-raise a sticky
                   device error
``mlx``            one tiny evaluation on MLX's default device
=================  =========================================================

Between failures, :func:`errored_engine` reads the engines' own ``errored``
flags for the worker's liveness thread (an engine that dies while idle).

Nothing is imported here: torch, MLX and the engines are looked at only when
MinerU already imported them. Remote engines (``http-client`` backends, a
``server_url`` in the model key) are never checked, and a remote task is
never verified.

Bounds: every check of one verification runs in one daemon thread, waited for
at most ``timeout_s`` (``MINERU_HEALTH_VERIFY_S``, default
:data:`DEFAULT_TIMEOUT_S`; 0 turns verification off). Never twice at
once: a failure that arrives while a verification runs shares its answer,
and a check still stuck past its bound is never started again until it
returns. A check that raises where the engine's API says "unhealthy" is
dead; a verifier that cannot read the handle (another version's shape) says
``unknown``, which never condemns.

Busy is not dead: a verification that times out condemns only when no engine
call is in flight (an idle engine that cannot answer a flag read, a health
call or a one-element device op within the bound is hung). With engine calls
in flight the timeout is ``inconclusive`` and the failure stays task-local;
the stall watchdog (``MINERU_HEALTH_STALL_S``) is what judges a loaded
engine that stops making progress.

Thread-safety: every function may be called from any thread at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ...safe_text import describe_exception

__all__ = [
    "CATEGORY",
    "DEFAULT_TIMEOUT_S",
    "MODEL_MODULES",
    "RULE_PREFIX",
    "Check",
    "Handle",
    "Verification",
    "Verifier",
    "device_handles",
    "engine_handles",
    "errored_engine",
]

#: Category of every fatal verdict verification records.
CATEGORY = "engine_check_failed"
#: Rule ids are ``verify.<verifier>`` (``verify.timeout`` for an idle engine that never answered).
RULE_PREFIX = "verify."
#: Seconds one verification may take, all checks together.
DEFAULT_TIMEOUT_S = 2.0
#: MinerU modules whose ``ModelSingleton._models`` hold engine handles (3.x, 4.0).
MODEL_MODULES = ("mineru.backend.vlm.vlm_analyze", "mineru.model.vlm.runtime")

State = Literal["dead", "alive", "unknown"]
Outcome = Literal["dead", "alive", "inconclusive"]

#: ``_mineru_runtime_handles`` keys (and ``client`` attributes) -> verifier.
_HANDLE_VERIFIERS = (
    ("vllm_async_llm", "vllm"),
    ("vllm_llm", "vllm"),
    ("lmdeploy_engine", "lmdeploy"),
    ("llama_cpp_engine", "llama_cpp"),
)
#: Verifiers whose check is model work (a test generation): its time depends on the
#: machine and the model, so running past the bound is never evidence of death.
_WORK_VERIFIERS = frozenset({"llama_cpp"})
#: torch accelerator namespaces whose devices are checked when initialised.
_TORCH_BACKENDS = ("cuda", "npu", "musa", "xpu", "mlu")
_MAX_DEVICES = 16


@dataclass(frozen=True, slots=True)
class Handle:
    """One thing to check: ``verifier`` names the check, ``where`` the handle."""

    verifier: str
    where: str
    obj: Any


@dataclass(frozen=True, slots=True)
class Check:
    """What one verifier found on one handle."""

    verifier: str
    where: str
    state: State
    detail: str

    def to_json(self) -> dict[str, str]:
        return {
            "verifier": self.verifier,
            "where": self.where,
            "state": self.state,
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True)
class Verification:
    """One verification: ``dead`` (evidence found), ``alive`` or ``inconclusive``.

    ``rule`` is ``verify.<verifier>`` of the check that found a dead engine
    (``""`` otherwise). ``shared``: the answer of a verification another
    failure had already started.
    """

    outcome: Outcome
    rule: str
    detail: str
    checks: tuple[Check, ...] = ()
    elapsed_s: float = 0.0
    shared: bool = False

    @property
    def dead(self) -> bool:
        return self.outcome == "dead"

    def to_json(self) -> dict[str, Any]:
        """For a task's status: the outcome, the deciding rule, what was checked."""
        return {
            "outcome": self.outcome,
            "rule": self.rule,
            "detail": self.detail,
            "elapsed_s": round(self.elapsed_s, 6),
            "checks": [check.to_json() for check in self.checks],
        }


# --- finding handles ---------------------------------------------------------------------------


def _remote_entry(key: Any, predictor: Any) -> bool:
    # 3.x keys are (backend, model_path, server_url), 4.0's add a fingerprint.
    if isinstance(key, tuple) and len(key) >= 3 and key[2]:
        return True
    backend = key[0] if isinstance(key, tuple) and key else getattr(predictor, "backend", "")
    return str(backend or "").endswith("http-client")


def _predictor_handles(where: str, predictor: Any) -> Iterator[Handle]:
    handles = getattr(predictor, "_mineru_runtime_handles", None)
    backend = ""
    if isinstance(handles, dict):
        backend = str(handles.get("backend") or "")
        for name, verifier in _HANDLE_VERIFIERS:
            yield Handle(verifier, f"{where}[{name}]", handles.get(name))
        model = handles.get("model")
        if model is not None and backend == "mlx-engine":
            yield Handle("mlx", f"{where}[model]", model)
    client = getattr(predictor, "client", None)
    if client is not None:
        for name, verifier in _HANDLE_VERIFIERS:
            yield Handle(verifier, f"{where}.client.{name}", getattr(client, name, None))


def engine_handles(models: Mapping[Any, Any] | None = None) -> list[Handle]:
    """The local engine handles of MinerU's ``ModelSingleton`` (or of ``models``)."""
    sources: list[Mapping[Any, Any]] = []
    if models is not None:
        sources.append(models)
    else:
        for name in MODEL_MODULES:
            singleton = getattr(sys.modules.get(name), "ModelSingleton", None)
            found = getattr(singleton, "_models", None)
            if isinstance(found, dict):
                sources.append(found)
    result: list[Handle] = []
    seen: set[int] = set()

    def add(handle: Handle) -> None:
        if handle.obj is not None and id(handle.obj) not in seen:
            seen.add(id(handle.obj))
            result.append(handle)

    for source in sources:
        for key, predictor in list(source.items()):
            if _remote_entry(key, predictor):
                continue
            where = repr(key)
            if hasattr(predictor, "_fatal_error") and hasattr(predictor, "_thread"):
                add(Handle("mineru_runtime", where, predictor))  # 4.0's AsyncVlmPredictor
                inner = getattr(predictor, "_predictor", None)
                if inner is not None:
                    for handle in _predictor_handles(f"{where}._predictor", inner):
                        add(handle)
            for handle in _predictor_handles(where, predictor):
                add(handle)
    return result


def errored_engine(models: Mapping[Any, Any] | None = None) -> Handle | None:
    """The first local engine handle whose ``errored`` flag is set (vLLM's ``AsyncLLM``).

    A read, not a check: the worker's liveness thread asks once a second, so
    that an engine that died while no task ran turns the worker fatal
    without a task failing first. A flag that is not ``True``, or whose read
    raises, is no evidence.
    """
    for handle in engine_handles(models):
        try:
            if getattr(handle.obj, "errored", False) is True:
                return handle
        except Exception:  # noqa: BLE001, S112 - a broken property never condemns
            continue
    return None


def _verifier_name(torch: Any, backend: str) -> str:
    if backend == "cuda" and getattr(getattr(torch, "version", None), "hip", None):
        return "device_hip"  # ROCm runs behind torch.cuda
    return f"device_{backend}"


def _devices_in_use(module: Any) -> list[int]:
    count = min(int(module.device_count()), _MAX_DEVICES)
    allocated = getattr(module, "memory_allocated", None)
    used: list[int] = []
    if callable(allocated):
        used = [index for index in range(count) if allocated(index) > 0]
    if not used and count > 0:
        used = [int(module.current_device())]
    return used


def device_handles() -> list[Handle]:
    """torch devices already in use and MLX's default device (only if already imported)."""
    result: list[Handle] = []
    torch = sys.modules.get("torch")
    if torch is not None:
        for backend in _TORCH_BACKENDS:
            module = getattr(torch, backend, None)
            try:
                initialised = module is not None and bool(module.is_initialized())
                indices = _devices_in_use(module) if initialised else []
            except Exception:  # noqa: BLE001, S112 - a half-installed backend: nothing to check
                continue
            name = _verifier_name(torch, backend)
            for index in indices:
                result.append(Handle(name, f"{backend}:{index}", (torch, backend, index)))
        try:
            mps = getattr(torch, "mps", None)
            if mps is not None and mps.current_allocated_memory() > 0:
                result.append(Handle("device_mps", "mps", (torch, "mps", 0)))
        except Exception:  # noqa: BLE001, S110 - no MPS here
            pass
    if sys.modules.get("mlx.core") is not None:
        result.append(Handle("mlx", "mlx default device", sys.modules["mlx.core"]))
    return result


def all_handles() -> list[Handle]:
    return engine_handles() + device_handles()


# --- verifiers ----------------------------------------------------------------------------------


def _error_text(error: BaseException) -> str:
    return describe_exception(error)[:300]


def _drive(result: Any) -> Any:
    """Runs a coroutine a health call returned on a private loop (the caller's thread)."""
    if inspect.isawaitable(result):

        async def wait() -> Any:
            return await result

        return asyncio.run(wait())
    return result


def verify_vllm(handle: Any) -> tuple[State, str]:
    """vLLM ``AsyncLLM`` (``errored``, ``check_health()``) or ``LLM`` (the core's dead flag)."""
    errored = getattr(handle, "errored", None)
    if errored is True:
        return "dead", "errored is true"
    engine = getattr(handle, "llm_engine", None)  # vllm.LLM
    core = getattr(engine if engine is not None else handle, "engine_core", None)
    if getattr(getattr(core, "resources", None), "engine_dead", False) is True:
        return "dead", "engine_core.resources.engine_dead is true"
    check = getattr(handle if errored is not None else engine, "check_health", None)
    if not callable(check):
        if errored is False:
            return "alive", "errored is false"
        if getattr(getattr(core, "resources", None), "engine_dead", None) is False:
            return "alive", "engine_core.resources.engine_dead is false"
        return "unknown", "no health flag or call"
    try:
        _drive(check())
    except Exception as error:  # noqa: BLE001 - the API's way of saying unhealthy
        return "dead", f"check_health() raised {_error_text(error)}"
    return "alive", "check_health() passed"


def _task_stopped(task: Any) -> str | None:
    """Why an asyncio task (or future) has stopped; None while it runs or when unknown."""
    done = getattr(task, "done", None)
    if not callable(done) or done() is not True:
        return None
    try:
        if task.cancelled():
            return "cancelled"
        error = task.exception()
    except Exception:  # noqa: BLE001 - a future of another kind: done is enough
        return "finished"
    return f"failed: {_error_text(error)}" if error is not None else "finished"


def verify_lmdeploy(handle: Any) -> tuple[State, str]:
    """lmdeploy's ``(VL)AsyncEngine``: its engine's loop tasks, or its engine process."""
    engine = getattr(handle, "engine", None)
    if engine is None:
        return "unknown", "no engine attribute"
    found = False
    for label, task in (
        ("main loop", getattr(engine, "_loop_main", None)),
        ("request loop", getattr(getattr(engine, "req_manager", None), "_loop_task", None)),
    ):
        if task is None:
            continue
        found = True
        why = _task_stopped(task)
        if why is not None:
            return "dead", f"engine {label} {why}"
    engine_loop = getattr(engine, "_engine_loop", None)
    for task in list(getattr(engine_loop, "tasks", None) or ()):
        found = True
        why = _task_stopped(task)
        if why is not None:
            name = getattr(task, "get_name", lambda: "?")()
            return "dead", f"engine loop task {name} {why}"
    proc = getattr(engine, "proc", None)  # the multiprocess (ZMQ) engine
    if proc is not None and callable(getattr(proc, "is_alive", None)):
        found = True
        if not proc.is_alive():
            return "dead", f"engine process exited ({getattr(proc, 'exitcode', None)})"
    return ("alive", "engine loops running") if found else ("unknown", "engine loop not started")


def _llama_error_class(handle: Any, name: str) -> type[BaseException] | None:
    module = sys.modules.get("mineru_llama_cpp.exceptions")
    if module is None:
        module = sys.modules.get(type(handle).__module__.rsplit(".", 1)[0] + ".exceptions")
    found = getattr(module, name, None)
    return found if isinstance(found, type) and issubclass(found, BaseException) else None


def verify_llama_cpp(handle: Any) -> tuple[State, str]:
    """``mineru_llama_cpp.Engine``: closed, or a one-token generation that fails as the engine."""
    if getattr(handle, "_closed", False) is True:
        return "dead", "engine closed"
    if not hasattr(handle, "_core"):
        return "dead", "engine core released"
    generate = getattr(handle, "generate", None)
    if not callable(generate):
        return "unknown", "no generate()"
    package = sys.modules.get(type(handle).__module__.rsplit(".", 1)[0])
    params_class = getattr(package, "SamplingParams", None)
    params = params_class(n_predict=1) if params_class is not None else None
    engine_error = _llama_error_class(handle, "EngineError")
    request_error = _llama_error_class(handle, "InvalidRequestError")
    try:
        generate([{"role": "user", "content": "1"}], params)
    except Exception as error:  # noqa: BLE001 - sorted below
        if engine_error is not None and isinstance(error, engine_error):
            return "dead", f"probe generation raised {_error_text(error)}"
        if request_error is not None and isinstance(error, request_error):
            return "alive", "probe refused as a request: the engine answered"
        return "unknown", f"probe raised {_error_text(error)}"
    return "alive", "probe generation answered"


def verify_mineru_runtime(handle: Any) -> tuple[State, str]:
    """MinerU 4.0's ``AsyncVlmPredictor``: sticky fatal error, its thread and loop."""
    if getattr(handle, "_closing", False) is True:
        return "unknown", "runtime shutting down"
    fatal = getattr(handle, "_fatal_error", None)
    if isinstance(fatal, BaseException):
        return "dead", f"runtime holds a fatal error: {_error_text(fatal)}"
    thread = getattr(handle, "_thread", None)
    if thread is not None and callable(getattr(thread, "is_alive", None)) and not thread.is_alive():
        return "dead", "runtime thread exited"
    loop = getattr(handle, "_loop", None)
    if loop is not None and callable(getattr(loop, "is_closed", None)) and loop.is_closed():
        return "dead", "runtime event loop closed"
    return "alive", "runtime thread running"


def verify_torch_device(handle: Any) -> tuple[State, str]:
    """One torch device: a stream query (never blocks), then a one-element op read back."""
    torch, backend, index = handle
    module = getattr(torch, backend)
    device = "mps" if backend == "mps" else f"{backend}:{index}"
    try:
        if backend != "mps":
            module.current_stream(index).query()  # reports a sticky error without waiting
        value = torch.ones(1, device=device).add(1).item()  # waits for this op alone
    except Exception as error:  # noqa: BLE001 - the device's way of saying broken
        return "dead", f"{device}: {_error_text(error)}"
    if value != 2:
        return "dead", f"{device}: 1 + 1 gave {value!r}"
    return "alive", f"{device} answered"


def verify_mlx(handle: Any) -> tuple[State, str]:
    """MLX: one tiny evaluation (and a synchronize where MLX has one)."""
    mx = sys.modules.get("mlx.core") if not hasattr(handle, "array") else handle
    if mx is None:
        return "unknown", "mlx.core not imported"
    try:
        result = mx.array([1.0]) + 1
        mx.eval(result)
        if callable(getattr(mx, "synchronize", None)):
            mx.synchronize()
        value = result.item() if hasattr(result, "item") else None
    except Exception as error:  # noqa: BLE001
        return "dead", f"mlx: {_error_text(error)}"
    if value is not None and value != 2:
        return "dead", f"mlx: 1 + 1 gave {value!r}"
    return "alive", "mlx answered"


VERIFIERS: dict[str, Callable[[Any], tuple[State, str]]] = {
    "vllm": verify_vllm,
    "lmdeploy": verify_lmdeploy,
    "llama_cpp": verify_llama_cpp,
    "mineru_runtime": verify_mineru_runtime,
    "mlx": verify_mlx,
}


def _verifier_for(name: str) -> Callable[[Any], tuple[State, str]] | None:
    if name.startswith("device_") and name != "device_mlx":
        return verify_torch_device
    return VERIFIERS.get(name)


def run_check(handle: Handle) -> Check:
    """Runs one handle's verifier in this thread; a verifier that breaks says unknown."""
    verifier = _verifier_for(handle.verifier)
    if verifier is None:
        return Check(handle.verifier, handle.where, "unknown", "no verifier")
    try:
        state, detail = verifier(handle.obj)
    except Exception as error:  # noqa: BLE001 - another API shape: no evidence either way
        return Check(
            handle.verifier, handle.where, "unknown", f"verifier failed: {_error_text(error)}"
        )
    return Check(handle.verifier, handle.where, state, detail)


# --- the bounded, single-flight runner ---------------------------------------------------------


class _Run:
    __slots__ = ("checks", "current", "deadline", "done", "result", "started", "work")

    def __init__(self, started: float, deadline: float) -> None:
        self.started = started
        self.deadline = deadline
        self.done = threading.Event()
        self.checks: list[Check] = []
        self.current = ""
        self.work = False  # the check running now is model work (see _WORK_VERIFIERS)
        self.result: Verification | None = None


class Verifier:
    """Runs every check of one verification in a thread of its own, bounded, one at a time.

    ``find`` lists the handles (default: MinerU's engines and the devices in
    use); ``clock`` is injectable for tests. ``timeout_s`` 0 turns
    verification off (the judge then never asks).
    """

    def __init__(
        self,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        find: Callable[[], list[Handle]] = all_handles,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout_s = max(0.0, float(timeout_s))
        self._find = find
        self._clock = clock
        self._lock = threading.Lock()
        self._run: _Run | None = None
        self.started = 0  # verifications started (tests, bench)

    @property
    def running(self) -> bool:
        run = self._run
        return run is not None and not run.done.is_set()

    def verify(self, *, busy: Callable[[], bool] | None = None) -> Verification:
        """Checks every handle; waits at most ``timeout_s``. Never raises.

        ``busy`` says whether engine calls are in flight: a timeout then has
        no evidence of death (``inconclusive``); without it, a timeout is.
        """
        with self._lock:
            now = self._clock()
            run = self._run
            shared = run is not None and not run.done.is_set()
            if shared:
                assert run is not None
                if now >= run.deadline:
                    return Verification(
                        "inconclusive",
                        "",
                        f"an earlier check ({run.current or 'starting'}) is still running "
                        f"{now - run.started:.1f}s after it began; not starting another",
                    )
            else:
                run = _Run(now, now + self.timeout_s)
                self._run = run
                self.started += 1
                thread = threading.Thread(
                    target=self._execute, args=(run,), name="mineru-health-verify", daemon=True
                )
                try:
                    thread.start()
                except RuntimeError as error:  # no thread to be had: no evidence either way
                    run.result = Verification(
                        "inconclusive", "", f"verification failed: {_error_text(error)}"
                    )
                    run.done.set()  # ended: the next failure starts a check of its own
        assert run is not None
        run.done.wait(max(0.0, run.deadline - self._clock()))
        result = run.result
        if result is not None:
            return dataclasses.replace(result, shared=True) if shared else result
        checks = tuple(run.checks)
        elapsed = self._clock() - run.started
        what = run.current or "listing handles"
        try:
            loaded = bool(busy()) if busy is not None else False
        except Exception:  # noqa: BLE001 - unknown load: no evidence
            loaded = True
        if loaded or run.work:
            why = (
                "a test generation's time is no evidence"
                if run.work
                else "engine calls are in flight: busy is not dead"
            )
            return Verification(
                "inconclusive",
                "",
                f"{what} did not answer within {self.timeout_s:g}s; {why}",
                checks,
                elapsed,
                shared,
            )
        return Verification(
            "dead",
            RULE_PREFIX + "timeout",
            f"{what} did not answer within {self.timeout_s:g}s with no engine call in flight",
            checks,
            elapsed,
            shared,
        )

    def _execute(self, run: _Run) -> None:
        try:
            handles = self._find()
            for handle in handles:
                run.current = f"{handle.verifier} check of {handle.where}"
                run.work = handle.verifier in _WORK_VERIFIERS
                check = run_check(handle)
                run.checks.append(check)
                if check.state == "dead":
                    break  # one dead engine is enough; the rest may hang on it
            dead = next((c for c in run.checks if c.state == "dead"), None)
            elapsed = self._clock() - run.started
            if dead is not None:
                run.result = Verification(
                    "dead",
                    RULE_PREFIX + dead.verifier,
                    f"{dead.verifier} check of {dead.where}: {dead.detail}",
                    tuple(run.checks),
                    elapsed,
                )
            elif any(c.state == "alive" for c in run.checks):
                run.result = Verification(
                    "alive",
                    "",
                    f"{len(run.checks)} check(s), none dead",
                    tuple(run.checks),
                    elapsed,
                )
            else:
                run.result = Verification(
                    "inconclusive",
                    "",
                    "nothing local to check"
                    if not run.checks
                    else "no verifier could read its handle",
                    tuple(run.checks),
                    elapsed,
                )
        except Exception as error:  # noqa: BLE001 - a broken verification never condemns
            run.result = Verification(
                "inconclusive",
                "",
                f"verification failed: {_error_text(error)}",
                tuple(run.checks),
                self._clock() - run.started,
            )
        finally:
            run.done.set()

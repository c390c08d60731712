"""Tracks MinerU's engine calls, so the native state knows whether the engine makes progress.

Two kinds of call site are wrapped, each once per process:

* **Engine calls**, one batch or window of pages each: ``MinerUClient``'s
  ``(aio_)batch_two_step_extract`` and ``(aio_)batch_extract_with_layout``
  (VLM and hybrid backends) and the pipeline backend's ``BatchAnalyze.__call__``.
  Each is counted in flight while it runs; its end (success or failure) is
  progress. A call whose client is ``http-client`` talks to a remote server,
  not this worker's engine: it is never counted in flight, and its task waits
  on the remote server meanwhile (``WorkerHealth.remote_wait``), which the
  task watchdog never counts as hung (issues 17 and 24: a user's
  ``server_url`` that never answers must not stall the worker, restart it,
  or get a document quarantined). So does the http client's construction,
  which asks the server for its model name, and MinerU's lookup of the
  client (``ModelSingleton.get_model`` with the ``http-client`` backend).
  A remote wait has bounds of its own (issue 32, :mod:`.remote_waits`): past
  them its task fails alone, never the worker's fault.
  A local call is a :func:`local_engine_call`: an exception escaping it is
  marked as this worker's engine's (:func:`raised_by_local_engine`).
* **Engine requests**, one page or block each: ``predict`` / ``aio_predict`` of
  the concrete ``mineru_vl_utils`` VLM clients. Their end is progress too, so a
  long window on a slow device is not mistaken for a stall.

The id of the task being parsed is kept in a context variable
(``follow_tasks(manager)`` wraps MinerU's ``AsyncTaskManager._run_task``; the
engine calls run in that task's context, directly or through
``asyncio.to_thread``, which copies it), so that an engine call's end is
its own task's progress.

Modules are wrapped when they are imported (most are imported lazily by
MinerU, e.g. the pipeline backend only on its first task), through a small
post-import hook; nothing here imports a backend by itself.

Thread-safety: the wrappers run on any thread; install() runs once, at start-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import Any

from . import remote_waits
from .health import WorkerHealth

__all__ = [
    "ENGINE_CALL_SITES",
    "REMOTE_SITES",
    "REQUEST_SITES",
    "current_task_id",
    "follow_tasks",
    "install",
    "local_engine_call",
    "on_import",
    "raised_by_local_engine",
    "task_context",
]

#: (module, class, methods) whose calls are engine calls.
ENGINE_CALL_SITES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "mineru_vl_utils.mineru_client",
        "MinerUClient",
        (
            "aio_batch_two_step_extract",
            "batch_two_step_extract",
            "aio_batch_extract_with_layout",
            "batch_extract_with_layout",
        ),
    ),
    ("mineru.backend.pipeline.batch_analyze", "BatchAnalyze", ("__call__",)),
)

_VLM_CLIENTS = "mineru_vl_utils.vlm_client."
#: (module, class, methods) whose calls are single engine requests (progress only).
REQUEST_SITES: tuple[tuple[str, str, tuple[str, ...]], ...] = tuple(
    (f"{_VLM_CLIENTS}{module}", cls, ("predict", "aio_predict"))
    for module, cls in (
        ("http_client", "HttpVlmClient"),
        ("vllm_async_engine_client", "VllmAsyncEngineVlmClient"),
        ("vllm_engine_client", "VllmEngineVlmClient"),
        ("lmdeploy_engine_client", "LmdeployEngineVlmClient"),
        ("transformers_client", "TransformersVlmClient"),
        ("mlx_client", "MlxVlmClient"),
        ("llama_cpp_engine_client", "LlamaCppEngineVlmClient"),
    )
)

#: (module, class, methods) that wait on a remote server whatever the backend.
REMOTE_SITES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (f"{_VLM_CLIENTS}http_client", "HttpVlmClient", ("__init__",)),
)

_MARK = "__mineru_health_tracked__"
#: Set on an exception that escaped a :func:`local_engine_call`.
_LOCAL_ENGINE_ATTR = "__mineru_health_local_engine__"
#: Exceptions of a chain looked at by :func:`raised_by_local_engine`.
_MAX_CHAIN = 16

#: The id of the MinerU task whose processing runs in this context.
_current_task: contextvars.ContextVar[str] = contextvars.ContextVar(
    "mineru_health_current_task", default=""
)


@contextlib.contextmanager
def task_context(task_id: str) -> Iterator[None]:
    """Puts ``task_id`` in context for the work done inside the block."""
    token = _current_task.set(task_id)
    try:
        yield
    finally:
        _current_task.reset(token)


def current_task_id() -> str:
    """The id of the task being processed in this context ("" outside one)."""
    return _current_task.get()


def follow_tasks(manager: Any, health: Callable[[], WorkerHealth]) -> None:
    """Wraps ``manager._run_task``: its task in context, tracked by the task watchdog.

    Idempotent. The task's engine calls and requests run in that context
    (directly or through ``asyncio.to_thread``, which copies it), so their
    ends are its progress.
    """
    run_task = getattr(manager, "_run_task", None)
    if run_task is None or getattr(run_task, _MARK, False):
        return

    @functools.wraps(run_task)
    async def run_task_in_context(task: Any, *args: Any, **kwargs: Any) -> Any:
        task_id = str(getattr(task, "task_id", "") or "")
        token = _current_task.set(task_id)
        state = health()
        state.task_started(task_id)
        try:
            return await run_task(task, *args, **kwargs)
        finally:
            state.task_finished(task_id)
            _current_task.reset(token)

    setattr(run_task_in_context, _MARK, True)
    manager._run_task = run_task_in_context


# --- a post-import hook --------------------------------------------------------------------

_hooks_lock = threading.Lock()
_hooks: dict[str, list[Callable[[ModuleType], None]]] = {}


class _Loader(importlib.abc.Loader):
    """Runs the real loader, then the callbacks registered for the module."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        with _hooks_lock:
            callbacks = _hooks.pop(module.__name__, [])
        for callback in callbacks:
            callback(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        with _hooks_lock:
            if fullname not in _hooks:
                return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader)
                return spec
        return None


_finder = _Finder()


def on_import(module_name: str, callback: Callable[[ModuleType], None]) -> None:
    """Calls ``callback(module)`` now if the module is loaded, else right after its import."""
    module = sys.modules.get(module_name)
    if module is not None:
        callback(module)
        return
    with _hooks_lock:
        _hooks.setdefault(module_name, []).append(callback)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)


# --- wrappers ---------------------------------------------------------------------------------


def _server_of_call(args: tuple[Any, ...]) -> str:
    """host:port of the server a remote engine call's client talks to ("" if unknown)."""
    client = getattr(args[0], "client", None) if args else None
    return remote_waits.server_name(getattr(client, "server_url", ""))


def _is_remote(args: tuple[Any, ...]) -> bool:
    """True when the call's client talks to a remote server (``http-client``).

    A remote server, often one a user named in ``server_url``, is not this
    worker's engine: its slowness never counts toward the stall watchdog, as
    its errors never make the worker fatal. The task waits on the client's
    own timeout and fails alone.
    """
    return bool(args) and getattr(args[0], "backend", None) == "http-client"


@contextlib.contextmanager
def local_engine_call(
    health: WorkerHealth, failure_judge: FailureJudge | None = None
) -> Iterator[None]:
    """One call into this worker's own engine: in flight while it runs, its failure the engine's.

    An exception escaping the block is marked, so that the worker treats it
    as a local engine's failure (:func:`raised_by_local_engine`) even in a
    task whose backend is remote: what failed ran here, not on the server.
    On a thread without an event loop it is also handed to ``failure_judge``
    (the line's, if it has one: :func:`judge_off_loop`).
    """
    health.engine_call_started()
    try:
        yield
    except BaseException as error:
        with contextlib.suppress(Exception):  # an exception refusing attributes stays unmarked
            setattr(error, _LOCAL_ENGINE_ATTR, True)
        judge_off_loop(failure_judge, error)
        raise
    finally:
        health.engine_call_finished()


#: A line's judge of a failure escaping a local engine call (the runtime's ``failure_judge``).
FailureJudge = Callable[[BaseException], object]


def judge_off_loop(failure_judge: FailureJudge | None, error: BaseException) -> None:
    """Hands ``error`` to ``failure_judge`` when this thread runs no event loop.

    MinerU 4.0 asks whether a job's failure is fatal on its event loop, where
    verification must not wait; for engines it drives synchronously (llama.cpp,
    lmdeploy, MLX) the failure first escapes the engine call on the parse
    thread, where waiting costs nothing: the line decides (and verifies) it
    there and answers the loop's question from that verdict.
    """
    if failure_judge is None or not isinstance(error, Exception):
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        with contextlib.suppress(Exception):  # the judge's own failure leaves MinerU's path as is
            failure_judge(error)


def raised_by_local_engine(error: BaseException) -> bool:
    """True when ``error``, or an exception it wraps, escaped a :func:`local_engine_call`."""
    current: BaseException | None = error
    for _ in range(_MAX_CHAIN):
        if current is None:
            break
        if getattr(current, _LOCAL_ENGINE_ATTR, False) is True:
            return True
        current = current.__cause__ or current.__context__
    return False


def _engine_call(
    original: Callable[..., Any],
    health: Callable[[], WorkerHealth],
    failure_judge: Callable[[], FailureJudge | None] = lambda: None,
) -> Callable[..., Any]:
    if _is_coroutine_function(original):

        @functools.wraps(original)
        async def tracked_async(*args: Any, **kwargs: Any) -> Any:
            state = health()
            try:
                if _is_remote(args):
                    with remote_waits.waiting(state, current_task_id(), _server_of_call(args)):
                        return await original(*args, **kwargs)
                with local_engine_call(state, failure_judge()):
                    return await original(*args, **kwargs)
            finally:
                state.task_progress(current_task_id())

        return tracked_async

    @functools.wraps(original)
    def tracked(*args: Any, **kwargs: Any) -> Any:
        state = health()
        try:
            if _is_remote(args):
                with remote_waits.waiting(state, current_task_id(), _server_of_call(args)):
                    return original(*args, **kwargs)
            with local_engine_call(state, failure_judge()):
                return original(*args, **kwargs)
        finally:
            state.task_progress(current_task_id())

    return tracked


def _engine_request(
    original: Callable[..., Any], health: Callable[[], WorkerHealth]
) -> Callable[..., Any]:
    if _is_coroutine_function(original):

        @functools.wraps(original)
        async def request_async(*args: Any, **kwargs: Any) -> Any:
            try:
                return await original(*args, **kwargs)
            finally:
                state = health()
                state.progress()
                state.task_progress(current_task_id())

        return request_async

    @functools.wraps(original)
    def request(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        finally:
            state = health()
            state.progress()
            state.task_progress(current_task_id())

    return request


def _remote_wait(
    original: Callable[..., Any], health: Callable[[], WorkerHealth]
) -> Callable[..., Any]:
    @functools.wraps(original)
    def waiting(*args: Any, **kwargs: Any) -> Any:
        # HttpVlmClient(self, model_name, server_url, ...)
        server = remote_waits.configured_server(
            kwargs.get("server_url", args[2] if len(args) > 2 else "")
        )
        with remote_waits.waiting(health(), current_task_id(), server):
            return original(*args, **kwargs)

    return waiting


def _is_coroutine_function(fn: Callable[..., Any]) -> bool:
    import inspect

    return inspect.iscoroutinefunction(fn)


def _wrap_class(
    module: ModuleType,
    class_name: str,
    methods: tuple[str, ...],
    make: Callable[[Callable[..., Any]], Callable[..., Any]],
) -> None:
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        return
    for name in methods:
        current = cls.__dict__.get(name)
        if current is None or getattr(current, _MARK, False):
            continue
        wrapped = make(current)
        setattr(wrapped, _MARK, True)
        setattr(cls, name, wrapped)


def install(
    health: Callable[[], WorkerHealth],
    settings: Callable[[], Any],
    failure_judge: Callable[[], FailureJudge | None] = lambda: None,
) -> None:
    """Wraps every call site above, now or when its module is imported (idempotent).

    ``settings()``: the worker's settings, for the errors of remote waits past a bound;
    ``failure_judge()``: the line's judge of local engine failures off the loop, if any.
    """
    remote_waits.install(health, settings, on_import)
    for module_name, class_name, methods in ENGINE_CALL_SITES:
        on_import(
            module_name,
            functools.partial(
                _wrap_class,
                class_name=class_name,
                methods=methods,
                make=lambda fn: _engine_call(fn, health, failure_judge),
            ),
        )
    for module_name, class_name, methods in REQUEST_SITES:
        on_import(
            module_name,
            functools.partial(
                _wrap_class,
                class_name=class_name,
                methods=methods,
                make=lambda fn: _engine_request(fn, health),
            ),
        )
    for module_name, class_name, methods in REMOTE_SITES:
        on_import(
            module_name,
            functools.partial(
                _wrap_class,
                class_name=class_name,
                methods=methods,
                make=lambda fn: _remote_wait(fn, health),
            ),
        )

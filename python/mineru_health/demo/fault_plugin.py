"""The fault plan as a plugin the test and demo sandboxes load into MinerU (never production).

The sandbox writes a ``sitecustomize.py`` next to its MinerU copy
(:func:`~mineru_health.demo.sandbox.add_fault_plugin`) that calls
:func:`load` when ``MINERU_HEALTH_FAULT_PLAN`` is set. The plugin attaches
itself from outside, through the post-import hook of
:mod:`~mineru_health.runtime.worker.engine_calls`, to what each MinerU line
imports:

* **Engine calls** (``engine_calls.ENGINE_CALL_SITES``, both lines): the
  planned failure or stall comes first, inside a
  :func:`~mineru_health.runtime.worker.engine_calls.local_engine_call`: in flight
  while it raises or stalls (a stall trips the stall watchdog), and a local
  engine's failure for the worker, whatever transport the task uses.
* **The parse call**: ``parse_hang`` blocks the next one before it starts,
  outside any engine call (only the task watchdog sees it). On 3.x that is
  ``do_parse``/``aio_do_parse`` of ``mineru.cli.common``, wherever they are
  bound; on 4.0 ``MinerUParser._arun_analysis`` (and ``_run_analysis``),
  which also stands in for an engine call: 4.0's flash tier runs no engine.
* **The plan is read** on the worker's event loop every 100 ms (``hang``
  blocks that loop), for as long as the worker's loop watcher runs
  (``loop_watch.watch_loop``, which both lines start once MinerU's start-up
  is over); engine and parse calls read it too.
* **The worker's runtime** is the one ``install`` builds (``begin_install``
  is wrapped when its module is imported): the plugin is loaded before it exists.
* **Child processes** (``MINERU_HEALTH_FAULT_CHILDREN``, ``tests/harness/children.py``)
  are started when the loop watcher starts, as an engine starts its own.
* **The task's upload names** are kept in context for ``poison``
  (:func:`current_uploads`): 3.x's task manager's ``_run_task`` is wrapped
  when the watcher starts (:func:`follow_uploads`; its module may be
  ``__main__``), 4.0's ``_run_job`` when ``mineru.parser.api_server`` is
  imported.

The words are those of :mod:`.faults`; ``engine_dead_idle`` and
``unknown_error_*`` act on 3.x's structures.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import logging
import os
import sys
import threading
from collections.abc import Awaitable, Callable, Iterable
from types import ModuleType
from typing import Any

from ..runtime.worker import engine_calls
from ..runtime.worker.health import WorkerHealth
from ..runtime.worker.worker_runtime import WorkerRuntime
from .faults import FaultInjector, hang_s_from_env

__all__ = ["current_uploads", "faulted", "follow_uploads", "injector", "load"]

#: MinerU 3.x: the module defining the parse functions, and their names.
PARSE_MODULE = "mineru.cli.common"
PARSE_FUNCTIONS = ("do_parse", "aio_do_parse")
#: MinerU 4.0: the parser class's module, the class and its parse calls.
PARSER_MODULE = "mineru.parser.mineru_parser"
PARSER_CLASS = "MinerUParser"
PARSER_CALLS = ("_arun_analysis", "_run_analysis")
#: MinerU 4.0: the module whose ``_run_job`` runs one job (its files in ``record.files``).
JOBS_MODULE = "mineru.parser.api_server"
#: Where the worker's runtime is built (``begin_install``), which the plugin notes.
INSTALL_MODULE = "mineru_health.runtime.worker.install"
#: The worker's event-loop watcher (both lines), which the plan's reads follow.
WATCHER_MODULE = "mineru_health.runtime.worker.loop_watch"
POLL_S = 0.1

_MARK = "__mineru_health_faults__"
_log = logging.getLogger("mineru_health.faults")
_lock = threading.Lock()
_injector: FaultInjector | None = None
#: The upload names of the task (3.x) or job (4.0) whose work runs in this context.
_uploads: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "mineru_health_fault_plan_uploads", default=()
)

Plan = Callable[[], FaultInjector | None]
#: The runtime ``install`` built in this process, once it has.
_runtime: WorkerRuntime | None = None


def injector() -> FaultInjector | None:
    """The process's plan, made on first use (``{port}`` needs the final argv)."""
    global _injector
    with _lock:
        if _injector is None:
            _injector = FaultInjector.from_env()
            if _injector is not None:
                _log.warning("fault injection enabled, plan file %s", _injector.plan_path)
        return _injector


def _noting_runtime(begin_install: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(begin_install)
    def begin_install_noted(*args: Any, **kwargs: Any) -> Any:
        global _runtime
        runtime = begin_install(*args, **kwargs)
        if isinstance(runtime, WorkerRuntime):
            _runtime = runtime
        return runtime

    setattr(begin_install_noted, _MARK, True)
    return begin_install_noted


def _runtime_health() -> WorkerHealth | None:
    return _runtime.health if _runtime is not None else None


def _engine_call(health: WorkerHealth | None) -> contextlib.AbstractContextManager[None]:
    """A local engine call of ``health`` (none before the runtime is built)."""
    if health is None:
        return contextlib.nullcontext()
    failure_judge = _runtime.failure_judge if _runtime is not None else None
    return engine_calls.local_engine_call(health, failure_judge)


def current_uploads() -> tuple[str, ...]:
    """The upload names of the task being parsed in this context (empty outside one)."""
    return _uploads.get()


def _with_uploads(
    run: Callable[..., Awaitable[Any]], names_of: Callable[[Any], Iterable[Any]]
) -> Callable[..., Awaitable[Any]]:
    """``run(item, ...)`` with ``names_of(item)`` in context, for the work it does."""

    @functools.wraps(run)
    async def run_with_uploads(item: Any, *args: Any, **kwargs: Any) -> Any:
        token = _uploads.set(tuple(str(name) for name in names_of(item)))
        try:
            return await run(item, *args, **kwargs)
        finally:
            _uploads.reset(token)

    setattr(run_with_uploads, _MARK, True)
    return run_with_uploads


def follow_uploads(manager: Any) -> None:
    """MinerU 3.x: ``manager._run_task`` with its task's upload names in context (idempotent).

    The engine calls run in that context, directly or through
    ``asyncio.to_thread``, which copies it.
    """
    run_task = getattr(manager, "_run_task", None)
    if run_task is not None and not getattr(run_task, _MARK, False):
        manager._run_task = _with_uploads(
            run_task, lambda task: getattr(task, "upload_names", None) or ()
        )


def _job_file_names(record: Any) -> list[Any]:
    return [getattr(file, "name", "") for file in getattr(record, "files", None) or ()]


def faulted(
    original: Callable[..., Any],
    *,
    parse: bool,
    engine: bool,
    plan: Plan = injector,
    health: Callable[[], WorkerHealth | None] = _runtime_health,
) -> Callable[..., Any]:
    """``original`` with the plan's turn first.

    ``parse``: a pending ``parse_hang`` blocks this call. ``engine``: the
    planned failure or stall, inside a local engine call of ``health``.
    """
    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def faulted_async(*args: Any, **kwargs: Any) -> Any:
            planned = plan()
            if planned is not None:
                if parse and planned.take_parse_hang():
                    await asyncio.sleep(planned.hang_s)
                if engine:
                    with _engine_call(health()):
                        await planned.before_engine_call_async(current_uploads())
            return await original(*args, **kwargs)

        setattr(faulted_async, _MARK, True)
        return faulted_async

    @functools.wraps(original)
    def faulted_sync(*args: Any, **kwargs: Any) -> Any:
        planned = plan()
        if planned is not None:
            if parse and planned.take_parse_hang():
                threading.Event().wait(planned.hang_s)
            if engine:
                with _engine_call(health()):
                    planned.before_engine_call(current_uploads())
        return original(*args, **kwargs)

    setattr(faulted_sync, _MARK, True)
    return faulted_sync


async def _read_plan(planned: FaultInjector) -> None:
    """Reads the plan every :data:`POLL_S` on the event loop until cancelled."""
    while True:
        try:
            planned.poll()
        except Exception as error:  # noqa: BLE001 - a bad read must not end the reads
            _log.warning("reading the fault plan failed: %r", error)
        await asyncio.sleep(POLL_S)


def _reading_the_plan(watch_loop: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(watch_loop)
    async def watch_loop_and_plan(*args: Any, **kwargs: Any) -> Any:
        from ..mineru3.worker.tasks import task_managers

        for manager in task_managers(_runtime) if _runtime is not None else ():
            # 3.x's; 4.0's jobs are followed at import
            follow_uploads(manager)
        _start_children()  # its start-up is over: an engine's processes, if asked
        planned = injector()
        reads = (
            None
            if planned is None
            else asyncio.get_running_loop().create_task(
                _read_plan(planned), name="mineru-health-fault-plan"
            )
        )
        try:
            return await watch_loop(*args, **kwargs)
        finally:
            if reads is not None:
                reads.cancel()

    setattr(watch_loop_and_plan, _MARK, True)
    return watch_loop_and_plan


def _wrap_methods(
    module: ModuleType,
    class_name: str,
    names: tuple[str, ...],
    make: Callable[[Callable[..., Any]], Callable[..., Any]],
) -> None:
    cls = getattr(module, class_name, None)
    for name in names:
        current = getattr(cls, "__dict__", {}).get(name)
        if current is not None and not getattr(current, _MARK, False):
            setattr(cls, name, make(current))


def _wrap_functions(
    module: ModuleType,
    names: tuple[str, ...],
    make: Callable[[Callable[..., Any]], Callable[..., Any]],
) -> None:
    """Wraps ``module``'s functions in every loaded module that bound them by name."""
    for name in names:
        original = getattr(module, name, None)
        if original is None or getattr(original, _MARK, False):
            continue
        wrapped = make(original)
        for holder in [module, *sys.modules.values()]:
            if getattr(holder, "__dict__", {}).get(name) is original:
                setattr(holder, name, wrapped)


def load() -> None:
    """Arms the plan for this process: what it needs is wrapped when MinerU imports it.

    Raises ``ValueError`` on a bad ``MINERU_HEALTH_FAULT_HANG_S``.
    """
    hang_s_from_env()
    engine_call = functools.partial(faulted, parse=False, engine=True)
    for module_name, class_name, methods in engine_calls.ENGINE_CALL_SITES:
        engine_calls.on_import(
            module_name,
            functools.partial(
                _wrap_methods, class_name=class_name, names=methods, make=engine_call
            ),
        )
    engine_calls.on_import(
        PARSE_MODULE,
        functools.partial(
            _wrap_functions,
            names=PARSE_FUNCTIONS,
            make=functools.partial(faulted, parse=True, engine=False),
        ),
    )
    engine_calls.on_import(
        PARSER_MODULE,
        functools.partial(
            _wrap_methods,
            class_name=PARSER_CLASS,
            names=PARSER_CALLS,
            make=functools.partial(faulted, parse=True, engine=True),
        ),
    )
    engine_calls.on_import(
        JOBS_MODULE,
        functools.partial(
            _wrap_functions,
            names=("_run_job",),
            make=functools.partial(_with_uploads, names_of=_job_file_names),
        ),
    )
    engine_calls.on_import(
        INSTALL_MODULE,
        functools.partial(_wrap_functions, names=("begin_install",), make=_noting_runtime),
    )
    engine_calls.on_import(
        WATCHER_MODULE,
        functools.partial(_wrap_functions, names=("watch_loop",), make=_reading_the_plan),
    )


#: Tests only: a directory where the worker starts and records engine-like child processes
#: (``tests/harness/children.py``, on the worker's path when a test sets this).
CHILDREN_ENV = "MINERU_HEALTH_FAULT_CHILDREN"


def _start_children() -> None:
    if not os.environ.get(CHILDREN_ENV):
        return
    from harness import children  # type: ignore[import-not-found]  # the tests' own

    children.start_from_env()

"""The fault plan as a plugin the test and demo sandboxes load into MinerU (never production).

The sandbox writes a ``sitecustomize.py`` next to its MinerU copy
(:func:`~mineru_health.testing.sandbox.add_fault_plugin`) that calls
:func:`load` when ``MINERU_HEALTH_FAULT_PLAN`` is set. The plugin attaches
itself from outside, through the post-import hook of
:mod:`~mineru_health.integration.engine_calls`, to what each MinerU line
imports:

* **Engine calls** (``engine_calls.ENGINE_CALL_SITES``, both lines): the
  planned failure or stall comes first, inside a
  :func:`~mineru_health.integration.engine_calls.local_engine_call`: in flight
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

The words are those of :mod:`.faults`; ``poison`` reads the upload names the
worker hooks keep in context (``engine_calls.current_upload_names``).
``engine_dead_idle`` and ``unknown_error_*`` act on 3.x's structures.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ..integration import engine_calls
from ..worker import WorkerHealth, worker_health
from .faults import FaultInjector, hang_s_from_env

__all__ = ["faulted", "injector", "load"]

#: MinerU 3.x: the module defining the parse functions, and their names.
PARSE_MODULE = "mineru.cli.common"
PARSE_FUNCTIONS = ("do_parse", "aio_do_parse")
#: MinerU 4.0: the parser class's module, the class and its parse calls.
PARSER_MODULE = "mineru.parser.mineru_parser"
PARSER_CLASS = "MinerUParser"
PARSER_CALLS = ("_arun_analysis", "_run_analysis")
#: The worker's event-loop watcher (both lines), which the plan's reads follow.
WATCHER_MODULE = "mineru_health.integration.worker.loop_watch"
POLL_S = 0.1

_MARK = "__mineru_health_faults__"
_log = logging.getLogger("mineru_health.faults")
_lock = threading.Lock()
_injector: FaultInjector | None = None

Plan = Callable[[], FaultInjector | None]


def injector() -> FaultInjector | None:
    """The process's plan, made on first use (``{port}`` needs the final argv)."""
    global _injector
    with _lock:
        if _injector is None:
            _injector = FaultInjector.from_env()
            if _injector is not None:
                _log.warning("fault injection enabled, plan file %s", _injector.plan_path)
        return _injector


def faulted(original: Callable[..., Any], *, parse: bool, engine: bool, plan: Plan = injector,
            health: Callable[[], WorkerHealth] = worker_health) -> Callable[..., Any]:
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
                    with engine_calls.local_engine_call(health()):
                        await planned.before_engine_call_async(
                            engine_calls.current_upload_names())
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
                with engine_calls.local_engine_call(health()):
                    planned.before_engine_call(engine_calls.current_upload_names())
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
        planned = injector()
        reads = None if planned is None else asyncio.get_running_loop().create_task(
            _read_plan(planned), name="mineru-health-fault-plan")
        try:
            return await watch_loop(*args, **kwargs)
        finally:
            if reads is not None:
                reads.cancel()

    setattr(watch_loop_and_plan, _MARK, True)
    return watch_loop_and_plan


def _wrap_methods(module: ModuleType, class_name: str, names: tuple[str, ...],
                  make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    cls = getattr(module, class_name, None)
    for name in names:
        current = getattr(cls, "__dict__", {}).get(name)
        if current is not None and not getattr(current, _MARK, False):
            setattr(cls, name, make(current))


def _wrap_functions(module: ModuleType, names: tuple[str, ...],
                    make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Wraps ``module``'s functions in every loaded module that bound them by name."""
    for name in names:
        original = getattr(module, name, None)
        if original is None or getattr(original, _MARK, False):
            continue
        wrapped = make(original)
        for holder in list(sys.modules.values()):
            if getattr(holder, "__dict__", {}).get(name) is original:
                setattr(holder, name, wrapped)


def load() -> None:
    """Arms the plan for this process: what it needs is wrapped when MinerU imports it.

    Raises ``ValueError`` on a bad ``MINERU_HEALTH_FAULT_HANG_S``.
    """
    hang_s_from_env()
    engine_call = functools.partial(faulted, parse=False, engine=True)
    for module_name, class_name, methods in engine_calls.ENGINE_CALL_SITES:
        engine_calls.on_import(module_name, functools.partial(
            _wrap_methods, class_name=class_name, names=methods, make=engine_call))
    engine_calls.on_import(PARSE_MODULE, functools.partial(
        _wrap_functions, names=PARSE_FUNCTIONS,
        make=functools.partial(faulted, parse=True, engine=False)))
    engine_calls.on_import(PARSER_MODULE, functools.partial(
        _wrap_methods, class_name=PARSER_CLASS, names=PARSER_CALLS,
        make=functools.partial(faulted, parse=True, engine=True)))
    engine_calls.on_import(WATCHER_MODULE, functools.partial(
        _wrap_functions, names=("watch_loop",), make=_reading_the_plan))

"""The fault plan on MinerU 4.0, as a plugin the test and demo sandboxes load (never production).

The sandbox writes a ``sitecustomize.py`` next to its MinerU copy that calls
:func:`load` when ``MINERU_HEALTH_FAULT_PLAN`` is set. Then:

* 4.0's parse call, ``MinerUParser._arun_analysis`` (and ``_run_analysis``),
  is where the engine raises: the flash tier runs no engine, so the planned
  fault stands in for an engine call (in flight while it raises or stalls,
  so a stalled one trips the stall watchdog; the parse itself is not one);
* the injector is handed to the worker hooks (``runtime.faults``), whose
  event-loop watcher polls the plan file (``hang`` sleeps on the loop).

* the worker hooks run each job with its files' names in context
  (``mineru4.worker.watch.follow_jobs``), which the ``poison`` word reads;
* ``parse_hang`` blocks the next parse call before it starts, outside any
  engine call: only the task watchdog sees it.

The words are those of :mod:`.faults` (``engine_dead_idle`` acts on 3.4's
structures and does nothing here).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from types import ModuleType
from typing import Any

from ..integration import engine_calls
from .faults import FaultInjector

PARSER_MODULE = "mineru.parser.mineru_parser"
PARSE_CALLS = ("_arun_analysis", "_run_analysis")

_MARK = "__mineru_health_faults__"
_injector: FaultInjector | None = None


def injector() -> FaultInjector | None:
    """The process's injector, made on first use (``{port}`` needs the final argv)."""
    global _injector
    if _injector is None:
        _injector = FaultInjector.from_env()
        if _injector is not None:
            from ..integration.worker.context import log, runtime

            runtime.faults = _injector
            log("WARNING", f"fault injection enabled, plan file {_injector.plan_path}")
    return _injector


def _faulted(original: Any) -> Any:
    from ..integration.worker.context import current_health

    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def parse_async(*args: Any, **kwargs: Any) -> Any:
            planned = injector()
            if planned is not None and planned.take_parse_hang():
                await asyncio.sleep(planned.hang_s)
            if planned is not None:
                state = current_health()
                state.engine_call_started()
                try:
                    await planned.before_engine_call_async(engine_calls.current_upload_names())
                finally:
                    state.engine_call_finished()
            return await original(*args, **kwargs)

        return parse_async

    @functools.wraps(original)
    def parse(*args: Any, **kwargs: Any) -> Any:
        planned = injector()
        if planned is not None and planned.take_parse_hang():
            threading.Event().wait(planned.hang_s)
        if planned is not None:
            state = current_health()
            state.engine_call_started()
            try:
                planned.before_engine_call(engine_calls.current_upload_names())
            finally:
                state.engine_call_finished()
        return original(*args, **kwargs)

    return parse


def _wrap_parser(module: ModuleType) -> None:
    injector()
    parser = getattr(module, "MinerUParser", None)
    for name in PARSE_CALLS:
        current = getattr(parser, "__dict__", {}).get(name)
        if current is not None and not getattr(current, _MARK, False):
            wrapped = _faulted(current)
            setattr(wrapped, _MARK, True)
            setattr(parser, name, wrapped)


def load() -> None:
    """Arms the plan for this process: MinerU's functions are wrapped when it imports them."""
    engine_calls.on_import(PARSER_MODULE, _wrap_parser)

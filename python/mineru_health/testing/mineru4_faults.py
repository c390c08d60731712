"""The fault plan on MinerU 4.0, as a plugin the test and demo sandboxes load (never production).

The sandbox writes a ``sitecustomize.py`` next to its MinerU copy that calls
:func:`load` when ``MINERU_HEALTH_FAULT_PLAN`` is set. Then:

* 4.0's parse call, ``MinerUParser._arun_analysis`` (and ``_run_analysis``),
  is where the engine raises: the flash tier runs no engine, so the planned
  fault stands in for an engine call (in flight while it raises or stalls,
  so a stalled one trips the stall watchdog; the parse itself is not one);
* the injector is handed to the worker hooks (``runtime.faults``), whose
  event-loop watcher polls the plan file (``hang`` sleeps on the loop).

* 4.0's ``_run_job`` (``mineru.parser.api_server``, looked up by name when a
  job starts) runs with its files' names in context, for the ``poison`` word.

The words are those of :mod:`.faults` (``engine_dead_idle`` acts on 3.4's
structures and does nothing here).
"""

from __future__ import annotations

import functools
import inspect
from types import ModuleType
from typing import Any

from ..integration import engine_calls
from .faults import FaultInjector

PARSER_MODULE = "mineru.parser.mineru_parser"
SERVER_MODULE = "mineru.parser.api_server"
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


def _wrap_run_job(module: ModuleType) -> None:
    run_job = getattr(module, "_run_job", None)
    if run_job is None or getattr(run_job, _MARK, False):
        return

    @functools.wraps(run_job)
    async def run_job_with_names(record: Any, *args: Any, **kwargs: Any) -> Any:
        names = [str(getattr(f, "name", "")) for f in getattr(record, "files", None) or ()]
        with engine_calls.upload_names(names):
            return await run_job(record, *args, **kwargs)

    setattr(run_job_with_names, _MARK, True)
    module._run_job = run_job_with_names  # type: ignore[attr-defined]


def load() -> None:
    """Arms the plan for this process: MinerU's functions are wrapped when it imports them."""
    engine_calls.on_import(PARSER_MODULE, _wrap_parser)
    engine_calls.on_import(SERVER_MODULE, _wrap_run_job)

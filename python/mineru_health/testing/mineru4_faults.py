"""The fault plan on MinerU 4.0, as a plugin the test and demo sandboxes load (never production).

The sandbox writes a ``sitecustomize.py`` next to its MinerU copy that calls
:func:`load` when ``MINERU_HEALTH_FAULT_PLAN`` is set. Then:

* 4.0's parse call, ``MinerUParser._arun_analysis`` (and ``_run_analysis``),
  is where the engine raises: the flash tier runs no engine, so this call
  stands in for one (counted as an engine call in flight, so a stalled one
  trips the stall watchdog) and consults :class:`~.faults.FaultInjector`
  first;
* the injector is handed to the worker hooks (``runtime.faults``), whose
  event-loop watcher polls the plan file (``hang`` sleeps on the loop).

The words are those of :mod:`.faults` (``engine_dead_idle`` and ``poison``
act on 3.4's structures and do nothing here).
"""

from __future__ import annotations

import functools
from types import ModuleType

from ..integration import engine_calls
from .faults import FaultInjector

PARSER_MODULE = "mineru.parser.mineru_parser"
PARSE_CALLS = ("_arun_analysis", "_run_analysis")

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


def _wrap_parser(module: ModuleType) -> None:
    from ..integration.worker.context import current_health

    injector()
    engine_calls.track(module, "MinerUParser", PARSE_CALLS, current_health, injector)


def load() -> None:
    """Arms the plan for this process: the parse call is wrapped when MinerU imports it."""
    engine_calls.on_import(PARSER_MODULE, functools.partial(_wrap_parser))

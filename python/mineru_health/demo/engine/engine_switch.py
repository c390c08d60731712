"""Closes a live worker's llama.cpp engine with the engine's own ``close()``: a real death, on cue.

Loaded into a ``mineru-api`` 4.0 process by the ``sitecustomize.py`` that
:func:`install_into_site` writes (the demo, the tests and ``bench/recovery`` only; nothing
else loads it), when ``ENGINE_SWITCH_CLOSE_ARM`` names an *arm file*. While that file exists,
the engine that completes its ``ENGINE_SWITCH_CLOSE_AFTER``-th
generation (default 1) in this process deletes the file and closes itself:
``mineru_llama_cpp.Engine.close()`` releases its core, as MinerU's shutdown
does, and every later call on that engine fails the way a released engine
fails (``'Engine' object has no attribute '_core'``, raised by the engine's own
``generate``). Nothing is raised here and no exception is made up: the
worker's hooks meet the engine's real failure and ask the real object.

The variables carry neither ``MINERU_`` (MinerU reads those as its configuration) nor
``MINERU_HEALTH_`` (mineru-health refuses variables of its prefix that it does not know).

One arm file, one death: the first engine to get there consumes it, so a
restarted worker (or the other worker of a fleet) keeps its engine.
"""

from __future__ import annotations

import functools
import os
import threading
from pathlib import Path
from typing import Any

ARM_ENV = "ENGINE_SWITCH_CLOSE_ARM"
AFTER_ENV = "ENGINE_SWITCH_CLOSE_AFTER"
_MARK = "__mineru_health_engine_switch__"

#: Appended to a sandbox site's ``sitecustomize.py`` (after the fault plugin's loader, if any).
_LOADER = """
# Written by mineru_health.demo.engine: the engine switch, for the demo and tests only.
import os
if os.environ.get("ENGINE_SWITCH_CLOSE_ARM"):
    import mineru_health.demo.engine.engine_switch
    mineru_health.demo.engine.engine_switch.load()
"""


def install_into_site(site: Path) -> Path:
    """Makes the processes started from ``site`` load this switch when they are armed.

    The site's ``sitecustomize.py`` gets the loader (once), after what it already holds.
    """
    custom = site / "sitecustomize.py"
    text = custom.read_text(encoding="utf-8") if custom.is_file() else ""
    if _LOADER not in text:
        custom.write_text(text + _LOADER, encoding="utf-8")
    return site


def load() -> None:
    """Arms this process: wraps ``Engine.generate`` to count completed generations."""
    arm = Path(os.environ[ARM_ENV])
    after = int(os.environ.get(AFTER_ENV, "1"))
    from mineru_llama_cpp import (  # type: ignore[import-not-found,unused-ignore]
        engine as engine_module,
    )

    generate = engine_module.Engine.generate
    if getattr(generate, _MARK, False):
        return
    lock = threading.Lock()
    completed = [0]

    @functools.wraps(generate)
    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = generate(self, *args, **kwargs)
        with lock:
            completed[0] += 1
            due = completed[0] >= after and _consume(arm)
        if due:
            self.close()
        return result

    setattr(counted, _MARK, True)
    engine_module.Engine.generate = counted  # type: ignore[method-assign,unused-ignore]


def _consume(arm: Path) -> bool:
    """True for the one process that removes the arm file."""
    try:
        arm.unlink()
    except FileNotFoundError:
        return False
    return True

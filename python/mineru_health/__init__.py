"""mineru-health: self-healing MinerU fleets (3.3–3.4 and 4.0 workers and routers).

    >>> import mineru_health
    >>> found = mineru_health.classify(exc)   # a Classification: fatal (engine died)?
    >>> found.fatal, found.rule

Public names are loaded on first use, so that light entry points (the
``mineru-health patch`` command) work without importing the native core.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (
    ConfigError,
    MineruHealthError,
    PatchError,
    RulesError,
    UnsupportedMinerUError,
)

__version__ = "0.4.0"

__all__ = [
    "Classification",
    "ConfigError",
    "Frame",
    "MineruHealthError",
    "PatchError",
    "Rule",
    "RuleKind",
    "Rules",
    "RulesError",
    "UnsupportedMinerUError",
    "Verdict",
    "WorkerHealth",
    "__version__",
    "classify",
    "classify_text",
    "default_rules",
    "frames_from_exception",
    "frames_from_text",
    "load_rules",
    "reload_rules",
]

_LAZY = {
    "Frame": "frames",
    "frames_from_exception": "frames",
    "frames_from_text": "tracebacks",
    "Rule": "classifier",
    "RuleKind": "classifier",
    "Rules": "classifier",
    "Classification": "classifier",
    "Verdict": "classifier",
    "classify": "classifier",
    "classify_text": "tracebacks",
    "default_rules": "classifier",
    "load_rules": "classifier",
    "reload_rules": "classifier",
    "WorkerHealth": "runtime.worker.health",
}

if TYPE_CHECKING:
    from .classifier import (
        Classification,
        Rule,
        RuleKind,
        Rules,
        Verdict,
        classify,
        default_rules,
        load_rules,
        reload_rules,
    )
    from .frames import Frame, frames_from_exception
    from .runtime.worker.health import WorkerHealth
    from .tracebacks import classify_text, frames_from_text


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mineru_health' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

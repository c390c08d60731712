"""The process's own Prometheus registry and the metric sets created in it on first use.

Never the library's global registry, so nothing MinerU or its libraries
register can collide with our names. Thread-safe: ``metric_set`` creates each
set once under a lock; prometheus-client's metric objects lock internally.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector

__all__ = ["ProcessRegistry", "current", "reset"]

T = TypeVar("T")


class ProcessRegistry:
    """A registry with the standard ``process_*``/``python_info`` collectors and lazy metric sets."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self._lock = threading.Lock()
        self._sets: dict[Callable[[CollectorRegistry], Any], Any] = {}

    def metric_set(self, factory: Callable[[CollectorRegistry], T]) -> T:
        """The set ``factory(registry)`` made the first time it was asked for, reused after."""
        with self._lock:
            found = self._sets.get(factory)
            if found is None:
                found = factory(self.registry)
                self._sets[factory] = found
            return cast(T, found)


_current = ProcessRegistry()


def current() -> ProcessRegistry:
    return _current


def reset() -> None:
    """Starts over from an empty registry (tests only)."""
    global _current
    _current = ProcessRegistry()

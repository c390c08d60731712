"""The process's own Prometheus registry and the metric sets created in it on first use.

Never the library's global registry, so nothing MinerU or its libraries
register can collide with our names. Thread-safe: ``metric_set`` creates each
set once under a lock; prometheus-client's metric objects lock internally.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .. import safe_text

__all__ = ["BoundSourceCollector", "Family", "ProcessRegistry", "current", "reset"]

_log = safe_text.logger("mineru_health.metrics")

#: The metric families a BoundSourceCollector exports.
Family = GaugeMetricFamily | CounterMetricFamily

T = TypeVar("T")


class ProcessRegistry:
    """A registry with the standard ``process_*``/``python_info`` collectors, lazy metric sets."""

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


class BoundSourceCollector(Collector):
    """Families computed at every scrape from a bound source of state owned elsewhere.

    The way prometheus-client's ``ProcessCollector`` reads /proc: the value is
    read when scraped, never copied, so it cannot drift. Subclasses give
    ``families()`` (fresh, empty families) and ``fill(families, value)``.
    Unbound, or when the source raises, the families are exported empty: a
    scrape always answers. Thread-safe: binding swaps one reference;
    ``collect`` runs on whichever thread scrapes.
    """

    what = "state"  # for the log line when the source fails

    def __init__(self) -> None:
        self._source: Callable[[], Any] | None = None

    def bind(self, source: Callable[[], Any] | None) -> None:
        self._source = source

    def families(self) -> tuple[Family, ...]:
        raise NotImplementedError

    def fill(self, families: tuple[Family, ...], value: Any) -> None:
        raise NotImplementedError

    def describe(self) -> Iterator[Family]:
        # Names only: registering must not call the source.
        yield from self.families()

    def collect(self) -> Iterator[Family]:
        families = self.families()
        source = self._source
        if source is not None:
            try:
                value = source()
            except Exception:  # noqa: BLE001 -- a scrape must answer even if the source broke
                _log.exception("reading %s for /metrics failed", self.what)
            else:
                self.fill(families, value)
        yield from families


_current = ProcessRegistry()


def current() -> ProcessRegistry:
    return _current


def reset() -> None:
    """Starts over from an empty registry (tests only)."""
    global _current
    _current = ProcessRegistry()

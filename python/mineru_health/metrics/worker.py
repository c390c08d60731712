"""Worker-side metrics (``mineru-api``), called by ``mineru_health.runtime.worker``.

- ``bind_worker_healthy(fn)``            -- the healthy gauge reads ``fn()`` at
  scrape time (e.g. ``lambda: state.healthy()``); preferred over pushing.
- ``set_worker_healthy(healthy)``        -- push form, when no callable fits.
- ``record_worker_fatal(rule, category)`` -- one fatal (engine-dead) failure.
- ``record_worker_task_local(remote_engine=False)`` -- one failure that
  stayed task-local (a remote engine's failure is counted apart too).
- ``bind_worker_snapshot(fn)``           -- the engine and loop gauges read
  ``fn()`` (the native state's snapshot) at scrape time: never copied.

Families:

- ``mineru_worker_healthy`` gauge: 1 while the engine is usable, 0 after a
  fatal error (the same fact as ``/health`` answering 503).
- ``mineru_worker_fatal_errors_total{rule,category}`` counter.
- ``mineru_worker_task_local_failures_total`` counter.
- ``mineru_worker_remote_engine_failures_total`` counter: failures of a remote
  engine (``*-http-client`` backends), task-local for this worker.
- ``mineru_worker_loop_lag_seconds`` gauge: seconds since the event loop last
  ticked (busy, not broken, until ``MINERU_HEALTH_LOOP_HANG_S``).
- ``mineru_worker_engine_calls_in_flight`` gauge.
- ``mineru_worker_seconds_since_progress`` gauge: while engine calls are in
  flight, seconds since one of them (or one engine request) completed; absent
  otherwise.
- ``mineru_worker_ambiguous_errors_total`` counter: ambiguous device errors
  (``MINERU_HEALTH_ERROR_BUDGET`` of them within the window are fatal).

Every function is thread-safe (the task-failure hook runs on MinerU's
threads) and never raises on odd label values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ._registry import BoundSourceCollector, Family, current

__all__ = [
    "METRIC_NAMES",
    "WorkerSnapshotCollector",
    "bind_worker_healthy",
    "bind_worker_snapshot",
    "ensure_families",
    "record_worker_fatal",
    "record_worker_task_local",
    "set_worker_healthy",
]

METRIC_NAMES: tuple[str, ...] = (
    "mineru_worker_healthy",
    "mineru_worker_fatal_errors_total",
    "mineru_worker_task_local_failures_total",
    "mineru_worker_remote_engine_failures_total",
    "mineru_worker_loop_lag_seconds",
    "mineru_worker_engine_calls_in_flight",
    "mineru_worker_seconds_since_progress",
    "mineru_worker_ambiguous_errors_total",
)


class WorkerSnapshotCollector(BoundSourceCollector):
    """The engine and event-loop gauges, from the worker's ``HealthSnapshot``
    (``mineru_health.worker``) at every scrape."""

    what = "the worker state"

    def families(self) -> tuple[Family, ...]:
        return (
            GaugeMetricFamily("mineru_worker_loop_lag_seconds",
                              "Seconds since the worker's event loop last ticked."),
            GaugeMetricFamily("mineru_worker_engine_calls_in_flight",
                              "Engine calls (batches or windows of pages) in flight."),
            GaugeMetricFamily("mineru_worker_seconds_since_progress",
                              "While engine calls are in flight: seconds since one completed."),
            CounterMetricFamily("mineru_worker_ambiguous_errors",
                                "Ambiguous device errors (counted against the error budget)."),
        )

    def fill(self, families: tuple[Family, ...], value: Any) -> None:
        lag, in_flight, quiet, ambiguous = families
        if value.loop_lag_s is not None:
            lag.add_metric([], float(value.loop_lag_s))
        in_flight.add_metric([], float(value.engine_calls_in_flight))
        if value.seconds_since_progress is not None:
            quiet.add_metric([], float(value.seconds_since_progress))
        ambiguous.add_metric([], float(value.ambiguous_count))


class _WorkerMetrics:
    def __init__(self, reg: CollectorRegistry) -> None:
        self.healthy = Gauge(
            "mineru_worker_healthy",
            "1 while this worker's inference engine is usable, 0 after a fatal error.",
            registry=reg,
        )
        # A worker starts healthy, as its native WorkerState does.
        self.healthy.set(1)
        # True once bind_worker_healthy() made the gauge read a callable.
        self.healthy_bound = False
        self.fatal = Counter(
            "mineru_worker_fatal_errors",
            "Task failures classified as fatal for the engine, by rule and category.",
            ["rule", "category"],
            registry=reg,
        )
        self.task_local = Counter(
            "mineru_worker_task_local_failures",
            "Task failures that were classified as affecting one task only.",
            registry=reg,
        )
        self.remote_engine = Counter(
            "mineru_worker_remote_engine_failures",
            "Task failures of a remote engine (http-client backends); task-local here.",
            registry=reg,
        )
        self.snapshot = WorkerSnapshotCollector()
        reg.register(self.snapshot)


def _metrics() -> _WorkerMetrics:
    return current().metric_set(_WorkerMetrics)


def ensure_families() -> None:
    """Creates the worker families, so they show from the first scrape."""
    _metrics()


def set_worker_healthy(healthy: bool) -> None:
    """Pushes the worker's health (1 healthy, 0 engine dead)."""
    _metrics().healthy.set(1 if healthy else 0)


def bind_worker_healthy(fn: Callable[[], bool]) -> None:
    """Makes the healthy gauge call ``fn`` at every scrape instead of pushing.

    ``fn`` runs on the scraping thread; it must be cheap, must not block and
    must not raise.
    """

    def read() -> float:
        return 1.0 if fn() else 0.0

    metrics = _metrics()
    metrics.healthy.set_function(read)
    metrics.healthy_bound = True


def record_worker_fatal(rule: str, category: str) -> None:
    """Counts one fatal failure and marks the worker unhealthy.

    If the gauge is bound to a callable (bind_worker_healthy) the callable
    stays the source of truth and this only counts.
    """
    metrics = _metrics()
    metrics.fatal.labels(rule=rule or "unknown", category=category or "unknown").inc()
    # set() would replace a bound callable, so push only when nothing is bound.
    if not metrics.healthy_bound:
        metrics.healthy.set(0)


def record_worker_task_local(*, remote_engine: bool = False) -> None:
    """Counts one failure that the classifier kept task-local (a remote engine's, too)."""
    metrics = _metrics()
    metrics.task_local.inc()
    if remote_engine:
        metrics.remote_engine.inc()


def bind_worker_snapshot(fn: Callable[[], Any] | None) -> None:
    """Makes the engine and loop gauges read ``fn()`` (a ``HealthSnapshot``) at every scrape."""
    _metrics().snapshot.bind(fn)

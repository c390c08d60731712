"""Worker-side metrics (``mineru-api``), read from the native worker state at scrape time.

- ``bind_worker_healthy(fn)``  -- the healthy gauge reads ``fn()`` at scrape
  time (``lambda: state.healthy``).
- ``bind_worker_snapshot(fn)`` -- every other family reads ``fn()`` (the
  native state's snapshot) at scrape time: nothing is pushed or copied, so a
  fatal record made anywhere (a rule, verification, the stall or hung-task
  watchdog, the error budget, the liveness check) is counted, once.

Families:

- ``mineru_worker_healthy`` gauge: 1 while the engine is usable, 0 after a
  fatal error (the same fact as ``/health`` answering 503).
- ``mineru_worker_fatal_errors_total{rule,category}`` counter: fatal records.
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
- ``mineru_worker_storage_full_refusals_total`` counter: submissions answered
  507 because the disk or quota where the worker stores them is full.
- ``mineru_worker_remote_wait_failures_total{reason}`` counter: tasks failed
  by their remote wait's bounds (issue 32): ``silent`` (their server sent
  nothing for ``MINERU_HEALTH_TASK_HANG_S``) or ``total`` (past
  ``MINERU_HEALTH_REMOTE_WAIT_S``); of the remote-engine failures.
- ``mineru_worker_remote_waits`` gauge: tasks waiting on a remote engine now.

Thread-safe: the scrape runs on the metrics endpoint's thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ._registry import BoundSourceCollector, Family, ProcessRegistry, current

__all__ = [
    "METRIC_NAMES",
    "WorkerSnapshotCollector",
    "bind_worker_healthy",
    "bind_worker_snapshot",
    "ensure_families",
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
    "mineru_worker_storage_full_refusals_total",
    "mineru_worker_remote_wait_failures_total",
    "mineru_worker_remote_waits",
)


class WorkerSnapshotCollector(BoundSourceCollector):
    """The engine and event-loop gauges, from the worker's ``HealthSnapshot``
    (``mineru_health.runtime.worker.health``) at every scrape."""

    what = "the worker state"

    def families(self) -> tuple[Family, ...]:
        return (
            CounterMetricFamily(
                "mineru_worker_fatal_errors",
                "Fatal records of this worker's engine, by rule and category.",
                labels=["rule", "category"],
            ),
            CounterMetricFamily(
                "mineru_worker_task_local_failures",
                "Task failures that were classified as affecting one task only.",
            ),
            CounterMetricFamily(
                "mineru_worker_remote_engine_failures",
                "Task failures of a remote engine (http-client backends); task-local here.",
            ),
            GaugeMetricFamily(
                "mineru_worker_loop_lag_seconds",
                "Seconds since the worker's event loop last ticked.",
            ),
            GaugeMetricFamily(
                "mineru_worker_engine_calls_in_flight",
                "Engine calls (batches or windows of pages) in flight.",
            ),
            GaugeMetricFamily(
                "mineru_worker_seconds_since_progress",
                "While engine calls are in flight: seconds since one completed.",
            ),
            CounterMetricFamily(
                "mineru_worker_ambiguous_errors",
                "Ambiguous device errors (counted against the error budget).",
            ),
            CounterMetricFamily(
                "mineru_worker_storage_full_refusals",
                "Submissions answered 507: the worker's storage is full.",
            ),
            CounterMetricFamily(
                "mineru_worker_remote_wait_failures",
                "Tasks failed by their remote wait's bounds, by reason "
                "(silent: nothing heard; total: waited too long).",
                labels=["reason"],
            ),
            GaugeMetricFamily(
                "mineru_worker_remote_waits", "Tasks waiting on a remote engine server now."
            ),
        )

    def fill(self, families: tuple[Family, ...], value: Any) -> None:
        (
            fatal,
            task_local,
            remote,
            lag,
            in_flight,
            quiet,
            ambiguous,
            storage,
            remote_failed,
            remote_waits,
        ) = families
        for counted in value.fatal_counts:
            fatal.add_metric(
                [counted.rule or "unknown", counted.category or "unknown"], float(counted.count)
            )
        task_local.add_metric([], float(value.task_local_count))
        remote.add_metric([], float(value.remote_engine_failure_count))
        if value.loop_lag_s is not None:
            lag.add_metric([], float(value.loop_lag_s))
        in_flight.add_metric([], float(value.engine_calls_in_flight))
        if value.seconds_since_progress is not None:
            quiet.add_metric([], float(value.seconds_since_progress))
        ambiguous.add_metric([], float(value.ambiguous_count))
        storage.add_metric([], float(value.storage_full_count))
        remote_failed.add_metric(["silent"], float(value.remote_silent_count))
        remote_failed.add_metric(["total"], float(value.remote_too_long_count))
        remote_waits.add_metric([], float(value.remote_waits))


class _WorkerMetrics:
    def __init__(self, reg: CollectorRegistry) -> None:
        self.healthy = Gauge(
            "mineru_worker_healthy",
            "1 while this worker's inference engine is usable, 0 after a fatal error.",
            registry=reg,
        )
        # A worker starts healthy, as its native WorkerState does.
        self.healthy.set(1)
        self.snapshot = WorkerSnapshotCollector()
        reg.register(self.snapshot)


def _metrics(registry: ProcessRegistry | None) -> _WorkerMetrics:
    return (registry if registry is not None else current()).metric_set(_WorkerMetrics)


def ensure_families(registry: ProcessRegistry | None = None) -> None:
    """Creates the worker families in ``registry`` (a worker runtime's; the process's
    otherwise), so they show from the first scrape."""
    _metrics(registry)


def bind_worker_healthy(fn: Callable[[], bool], registry: ProcessRegistry | None = None) -> None:
    """Makes the healthy gauge (of ``registry``, as for :func:`ensure_families`) call ``fn``
    at every scrape.

    ``fn`` runs on the scraping thread; it must be cheap, must not block and
    must not raise.
    """

    def read() -> float:
        return 1.0 if fn() else 0.0

    _metrics(registry).healthy.set_function(read)


def bind_worker_snapshot(
    fn: Callable[[], Any] | None, registry: ProcessRegistry | None = None
) -> None:
    """Makes the worker families (of ``registry``) read ``fn()`` (the native
    ``WorkerSnapshot``) at every scrape."""
    _metrics(registry).snapshot.bind(fn)

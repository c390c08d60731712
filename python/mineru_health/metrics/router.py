"""Router-side metrics (``mineru-router``), fed by ``mineru_health.runtime.router``.

Two kinds, by where the truth lives:

- **State** belongs to the native restart policy. ``bind_worker_statuses(fn)``
  registers ``fn`` (the poller's ``statuses()``); a custom collector calls it
  at every scrape, as prometheus-client's ``ProcessCollector`` reads /proc, so
  these gauges cannot drift from ``/health``:

  - ``mineru_router_worker_state{worker,state}`` gauge: 1 for the worker's
    current phase, 0 for the six others (all seven series always exist).
  - ``mineru_router_worker_consecutive_failures{worker}`` gauge.

- The **poller's own counters** (``bind_poller_stats(fn)``, the poller's
  ``stats()``), read the same way: ``mineru_router_poller_dropped_events_total``
  (probe events lost because the router did not drain them),
  ``mineru_router_poller_io_errors_total`` and ``mineru_router_poller_io_failing``
  (the poller's own I/O is failing: probing has stalled), and
  ``mineru_router_ejections_suppressed_total`` (ejections the mass-ejection
  guard held back).

- **Admission refusals** (``bind_admission_refusals(fn)``, the supervisor's
  ``refusal_counts``), read the same way:
  ``mineru_router_storage_full_refusals_total`` (submissions answered 507:
  the router could not keep them on its disk) and
  ``mineru_router_kept_cap_refusals_total`` (answered 503: the caps on kept
  submissions and bytes were reached).

- The **bounds broken by worker answers** (``bind_upstream_reads(fn)``, the
  ``broken()`` of ``runtime.router.upstream_reads``, where the count lives):
  ``mineru_router_upstream_bounds_broken_total{worker,bound}``, ``worker``
  the worker's address, ``bound`` one of ``size``, ``time``, ``encoding``.

- **Events** are counted as they are handled on the router's loop:

  - ``observe_probe(worker, latency_s, status, unix_time)`` -- every finished
    probe: ``mineru_router_probe_duration_seconds{worker}`` histogram,
    ``mineru_router_probes_total{worker,status}`` counter (``status`` is the
    probe classification: ``healthy``, ``timeout``, ``engine_dead`` ...) and
    ``mineru_router_last_probe_timestamp_seconds{worker}`` gauge (unix time).
    The poller has no sweeps -- each worker is probed on its own jittered
    schedule -- so instead of a sweep duration we expose when each worker was
    last probed: ``time() - x`` growing past a few intervals means probes are
    falling behind (the failure mode a sweep duration would reveal).
  - ``record_audit(worker, action, reason_kind="")`` -- every audit record:
    ``mineru_router_audit_events_total{worker,action}``,
    ``mineru_router_restarts_total{worker,outcome}`` (``started``, then
    ``succeeded`` once the worker stayed healthy for the stability window, or
    ``failed``), ``mineru_router_gave_up_total{worker}`` and
    ``mineru_router_ejections_total{worker,reason}``; ``reason`` is a probe
    status, ``process_exit``, ``passive_failure`` or ``other`` (never free
    text: labels must stay bounded).
  - ``forget_worker(worker)`` -- a worker left the pool: drops its counters.
  - ``record_resubmission(reason)`` -- a task sent again to another worker:
    ``mineru_router_task_resubmissions_total{reason}``, one series per
    ``policy.ResubmitReason`` (``engine_dead``: its upstream failed with the
    engine; ``hung``: the worker's task watchdog failed it; ``lost``: the
    worker's current instance does not know it; ``worker_failed``: its worker
    was declared failed; ``router_restart``: a new router resumed it from its
    store).
  - ``record_resubmission_refused(cause)`` -- a task left failed instead:
    ``mineru_router_task_resubmissions_refused_total{cause}`` (``retries``,
    ``budget``, ``no_worker``, ``poison``, ``rejected``).
  - ``record_poison_document()`` -- a document quarantined after killing
    engines on two workers: ``mineru_router_poison_documents_total``.

Every function is thread-safe and none raises on odd values: metrics must
never break the request path. Phase, action and probe status names are the
native module's ``to_string`` spellings, enumerated from its enums.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from mineru_health import _native
from mineru_health._names import enum_name, enum_names
from mineru_health.runtime.router.policy import Refusal, ResubmitReason

from ._registry import BoundSourceCollector, Family, current

__all__ = [
    "AUDIT_ACTIONS",
    "EJECTION_REASONS",
    "METRIC_NAMES",
    "WORKER_STATES",
    "AdmissionRefusalCollector",
    "PollerStatsCollector",
    "WorkerStatusCollector",
    "bind_admission_refusals",
    "bind_poller_stats",
    "bind_upstream_reads",
    "bind_worker_statuses",
    "ensure_families",
    "forget_worker",
    "observe_probe",
    "record_audit",
    "record_ejection",
    "record_poison_document",
    "record_resubmission",
    "record_resubmission_refused",
]

# The phases of the native RestartPolicy, as its to_string() spells them.
WORKER_STATES: tuple[str, ...] = enum_names(_native.WorkerPhase)

# Audit action names, as the audit log writes them.
AUDIT_ACTIONS: tuple[str, ...] = enum_names(_native.AuditAction)

_HEALTHY_PROBE = enum_name(_native.ProbeStatus.HEALTHY)

# Every cause the native policy names (probe failure classifications, then
# process_exit, passive_failure, ...); anything else is counted as "other" so
# the label set stays bounded.
EJECTION_REASONS: tuple[str, ...] = (*_native.failure_cause_names(), "other")

METRIC_NAMES: tuple[str, ...] = (
    "mineru_router_worker_state",
    "mineru_router_worker_consecutive_failures",
    "mineru_router_probe_duration_seconds",
    "mineru_router_probes_total",
    "mineru_router_last_probe_timestamp_seconds",
    "mineru_router_restarts_total",
    "mineru_router_gave_up_total",
    "mineru_router_ejections_total",
    "mineru_router_audit_events_total",
    "mineru_router_poller_dropped_events_total",
    "mineru_router_poller_io_errors_total",
    "mineru_router_poller_io_failing",
    "mineru_router_ejections_suppressed_total",
    "mineru_router_task_resubmissions_total",
    "mineru_router_task_resubmissions_refused_total",
    "mineru_router_poison_documents_total",
    "mineru_router_storage_full_refusals_total",
    "mineru_router_kept_cap_refusals_total",
    "mineru_router_upstream_bounds_broken_total",
)

#: Label values of the resubmission counters (anything else is counted as "other").
#: The label values, from the enums the policy decides with: a new reason has its series.
RESUBMIT_REASONS: tuple[str, ...] = tuple(r.value for r in ResubmitReason)
REFUSAL_CAUSES: tuple[str, ...] = tuple(r.value for r in Refusal)

# Healthy probes answer in milliseconds; failing ones run up to the probe
# timeout (1.5 s by default, 10 s in the slowest preset).
_PROBE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

StatusSource = Callable[[], Iterable[Any]]
StatsSource = Callable[[], Any]


class WorkerStatusCollector(BoundSourceCollector):
    """The state gauges, from the poller's ``statuses()`` (``id``, ``phase``,
    ``consecutive_failures`` of each ``WorkerStatus``) at every scrape."""

    what = "worker statuses"

    def families(self) -> tuple[Family, ...]:
        return (
            GaugeMetricFamily(
                "mineru_router_worker_state",
                "1 for the worker's current health phase, 0 for the others.",
                labels=["worker", "state"],
            ),
            GaugeMetricFamily(
                "mineru_router_worker_consecutive_failures",
                "Failed probes in a row for the worker.",
                labels=["worker"],
            ),
        )

    def fill(self, families: tuple[Family, ...], value: Iterable[Any]) -> None:
        state, failures = families
        for status in value:
            try:
                phase = enum_name(status.phase)
                worker = str(status.id)
                count = float(status.consecutive_failures)
            except (AttributeError, TypeError, ValueError):
                continue  # not a status: leave it out rather than fail the scrape
            for name in WORKER_STATES:
                state.add_metric([worker, name], 1.0 if name == phase else 0.0)
            failures.add_metric([worker], count)


class PollerStatsCollector(BoundSourceCollector):
    """The poller's own counters (``PollerStats``): lost events, I/O errors and
    held-back ejections live in the native poller; read, never copied."""

    what = "poller stats"

    def families(self) -> tuple[Family, ...]:
        return (
            CounterMetricFamily(
                "mineru_router_poller_dropped_events",
                "Probe events the poller dropped because the router did not drain them.",
            ),
            CounterMetricFamily(
                "mineru_router_poller_io_errors",
                "Failed calls of the poller's own I/O (libcurl, epoll).",
            ),
            GaugeMetricFamily(
                "mineru_router_poller_io_failing",
                "1 while the poller's I/O keeps failing (probing has stalled).",
            ),
            CounterMetricFamily(
                "mineru_router_ejections_suppressed",
                "Ejections held back by the mass-ejection guard (MAX_EJECTION_PERCENT).",
            ),
        )

    def fill(self, families: tuple[Family, ...], value: Any) -> None:
        dropped, io_errors, failing, suppressed = families
        dropped.add_metric([], float(value.dropped_events))
        io_errors.add_metric([], float(value.io_errors))
        failing.add_metric([], 1.0 if value.io_failing else 0.0)
        suppressed.add_metric([], float(value.ejections_suppressed))


class AdmissionRefusalCollector(BoundSourceCollector):
    """Submissions the router refused at admission, from the supervisor's counts
    (``{"storage_full": n, "kept_cap": n}``), read at every scrape."""

    what = "admission refusals"

    def families(self) -> tuple[Family, ...]:
        return (
            CounterMetricFamily(
                "mineru_router_storage_full_refusals",
                "Submissions refused with 507: the router could not keep them on its disk.",
            ),
            CounterMetricFamily(
                "mineru_router_kept_cap_refusals",
                "Submissions refused with 503: the caps on kept submissions or bytes.",
            ),
        )

    def fill(self, families: tuple[Family, ...], value: Any) -> None:
        storage, cap = families
        storage.add_metric([], float(value.get("storage_full", 0)))
        cap.add_metric([], float(value.get("kept_cap", 0)))


class UpstreamReadsCollector(BoundSourceCollector):
    """Bounds that worker answers broke (``UpstreamReads.broken()``), read at every scrape."""

    what = "bounds broken by worker answers"

    def families(self) -> tuple[Family, ...]:
        return (
            CounterMetricFamily(
                "mineru_router_upstream_bounds_broken",
                "Worker answers cut for breaking a bound (size, time, encoding), by worker address.",
                labels=["worker", "bound"],
            ),
        )

    def fill(self, families: tuple[Family, ...], value: Any) -> None:
        (broken,) = families
        for (worker, bound), count in dict(value).items():
            broken.add_metric([str(worker), str(bound)], float(count))


class _RouterMetrics:
    def __init__(self, reg: CollectorRegistry) -> None:
        self.admission = AdmissionRefusalCollector()
        reg.register(self.admission)
        self.upstream_reads = UpstreamReadsCollector()
        reg.register(self.upstream_reads)
        self.statuses = WorkerStatusCollector()
        reg.register(self.statuses)
        self.poller = PollerStatsCollector()
        reg.register(self.poller)
        self.probe_duration = Histogram(
            "mineru_router_probe_duration_seconds",
            "Time one GET /health probe took, failures included.",
            ["worker"],
            buckets=_PROBE_BUCKETS,
            registry=reg,
        )
        self.probes = Counter(
            "mineru_router_probes",
            "Finished probes, by classification.",
            ["worker", "status"],
            registry=reg,
        )
        self.last_probe = Gauge(
            "mineru_router_last_probe_timestamp_seconds",
            "Unix time the worker's last probe finished.",
            ["worker"],
            registry=reg,
        )
        self.restarts = Counter(
            "mineru_router_restarts",
            "Restart attempts of router-managed workers: started, succeeded (stable), failed.",
            ["worker", "outcome"],
            registry=reg,
        )
        self.gave_up = Counter(
            "mineru_router_gave_up",
            "Times the router stopped restarting a worker after max attempts.",
            ["worker"],
            registry=reg,
        )
        self.ejections = Counter(
            "mineru_router_ejections",
            "Times a worker was taken out of rotation, by cause.",
            ["worker", "reason"],
            registry=reg,
        )
        self.audit = Counter(
            "mineru_router_audit_events",
            "Audit records written, by action.",
            ["worker", "action"],
            registry=reg,
        )
        self.resubmissions = Counter(
            "mineru_router_task_resubmissions",
            "Tasks sent again to another worker, by reason.",
            ["reason"],
            registry=reg,
        )
        self.refused = Counter(
            "mineru_router_task_resubmissions_refused",
            "Tasks left failed instead of resubmitted, by cause.",
            ["cause"],
            registry=reg,
        )
        self.poison = Counter(
            "mineru_router_poison_documents",
            "Documents quarantined after killing the engine of two different workers.",
            registry=reg,
        )


def _metrics() -> _RouterMetrics:
    return current().metric_set(_RouterMetrics)


_ENUMS = (_native.ProbeStatus, _native.WorkerPhase, _native.AuditAction)


def _name(value: object) -> str:
    """A native enum member's to_string() spelling; strings pass through; anything else "other"."""
    if isinstance(value, str):
        return value
    if isinstance(value, _ENUMS):
        return enum_name(value)
    return "other"


def ensure_families() -> None:
    """Creates the router families, so they show from the first scrape."""
    _metrics()


def bind_worker_statuses(source: StatusSource | None) -> None:
    """Makes the state gauges read ``source()`` (the poller's ``statuses``) at every scrape.

    ``source`` runs on the scraping thread; it must be cheap and must not
    block for long (the poller takes its mutex briefly). ``None`` unbinds.
    """
    _metrics().statuses.bind(source)


def bind_poller_stats(source: StatsSource | None) -> None:
    """Makes the poller counters read ``source()`` (the poller's ``stats``) at every scrape."""
    _metrics().poller.bind(source)


def bind_admission_refusals(source: Callable[[], Any] | None) -> None:
    """Makes the refusal counters read ``source()`` (the supervisor's ``refusal_counts``)."""
    _metrics().admission.bind(source)


def bind_upstream_reads(source: StatsSource | None) -> None:
    """Makes the bounds-broken counter read ``source()`` (``UpstreamReads.broken``) at scrapes."""
    _metrics().upstream_reads.bind(source)


def observe_probe(
    worker: str, latency_s: float, status: object = _HEALTHY_PROBE, unix_time: float | None = None
) -> None:
    """Records one finished probe: its latency, its classification and when it ended.

    ``status`` is the probe classification ("healthy", "timeout", ... or the
    native enum member); anything else is counted as "other".
    """
    metrics = _metrics()
    name = _name(status)
    if name != _HEALTHY_PROBE and name not in EJECTION_REASONS:
        name = "other"
    metrics.probe_duration.labels(worker=worker).observe(max(0.0, float(latency_s)))
    metrics.probes.labels(worker=worker, status=name).inc()
    metrics.last_probe.labels(worker=worker).set(time.time() if unix_time is None else unix_time)


def record_ejection(worker: str, reason_kind: str) -> None:
    """Counts one removal from rotation; ``reason_kind`` outside EJECTION_REASONS is "other"."""
    kind = reason_kind if reason_kind in EJECTION_REASONS else "other"
    _metrics().ejections.labels(worker=worker, reason=kind).inc()


def record_audit(worker: str, action: object, reason_kind: str = "") -> None:
    """Counts one audit record and the counter it implies.

    ``action`` is the audit log's action name (AUDIT_ACTIONS) or the native
    enum member. ``reason_kind`` matters for ``ejected`` only: the cause the
    native policy recorded (a probe status, ``process_exit``, ``passive_failure``...).
    """
    name = _name(action)
    if name not in AUDIT_ACTIONS:
        name = "other"
    metrics = _metrics()
    metrics.audit.labels(worker=worker, action=name).inc()
    if name == "auto_restart_requested":
        metrics.restarts.labels(worker=worker, outcome="started").inc()
    elif name == "auto_restart_success":
        metrics.restarts.labels(worker=worker, outcome="succeeded").inc()
    elif name == "auto_restart_failed":
        metrics.restarts.labels(worker=worker, outcome="failed").inc()
    elif name == "auto_restart_gave_up":
        metrics.gave_up.labels(worker=worker).inc()
    elif name == "ejected":
        record_ejection(worker, reason_kind)


def record_resubmission(reason: str) -> None:
    """Counts one task resubmitted; ``reason`` outside RESUBMIT_REASONS is "other"."""
    _metrics().resubmissions.labels(reason=reason if reason in RESUBMIT_REASONS else "other").inc()


def record_resubmission_refused(cause: str) -> None:
    """Counts one task left failed; ``cause`` outside REFUSAL_CAUSES is "other"."""
    _metrics().refused.labels(cause=cause if cause in REFUSAL_CAUSES else "other").inc()


def record_poison_document() -> None:
    _metrics().poison.inc()


def forget_worker(worker: str) -> None:
    """Drops the worker's event series (it left the pool); counters restart at 0 if it returns.

    Its state series need nothing: they disappear with its status.
    """
    metrics = _metrics()
    _remove(metrics.probe_duration, worker)
    _remove(metrics.last_probe, worker)
    _remove(metrics.gave_up, worker)
    for status in (*EJECTION_REASONS, _HEALTHY_PROBE):
        _remove(metrics.probes, worker, status)
    for outcome in ("started", "succeeded", "failed"):
        _remove(metrics.restarts, worker, outcome)
    for reason in EJECTION_REASONS:
        _remove(metrics.ejections, worker, reason)
    for action in (*AUDIT_ACTIONS, "other"):
        _remove(metrics.audit, worker, action)


def _remove(metric: Gauge | Counter | Histogram, *labels: str) -> None:
    try:
        metric.remove(*labels)
    except KeyError:
        pass  # that combination was never recorded

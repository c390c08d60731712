"""Router-side metrics (``mineru-router``), fed by ``mineru_health.runtime.router``.

Two kinds, by where the truth lives:

- **State and events** belong to the native poller, which makes every probe
  and every restart-policy call and counts them where they happen
  (``worker_counters.h``). ``bind_worker_statuses(fn)`` registers ``fn`` (the
  poller's ``statuses()``); a custom collector calls it at every scrape, as
  prometheus-client's ``ProcessCollector`` reads /proc, so these cannot drift
  from ``/health`` or miss an event the router did not drain; a worker that
  leaves the pool takes its series with it:

  - ``mineru_router_worker_state{worker,state}`` gauge: 1 for the worker's
    current phase, 0 for the six others (all seven series always exist).
  - ``mineru_router_worker_consecutive_failures{worker}`` gauge.
  - ``mineru_router_probe_duration_seconds{worker}`` histogram and
    ``mineru_router_probes_total{worker,status}`` counter (``status`` is the
    probe classification: ``healthy``, ``timeout``, ``engine_dead`` ...), and
    ``mineru_router_last_probe_timestamp_seconds{worker}`` gauge (unix time).
    The poller has no sweeps -- each worker is probed on its own jittered
    schedule -- so instead of a sweep duration we expose when each worker was
    last probed: ``time() - x`` growing past a few intervals means probes are
    falling behind (the failure mode a sweep duration would reveal).
  - From its audit events: ``mineru_router_audit_events_total{worker,action}``,
    ``mineru_router_restarts_total{worker,outcome}`` (``started``, then
    ``succeeded`` once the worker stayed healthy for the stability window, or
    ``failed``), ``mineru_router_gave_up_total{worker}`` and
    ``mineru_router_ejections_total{worker,reason}``; ``reason`` is a probe
    status, ``process_exit``, ``passive_failure`` or ``other`` (never free
    text: labels must stay bounded).

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
  the router could not keep them on its disk),
  ``mineru_router_kept_cap_refusals_total`` (answered 503: the caps on kept
  submissions and bytes were reached) and
  ``mineru_router_store_unreachable_refusals_total`` (answered 503: the
  router's store, a database, could not be reached).

- A **lease in a shared store** (``bind_lease(fn)``, the lease's ``counts()``;
  ``runtime.router.leases``), read the same way:
  ``mineru_router_store_fenced_writes_total`` (writes the store refused: another
  router owns the row now, or wrote it since), ``mineru_router_lease_lapses_total``
  (renewals that found this router's lease had run out) and
  ``mineru_router_takeovers_total`` (expired routers whose submissions this one
  took over).

- The **bounds broken by worker answers** (``bind_upstream_reads(fn)``, the
  ``broken()`` of ``runtime.router.upstream_reads``, where the count lives):
  ``mineru_router_upstream_bounds_broken_total{worker,bound}``, ``worker``
  the worker's address, ``bound`` one of ``size``, ``time``, ``encoding``.

- **Workers found by DNS** (``bind_dns(fn)``, the discovery's ``stats()``;
  ``runtime.router.discovery``), read the same way:
  ``mineru_router_dns_workers{state}`` gauge (``active``, ``draining``),
  ``mineru_router_dns_lookups_total{outcome}`` (``addresses``, ``empty``,
  ``failed``: the last two keep the last good set) and
  ``mineru_router_dns_worker_changes_total{change}`` (``admitted``,
  ``draining``, ``restored``, ``forgotten``).

- **Events of the supervisor** are counted as they are handled on the router's loop:

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

import math
from collections.abc import Callable, Iterable
from typing import Any, cast

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

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
    "DnsCollector",
    "PollerStatsCollector",
    "WorkerStatusCollector",
    "bind_admission_refusals",
    "bind_dns",
    "bind_lease",
    "bind_poller_stats",
    "bind_upstream_reads",
    "bind_worker_statuses",
    "ensure_families",
    "record_poison_document",
    "record_resubmission",
    "record_resubmission_refused",
]

# The phases of the native RestartPolicy, as its to_string() spells them.
WORKER_STATES: tuple[str, ...] = enum_names(_native.WorkerPhase)

# Audit action names, as the audit log writes them.
AUDIT_ACTIONS: tuple[str, ...] = enum_names(_native.AuditAction)

_HEALTHY_PROBE = enum_name(_native.ProbeStatus.HEALTHY)
#: Audit actions (their to_string spellings) behind the restart and gave-up counters.
_RESTART_OUTCOMES = {
    "auto_restart_requested": "started",
    "auto_restart_success": "succeeded",
    "auto_restart_failed": "failed",
}
_GAVE_UP = "auto_restart_gave_up"

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
    "mineru_router_store_unreachable_refusals_total",
    "mineru_router_store_fenced_writes_total",
    "mineru_router_lease_lapses_total",
    "mineru_router_takeovers_total",
    "mineru_router_upstream_bounds_broken_total",
    "mineru_router_dns_workers",
    "mineru_router_dns_lookups_total",
    "mineru_router_dns_worker_changes_total",
)

#: Label values of the resubmission counters (anything else is counted as "other").
#: The label values, from the enums the policy decides with: a new reason has its series.
RESUBMIT_REASONS: tuple[str, ...] = tuple(r.value for r in ResubmitReason)
REFUSAL_CAUSES: tuple[str, ...] = tuple(r.value for r in Refusal)

StatusSource = Callable[[], Iterable[Any]]
StatsSource = Callable[[], Any]


class WorkerStatusCollector(BoundSourceCollector):
    """Each worker's state gauges and event counters, from the poller's ``statuses()`` at
    every scrape: ``phase`` and ``consecutive_failures``, and ``counters`` (the poller's
    own count of its probes and policy events, ``WorkerCounters``)."""

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
            # The registry's collectors handle any family; Family names the two most use.
            cast(
                Family,
                HistogramMetricFamily(
                    "mineru_router_probe_duration_seconds",
                    "Time one GET /health probe took, failures included.",
                    labels=["worker"],
                ),
            ),
            CounterMetricFamily(
                "mineru_router_probes",
                "Finished probes, by classification.",
                labels=["worker", "status"],
            ),
            GaugeMetricFamily(
                "mineru_router_last_probe_timestamp_seconds",
                "Unix time the worker's last probe finished.",
                labels=["worker"],
            ),
            CounterMetricFamily(
                "mineru_router_restarts",
                "Restart attempts of router-managed workers: started, succeeded (stable), failed.",
                labels=["worker", "outcome"],
            ),
            CounterMetricFamily(
                "mineru_router_gave_up",
                "Times the router stopped restarting a worker after max attempts.",
                labels=["worker"],
            ),
            CounterMetricFamily(
                "mineru_router_ejections",
                "Times a worker was taken out of rotation, by cause.",
                labels=["worker", "reason"],
            ),
            CounterMetricFamily(
                "mineru_router_audit_events",
                "Audit records written, by action.",
                labels=["worker", "action"],
            ),
        )

    def fill(self, families: tuple[Family, ...], value: Iterable[Any]) -> None:
        state, failures, *counted = families
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
            counters = getattr(status, "counters", None)
            if counters is not None:
                _fill_counters(counted, worker, counters)


def _fill_counters(families: list[Family], worker: str, counters: Any) -> None:
    """One worker's ``WorkerCounters`` as its families; label values stay bounded."""
    histogram, probes, last_probe, restarts, gave_up, ejections, audit = families
    duration = cast(HistogramMetricFamily, histogram)
    cumulative, buckets = 0, []
    for bound, count in zip(
        (*_native.WorkerCounters.latency_bounds(), math.inf), counters.latency_counts, strict=True
    ):
        cumulative += int(count)
        buckets.append(("+Inf" if math.isinf(bound) else repr(bound), float(cumulative)))
    duration.add_metric([worker], buckets, float(counters.latency_sum_s))
    by_status: dict[str, float] = {}
    for status, count in counters.probes.items():
        name = status if status == _HEALTHY_PROBE or status in EJECTION_REASONS else "other"
        by_status[name] = by_status.get(name, 0.0) + count
    for name, count in by_status.items():
        probes.add_metric([worker, name], count)
    if counters.last_probe_unix_time is not None:
        last_probe.add_metric([worker], float(counters.last_probe_unix_time))
    actions = dict(counters.audits)
    for action, outcome in _RESTART_OUTCOMES.items():
        if action in actions:
            restarts.add_metric([worker, outcome], float(actions[action]))
    if _GAVE_UP in actions:
        gave_up.add_metric([worker], float(actions[_GAVE_UP]))
    by_cause: dict[str, float] = {}
    for cause, count in counters.ejections.items():
        name = cause if cause in EJECTION_REASONS else "other"
        by_cause[name] = by_cause.get(name, 0.0) + count
    for name, count in by_cause.items():
        ejections.add_metric([worker, name], count)
    for action, count in actions.items():
        audit.add_metric([worker, action if action in AUDIT_ACTIONS else "other"], float(count))


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
    (``{"storage_full": n, "kept_cap": n, "store_unreachable": n}``), read at every scrape."""

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
            CounterMetricFamily(
                "mineru_router_store_unreachable_refusals",
                "Submissions refused with 503: the router's store (a database) was unreachable.",
            ),
        )

    def fill(self, families: tuple[Family, ...], value: Any) -> None:
        storage, cap, unreachable = families
        storage.add_metric([], float(value.get("storage_full", 0)))
        cap.add_metric([], float(value.get("kept_cap", 0)))
        unreachable.add_metric([], float(value.get("store_unreachable", 0)))


class LeaseCollector(BoundSourceCollector):
    """This router's lease in a shared store, from ``Lease.counts()`` (``{"fenced": n,
    "lapses": n, "takeovers": n}``), read at every scrape."""

    what = "the router's lease"

    def families(self) -> tuple[Family, ...]:
        return (
            CounterMetricFamily(
                "mineru_router_store_fenced_writes",
                "Writes the shared store refused (fenced): another router owns the row now.",
            ),
            CounterMetricFamily(
                "mineru_router_lease_lapses",
                "Renewals that found this router's lease had run out (a pause, a partition).",
            ),
            CounterMetricFamily(
                "mineru_router_takeovers",
                "Expired routers whose submissions this router took over.",
            ),
        )

    def fill(self, families: tuple[Family, ...], value: Any) -> None:
        fenced, lapses, takeovers = families
        fenced.add_metric([], float(value.get("fenced", 0)))
        lapses.add_metric([], float(value.get("lapses", 0)))
        takeovers.add_metric([], float(value.get("takeovers", 0)))


class UpstreamReadsCollector(BoundSourceCollector):
    """Bounds that worker answers broke (``UpstreamReads.broken()``), read at every scrape."""

    what = "bounds broken by worker answers"

    def families(self) -> tuple[Family, ...]:
        return (
            CounterMetricFamily(
                "mineru_router_upstream_bounds_broken",
                "Worker answers cut for breaking a bound (size, time, encoding), by worker.",
                labels=["worker", "bound"],
            ),
        )

    def fill(self, families: tuple[Family, ...], value: Any) -> None:
        (broken,) = families
        for (worker, bound), count in dict(value).items():
            broken.add_metric([str(worker), str(bound)], float(count))


class DnsCollector(BoundSourceCollector):
    """Workers found by DNS, from the discovery's ``stats()`` (``active``, ``draining``,
    ``lookups`` and ``changes`` by name), read at every scrape."""

    what = "workers found by DNS"

    def families(self) -> tuple[Family, ...]:
        return (
            GaugeMetricFamily(
                "mineru_router_dns_workers",
                "Workers found by DNS, by state (active, draining).",
                labels=["state"],
            ),
            CounterMetricFamily(
                "mineru_router_dns_lookups",
                "Lookups of UPSTREAM_DNS, by outcome (addresses, empty, "
                "failed; the last two keep the last good set).",
                labels=["outcome"],
            ),
            CounterMetricFamily(
                "mineru_router_dns_worker_changes",
                "Workers found by DNS admitted, drained, taken back, forgotten.",
                labels=["change"],
            ),
        )

    def fill(self, families: tuple[Family, ...], value: Any) -> None:
        workers, lookups, changes = families
        workers.add_metric(["active"], float(value.active))
        workers.add_metric(["draining"], float(value.draining))
        for outcome, count in dict(value.lookups).items():
            lookups.add_metric([str(outcome)], float(count))
        for change, count in dict(value.changes).items():
            changes.add_metric([str(change)], float(count))


class _RouterMetrics:
    def __init__(self, reg: CollectorRegistry) -> None:
        self.dns = DnsCollector()
        reg.register(self.dns)
        self.admission = AdmissionRefusalCollector()
        reg.register(self.admission)
        self.lease = LeaseCollector()
        reg.register(self.lease)
        self.upstream_reads = UpstreamReadsCollector()
        reg.register(self.upstream_reads)
        self.statuses = WorkerStatusCollector()
        reg.register(self.statuses)
        self.poller = PollerStatsCollector()
        reg.register(self.poller)
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


def bind_lease(source: Callable[[], Any] | None) -> None:
    """Makes the lease counters read ``source()`` (the lease's ``counts``) at every scrape."""
    _metrics().lease.bind(source)


def bind_dns(source: StatsSource | None) -> None:
    """Makes the DNS families read ``source()`` (``Discovery.stats``) at every scrape."""
    _metrics().dns.bind(source)


def bind_upstream_reads(source: StatsSource | None) -> None:
    """Makes the bounds-broken counter read ``source()`` (``UpstreamReads.broken``) at scrapes."""
    _metrics().upstream_reads.bind(source)


def record_resubmission(reason: str) -> None:
    """Counts one task resubmitted; ``reason`` outside RESUBMIT_REASONS is "other"."""
    _metrics().resubmissions.labels(reason=reason if reason in RESUBMIT_REASONS else "other").inc()


def record_resubmission_refused(cause: str) -> None:
    """Counts one task left failed; ``cause`` outside REFUSAL_CAUSES is "other"."""
    _metrics().refused.labels(cause=cause if cause in REFUSAL_CAUSES else "other").inc()


def record_poison_document() -> None:
    _metrics().poison.inc()

"""Prometheus metrics for patched MinerU workers and routers.

Each process owns one :class:`prometheus_client.CollectorRegistry` (never the
library's global one, so MinerU or anything else it imports cannot collide
with our names). Metrics are created on first use, per side: a worker process
exposes only ``mineru_worker_*``, a router only ``mineru_router_*``, and both
the standard ``process_*`` and ``python_info`` families. Every function here
is thread-safe (prometheus-client's metric objects lock internally), so the
router's asyncio loop, the worker's task threads and a scrape may call them
at once. None of them raises on bad label values: metrics must never break
the request path.

Worker side (called by ``mineru_health.integration.worker``):

- ``mount_metrics(app, role="worker")``  -- adds ``GET /metrics``; creates the
  worker families so they show from the first scrape.
- ``bind_worker_healthy(fn)``            -- the healthy gauge reads ``fn()`` at
  scrape time (e.g. ``lambda: state.healthy()``); preferred over pushing.
- ``set_worker_healthy(healthy)``        -- push form, when no callable fits.
- ``record_worker_fatal(rule, category)`` -- one fatal (engine-dead) failure.
- ``record_worker_task_local()``         -- one failure that stayed task-local.

Router side (called by ``mineru_health.integration.router``):

- ``mount_metrics(app, role="router")``
- ``observe_probe(worker, latency_s, status)`` -- every finished probe.
- ``set_worker_state(worker, state, consecutive_failures=None)`` -- after
  every event that may change a worker's phase (or ``update_worker_status``
  with a status object from the poller).
- ``record_audit(worker, action, reason_kind="")`` -- every audit event, with
  the action name the audit log uses (``auto_restart_success`` ...).
- ``forget_worker(worker)``              -- a worker left the pool.

Metric reference (docs/operations.md has the alert rules built on them):

- ``mineru_worker_healthy`` gauge: 1 while the engine is usable, 0 after a
  fatal error (the same fact as ``/health`` answering 503).
- ``mineru_worker_fatal_errors_total{rule,category}`` counter.
- ``mineru_worker_task_local_failures_total`` counter.
- ``mineru_router_worker_state{worker,state}`` gauge: 1 for the worker's
  current phase, 0 for the six others (all seven series always exist).
- ``mineru_router_worker_consecutive_failures{worker}`` gauge.
- ``mineru_router_probe_duration_seconds{worker}`` histogram.
- ``mineru_router_probes_total{worker,status}`` counter; ``status`` is the
  probe classification (``healthy``, ``timeout``, ``engine_dead`` ...).
- ``mineru_router_last_probe_timestamp_seconds{worker}`` gauge (unix time).
  The poller has no sweeps -- each worker is probed on its own jittered
  schedule -- so instead of a sweep duration we expose when each worker was
  last probed: ``time() - x`` growing past a few intervals means probes are
  falling behind (the failure mode a sweep duration would reveal).
- ``mineru_router_restarts_total{worker,outcome}`` counter, outcome
  ``succeeded`` or ``failed``.
- ``mineru_router_gave_up_total{worker}`` counter.
- ``mineru_router_ejections_total{worker,reason}`` counter: taken out of
  rotation; ``reason`` is a probe status, ``process_exit``,
  ``passive_failure`` or ``other`` (never free text: labels must stay bounded).
- ``mineru_router_audit_events_total{worker,action}`` counter: every audit
  record, by its action name.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Any, Literal, Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

__all__ = [
    "AUDIT_ACTIONS",
    "EJECTION_REASONS",
    "METRIC_NAMES",
    "WORKER_STATES",
    "bind_worker_healthy",
    "exposition",
    "forget_worker",
    "mount_metrics",
    "observe_probe",
    "record_audit",
    "record_ejection",
    "record_worker_fatal",
    "record_worker_task_local",
    "registry",
    "reset_for_tests",
    "set_worker_healthy",
    "set_worker_state",
    "update_worker_status",
]

Role = Literal["worker", "router"]

# The phases of the native RestartPolicy, as its to_string() spells them.
WORKER_STATES: tuple[str, ...] = (
    "starting",
    "healthy",
    "unhealthy",
    "failed",
    "restart_scheduled",
    "restarting",
    "gave_up",
)

# Audit action names, as the audit log writes them.
AUDIT_ACTIONS: tuple[str, ...] = (
    "health_failed",
    "auto_restart_scheduled",
    "auto_restart_success",
    "auto_restart_failed",
    "auto_restart_gave_up",
    "recovered",
    "ejected",
)

# Probe classifications (the native ProbeStatus names) plus the non-probe
# causes. Anything else is counted as "other" so the label set stays bounded.
EJECTION_REASONS: tuple[str, ...] = (
    "connect_error",
    "timeout",
    "http_status",
    "engine_dead",
    "body_too_large",
    "not_json_object",
    "unexpected_status",
    "bad_protocol",
    "bad_fields",
    "transport_error",
    "process_exit",
    "passive_failure",
    "other",
)

METRIC_NAMES: dict[Role, tuple[str, ...]] = {
    "worker": (
        "mineru_worker_healthy",
        "mineru_worker_fatal_errors_total",
        "mineru_worker_task_local_failures_total",
    ),
    "router": (
        "mineru_router_worker_state",
        "mineru_router_worker_consecutive_failures",
        "mineru_router_probe_duration_seconds",
        "mineru_router_probes_total",
        "mineru_router_last_probe_timestamp_seconds",
        "mineru_router_restarts_total",
        "mineru_router_gave_up_total",
        "mineru_router_ejections_total",
        "mineru_router_audit_events_total",
    ),
}

# Healthy probes answer in milliseconds; failing ones run up to the probe
# timeout (1.5 s by default, 10 s in the slowest preset).
_PROBE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


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


class _RouterMetrics:
    def __init__(self, reg: CollectorRegistry) -> None:
        self.state = Gauge(
            "mineru_router_worker_state",
            "1 for the worker's current health phase, 0 for the others.",
            ["worker", "state"],
            registry=reg,
        )
        self.consecutive_failures = Gauge(
            "mineru_router_worker_consecutive_failures",
            "Failed probes in a row for the worker.",
            ["worker"],
            registry=reg,
        )
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
            "Finished restart attempts of router-managed workers, by outcome.",
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
        self.known_workers: set[str] = set()


class _Registry:
    """The per-process registry and the lazily created metric sets."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self._worker: _WorkerMetrics | None = None
        self._router: _RouterMetrics | None = None

    def worker(self) -> _WorkerMetrics:
        with self.lock:
            if self._worker is None:
                self._worker = _WorkerMetrics(self.registry)
            return self._worker

    def router(self) -> _RouterMetrics:
        with self.lock:
            if self._router is None:
                self._router = _RouterMetrics(self.registry)
            return self._router


_state = _Registry()


def registry() -> CollectorRegistry:
    """This process's registry (for tests and for adding collectors)."""
    return _state.registry


def exposition() -> bytes:
    """The current metrics in Prometheus text format."""
    return generate_latest(_state.registry)


def reset_for_tests() -> None:
    """Forget every metric and start from an empty registry. Tests only."""
    global _state
    _state = _Registry()


# --- worker side -------------------------------------------------------------


def set_worker_healthy(healthy: bool) -> None:
    """Pushes the worker's health (1 healthy, 0 engine dead)."""
    _state.worker().healthy.set(1 if healthy else 0)


def bind_worker_healthy(fn: Callable[[], bool]) -> None:
    """Makes the healthy gauge call ``fn`` at every scrape instead of pushing.

    ``fn`` runs on the scraping thread; it must be cheap, must not block and
    must not raise.
    """

    def read() -> float:
        return 1.0 if fn() else 0.0

    metrics = _state.worker()
    metrics.healthy.set_function(read)
    metrics.healthy_bound = True


def record_worker_fatal(rule: str, category: str) -> None:
    """Counts one fatal failure and marks the worker unhealthy.

    If the gauge is bound to a callable (bind_worker_healthy) the callable
    stays the source of truth and this only counts.
    """
    metrics = _state.worker()
    metrics.fatal.labels(rule=rule or "unknown", category=category or "unknown").inc()
    # set() would replace a bound callable, so push only when nothing is bound.
    if not metrics.healthy_bound:
        metrics.healthy.set(0)


def record_worker_task_local() -> None:
    """Counts one failure that the classifier kept task-local."""
    _state.worker().task_local.inc()


# --- router side -------------------------------------------------------------


def _phase_name(state: object) -> str:
    """Accepts "restart_scheduled", an enum member or its name ("kRestartScheduled")."""
    if isinstance(state, str):
        text = state
    else:
        text = str(getattr(state, "name", state))
    text = text.rsplit(".", 1)[-1]
    if re.fullmatch(r"k[A-Z]\w*", text):
        text = text[1:]
    # CamelCase -> snake_case; already snake or upper case passes through.
    text = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", text)
    return text.lower()


def set_worker_state(worker: str, state: object, consecutive_failures: int | None = None) -> None:
    """Records the worker's current phase (one of WORKER_STATES).

    Sets the current phase's series to 1 and every other phase's to 0, so a
    query never sees a worker in two states. Unknown phases are ignored.
    """
    name = _phase_name(state)
    if name not in WORKER_STATES:
        return
    metrics = _state.router()
    for phase in WORKER_STATES:
        metrics.state.labels(worker=worker, state=phase).set(1 if phase == name else 0)
    if consecutive_failures is not None:
        metrics.consecutive_failures.labels(worker=worker).set(consecutive_failures)
    metrics.known_workers.add(worker)


class _StatusLike(Protocol):
    id: str
    phase: Any
    consecutive_failures: int


def update_worker_status(status: _StatusLike) -> None:
    """set_worker_state from a poller WorkerStatus (``id``, ``phase``, ``consecutive_failures``)."""
    set_worker_state(status.id, status.phase, status.consecutive_failures)


def observe_probe(
    worker: str, latency_s: float, status: object = "healthy", unix_time: float | None = None
) -> None:
    """Records one finished probe: its latency, its classification and when it ended.

    ``status`` is the probe classification ("healthy", "timeout", ... or the
    native enum member); anything else is counted as "other".
    """
    metrics = _state.router()
    name = _phase_name(status)
    if name != "healthy" and name not in EJECTION_REASONS:
        name = "other"
    metrics.probe_duration.labels(worker=worker).observe(max(0.0, float(latency_s)))
    metrics.probes.labels(worker=worker, status=name).inc()
    metrics.last_probe.labels(worker=worker).set(time.time() if unix_time is None else unix_time)
    metrics.known_workers.add(worker)


def record_ejection(worker: str, reason_kind: str) -> None:
    """Counts one removal from rotation; ``reason_kind`` outside EJECTION_REASONS is "other"."""
    kind = reason_kind if reason_kind in EJECTION_REASONS else "other"
    _state.router().ejections.labels(worker=worker, reason=kind).inc()


def record_audit(worker: str, action: object, reason_kind: str = "") -> None:
    """Counts one audit record and updates the counter it implies.

    ``action`` is the audit log's action name (AUDIT_ACTIONS) or the native
    enum member. ``reason_kind`` matters for ``ejected`` only: the probe status
    that caused it, ``process_exit`` or ``passive_failure``.
    """
    name = _audit_name(action)
    metrics = _state.router()
    metrics.audit.labels(worker=worker, action=name).inc()
    if name == "auto_restart_success":
        metrics.restarts.labels(worker=worker, outcome="succeeded").inc()
    elif name == "auto_restart_failed":
        metrics.restarts.labels(worker=worker, outcome="failed").inc()
    elif name == "auto_restart_gave_up":
        metrics.gave_up.labels(worker=worker).inc()
    elif name == "ejected":
        record_ejection(worker, reason_kind)


_AUDIT_ENUM_NAMES = {
    "health_failed": "health_failed",
    "restart_scheduled": "auto_restart_scheduled",
    "restart_succeeded": "auto_restart_success",
    "restart_failed": "auto_restart_failed",
    "gave_up": "auto_restart_gave_up",
    "recovered": "recovered",
    "ejected": "ejected",
}


def _audit_name(action: object) -> str:
    if isinstance(action, str) and action in AUDIT_ACTIONS:
        return action
    name = _phase_name(action)
    if name in AUDIT_ACTIONS:
        return name
    return _AUDIT_ENUM_NAMES.get(name, "other")


def forget_worker(worker: str) -> None:
    """Drops the worker's series (it left the pool); counters restart at 0 if it returns."""
    metrics = _state.router()
    for phase in WORKER_STATES:
        _remove(metrics.state, worker, phase)
    _remove(metrics.consecutive_failures, worker)
    _remove(metrics.probe_duration, worker)
    _remove(metrics.last_probe, worker)
    _remove(metrics.gave_up, worker)
    for status in (*EJECTION_REASONS, "healthy"):
        _remove(metrics.probes, worker, status)
    for outcome in ("succeeded", "failed"):
        _remove(metrics.restarts, worker, outcome)
    for reason in EJECTION_REASONS:
        _remove(metrics.ejections, worker, reason)
    for action in (*AUDIT_ACTIONS, "other"):
        _remove(metrics.audit, worker, action)
    metrics.known_workers.discard(worker)


def _remove(metric: Gauge | Counter | Histogram, *labels: str) -> None:
    try:
        metric.remove(*labels)
    except KeyError:
        pass  # that combination was never recorded


# --- HTTP --------------------------------------------------------------------


def mount_metrics(app: Any, role: Role, path: str = "/metrics") -> None:
    """Adds ``GET <path>`` (Prometheus text format) to a FastAPI app.

    Creates the role's metric families first so they appear on the first
    scrape, before anything happened. Call once per app, at import or
    start-up of the patched worker or router.
    """
    if role == "worker":
        _state.worker()
    elif role == "router":
        _state.router()
    else:
        raise ValueError(f"role must be 'worker' or 'router', not {role!r}")

    from starlette.responses import Response

    async def metrics_endpoint() -> Response:
        return Response(content=exposition(), media_type=CONTENT_TYPE_LATEST)

    app.add_api_route(path, metrics_endpoint, methods=["GET"], include_in_schema=False)

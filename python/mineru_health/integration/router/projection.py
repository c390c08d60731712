"""Poller events and statuses projected onto MinerU's ``WorkerState`` -- pure, no I/O.

The native restart policy owns every worker's state; MinerU's router reads
``WorkerState`` objects (``healthy`` decides routing, the rest shows in
``/health``). These functions write what the poller says onto them and keep
nothing of their own, so ``server.healthy`` is always the policy's "in
rotation" as of the latest event or status read:

    project_event(server, event)         # every event, on the router's loop
    project_status(server, status)       # right after a report (exit, passive failure)
    add_policy_fields(entry, status, restarting=..., now=...)   # one /health entry

``EjectionCauses`` labels ``ejected`` audit events for the ejections counter
from the event stream (see its docstring). Not thread-safe; everything here
runs on the router's event loop.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from mineru_health import _native

__all__ = [
    "PASSIVE_FAILURE",
    "PROCESS_EXIT",
    "EjectionCauses",
    "add_policy_fields",
    "iso_time",
    "passive_submission_reason",
    "passive_task_reason",
    "process_exit_reason",
    "project_event",
    "project_status",
    "short_reason",
    "start_failure_reason",
]

_PROBE = _native.PollerEventKind.PROBE
_AUDIT = _native.PollerEventKind.AUDIT
_EJECTED = _native.AuditAction.EJECTED

# A reason longer than this is cut in audit reasons, last_error and logs.
REASON_CHARS = 300

# Ejection causes that are not a probe status (labels of mineru_router_ejections_total).
PROCESS_EXIT = "process_exit"
PASSIVE_FAILURE = "passive_failure"

# The reasons the router itself reports, by cause. The native audit event does
# not carry a cause yet, so an ejection the router reported is recognised by
# the reason it wrote; the builders below are the only writers of these.
_PROCESS_EXIT_PREFIXES = ("worker process ", "failed to start: ")
_PASSIVE_PREFIXES = ("task failed with a fatal error ", "submission answered 503 ")


def iso_time(unix_time: float) -> str:
    return datetime.fromtimestamp(unix_time, tz=UTC).isoformat()


def short_reason(text: str) -> str:
    """One line, at most REASON_CHARS characters."""
    text = " ".join(text.split())
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 3] + "..."


def process_exit_reason(pid: int, code: int) -> str:
    return f"worker process {pid} exited with code {code}"


def start_failure_reason(error: object) -> str:
    return short_reason(f"failed to start: {error}")


def passive_task_reason(rule: str, error: str) -> str:
    return short_reason(f"task failed with a fatal error ({rule}): {error}")


def passive_submission_reason(rule: str, error: str) -> str:
    return short_reason(f"submission answered 503 ({rule}): {error}")


def project_event(server: Any, event: Any) -> None:
    """Writes one poller event onto ``server`` (a MinerU ``WorkerState``).

    ``healthy`` becomes the event's ``in_rotation``; a probe also brings when
    it finished, and the load fields when the worker answered healthy; a
    failed probe or an ejection its reason. ``restart_requested`` carries only
    the rotation.
    """
    server.healthy = bool(event.in_rotation)
    if event.kind == _PROBE:
        probe = event.probe
        server.last_checked_at = iso_time(event.unix_time)
        if probe.healthy:
            load = probe.load
            server.queued_tasks = int(load.queued_tasks)
            server.processing_tasks = int(load.processing_tasks)
            server.completed_tasks = int(load.completed_tasks)
            server.failed_tasks = int(load.failed_tasks)
            server.max_concurrent_requests = int(load.max_concurrent_requests)
            server.processing_window_size = max(1, int(load.processing_window_size))
            server.last_error = None
        else:
            server.last_error = short_reason(f"{_native.to_string(probe.status)}: {probe.detail}")
    elif event.kind == _AUDIT and not server.healthy and event.audit.reason:
        server.last_error = short_reason(event.audit.reason)


def project_status(server: Any, status: Any | None) -> None:
    """Writes the policy's current rotation onto ``server`` (no-op for an unknown worker)."""
    if status is not None:
        server.healthy = bool(status.in_rotation)


def add_policy_fields(
    entry: dict[str, Any], status: Any, *, restarting: bool, now: float
) -> None:
    """Adds the policy's view of one worker to its ``/health`` entry (MinerU's snapshot)."""
    entry["state"] = _native.to_string(status.phase)
    entry["in_rotation"] = bool(status.in_rotation)
    entry["restartable"] = bool(status.restartable)
    entry["consecutive_failures"] = int(status.consecutive_failures)
    entry["restart_attempt"] = int(status.attempt)
    entry["restarting"] = restarting
    delay = status.next_restart_in_s
    entry["next_restart_at"] = None if delay is None else iso_time(now + max(0.0, delay))
    if entry.get("last_error") is None and not status.in_rotation and status.last_error:
        entry["last_error"] = status.last_error


class EjectionCauses:
    """Names the cause of each ``ejected`` audit event, for ``mineru_router_ejections_total``.

    The poller queues a probe's event and the audit events that probe caused
    together, under one lock, and events are handled in queue order; an
    ejection needs a worker in rotation, and a failed probe of a worker in
    rotation always ejects it. So an ejection right after a failed probe of
    the same worker was caused by that probe (its status names the cause);
    any other ejection came from a report of the router's, recognised by its
    reason. Only the previous event is remembered, never a worker's state.
    """

    def __init__(self) -> None:
        self._failed_probe: tuple[str, str] | None = None  # (worker id, probe status)

    def cause_of(self, event: Any) -> str | None:
        """Feed every event in order; returns the cause for an ``ejected`` audit, else None."""
        previous, self._failed_probe = self._failed_probe, None
        if event.kind == _PROBE:
            if not event.probe.healthy:
                self._failed_probe = (event.worker_id, _native.to_string(event.probe.status))
            return None
        if event.kind != _AUDIT or event.audit.action != _EJECTED:
            return None
        if previous is not None and previous[0] == event.worker_id:
            return previous[1]
        return report_cause(event.audit.reason)


def report_cause(reason: str) -> str:
    """``process_exit``, ``passive_failure`` or ``other`` for a reason the router reported."""
    if reason.startswith(_PROCESS_EXIT_PREFIXES):
        return PROCESS_EXIT
    if reason.startswith(_PASSIVE_PREFIXES):
        return PASSIVE_FAILURE
    return "other"

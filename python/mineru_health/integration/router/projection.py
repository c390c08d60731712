"""Poller events and statuses projected onto MinerU's ``WorkerState`` -- pure, no I/O.

The native restart policy owns every worker's state; MinerU's router reads
``WorkerState`` objects (``healthy`` decides routing, the rest shows in
``/health``). These functions write what the poller says onto them and keep
nothing of their own, so ``server.healthy`` is always the policy's "in
rotation" as of the latest event or status read:

    project_event(server, event)         # every event, on the router's loop
    project_status(server, status)       # right after a report (exit, passive failure)
    add_policy_fields(entry, status, restarting=..., now=...)   # one /health entry

Not thread-safe; everything here runs on the router's event loop.
"""

from __future__ import annotations

from typing import Any

from mineru_health import _native
from mineru_health._names import enum_name
from mineru_health.audit import iso_time

__all__ = [
    "DECLARED_FAILED",
    "add_policy_fields",
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

# A reason longer than this is cut in audit reasons, last_error and logs.
REASON_CHARS = 300

_P = _native.WorkerPhase
#: Phases in which the worker is declared failed: its tasks will not finish
#: there, and a further failure signal changes nothing in the policy.
DECLARED_FAILED = frozenset({_P.FAILED, _P.RESTART_SCHEDULED, _P.RESTARTING, _P.GAVE_UP})


def short_reason(text: str) -> str:
    """One line, at most REASON_CHARS characters."""
    text = " ".join(text.split())
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 3] + "..."


def process_exit_reason(pid: int, code: int) -> str:
    return f"worker process {pid} exited with code {code}"


def start_failure_reason(error: object) -> str:
    return short_reason(f"failed to start: {error}")


# The task's own error text can quote a user's document: reasons name the rule
# only, since they reach the audit log, /health and other users' views.
def passive_task_reason(rule: str) -> str:
    return short_reason(f"a task failed with a fatal error (rule {rule})")


def passive_submission_reason(what: str) -> str:
    return short_reason(f"a submission was refused with 503 ({what})")


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
            server.last_error = short_reason(f"{enum_name(probe.status)}: {probe.detail}")
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
    entry["state"] = enum_name(status.phase)
    entry["in_rotation"] = bool(status.in_rotation)
    entry["restartable"] = bool(status.restartable)
    entry["consecutive_failures"] = int(status.consecutive_failures)
    entry["restart_attempt"] = int(status.attempt)
    entry["restarting"] = restarting
    delay = status.next_restart_in_s
    entry["next_restart_at"] = None if delay is None else iso_time(now + max(0.0, delay))
    stable = status.stable_in_s
    entry["restart_confirmed_at"] = None if stable is None else iso_time(now + max(0.0, stable))
    entry["probe_endpoint"] = enum_name(status.endpoint)
    entry["probe_url"] = status.probe_url
    entry["last_cause"] = status.last_cause or None
    entry["last_exit_code"] = status.last_exit_code
    entry["ejection_suppressed"] = bool(status.ejection_suppressed)
    probe = status.last_probe
    entry["loop_lag_s"] = probe.loop_lag_s if probe is not None else None
    entry["engine_calls_in_flight"] = probe.engine_calls_in_flight if probe is not None else None
    if entry.get("last_error") is None and not status.in_rotation and status.last_error:
        entry["last_error"] = status.last_error

"""Passive ejection: a fatal error seen in the router's own traffic ejects its worker at once.

Two signals, both classified by the shared classifier
(``mineru_health.classifier``) and reported to the native policy, which
takes the worker out of rotation before the next probe:

- a task status ``failed`` whose error is fatal (``observe_task_status``,
  called from MinerU's ``fetch_router_task_status`` by the patch);
- a submission answered 503 with a fatal error (``mark_submission_failure``,
  MinerU's own hook, extended).

A worker the policy already handles (failed, restart scheduled, restarting,
gave up) is not reported again: a burst of failed tasks is one failure.
Runs on the router's event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mineru_health import _native
from mineru_health.monitor import HealthMonitor

from .projection import passive_submission_reason, passive_task_reason, project_status

__all__ = ["PassiveEjectionMixin", "is_fatal_error"]

_P = _native.WorkerPhase
# Phases in which a further failure signal changes nothing in the policy.
_HANDLED = frozenset({_P.FAILED, _P.RESTART_SCHEDULED, _P.RESTARTING, _P.GAVE_UP})


def is_fatal_error(text: str) -> tuple[bool, str]:
    """(fatal, rule id) for an error text, by the shared classifier."""
    # Imported here: the classifier loads its rules on first use, and a
    # router that never sees a failed task should not pay for it.
    from mineru_health.classifier import classify_text

    verdict = classify_text(text)
    return bool(verdict.fatal), str(verdict.rule)


class PassiveEjectionMixin:
    """Task status and submission hooks of the healing pool."""

    # Provided by MinerU's WorkerPool and PoolLifecycleMixin (for type checkers).
    _servers: dict[str, Any]
    _monitor: HealthMonitor
    _check_process: Callable[[Any], None]

    def observe_task_status(self, task: Any, payload: Any) -> None:
        """Hook: an upstream task status arrived; a fatal failure ejects its worker now."""
        if not isinstance(payload, dict) or payload.get("status") != "failed":
            return
        error = payload.get("error")
        if not isinstance(error, str) or not error:
            return
        server = self._servers.get(task.upstream_server_id)
        # A status from an instance we already replaced says nothing about the new one.
        if server is None or task.upstream_base_url != server.base_url:
            return
        fatal, rule = is_fatal_error(error)
        if fatal:
            self._report_passive(server, passive_task_reason(rule))

    async def mark_submission_failure(self, server_id: str, error: str) -> None:
        await super().mark_submission_failure(server_id, error)  # type: ignore[misc]
        server = self._servers.get(server_id)
        if server is None:
            return
        self._check_process(server)
        # MinerU words retryable submit answers "<status> <detail>".
        if error.startswith("503"):
            fatal, rule = is_fatal_error(error)
            if fatal:
                self._report_passive(server, passive_submission_reason(rule))

    def _report_passive(self, server: Any, reason: str) -> None:
        worker_id = server.server_id
        status = self._monitor.status(worker_id)
        if status is None or status.phase in _HANDLED:
            return
        server.last_error = reason
        self._monitor.report_passive_failure(worker_id, reason)
        # The policy applied the report already: routing follows it at once.
        project_status(server, self._monitor.status(worker_id))

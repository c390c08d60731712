"""Passive ejection: a dead worker's own verdict, seen in the router's traffic, ejects it at once.

A submission answered 503 by a worker whose engine is unusable
(``mark_submission_failure``, MinerU's own hook, extended) is reported to the
native policy, which takes the worker out of rotation before the next probe.
The verdict is the worker's: its refusal's error begins with
``REFUSAL_ERROR_PREFIX``; no text is classified here (a task status's
verdict is read in ``resubmission.py``).

A worker the policy already handles (failed, restart scheduled, restarting,
gave up) is not reported again: a burst of failed tasks is one failure.
Runs on the router's event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mineru_health.monitor import HealthMonitor
from mineru_health.worker import REFUSAL_ERROR_PREFIX

from .projection import DECLARED_FAILED, passive_submission_reason, project_status

__all__ = ["PassiveEjectionMixin"]


class PassiveEjectionMixin:
    """The submission hook of the healing pool (and the report both hooks share)."""

    # Provided by MinerU's WorkerPool and PoolLifecycleMixin (for type checkers).
    _servers: dict[str, Any]
    _monitor: HealthMonitor
    _check_process: Callable[[Any], None]

    async def mark_submission_failure(self, server_id: str, error: str) -> None:
        await super().mark_submission_failure(server_id, error)  # type: ignore[misc]
        server = self._servers.get(server_id)
        if server is None:
            return
        self._check_process(server)
        # MinerU words retryable submit answers "<status> <detail>".
        refusal = f"503 {REFUSAL_ERROR_PREFIX}"
        if error.startswith(refusal):
            self._report_passive(server, passive_submission_reason(error[len(refusal):].strip()))

    def _report_passive(self, server: Any, reason: str) -> None:
        worker_id = server.server_id
        status = self._monitor.status(worker_id)
        if status is None or status.phase in DECLARED_FAILED:
            return
        server.last_error = reason
        self._monitor.report_passive_failure(worker_id, reason)
        # The policy applied the report already: routing follows it at once.
        project_status(server, self._monitor.status(worker_id))

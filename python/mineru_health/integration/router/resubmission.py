"""The healing pool's task side: a task supervisor per pool, fed by the poller's events.

``ResubmissionMixin`` gives the pool a ``task_supervisor`` (``tasks.py``),
hands it every poller event after the pool has handled it, closes it on
shutdown (deleting the uploads it kept), and ejects a worker passively on
the worker's own verdict: a task status ``failed`` with ``"engine_dead":
true`` (no text matching). Runs on the router's event loop; not
thread-safe, like the class it extends.
"""

from __future__ import annotations

from typing import Any

from .projection import passive_task_reason
from .resubmit_policy import engine_dead_failure
from .tasks import TaskSupervisor

__all__ = ["ResubmissionMixin"]


class ResubmissionMixin:
    """Keeps uploads of unfinished tasks and resubmits those a dead worker lost."""

    # Provided by the other mixins and MinerU's WorkerPool (for type checkers).
    _servers: dict[str, Any]
    _router: Any
    _audit: Any
    health_settings: Any
    _report_passive: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.task_supervisor = TaskSupervisor(
            self, settings=self.health_settings, namespace=self._router, audit=self._audit
        )

    def _on_health_event(self, event: Any) -> None:
        super()._on_health_event(event)  # type: ignore[misc]
        self.task_supervisor.on_event(event)

    async def shutdown(self) -> None:
        await self.task_supervisor.close()
        await super().shutdown()  # type: ignore[misc]

    def observe_task_status(self, task: Any, payload: Any) -> None:
        """Hook: an upstream task status arrived; the worker's engine_dead verdict ejects it now."""
        if not isinstance(payload, dict) or not engine_dead_failure(payload):
            return
        server = self._servers.get(task.upstream_server_id)
        # A status from an instance we already replaced says nothing about the new one.
        if server is None or task.upstream_base_url != server.base_url:
            return
        verdict = payload.get("verdict")
        rule = verdict.get("rule") if isinstance(verdict, dict) else None
        # The rule names the cause; the task's own text may quote a user's document.
        self._report_passive(server, passive_task_reason(str(rule or "engine_dead")))

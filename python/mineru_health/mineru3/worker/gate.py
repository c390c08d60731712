"""MinerU 3.x's gate and what its loop watcher does: its task figures pushed, hung tasks
failed, a new fatal acted on. The watcher starts when MinerU's start-up is over
(model preload included): from then on a blocked loop is a hung loop.
"""

from __future__ import annotations

import sys
from typing import Any

from ...runtime.worker import engine_calls
from ...runtime.worker.context import mineru_version, runtime, worker_health
from ...runtime.worker.gate import HealthGate
from ...runtime.worker.loop_watch import int_or, start_watcher, stop_watcher
from . import fairness, task_store
from .tasks import (
    FAILED,
    PENDING,
    PROCESSING,
    act_on_fatal,
    fail_hung_tasks,
    fail_remote_waits,
    task_managers,
    wrap_status_payload,
)

#: MinerU 3.x's health check, and the two ways to submit work.
HEALTH_PATHS = frozenset({"/health"})
GATED_POSTS = frozenset({"/tasks", "/file_parse"})


def _report_service(manager: Any) -> None:
    """The static part of MinerU's /health body, as its own handler computes it."""
    module = sys.modules.get(type(manager).__module__)
    try:
        max_requests = module.get_max_concurrent_requests()  # type: ignore[union-attr]
        window = module.get_processing_window_size(  # type: ignore[union-attr]
            default=module.DEFAULT_PROCESSING_WINDOW_SIZE  # type: ignore[union-attr]
        )
    except Exception:  # noqa: BLE001 - a renamed helper must not stop the worker
        max_requests, window = 1, 1
    worker_health().set_service(
        version=mineru_version(),
        protocol_version=int_or(getattr(module, "API_PROTOCOL_VERSION", 0), 0),
        max_concurrent_requests=int_or(max_requests, 1),
        processing_window_size=max(1, int_or(window, 1)),
        task_retention_seconds=int_or(getattr(manager, "task_retention_seconds", 0), 0),
        task_cleanup_interval_seconds=int_or(
            getattr(manager, "task_cleanup_interval_seconds", 0), 0),
    )


def _report_tasks() -> None:
    """MinerU's task figures and its own health verdict, as its /health computes them."""
    counts = [0, 0, 0, 0]
    errors = []
    for manager in task_managers():
        module = sys.modules.get(type(manager).__module__)
        stats = manager.get_stats()
        for index, (name, default) in enumerate(
            (("TASK_PENDING", PENDING), ("TASK_PROCESSING", PROCESSING),
             ("TASK_COMPLETED", "completed"), ("TASK_FAILED", FAILED))
        ):
            counts[index] += int_or(stats.get(getattr(module, name, default), 0), 0)
        if not manager.is_healthy():
            errors.append(str(manager.last_worker_error or "task manager unhealthy"))
    queued, processing, completed, failed = counts
    worker_health().set_tasks(queued, processing, completed, failed, "; ".join(errors))


def _act() -> None:
    fail_hung_tasks()
    fail_remote_waits()
    act_on_fatal()  # once per fatal record; cheap while healthy


class Gate(HealthGate):
    """The gate on MinerU 3.x's paths; its watcher starts with MinerU's start-up."""

    health_paths = HEALTH_PATHS
    gated_posts = GATED_POSTS

    def started(self) -> None:
        runtime.open_store()  # the task store, now that the worker serves
        managers = task_managers()
        for manager in managers:
            module = sys.modules.get(type(manager).__module__)
            task_class = getattr(module, "AsyncParseTask", None)
            if isinstance(task_class, type):
                wrap_status_payload(task_class)
            task_store.attach(manager)  # task store: restore finished tasks, record new ones
            # The task in context (its id): its progress for the task watchdog.
            engine_calls.follow_tasks(manager, worker_health)
            fairness.share_slots(manager, runtime.settings.remote_server_share)
            _report_service(manager)
        if managers:
            _report_tasks()
        start_watcher(_report_tasks, _act)

    def stopped(self) -> None:
        stop_watcher()

"""The event-loop watcher: a tick every 100 ms, MinerU's figures pushed, a new fatal acted on.

Started when MinerU's start-up is over (model preload included): from then on
a blocked loop is a hung loop.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any

from ...worker import describe_exception
from .. import engine_calls, task_store
from .context import (
    FAILED,
    PENDING,
    PROCESSING,
    TICK_S,
    current_health,
    log,
    mineru_version,
    runtime,
    task_managers,
)
from .tasks import act_on_fatal, fail_hung_tasks, wrap_status_payload


def _int_or(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


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
    current_health().set_service(
        version=mineru_version(),
        protocol_version=_int_or(getattr(module, "API_PROTOCOL_VERSION", 0), 0),
        max_concurrent_requests=_int_or(max_requests, 1),
        processing_window_size=max(1, _int_or(window, 1)),
        task_retention_seconds=_int_or(getattr(manager, "task_retention_seconds", 0), 0),
        task_cleanup_interval_seconds=_int_or(
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
            counts[index] += _int_or(stats.get(getattr(module, name, default), 0), 0)
        if not manager.is_healthy():
            errors.append(str(manager.last_worker_error or "task manager unhealthy"))
    queued, processing, completed, failed = counts
    current_health().set_tasks(queued, processing, completed, failed, "; ".join(errors))


async def watch_loop(report: Callable[[], None], act: Callable[[], None]) -> None:
    """The watcher of either MinerU line, on the event loop until cancelled.

    Ticks the loop natively every 100 ms (loop lag), ``report``s MinerU's
    figures every 0.5 s and, every second, fails hung tasks and ``act``s on
    a new fatal record: the line's own two steps.
    """
    health = current_health()
    ticks = 0
    while True:
        try:
            health.loop_tick()
            if ticks % 5 == 0:
                report()
            if ticks % 10 == 0:
                act()  # hung tasks first, then a fatal record (hung tasks are not collateral)
        except Exception as error:  # noqa: BLE001 - the watcher must survive one bad step
            if ticks % 100 == 0:
                log("WARNING", f"watcher step failed: {describe_exception(error)}")
        ticks += 1
        await asyncio.sleep(TICK_S)


def _act() -> None:
    fail_hung_tasks()
    act_on_fatal()  # once per fatal record; cheap while healthy


def on_started() -> None:
    managers = task_managers()
    for manager in managers:
        module = sys.modules.get(type(manager).__module__)
        task_class = getattr(module, "AsyncParseTask", None)
        if isinstance(task_class, type):
            wrap_status_payload(task_class)
        task_store.attach(manager)  # task store: restore finished tasks, record new ones
        # The task in context (id and upload names): its progress for the task watchdog.
        engine_calls.follow_tasks(manager, current_health)
        _report_service(manager)
    if managers:
        _report_tasks()
    if runtime.watcher is None or runtime.watcher.done():
        runtime.watcher = asyncio.get_running_loop().create_task(
            watch_loop(_report_tasks, _act), name="mineru-health-loop-watcher"
        )


def stop_watcher() -> None:
    if runtime.watcher is not None:
        runtime.watcher.cancel()
        runtime.watcher = None

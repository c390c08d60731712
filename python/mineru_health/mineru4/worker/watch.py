"""4.0's event-loop watcher and main-port gate.

The watcher starts when MinerU's start-up is over (lifespan complete): a
tick every 100 ms (loop lag), MinerU's job figures pushed to the native state
every 0.5 s, and once per fatal record every app's ``JobStore.fail_engine``
(a stalled engine, a liveness check or an error budget turns the worker fatal
without a job failing through MinerU's own path).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from ...integration.worker.context import TICK_S, current_health, log, mineru_version, runtime
from ...integration.worker.gate import HealthGate
from ...worker import FatalInfo, describe_exception
from . import job_store

#: 4.0's routes: its health check, and the three ways to submit work.
HEALTH_PATHS = frozenset({"/v1/health"})
GATED_POSTS = frozenset({"/v1/tasks", "/v1/parse/jobs", "/v1/file_parse"})
_COUNTED = {"queued": 0, "running": 1, "completed": 2, "partial": 2, "failed": 3}


def job_stores() -> list[Any]:
    stores = []
    for app in runtime.apps:
        store = getattr(getattr(app, "state", None), "job_store", None)
        if store is not None:
            stores.append(store)
    return stores


def _int_or(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def report_service() -> None:
    stores = job_stores()
    if not stores:
        return
    store = stores[0]
    module = sys.modules.get("mineru.utils.retention")
    current_health().set_service(
        version=mineru_version(), protocol_version=0,
        max_concurrent_requests=_int_or(getattr(store, "_concurrency", 1), 1),
        processing_window_size=1,
        task_retention_seconds=_int_or(getattr(store, "retention_seconds", 0), 0),
        task_cleanup_interval_seconds=_int_or(
            getattr(module, "RETENTION_SCAN_INTERVAL_SECONDS", 0), 0),
    )


def report_jobs() -> None:
    """MinerU's job figures and its own verdict (engine error, failed preload)."""
    counts = [0, 0, 0, 0]
    errors = []
    for app in runtime.apps:
        state = getattr(app, "state", None)
        store = getattr(state, "job_store", None)
        if store is None:
            continue
        for record in list(getattr(store, "_jobs", {}).values()):
            index = _COUNTED.get(getattr(record, "status", ""))
            if index is not None:
                counts[index] += 1
        owner_error = getattr(getattr(store, "runtime_owner", None), "engine_error", None)
        preload = getattr(state, "model_preload_error", None)
        if owner_error:
            errors.append(str(owner_error))
        elif preload is not None:
            errors.append(str(getattr(preload, "message", preload)))
    queued, running, completed, failed = counts
    current_health().set_tasks(queued, running, completed, failed, "; ".join(errors))


def act_on_fatal() -> None:
    """Once per fatal record: every app fails its unfinished jobs (loop thread)."""
    health = current_health()
    if health.healthy or runtime.acted_on_fatal:
        return
    runtime.acted_on_fatal = True
    what = FatalInfo.cause(health.snapshot().first_fatal)
    for store in job_stores():
        store.fail_engine(f"inference engine unusable ({what})")
    log("ERROR", f"inference engine unusable ({what}); unfinished jobs failed")


async def _watch_loop() -> None:
    health = current_health()
    ticks = 0
    while True:
        try:
            health.loop_tick()
            if runtime.faults is not None:
                runtime.faults.poll()
            if ticks % 5 == 0:
                report_jobs()
            if ticks % 10 == 0:
                act_on_fatal()
        except Exception as error:  # noqa: BLE001 - the watcher must survive one bad step
            if ticks % 100 == 0:
                log("WARNING", f"watcher step failed: {describe_exception(error)}")
        ticks += 1
        await asyncio.sleep(TICK_S)


def on_started() -> None:
    for app in runtime.apps:
        job_store.attach(app)  # finished jobs of an earlier run back; new ones kept
    report_service()
    report_jobs()
    if runtime.watcher is None or runtime.watcher.done():
        runtime.watcher = asyncio.get_running_loop().create_task(
            _watch_loop(), name="mineru-health-loop-watcher")


def stop_watcher() -> None:
    if runtime.watcher is not None:
        runtime.watcher.cancel()
        runtime.watcher = None


class Gate(HealthGate):
    """3.4's gate on 4.0's paths: ``/v1/health`` and the submissions."""

    health_paths = HEALTH_PATHS
    gated_posts = GATED_POSTS

    def lifespan(self, send: Callable[[Any], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
        async def wrapped(message: Any) -> None:
            kind = message.get("type") if isinstance(message, dict) else None
            if kind == "lifespan.startup.complete":
                on_started()  # start-up (preload included) is over: a blocked loop is hung
            elif kind in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
                stop_watcher()
            await send(message)

        return wrapped

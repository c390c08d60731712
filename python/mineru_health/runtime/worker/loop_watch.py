"""The event-loop watcher of either MinerU line: a tick every 100 ms, the line's figures, its acts.

    start_watcher(runtime, report, act)   # once MinerU's start-up is over (the gate's ``started``)
    stop_watcher(runtime)                 # at its shut-down

From the start on, a blocked loop is a hung loop (the native state sees the
ticks stop). ``report`` pushes MinerU's figures every 0.5 s; ``act`` fails
hung tasks and acts on a new fatal record every second: the line's own steps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ...safe_text import describe_exception
from .log import log
from .worker_runtime import TICK_S, WorkerRuntime

__all__ = ["int_or", "start_watcher", "stop_watcher", "watch_loop"]


def int_or(value: Any, default: int) -> int:
    """``int(value)``, or ``default`` for what MinerU left unset or renamed."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


async def watch_loop(
    runtime: WorkerRuntime, report: Callable[[], None], act: Callable[[], None]
) -> None:
    """The watcher of either MinerU line, on the event loop until cancelled.

    Ticks ``runtime``'s loop natively every 100 ms (loop lag), ``report``s MinerU's
    figures every 0.5 s and, every second, fails hung tasks and ``act``s on
    a new fatal record: the line's own two steps.
    """
    health = runtime.health
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


def start_watcher(
    runtime: WorkerRuntime, report: Callable[[], None], act: Callable[[], None]
) -> None:
    if runtime.watcher is None or runtime.watcher.done():
        runtime.watcher = asyncio.get_running_loop().create_task(
            watch_loop(runtime, report, act), name="mineru-health-loop-watcher"
        )


def stop_watcher(runtime: WorkerRuntime) -> None:
    if runtime.watcher is not None:
        runtime.watcher.cancel()
        runtime.watcher = None

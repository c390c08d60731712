"""The supervisor's tasks beside the requests (checks, resubmissions, reconciling).

    background = Background()
    background.spawn(coro, "check")   # tracked until it ends
    background.closed = True          # the router shuts down: nothing waits any more
    await background.cancel(sweeper)  # every task still running (and those named) ended

Runs on the router's event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

__all__ = ["Background"]


class Background:
    """The supervisor's background tasks, cancelled together when the router shuts down."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()
        self.closed = False

    def spawn(self, coro: Coroutine[Any, Any, Any], what: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=f"mineru-health-{what}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def cancel(self, *apart: asyncio.Task[Any] | None) -> None:
        """Cancels every task still running, and those kept ``apart`` (None: none), and
        waits until they have ended."""
        pending = [t for t in (*self.tasks, *apart) if t is not None and not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    def __repr__(self) -> str:
        return f"Background(tasks={len(self.tasks)}, closed={self.closed})"

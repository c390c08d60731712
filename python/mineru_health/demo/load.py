"""The demo's load: a steady stream of one-page PDF tasks through the router, and their results.

Used on the demo's event loop only (not thread-safe).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .context import DemoContext

__all__ = ["Load", "TaskStats"]

MAX_IN_FLIGHT = 6
TASK_RESULT_S = 60.0  # a task without a result after this is counted as hung


@dataclass
class TaskStats:
    submitted: int = 0
    completed: int = 0
    failed: int = 0
    hung: int = 0
    rejected: int = 0  # the router answered 503 (no healthy worker) or the submit timed out
    in_flight: int = 0
    completed_during_outage: int = 0
    failures: list[str] = field(default_factory=list)


class Load:
    """Submits ``ctx.rate`` tasks per second (at most MAX_IN_FLIGHT at once) until ``finish``."""

    def __init__(self, ctx: DemoContext) -> None:
        self.ctx = ctx
        self.running = False
        self.tasks: set[asyncio.Task[Any]] = set()
        self.shown_after_recovery = 0

    async def run(self) -> None:
        self.running = True
        interval = 1.0 / self.ctx.rate
        number = 0
        while self.running:
            if self.ctx.stats.in_flight < MAX_IN_FLIGHT:
                number += 1
                task = asyncio.create_task(self._one_task(number), name=f"demo-task-{number}")
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
            await asyncio.sleep(interval)

    async def _one_task(self, number: int) -> None:
        import httpx

        ctx = self.ctx
        stats = ctx.stats
        stats.submitted += 1
        stats.in_flight += 1
        try:
            try:
                response = await ctx.client.post(
                    f"{ctx.router_url}/tasks",
                    files={"files": (f"doc-{number}.pdf", ctx.pdf, "application/pdf")},
                    data={"backend": "vlm-http-client", "server_url": ctx.fake_url},
                    timeout=15.0,
                )
            except httpx.HTTPError as exc:
                stats.rejected += 1
                ctx.timeline.add("task", f"#{number} not submitted: {type(exc).__name__}")
                return
            if response.status_code != 202:
                stats.rejected += 1
                detail = response.text[:120].replace("\n", " ")
                ctx.timeline.add(
                    "task", f"#{number} refused by router: {response.status_code} {detail}"
                )
                return
            task_id = response.json().get("task_id")
            started = time.monotonic()
            while time.monotonic() - started < TASK_RESULT_S:
                await asyncio.sleep(0.3)
                payload = await ctx.get_json(f"{ctx.router_url}/tasks/{task_id}", timeout=5.0)
                status = payload.get("status") if isinstance(payload, dict) else None
                if status == "completed":
                    self._completed(number, time.monotonic() - started)
                    return
                if status == "failed":
                    assert isinstance(payload, dict)
                    self._failed(number, str(payload.get("error") or ""))
                    return
            stats.hung += 1
            ctx.timeline.add("task", f"#{number} no result after 60s (counted as hung)")
        finally:
            stats.in_flight -= 1

    def _completed(self, number: int, took_s: float) -> None:
        ctx = self.ctx
        stats = ctx.stats
        stats.completed += 1
        took = f"#{number} completed in {took_s:.1f}s"
        if ctx.marks.outage():
            stats.completed_during_outage += 1
            # The first few tell the story; the rest are counted.
            if stats.completed_during_outage <= 3:
                ctx.timeline.add("task", f"{took} (the victim is out of rotation)")
            elif stats.completed_during_outage == 4:
                ctx.timeline.add("task", "... more tasks completing (counted)")
        elif stats.completed <= 3 or self._recently_recovered():
            ctx.timeline.add("task", took)

    def _failed(self, number: int, error: str) -> None:
        ctx = self.ctx
        ctx.stats.failed += 1
        ctx.stats.failures.append(error[:200])
        t = ctx.timeline.add("task", f"#{number} FAILED: {error[:140]}")
        if ctx.marks.fault_at is not None and ctx.marks.first_failed_task_at is None:
            ctx.marks.first_failed_task_at = t

    def _recently_recovered(self) -> bool:
        """True for the first three completions after the victim came back."""
        if self.ctx.marks.back_in_rotation_at is None or self.shown_after_recovery >= 3:
            return False
        self.shown_after_recovery += 1
        return True

    async def finish(self) -> None:
        """Stops submitting and waits (bounded) for the tasks in flight; the rest count as hung."""
        self.running = False
        ctx = self.ctx
        limit = 20.0
        ctx.timeline.wait("tasks in flight to finish", limit)
        deadline = time.monotonic() + limit
        while self.tasks and time.monotonic() < deadline:
            ctx.timeline.maybe_progress()
            await asyncio.sleep(0.2)
        if self.tasks:
            # Still without a result after the limit: counted as hung.
            ctx.stats.hung += len(self.tasks)
            ctx.timeline.add("task", f"{len(self.tasks)} task(s) still without a result")
        for task in list(self.tasks):
            task.cancel()
        ctx.timeline.waiting_for = ""

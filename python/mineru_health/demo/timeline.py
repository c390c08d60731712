"""The demo's timeline: events in arrival order, printed live, and the marks the summary reports.

Used on the demo's event loop only (not thread-safe).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TextIO

from ..safe_text import printable

__all__ = ["Event", "Marks", "Timeline", "since"]


@dataclass
class Event:
    t: float  # seconds since the demo started
    source: str  # demo, task, worker, router, audit
    text: str


@dataclass
class Marks:
    """When things happened, in timeline seconds (None: did not happen)."""

    fault_at: float | None = None
    first_failed_task_at: float | None = None
    worker_unhealthy_at: float | None = None
    out_of_rotation_at: float | None = None
    restart_scheduled_at: float | None = None
    back_in_rotation_at: float | None = None
    gave_up_at: float | None = None
    restart_attempts: int = 0
    failed_restarts: int = 0
    victim_actions: list[str] = field(default_factory=list)

    def outage(self) -> bool:
        """True while the victim is out of rotation after the fault."""
        return self.out_of_rotation_at is not None and self.back_in_rotation_at is None


def since(mark: float | None, origin: float | None) -> float | None:
    if mark is None or origin is None:
        return None
    return round(mark - origin, 2)


class Timeline:
    """Events in arrival order, printed live in text mode (``live`` None: JSON mode)."""

    def __init__(self, live: TextIO | None, progress: TextIO) -> None:
        self.wall0 = time.time()
        self.events: list[Event] = []
        self.live = live
        self.progress = progress
        self.last_print = time.monotonic()
        self.waiting_for = ""
        self.wait_started = time.monotonic()
        self.wait_limit = 0.0

    def now(self) -> float:
        return time.time() - self.wall0

    def at(self, unix_time: float) -> float:
        return unix_time - self.wall0

    def add(self, source: str, text: str, t: float | None = None) -> float:
        when = self.now() if t is None else t
        text = printable(text)  # task errors and audit reasons come from workers
        self.events.append(Event(round(when, 2), source, text))
        if self.live is not None:
            print(f"t+{when:7.2f}s  {source:<6}  {text}", file=self.live, flush=True)
        self.last_print = time.monotonic()
        return when

    def wait(self, what: str, limit_s: float) -> None:
        self.waiting_for = what
        self.wait_started = time.monotonic()
        self.wait_limit = limit_s

    def maybe_progress(self) -> None:
        """A progress line when nothing was printed for 5 s during a wait."""
        now = time.monotonic()
        if not self.waiting_for or now - self.last_print < 5:
            return
        elapsed = now - self.wait_started
        print(
            f"... waiting for {self.waiting_for} ({elapsed:.0f}s of at most {self.wait_limit:.0f}s)",
            file=self.progress,
            flush=True,
        )
        self.last_print = now

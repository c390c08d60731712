"""What one demo run shares between its set-up, watchers, load and outcome.

Used on the demo's event loop only (not thread-safe).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mineru_health.testing.sandbox import ManagedProcess, Processes

from .load import TaskStats
from .timeline import Marks, Timeline

if TYPE_CHECKING:
    from .scenarios import Scenario

__all__ = ["DemoContext", "SetupError", "port_of"]


class SetupError(Exception):
    """The demo could not get its processes running."""


def port_of(url: str) -> int | None:
    try:
        return int(url.rstrip("/").rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return None


class DemoContext:
    """The run's processes, URLs, the victim, what the watchers saw, and the clock."""

    def __init__(self, scenario: Scenario, *, rate: float, timeout_s: float,
                 timeline: Timeline) -> None:
        self.scenario = scenario
        self.rate = rate
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.timeline = timeline
        self.marks = Marks()
        self.stats = TaskStats()
        self.processes = Processes()
        self.tmp: Path | None = None
        self.client: Any = None  # httpx.AsyncClient while the demo runs
        self.python = ""  # MinerU's Python
        self.site: Path | None = None  # the patched MinerU copy
        self.router: ManagedProcess | None = None
        self.router_url = ""
        self.fake_url = ""
        self.pdf = b""
        self.victim = ""
        self.victim_url = ""
        self.other = ""
        # The router's /health entry of every worker, as last seen.
        self.servers: dict[str, dict[str, Any]] = {}
        self.victim_health = ""

    def check_deadline(self) -> None:
        if time.monotonic() > self.deadline:
            raise SetupError(f"the demo ran past --timeout {self.timeout_s:.0f}s")

    def check_router(self) -> None:
        if self.router is not None and self.router.poll() is not None:
            raise SetupError(f"mineru-router exited with code {self.router.returncode}")

    def victim_completed(self) -> int:
        return int(self.servers.get(self.victim, {}).get("completed_tasks") or 0)

    async def get_json(self, url: str, timeout: float) -> Any:
        try:
            response = await self.client.get(url, timeout=timeout)
            return response.json()
        except Exception:  # noqa: BLE001 - absent, slow or not JSON: the caller retries
            return None

    async def wait_for(self, what: str, limit_s: float, done: Callable[[], bool]) -> bool:
        """Waits (bounded) until ``done()``; False when ``limit_s`` passed first."""
        self.timeline.wait(what, limit_s)
        deadline = time.monotonic() + limit_s
        while not done():
            self.check_deadline()
            if time.monotonic() > deadline:
                self.timeline.waiting_for = ""
                return False
            self.check_router()
            await asyncio.sleep(0.2)
        self.timeline.waiting_for = ""
        return True

"""MinerU 3.x's gate: its paths, and the runtime's watcher started on its tasks
(:class:`~.tasks.TaskLine`) when MinerU's start-up is over (model preload
included): from then on a blocked loop is a hung loop.
"""

from __future__ import annotations

from ...runtime.worker import line
from ...runtime.worker.gate import HealthGate
from ...runtime.worker.loop_watch import stop_watcher
from .tasks import TaskLine

#: MinerU 3.x's health check, and the two ways to submit work.
HEALTH_PATHS = frozenset({"/health"})
GATED_POSTS = frozenset({"/tasks", "/file_parse"})


class Gate(HealthGate):
    """The gate on MinerU 3.x's paths; its watcher starts with MinerU's start-up."""

    health_paths = HEALTH_PATHS
    gated_posts = GATED_POSTS

    def started(self) -> None:
        line.serve(self.runtime, TaskLine(self.runtime))

    def stopped(self) -> None:
        stop_watcher(self.runtime)

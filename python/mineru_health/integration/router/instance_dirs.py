"""The directories that outlive a local worker's instances: its state directory, old outputs.

    dirs = InstanceDirs(retention_s=86400)
    dirs.state_dir("local-gpu-0")     # MINERU_HEALTH_STATE_DIR of every launch of that worker
    dirs.retire(local_server)         # right before a restart stops the old instance
    dirs.close()                      # router shutdown: everything we created is removed

Every local worker gets one state directory for its whole life in the router
(its task store, ``integration/task_store.py``), passed in its per-launch
variables (``HealingLocalServer.launch_env``); the output directory of each
instance a restart replaced is kept (MinerU's ``stop`` would delete it), so
that the new instance can still serve the results the old one completed.
Retired directories older than MinerU's task retention are removed at the
next restart, the rest when the router shuts down; a state directory under
an operator's ``MINERU_HEALTH_STATE_DIR`` is kept, and claimed for this
router alone (``state_dirs.claim``). Temporary state directories are claimed
too, so that the next router sweeps those a killed one left behind. Not
thread-safe: the router's loop owns it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from mineru_health import state_dirs

__all__ = ["STATE_DIR_ENV", "InstanceDirs"]

STATE_DIR_ENV = "MINERU_HEALTH_STATE_DIR"
_TEMP_PREFIX = "mineru-health-state-"

_log = logging.getLogger("mineru_health.router")


class InstanceDirs:
    """State directories of local workers, and the output directories of replaced instances."""

    def __init__(self, *, retention_s: float, base: str | None = None) -> None:
        # An operator's MINERU_HEALTH_STATE_DIR in the router's environment:
        # one subdirectory per worker, kept across router restarts, and
        # claimed (ConfigError if another live router holds it: its workers
        # would serve each other's tasks).
        self._base = base if base is not None else os.environ.get(STATE_DIR_ENV, "")
        self._retention_s = retention_s
        self._state: dict[str, tuple[Path, bool]] = {}  # server id -> (dir, ours to remove)
        self._retired: list[tuple[float, Any]] = []  # (monotonic time, TemporaryDirectory)
        self._locks: list[state_dirs.StateLock] = []
        if self._base:
            self._locks.append(state_dirs.claim(Path(self._base).expanduser(),
                                                variable=STATE_DIR_ENV))
        else:
            # Left by routers that were killed before they could remove them.
            state_dirs.sweep_abandoned(tempfile.gettempdir(), _TEMP_PREFIX)

    def state_dir(self, server_id: str) -> Path:
        """The worker's state directory (created on first use)."""
        known = self._state.get(server_id)
        if known is not None:
            return known[0]
        if self._base:
            path = Path(self._base).expanduser() / server_id
            path.mkdir(parents=True, exist_ok=True)
            self._state[server_id] = (path, False)
        else:
            path = Path(tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{server_id}-"))
            self._locks.append(state_dirs.claim(path))
            self._state[server_id] = (path, True)
        return path

    def retire(self, local_server: Any) -> None:
        """Keeps the outputs of the instance about to be stopped (MinerU's stop deletes them)."""
        temp_dir = getattr(local_server, "temp_dir", None)
        if temp_dir is None:
            return
        local_server.temp_dir = None
        now = time.monotonic()
        self._retired.append((now, temp_dir))
        # The new instance expires those tasks after MinerU's retention; the
        # directory itself can go once that has passed.
        while self._retired and now - self._retired[0][0] > self._retention_s > 0:
            _remove(self._retired.pop(0)[1])

    def close(self) -> None:
        """Removes every retired output directory and the state directories we created."""
        for _, temp_dir in self._retired:
            _remove(temp_dir)
        self._retired.clear()
        for path, ours in self._state.values():
            if ours:
                shutil.rmtree(path, ignore_errors=True)
        self._state.clear()
        for lock in self._locks:
            lock.release()
        self._locks.clear()

    @property
    def retired(self) -> int:
        return len(self._retired)


def _remove(temp_dir: Any) -> None:
    with contextlib.suppress(Exception):  # already gone, or busy: the OS cleans /tmp eventually
        temp_dir.cleanup()

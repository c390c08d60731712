"""What the worker runtime shares, on either MinerU line: one :class:`Runtime` per process.

    runtime = assemble(WorkerSettings.from_env())   # install(): settings, rules, health, verifier
    runtime.defer_store(settings, directory)         # where the task store will be
    runtime.open_store()                             # serving starts: the file is opened

Every part of the worker runtime reads the process's state from ``runtime``
(the native health record, the verifier, the rules, the task store); nothing
else in the package holds worker state. Tests assemble their own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ...classifier import Rules, load_rules
from ...settings import WorkerSettings
from ...verification import Verifier
from ...worker import HealthEndpoint, WorkerHealth
from . import store as task_store

#: EX_TEMPFAIL from sysexits.h: a temporary failure, worth a restart.
EXIT_CODE = 75
#: How often the event loop ticks; the watcher also pushes task figures every
#: 5 ticks and acts on a newly unhealthy state every 10.
TICK_S = 0.1
LIVENESS_INTERVAL_S = 1.0

ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()


def mineru_version() -> str:
    module = sys.modules.get("mineru.version")
    version = getattr(module, "__version__", None)
    return version if isinstance(version, str) else "unknown"


class Runtime:
    """What :func:`assemble` built for this process, and what ``install`` added to it."""

    def __init__(self, settings: WorkerSettings | None = None, rules: Rules | None = None) -> None:
        settings = settings if settings is not None else WorkerSettings()
        self.settings = settings
        # Read once by assemble(): a bad MINERU_HEALTH_RULES file stops the start-up.
        # None (a runtime nobody assembled): the library's default rules.
        self.rules = rules
        self.health = WorkerHealth(
            loop_hang_s=settings.loop_hang_s, stall_s=settings.stall_s,
            task_hang_s=settings.task_hang_s, remote_wait_s=settings.remote_wait_s,
            error_budget=settings.error_budget,
            error_budget_window_s=settings.error_budget_window_s)
        self.verifier = Verifier(timeout_s=settings.verify_s)
        self.apps: list[Any] = []
        self.endpoint: HealthEndpoint | None = None
        self.advertised_port: int | None = None
        self.watcher: asyncio.Task[None] | None = None
        self.classify_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.store: task_store.Store | None = None  # once opened (open_store)
        self._store_at: tuple[WorkerSettings, Path] | None = None
        # True once outstanding tasks were failed for the current fatal record.
        self.acted_on_fatal = False
        # The task whose own failure was the first fatal one (its verdict's role
        # is "trigger"; the poison guard counts it), once known.
        self.trigger_task = ""
        self.installed = False

    def defer_store(self, settings: WorkerSettings, directory: Path) -> None:
        """Where the task store will be. Importing MinerU's server module (which builds its
        app, and so installs the hooks) must not create files: :meth:`open_store` does."""
        self._store_at = (settings, directory)

    def open_store(self) -> task_store.Store | None:
        """Opens the store :meth:`defer_store` named, once. Raises ``ConfigError`` naming
        ``MINERU_HEALTH_STATE_DIR`` (see :func:`store.open_store`), which stops the start-up."""
        if self.store is None and self._store_at is not None:
            self.store = task_store.open_store(*self._store_at)
        return self.store

    def seal_store(self) -> None:
        """The router that launched this worker is gone: its store writes nothing more."""
        if self.store is not None:
            self.store.seal()


def assemble(settings: WorkerSettings, rules: Rules | None = None) -> Runtime:
    """Builds this process's runtime from ``settings`` and the rules (those of
    ``MINERU_HEALTH_RULES`` unless given); raises ``ConfigError`` on a bad rules file.

    Built in place: every module holds ``runtime`` from its import.
    """
    fresh = Runtime(settings, rules if rules is not None else load_rules())
    vars(runtime).update(vars(fresh))
    return runtime


#: The process's runtime, filled by :func:`assemble` (``install``; tests).
runtime = Runtime()


def worker_health() -> WorkerHealth:
    """The health record the worker runtime records into."""
    return runtime.health

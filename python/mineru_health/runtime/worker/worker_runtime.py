"""What the hooks of one patched worker share, on either MinerU line: its :class:`WorkerRuntime`.

    runtime = WorkerRuntime(WorkerSettings.from_env())  # settings, rules, health, verifier
    app.state.mineru_health = runtime                    # how MinerU's own objects lead to it
    runtime.defer_store(settings, directory)              # where the task store will be
    runtime.open_store()                                  # serving starts: the file is opened

``install`` builds one per app and hands it to what it installs: the gate (its
constructor), the loop watcher, the judge, the line's hooks (arguments and
closures). A hook MinerU calls with its own objects finds it on the app
(:func:`runtime_of`). Nothing in the package holds one at module level, so
tests build their own, two side by side if they like. What MinerU's classes
share process-wide (the engine-call and client-cache wrappers, installed once)
reads the runtime of the first app installed: a worker process serves one app.
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
from ...metrics import ProcessRegistry
from ..settings import WorkerSettings
from . import store as task_store
from .health import HealthEndpoint, WorkerHealth
from .verification import Verifier

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


#: The attribute of ``app.state`` that holds the app's runtime.
STATE_ATTR = "mineru_health"


class WorkerRuntime:
    """Everything one patched worker's hooks share: settings, rules, native health record,
    verifier, task store, the apps, the watcher; built by ``install``, or by a test."""

    def __init__(self, settings: WorkerSettings | None = None, rules: Rules | None = None) -> None:
        settings = settings if settings is not None else WorkerSettings()
        self.settings = settings
        # Read once, here: a bad MINERU_HEALTH_RULES file stops the start-up (ConfigError).
        self.rules = rules if rules is not None else load_rules()
        self.health = WorkerHealth(
            loop_hang_s=settings.loop_hang_s,
            stall_s=settings.stall_s,
            task_hang_s=settings.task_hang_s,
            remote_wait_s=settings.remote_wait_s,
            error_budget=settings.error_budget,
            error_budget_window_s=settings.error_budget_window_s,
        )
        self.verifier = Verifier(timeout_s=settings.verify_s)
        # Its own Prometheus registry: /metrics of its app reads it (metrics.mount_metrics).
        self.metrics = ProcessRegistry()
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
        # The line's judge of a failure escaping a local engine call off the event loop
        # (4.0 sets it: :func:`~mineru_health.runtime.worker.engine_calls.local_engine_call`).
        self.failure_judge: Callable[[BaseException], object] | None = None

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


def runtime_of(app: Any) -> WorkerRuntime | None:
    """The runtime ``install`` put on ``app`` (FastAPI's ``app.state``), if any."""
    runtime = getattr(getattr(app, "state", None), STATE_ATTR, None)
    return runtime if isinstance(runtime, WorkerRuntime) else None

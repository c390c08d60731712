"""What the worker runtime shares, on either MinerU line: what ``install`` set up, and the log."""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ...safe_text import printable
from ...settings import WorkerSettings
from ...worker import HealthEndpoint, WorkerHealth, worker_health

if TYPE_CHECKING:
    from .store import Store

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


def log(level: str, message: str) -> None:
    # Messages quote exceptions and task texts: escaped for the plain-text log.
    message = printable(message)
    try:
        from loguru import logger

        logger.opt(depth=1).log(level, "mineru-health: {}", message)
    except Exception:  # noqa: BLE001 - loguru missing or misconfigured: stderr still works
        print(f"mineru-health {level}: {message}", file=sys.stderr, flush=True)


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()


def mineru_version() -> str:
    module = sys.modules.get("mineru.version")
    version = getattr(module, "__version__", None)
    return version if isinstance(version, str) else "unknown"


class Runtime:
    """What :func:`install` set up for this process."""

    def __init__(self) -> None:
        self.apps: list[Any] = []
        self.settings = WorkerSettings()
        self.endpoint: HealthEndpoint | None = None
        self.advertised_port: int | None = None
        self.watcher: asyncio.Task[None] | None = None
        self.classify_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.store: Store | None = None  # the task store (store.py), once configured
        # True once outstanding tasks were failed for the current fatal record.
        self.acted_on_fatal = False
        # The task whose own failure was the first fatal one (its verdict's role
        # is "trigger"; the poison guard counts it), once known.
        self.trigger_task = ""
        self.installed = False


runtime = Runtime()


def current_health() -> WorkerHealth:
    return worker_health()

"""Installing the worker runtime on a MinerU worker's app, in two halves, for either line.

    started = begin_install(app, Gate)       # config, native state and endpoint, gate, /metrics
    if started is not None:
        settings, rules, first_install = started
        ...                                  # the line's own hooks
        finish_install(settings, rules, "4.0")   # engine calls, threads, start-up checks

Nothing here knows a MinerU line: the line's adapter gives its gate class and
installs what touches its code between the halves.
"""

from __future__ import annotations

import multiprocessing
import sys
from typing import Any

from ... import metrics, patching
from ...errors import ConfigError, HealthEndpointError
from ...settings import WorkerSettings
from ...worker import HealthEndpoint, WorkerHealth
from . import engine_calls, model_cache
from .context import assemble, runtime, worker_health
from .log import log
from .threads import (
    exit_after_fatal,
    exit_with_parent,
    lead_own_group,
    liveness_loop,
    start_waiting_thread,
    take_children_along,
)

__all__ = ["begin_install", "finish_install"]


def _main_host(argv: list[str]) -> str:
    """The ``--host`` mineru-api was started with (its default otherwise)."""
    for index, arg in enumerate(argv):
        if arg == "--host" and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith("--host="):
            return arg.split("=", 1)[1]
    return "127.0.0.1"


def _advertise(endpoint: HealthEndpoint) -> int | None:
    """The native port, when a client of the main port can reach it too."""
    bind = endpoint.bind_address
    if bind in ("0.0.0.0", "::") or bind == _main_host(sys.argv):
        return endpoint.port
    return None


def _start_endpoint(health: WorkerHealth, settings: WorkerSettings) -> None:
    if settings.port is None or runtime.endpoint is not None:
        return
    try:
        endpoint = HealthEndpoint.start(health, port=settings.port, bind=settings.bind,
                                        expose_errors=settings.expose_errors)
    except HealthEndpointError as error:
        variable = WorkerSettings.variable_name("port")
        raise ConfigError(f"{variable}: {error}", variable=variable) from error
    runtime.endpoint = endpoint
    runtime.advertised_port = _advertise(endpoint)
    log("INFO", f"native health endpoint on {endpoint.url} (/health, /livez, /readyz)")


def begin_install(app: Any, gate: type) -> tuple[WorkerSettings, Any, bool] | None:
    """The first half of installing the hooks on a worker's ``app``, for either MinerU line.

    Returns ``(settings, rules, first_install)``, or None when there is
    nothing to do (a spawned helper process, an app seen before). Reads and
    checks the configuration, builds the native state and its endpoint once
    per process, and puts ``gate`` and ``/metrics`` on ``app``. Raises
    :class:`~mineru_health.errors.ConfigError` on a bad rules file, a bad
    ``MINERU_HEALTH_*`` value or a native health port that cannot be served.
    """
    if multiprocessing.current_process().name != "MainProcess":
        # A spawned helper process re-imports the server module; it serves no requests.
        return None
    if any(known is app for known in runtime.apps):
        return None
    settings = WorkerSettings.from_env()
    first_install = not runtime.installed
    if first_install:
        assemble(settings)  # a bad MINERU_HEALTH_RULES file stops the start-up here
        _start_endpoint(runtime.health, settings)
    runtime.apps.append(app)
    app.add_middleware(gate)
    metrics.mount_metrics(app, role="worker")
    metrics.bind_worker_healthy(lambda: runtime.health.healthy)
    metrics.bind_worker_snapshot(lambda: runtime.health.snapshot())
    return settings, runtime.rules, first_install


def finish_install(settings: WorkerSettings, rules: Any, line: str) -> None:
    """The second half, once per process: engine calls, threads, the start-up checks."""
    health = runtime.health
    engine_calls.install(worker_health, lambda: runtime.settings)
    model_cache.install(worker_health, engine_calls.on_import)
    if settings.parent_pid:
        # Launched by a router: what it starts is its group's, carries its tag,
        # and ends with it however it ends.
        lead_own_group()
        take_children_along(settings.worker_tag)
        exit_with_parent(int(settings.parent_pid), settings.worker_tag, on_gone=runtime.seal_store)
    start_waiting_thread(liveness_loop, health, name="mineru-health-liveness")
    if settings.exit_on_fatal:
        start_waiting_thread(exit_after_fatal, health, settings.exit_grace_s,
                             settings.worker_tag, name="mineru-health-exit-on-fatal")
    runtime.installed = True
    problem = patching.running_problem()
    if problem:
        log("WARNING", f"this MinerU is not one mineru-health patched as a whole: {problem}")
    log("INFO", f"worker health hooks installed on MinerU {line} ({rules!r}; {settings!r})")

"""Installing the worker runtime on a MinerU worker's app, in two halves, for either line.

    runtime = begin_install(app, Gate)   # config, the app's runtime and endpoint, gate, /metrics
    if runtime is not None:
        ...                              # the line's own hooks, given the runtime
        finish_install(runtime, "4.0")   # engine calls, threads, start-up checks

Nothing here knows a MinerU line: the line's adapter gives its gate class and
installs what touches its code between the halves. The runtime is built here,
once per app, and handed to everything installed; the app keeps it in
``app.state`` (:func:`~.worker_runtime.runtime_of`).
"""

from __future__ import annotations

import multiprocessing
import sys
from typing import Any

from ... import metrics, patching
from ...errors import ConfigError, HealthEndpointError
from ..settings import WorkerSettings
from . import engine_calls, model_cache
from .health import HealthEndpoint
from .log import log
from .threads import (
    exit_after_fatal,
    exit_with_parent,
    lead_own_group,
    liveness_loop,
    start_waiting_thread,
    take_children_along,
)
from .worker_runtime import STATE_ATTR, WorkerRuntime, runtime_of

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


def _start_endpoint(runtime: WorkerRuntime) -> None:
    settings = runtime.settings
    if settings.port is None or runtime.endpoint is not None:
        return
    try:
        endpoint = HealthEndpoint.start(
            runtime.health,
            port=settings.port,
            bind=settings.bind,
            expose_errors=settings.expose_errors,
        )
    except HealthEndpointError as error:
        variable = WorkerSettings.variable_name("port")
        raise ConfigError(f"{variable}: {error}", variable=variable) from error
    runtime.endpoint = endpoint
    runtime.advertised_port = _advertise(endpoint)
    log("INFO", f"native health endpoint on {endpoint.url} (/health, /livez, /readyz)")


def begin_install(app: Any, gate: type) -> WorkerRuntime | None:
    """The first half of installing the hooks on a worker's ``app``, for either MinerU line.

    Returns the app's new runtime, or None when there is nothing to do (a
    spawned helper process, an app seen before). Reads and checks the
    configuration, builds the runtime (native state, rules, verifier) and its
    endpoint, and puts ``gate`` and ``/metrics`` on ``app``. Raises
    :class:`~mineru_health.errors.ConfigError` on a bad rules file, a bad
    ``MINERU_HEALTH_*`` value or a native health port that cannot be served.
    """
    if multiprocessing.current_process().name != "MainProcess":
        # A spawned helper process re-imports the server module; it serves no requests.
        return None
    if runtime_of(app) is not None:
        return None
    runtime = WorkerRuntime(WorkerSettings.from_env())  # a bad MINERU_HEALTH_RULES stops it here
    _start_endpoint(runtime)
    setattr(app.state, STATE_ATTR, runtime)
    runtime.apps.append(app)
    app.add_middleware(gate, runtime=runtime)
    metrics.mount_metrics(app, role="worker", registry=runtime.metrics)
    metrics.bind_worker_healthy(lambda: runtime.health.healthy, runtime.metrics)
    metrics.bind_worker_snapshot(runtime.health.snapshot, runtime.metrics)
    return runtime


def finish_install(runtime: WorkerRuntime, line: str) -> None:
    """The second half: engine calls, threads, the start-up checks."""
    settings = runtime.settings
    health = runtime.health
    engine_calls.install(
        lambda: runtime.health, lambda: runtime.settings, lambda: runtime.failure_judge
    )
    model_cache.install(lambda: runtime.health, engine_calls.on_import, lambda: runtime.settings)
    if settings.parent_pid:
        # Launched by a router: what it starts is its group's, carries its tag,
        # and ends with it however it ends.
        lead_own_group()
        take_children_along(settings.worker_tag)
        exit_with_parent(int(settings.parent_pid), settings.worker_tag, on_gone=runtime.seal_store)
    start_waiting_thread(liveness_loop, health, name="mineru-health-liveness")
    if settings.exit_on_fatal:
        start_waiting_thread(
            exit_after_fatal,
            health,
            settings.exit_grace_s,
            settings.worker_tag,
            name="mineru-health-exit-on-fatal",
        )
    problem = patching.running_problem()
    if problem:
        log("WARNING", f"this MinerU is not one mineru-health patched as a whole: {problem}")
    log("INFO", f"worker health hooks installed on MinerU {line} ({runtime.rules!r}; {settings!r})")

"""Hooks for MinerU's ``mineru-api`` worker (mineru/cli/fast_api.py, MinerU 3.4).

The shipped patch adds three lines to fast_api.py::

    import mineru_health.integration.worker as mineru_health_worker
    mineru_health_worker.install(app)                            # after app = create_app()
    await mineru_health_worker.on_task_failed(self, task, exc)   # first in _process_task's except

What they give the worker:

* **A native health endpoint** (``MINERU_HEALTH_PORT``): ``/health``, ``/livez`` and
  ``/readyz`` served by a native thread from the native state, so a worker
  whose event loop MinerU keeps busy answers at once (see
  :class:`~mineru_health.worker.HealthEndpoint`).
* **Loop lag**: a callback on the event loop ticks every 100 ms; a loop blocked
  past ``MINERU_HEALTH_LOOP_HANG_S`` is hung (native ``/health`` 503,
  ``"loop_hung": true``), shorter blocks are busy.
* **Engine stall watchdog**: engine calls and requests are tracked
  (:mod:`.engine_calls`); work in progress with no progress for
  ``MINERU_HEALTH_STALL_S`` makes the worker fatal (category ``engine_stalled``).
* **Classification off the loop**: a task failure is classified on a small
  thread pool (the native matcher releases the GIL). A fatal one is recorded
  natively, sets MinerU's ``last_worker_error``, fails every other pending or
  running task at once as *collateral* with a generic error, and wakes every
  waiter. An ambiguous device error counts against the error budget.
  The task's status payload carries the verdict (``verdict``, ``engine_dead``).
* **The main port**: ``GET /health`` answers 503 with the native body once the
  engine is dead, and advertises the native port when it is reachable;
  ``POST /tasks`` and ``POST /file_parse`` get 503 with ``Retry-After``.
* ``MINERU_HEALTH_EXIT_ON_FATAL=1``: after a fatal failure, exit with status 75
  (EX_TEMPFAIL) after ``MINERU_HEALTH_EXIT_GRACE_S`` seconds.

Nothing here may break MinerU: every hook catches and logs its own errors,
except :func:`install`, which refuses a bad configuration at start-up.

One module per job: ``context`` (what the hooks share), ``tasks`` (verdicts,
collateral failures), ``gate`` (the main port), ``loop_watch`` (the event-loop
watcher), ``threads`` (liveness, exit on fatal, exit with the router); this
module installs them.
"""

from __future__ import annotations

import multiprocessing
import sys
from typing import Any

from ... import metrics, patching, verification
from ...classifier import default_rules
from ...errors import ConfigError, HealthEndpointError
from ...settings import WorkerSettings
from ...worker import HealthEndpoint, WorkerHealth, configure_worker_health
from .. import engine_calls, task_store
from .context import EXIT_CODE, current_health, log, runtime
from .gate import HealthGate
from .tasks import fail_outstanding_tasks, on_engine_dead, on_task_failed
from .threads import exit_after_fatal, exit_with_parent, liveness_loop, start_thread

__all__ = [
    "EXIT_CODE",
    "HealthGate",
    "begin_install",
    "fail_outstanding_tasks",
    "finish_install",
    "install",
    "on_engine_dead",
    "on_task_failed",
]


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
    rules = default_rules()  # a bad MINERU_HEALTH_RULES file stops the start-up here
    settings = WorkerSettings.from_env()
    first_install = not runtime.installed
    if first_install:
        runtime.settings = settings
        health = configure_worker_health(WorkerHealth(
            loop_hang_s=settings.loop_hang_s, stall_s=settings.stall_s,
            task_hang_s=settings.task_hang_s,
            error_budget=settings.error_budget,
            error_budget_window_s=settings.error_budget_window_s,
        ))
        _start_endpoint(health, settings)
        verification.set_default_verifier(verification.Verifier(timeout_s=settings.verify_s))
    runtime.apps.append(app)
    app.add_middleware(gate)
    metrics.mount_metrics(app, role="worker")
    metrics.bind_worker_healthy(lambda: current_health().healthy)
    metrics.bind_worker_snapshot(lambda: current_health().snapshot())
    return settings, rules, first_install


def finish_install(settings: WorkerSettings, rules: Any, line: str) -> None:
    """The second half, once per process: engine calls, threads, the start-up checks."""
    health = current_health()
    engine_calls.install(current_health)
    if settings.parent_pid:
        exit_with_parent(int(settings.parent_pid))
    start_thread(liveness_loop, health, name="mineru-health-liveness")
    if settings.exit_on_fatal:
        start_thread(exit_after_fatal, health, settings.exit_grace_s,
                     name="mineru-health-exit-on-fatal")
    runtime.installed = True
    problem = patching.running_problem()
    if problem:
        log("WARNING", f"this MinerU is not one mineru-health patched as a whole: {problem}")
    log("INFO", f"worker health hooks installed on MinerU {line} ({rules!r}; {settings!r})")


def install(app: Any) -> None:
    """Installs the health hooks on MinerU 3.x's FastAPI ``app``. Called once, at import.

    Raises :class:`~mineru_health.errors.ConfigError` (see :func:`begin_install`);
    a bad ``MINERU_HEALTH_STATE_DIR`` too.
    """
    started = begin_install(app, HealthGate)
    if started is None:
        return
    settings, rules, first_install = started
    if not first_install:
        return
    task_store.configure(settings)  # task store: a bad MINERU_HEALTH_STATE_DIR stops start-up
    finish_install(settings, rules, "3.x")

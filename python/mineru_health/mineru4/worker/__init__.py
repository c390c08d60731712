"""Hooks for MinerU 4.0's ``mineru-api`` worker (mineru/parser/api_server.py).

The shipped patch adds two lines at the end of ``create_app``::

    import mineru_health.mineru4.worker as mineru_health_worker
    mineru_health_worker.install(application, globals())

What they give the worker, as on 3.4 (:mod:`mineru_health.integration.worker`):

* **The native classifier decides** wherever 4.0 asks ``is_fatal_engine_error``
  (:mod:`.verdicts`): a fatal verdict is recorded natively and MinerU's own
  ``JobStore.fail_engine`` fails the other jobs. Ambiguous device errors count
  against the error budget; a remote engine (``server_url``) never condemns
  the worker.
* **A native health endpoint** (``MINERU_HEALTH_PORT``): ``/health``,
  ``/livez``, ``/readyz`` served off the event loop from the native state.
* **Loop lag and engine stall watchdog** (:mod:`.watch`, and the engine calls
  of :mod:`mineru_health.integration.engine_calls`, which 4.0's VLM path
  still makes through ``mineru_vl_utils``).
* **The main port**: ``GET /v1/health`` answers 503 with the native body once
  the engine is dead and advertises ``native_health_port``; ``POST /v1/tasks``,
  ``/v1/parse/jobs`` and ``/v1/file_parse`` get 503 with ``Retry-After``.
* ``MINERU_HEALTH_EXIT_ON_FATAL=1`` and the router's parent watch, as on 3.4.

Fault injection is no part of this package: the test and demo sandboxes load
their plugin themselves (:mod:`mineru_health.testing.mineru4_faults`), which
sets ``runtime.faults``.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import MutableMapping
from typing import Any

from ... import metrics
from ...classifier import default_rules
from ...integration import engine_calls
from ...integration.worker import _start_endpoint
from ...integration.worker.context import EXIT_CODE, current_health, log, runtime
from ...integration.worker.threads import (
    exit_after_fatal,
    exit_with_parent,
    liveness_loop,
    start_thread,
)
from ...settings import WorkerSettings
from ...worker import WorkerHealth, configure_worker_health
from .verdicts import rebind
from .watch import Gate

__all__ = ["EXIT_CODE", "Gate", "install"]


def install(app: Any, namespace: MutableMapping[str, Any] | None = None) -> None:
    """Installs the health hooks on the app ``create_app`` built; ``namespace``: its globals.

    Raises :class:`~mineru_health.errors.ConfigError` (so the worker refuses to
    start) on a bad rules file, a bad ``MINERU_HEALTH_*`` value or a native
    health port that cannot be served.
    """
    if multiprocessing.current_process().name != "MainProcess":
        return  # a spawned helper process serves no requests
    if any(known is app for known in runtime.apps):
        return
    rules = default_rules()  # a bad MINERU_HEALTH_RULES file stops the start-up here
    settings = WorkerSettings.from_env()
    first_install = not runtime.installed
    if first_install:
        runtime.settings = settings
        health = configure_worker_health(WorkerHealth(
            loop_hang_s=settings.loop_hang_s, stall_s=settings.stall_s,
            error_budget=settings.error_budget,
            error_budget_window_s=settings.error_budget_window_s,
        ))
        _start_endpoint(health, settings)
    health = current_health()
    runtime.apps.append(app)
    app.add_middleware(Gate)
    metrics.mount_metrics(app, role="worker")
    metrics.bind_worker_healthy(lambda: current_health().healthy)
    metrics.bind_worker_snapshot(lambda: current_health().snapshot())
    rebound = rebind(namespace)
    if not first_install:
        return
    engine_calls.install(current_health, lambda: runtime.faults)
    if settings.parent_pid:
        exit_with_parent(int(settings.parent_pid))
    start_thread(liveness_loop, health, name="mineru-health-liveness")
    if settings.exit_on_fatal:
        start_thread(exit_after_fatal, health, settings.exit_grace_s,
                     name="mineru-health-exit-on-fatal")
    runtime.installed = True
    log("INFO", f"worker health hooks installed on MinerU 4.0 ({rebound} engine checks "
                f"rebound; {rules!r}; {settings!r})")

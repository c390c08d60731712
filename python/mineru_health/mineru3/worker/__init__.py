"""Hooks for MinerU 3.x's ``mineru-api`` worker (``mineru/cli/fast_api.py``, 3.3.0-3.4.5).

The shipped patch adds three lines to fast_api.py::

    import mineru_health.mineru3.worker as mineru_health_worker
    mineru_health_worker.install(app)                            # after app = create_app()
    await mineru_health_worker.on_task_failed(self, task, exc)   # first in _process_task's except

What they give the worker:

* **A native health endpoint** (``MINERU_HEALTH_PORT``): ``/health``, ``/livez`` and
  ``/readyz`` served by a native thread from the native state, so a worker
  whose event loop MinerU keeps busy answers at once (see
  :class:`~mineru_health.runtime.worker.health.HealthEndpoint`).
* **Loop lag**: a callback on the event loop ticks every 100 ms; a loop blocked
  past ``MINERU_HEALTH_LOOP_HANG_S`` is hung (native ``/health`` 503,
  ``"loop_hung": true``), shorter blocks are busy.
* **Engine stall watchdog**: engine calls and requests are tracked
  (:mod:`mineru_health.runtime.worker.engine_calls`); work in progress with no progress for
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
* ``MINERU_HEALTH_OUTPUT_DIR`` (set by a router with a durable state
  directory): MinerU's output root, so that results outlive the router.

Nothing here may break MinerU: every hook catches and logs its own errors,
except :func:`install`, which refuses a bad configuration at start-up.

What is MinerU 3.x's own lives here: ``tasks`` (its ``TaskLine`` for the
runtime: a task failed, its figures; its failure hook; verdicts in its
status payloads), ``gate`` (the gate on its paths), ``task_store`` (its
finished tasks in the task store), ``fairness`` (its slots shared among
remote servers); this module installs them. The rest
is the line-agnostic runtime (:mod:`mineru_health.runtime.worker`: install
halves, the :class:`~mineru_health.runtime.worker.worker_runtime.WorkerRuntime`
they share, the gate, the loop watcher and what it does on a line (hung
tasks, a fatal record acted on once), the judge, threads, engine calls, the
task store). ``on_task_failed`` finds the app's runtime through its task
manager's app (``manager.app.state``).
"""

from __future__ import annotations

import os
from typing import Any

from ...runtime.worker.install import begin_install, finish_install
from ...runtime.worker.worker_runtime import EXIT_CODE
from .gate import Gate
from .task_store import state_dir
from .tasks import fail_outstanding_tasks, on_engine_dead, on_task_failed

__all__ = [
    "EXIT_CODE",
    "Gate",
    "fail_outstanding_tasks",
    "install",
    "on_engine_dead",
    "on_task_failed",
]


def install(app: Any) -> None:
    """Installs the health hooks on MinerU 3.x's FastAPI ``app``. Called once, at import.

    Raises :class:`~mineru_health.errors.ConfigError` (see :func:`begin_install`);
    a bad ``MINERU_HEALTH_STATE_DIR`` too.
    """
    runtime = begin_install(app, Gate)
    if runtime is None:
        return
    settings = runtime.settings
    if settings.output_dir:
        # A router with a durable state directory: outputs live there, so that
        # the results this worker's task store restores outlive the router.
        os.environ["MINERU_API_OUTPUT_ROOT"] = str(settings.output_dir)
    # Opened when the worker starts serving (Gate.started); a bad
    # MINERU_HEALTH_STATE_DIR stops the start-up there.
    runtime.defer_store(settings, state_dir(settings))
    finish_install(runtime, "3.x")

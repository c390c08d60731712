"""Hooks for MinerU 4.0's ``mineru-api`` worker (mineru/parser/api_server.py).

The shipped patch adds two lines at the end of ``create_app``::

    import mineru_health.mineru4.worker as mineru_health_worker
    mineru_health_worker.install(application, globals())

What they give the worker, as on 3.x (the runtime: :mod:`mineru_health.runtime.worker`):

* **The native classifier decides** wherever 4.0 asks ``is_fatal_engine_error``
  (:mod:`.fatal_check`): a fatal verdict is recorded natively and MinerU's own
  ``JobStore.fail_engine`` fails the other jobs. Ambiguous device errors count
  against the error budget; a remote engine (``server_url``) never condemns
  the worker.
* **A native health endpoint** (``MINERU_HEALTH_PORT``): ``/health``,
  ``/livez``, ``/readyz`` served off the event loop from the native state.
* **Loop lag and engine stall watchdog** (:mod:`.gate`, and the engine calls
  of :mod:`mineru_health.runtime.worker.engine_calls`, which 4.0's VLM path
  still makes through ``mineru_vl_utils``).
* **The main port**: ``GET /v1/health`` answers 503 with the native body once
  the engine is dead and advertises ``native_health_port``; ``POST /v1/tasks``,
  ``/v1/parse/jobs`` and ``/v1/file_parse`` get 503 with ``Retry-After``.
* ``MINERU_HEALTH_EXIT_ON_FATAL=1`` and the router's parent watch, as on 3.4.
* **The task store**: finished jobs on disk (:mod:`.job_store`), in
  ``MINERU_HEALTH_STATE_DIR`` or the upload directory.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from ...runtime.worker import store
from ...runtime.worker.install import begin_install, finish_install
from ...runtime.worker.worker_runtime import EXIT_CODE
from .fatal_check import rebind
from .gate import Gate, follow_jobs

__all__ = ["EXIT_CODE", "Gate", "install"]


def install(app: Any, namespace: MutableMapping[str, Any] | None = None) -> None:
    """Installs the health hooks on the app ``create_app`` built; ``namespace``: its globals.

    Raises :class:`~mineru_health.errors.ConfigError` (so the worker refuses to
    start) on a bad rules file, a bad ``MINERU_HEALTH_*`` value, a native
    health port that cannot be served or a bad ``MINERU_HEALTH_STATE_DIR``.
    """
    runtime = begin_install(app, Gate)
    if runtime is None:
        return
    rebind(runtime, namespace)
    if namespace is not None:
        follow_jobs(runtime, namespace)  # the task watchdog, and the job in context
    settings = runtime.settings
    upload_dir = getattr(getattr(app, "state", None), "upload_dir", "")
    runtime.defer_store(settings, store.state_dir(settings, upload_dir or "."))
    finish_install(runtime, "4.0")

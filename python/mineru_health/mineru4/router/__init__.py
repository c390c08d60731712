"""Self-healing for MinerU 4.0's ``mineru-router`` (``mineru/kit/router/``).

The patch (``patches/mineru-4.0/``) adds a few lines:

- ``workers.py``, after ``class WorkerPool``: ``WorkerPool =
  install(globals())``, a subclass whose supervision is the native poller
  and restart policy (``pool.py``), and whose local workers start with
  their own native health port (``ManagedLocalWorker`` is rebound too);
- ``app.py``, in ``create_app``: ``install_app(application, globals())``
  (``/metrics``, the job supervisor, the job helpers it wraps) and, in
  ``submit_job``, ``job_submitted(application, job_route, body)``: the job
  is kept until it ends (``jobs.py``); ``submit_job = failover(application,
  submit_job)``: a submission its worker lost on the way is sent to another.

What changes against 4.0.12's own loop (``_monitor_loop`` every 2 s,
``refresh_all`` gathering every worker, restarts awaited inside it):

- each worker is probed on its own jittered schedule by one native thread
  (native endpoint first, else ``/v1/health`` with the generous main-port
  timeout); a slow or restarting worker never delays another;
- a 503 ``engine_dead`` ejects at once; other failures after the failure
  threshold, and a worker that stops answering is restarted too; backoff
  with cap and give-up; the mass-ejection guard; audit events; ``/metrics``;
- jobs a dead, stalled, killed or restarted worker lost are sent again
  under the same job id; a replaced worker's finished results stay
  downloadable (``retired.py``).

Remote upstream workers (``--upstream-url``) are never restarted.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from mineru_health import metrics

from .jobs import JobSupervisor
from .pool import healing_pool_class, launching_worker_class

__all__ = ["failover", "install", "install_app", "job_submitted"]


def install(namespace: MutableMapping[str, Any]) -> type:
    """The self-healing WorkerPool for ``mineru/kit/router/workers.py``'s globals().

    Also rebinds ``ManagedLocalWorker`` there, so that the pool builds
    local workers that launch with their own variables.
    """
    base = namespace["WorkerPool"]
    if getattr(base, "_mineru_health", False):
        return base  # type: ignore[no-any-return]
    namespace["ManagedLocalWorker"] = launching_worker_class(namespace["ManagedLocalWorker"])
    return healing_pool_class(base, namespace)


def install_app(app: Any, namespace: MutableMapping[str, Any]) -> None:
    """Adds ``GET /metrics`` and the job supervisor to the router's app.

    ``namespace`` is ``app.py``'s globals(): the supervisor wraps the
    module-level helpers that fail a job whose worker lost it.
    """
    metrics.mount_metrics(app, role="router")
    state = app.state
    supervisor = JobSupervisor(state.worker_pool, state.registry, state.source_store, namespace)
    state.worker_pool.job_supervisor = supervisor
    state.mineru_health_jobs = supervisor
    supervisor.install(namespace)


def job_submitted(app: Any, route: Any, body: dict[str, Any]) -> None:
    """``submit_job`` handed ``body`` on as the job of ``route``: keep it until it ends."""
    supervisor = getattr(app.state, "mineru_health_jobs", None)
    if supervisor is not None:
        supervisor.track(route, body)


def failover(app: Any, submit_job: Any) -> Any:
    """``submit_job`` that tries another worker when the chosen one fails on the way.

    4.0 hands a 502/504 (the worker died or hung during the upload) or a
    503 ``engine_dead`` straight to the client; such a submission is made
    again, once per other worker at most. Anything else is the answer.
    """

    async def submit_with_failover(body: dict[str, Any], request: Any,
                                   uploads: Any = None) -> Any:
        supervisor = getattr(app.state, "mineru_health_jobs", None)
        if supervisor is None:
            return await submit_job(body, request, uploads)
        return await supervisor.submit_with_failover(submit_job, body, request, uploads)

    return submit_with_failover

"""Self-healing for MinerU 4.0's ``mineru-router`` (``mineru/kit/router/``).

The patch (``patches/mineru-4.0/``) adds a few lines:

- ``workers.py``, after ``class WorkerPool``: ``WorkerPool =
  install(globals())``, a subclass whose supervision is the runtime's fleet
  (``pool.py``), and whose local workers start with their own variables
  (``ManagedLocalWorker`` is rebound too: with a durable state directory,
  its upload directory is in the worker's state directory);
- ``app.py``, in ``create_app``: ``install_app(application, globals())``
  (``/metrics``, the job supervisor, the job helpers it wraps, the router's
  store, resumed by the pool once its workers are up) and, in
  ``submit_job``, ``job_submitted(application, job_route, body)``: the job
  is kept until it ends (``jobs.py``); ``submit_job = failover(application,
  submit_job)``: every submission is admitted under the caps on kept jobs
  and bytes and the room on disk (503 or 507 with Retry-After,
  ``endpoints.py``), and one its worker lost on the way is sent to another.

What is MinerU 4.0's own lives here: its worker objects and capabilities
(``pool.py``), its jobs and routes (``jobs.py``), its app's helpers wrapped
(``endpoints.py``: job statuses, 404s, submissions with admission and
failover), the outputs of replaced instances (``retired.py``), its upstream
helpers bounded (``reads.py``), another router's jobs answered from the shared
store (``shared.py``). The rest is the line-agnostic runtime
(:mod:`mineru_health.runtime.router`).

Remote upstream workers (``--upstream-url``) are never restarted.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from mineru_health import metrics
from mineru_health.runtime.router.admission import Refused, answer_refusals
from mineru_health.runtime.router.fleet import quiet_config_tracebacks
from mineru_health.runtime.router.launch import launching_class

from .endpoints import failover, install_endpoints, job_submitted
from .health import StoreInHealth
from .jobs import JobLine
from .pool import healing_pool_class, outputs_kept_class
from .reads import bound_reads
from .shared import AnotherRoutersJobs

__all__ = ["failover", "install", "install_app", "job_submitted"]


def install(namespace: MutableMapping[str, Any]) -> type:
    """The self-healing WorkerPool for ``mineru/kit/router/workers.py``'s globals().

    Also rebinds ``ManagedLocalWorker`` there, so that the pool builds
    local workers that launch with their own variables.
    """
    base = namespace["WorkerPool"]
    if getattr(base, "_mineru_health", False):
        return base  # type: ignore[no-any-return]
    quiet_config_tracebacks()
    namespace["ManagedLocalWorker"] = outputs_kept_class(
        launching_class(namespace["ManagedLocalWorker"])
    )
    return healing_pool_class(base, namespace)


def install_app(app: Any, namespace: MutableMapping[str, Any]) -> None:
    """Adds ``GET /metrics`` and the job supervisor to the router's app.

    ``namespace`` is ``app.py``'s globals(): the supervisor wraps the
    module-level helpers that fail a job whose worker lost it.
    """
    metrics.mount_metrics(app, role="router")
    state = app.state
    pool = state.worker_pool
    pool.keep_in_scratch(state.source_store)
    line: JobLine = pool.job_line  # built with the pool's supervisor (runtime.py)
    line.install(state.registry, state.source_store, namespace)
    install_endpoints(line, namespace)  # app.py's helpers that end a lost job (endpoints.py)
    bound_reads(namespace)  # worker answers within bounds, named when broken (reads.py)
    # 503/507 with Retry-After, in 4.0's error shape (admission.py), never a bare 500.
    answer_refusals(app, lambda request: line.supervisor, _error_body)
    # /v1/health says whether the router's store can be reached (health.py).
    app.add_middleware(StoreInHealth, store_of=lambda: line.supervisor.store)
    # Another router's jobs answered from the shared store, never 404 (shared.py).
    app.add_middleware(AnotherRoutersJobs, line=line, registry=state.registry)


def _error_body(refusal: Refused) -> dict[str, Any]:
    return {"error": {"type": "api_error", "code": refusal.code, "message": refusal.detail}}

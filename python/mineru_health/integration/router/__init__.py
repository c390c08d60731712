"""Self-healing for MinerU's ``mineru-router`` (mineru/cli/router.py, MinerU 3.4.4).

The patch adds three lines to the router: right after ``class WorkerPool`` it
rebinds the name to ``install(globals())``, a subclass whose health loop is
the native poller; ``create_app`` calls ``install_app(app, globals())`` (adds
``/metrics``, and rebinds the task endpoints' helpers, see ``endpoints.py``);
``fetch_router_task_status`` calls
``worker_pool.observe_task_status(task, payload)``. Everything else lives in
this package, one job per module:

- ``pool.py``        -- lifecycle: start-up, shut-down, process watch,
  restarts as asyncio tasks, ``/health`` fields, poller event dispatch;
- ``projection.py``  -- pure: poller events and statuses written onto
  MinerU's ``WorkerState`` objects (``healthy`` is the policy's "in
  rotation", nothing else is kept), ``/health`` entries, ejection causes;
- ``passive.py``     -- passive ejection from a dead worker's refusals (task
  statuses: ``resubmission.py``); both read the worker's verdict, no text;
- ``instance_dirs.py`` -- local workers' state directories and replaced
  instances' outputs;
- ``endpoints.py``    -- staged uploads kept, status refresh, results from
  a restarted worker, ``attempts``/``workers_tried`` in task statuses;
- ``tasks.py``        -- the task supervisor: which tasks a dead, stalled,
  killed or restarted worker lost (decisions in ``resubmit_policy.py``);
  ``sending.py`` sends them again or fails them with a reason (the poison
  guard in ``poison.py``); ``tracked.py`` the kept task;
- ``resubmission.py`` -- the mixin that gives the pool its supervisor.

What changes against MinerU's own loop (which probes workers one after
another every 2 s and awaits restarts inside that loop):

- One native thread probes every worker concurrently on its own jittered
  schedule; a 503 carrying ``"engine_dead": true`` ejects at once, other
  failures after ``MINERU_ROUTER_HEALTH_FAILURE_THRESHOLD`` probes.
- A local worker's restart never blocks probing, routing or other restarts.
- Every audit event is one JSON line in ``MINERU_ROUTER_HEALTH_AUDIT_PATH``
  (stderr by default); ``/health`` shows each worker's phase, rotation,
  consecutive failures, restart attempt, next restart time and last error,
  read from the native policy; ``/metrics`` reads the same statuses.

Remote upstream workers (``--upstream-url``) are never restarted.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from mineru_health import metrics

from .endpoints import install_endpoints
from .passive import PassiveEjectionMixin
from .pool import PoolLifecycleMixin, launching_server_class
from .resubmission import ResubmissionMixin

__all__ = ["HealingPoolMixin", "install", "install_app"]


class HealingPoolMixin(ResubmissionMixin, PassiveEjectionMixin, PoolLifecycleMixin):
    """Replaces MinerU's sequential refresh loop with the native poller and restart policy.

    Mixed in before MinerU's WorkerPool (see ``install``). Runs on the
    router's event loop; not thread-safe, like the class it extends.
    """


def install_app(app: Any, namespace: MutableMapping[str, Any] | None = None) -> None:
    """Adds ``GET /metrics`` to the router's FastAPI app; rebinds the task helpers.

    ``namespace`` is the router module's ``globals()``; ``create_app`` runs
    after every function of the module is defined, so they can be wrapped.
    """
    metrics.mount_metrics(app, role="router")
    if namespace is not None:
        install_endpoints(namespace)


def install(namespace: Mapping[str, Any]) -> type:
    """Returns the self-healing WorkerPool for a MinerU router module's globals()."""
    base = namespace["WorkerPool"]
    if getattr(base, "_mineru_health", False):
        return base  # type: ignore[no-any-return]
    local_base = namespace.get("ManagedLocalServer")
    attrs = {
        "_router": namespace,
        "_local_server_class": launching_server_class(local_base) if local_base else None,
        "_mineru_health": True,
        "__module__": namespace.get("__name__", __name__),
        "__doc__": HealingPoolMixin.__doc__,
    }
    return type(base.__name__, (HealingPoolMixin, base), attrs)

"""Self-healing for MinerU 3.x's ``mineru-router`` (``mineru/cli/router.py``, 3.3.0-3.4.5).

The patch (``patches/mineru-3/router.patch``) adds three lines to the router:
right after ``class WorkerPool`` it rebinds the name to
``install(globals())``, a subclass whose supervision is the runtime's fleet
and task supervisor (``pool.py``); ``create_app`` calls
``install_app(app, globals())`` (``/metrics``, and the task endpoints'
helpers rebound, ``endpoints.py``); ``fetch_router_task_status`` calls
``worker_pool.observe_task_status(task, payload)``. What is MinerU 3.x's own
lives here: its worker objects (``pool.py``), its tasks (``tasks.py``), its
endpoints (``endpoints.py``), its blocking submission client (``reads.py``).
The rest is the line-agnostic runtime (:mod:`mineru_health.runtime.router`).

Remote upstream workers (``--upstream-url``) are never restarted.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from mineru_health import metrics
from mineru_health.runtime.router.fleet import quiet_config_tracebacks

from .endpoints import answer_storage_errors, install_endpoints
from .pool import healing_pool_class
from .reads import bound_submissions

__all__ = ["install", "install_app"]


def install(namespace: Mapping[str, Any]) -> type:
    """Returns the self-healing WorkerPool for a MinerU 3.x router module's globals()."""
    base = namespace["WorkerPool"]
    if getattr(base, "_mineru_health", False):
        return base  # type: ignore[no-any-return]
    quiet_config_tracebacks()
    return healing_pool_class(base, namespace)


def install_app(app: Any, namespace: MutableMapping[str, Any] | None = None) -> None:
    """Adds ``GET /metrics`` to the router's FastAPI app; rebinds the task helpers.

    ``namespace`` is the router module's ``globals()``; ``create_app`` runs
    after every function of the module is defined, so they can be wrapped.
    """
    metrics.mount_metrics(app, role="router")
    answer_storage_errors(app)  # 507, never a bare 500, for a full disk
    if namespace is not None:
        install_endpoints(namespace)
        bound_submissions(app, namespace)  # the answer to a submission within bounds (reads.py)

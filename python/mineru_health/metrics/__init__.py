"""Prometheus metrics for patched MinerU workers and routers.

Each process owns one registry (``_registry.py``), never the library's global
one; a worker's runtime owns its own (``registry=`` below), the router uses the
process's. Metrics are created per side on first use: a worker process exposes only
``mineru_worker_*`` (:mod:`.worker`), a router only ``mineru_router_*``
(:mod:`.router`), and both the standard ``process_*`` and ``python_info``
families. docs/operations.md has the reference and the alert rules built on
them.

    from mineru_health import metrics
    metrics.mount_metrics(app, role="worker", registry=reg)  # GET /metrics, families created
    metrics.bind_worker_healthy(lambda: health.healthy, reg)
    metrics.bind_worker_snapshot(health.snapshot, reg)       # every other worker family

The worker-side functions are re-exported here (the worker runtime calls
them as ``metrics.<name>``); router code uses ``metrics.router``. Every
function is thread-safe.
"""

from __future__ import annotations

from typing import Any, Literal

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from . import _registry, router, worker
from ._registry import ProcessRegistry
from .worker import bind_worker_healthy, bind_worker_snapshot

__all__ = [
    "METRIC_NAMES",
    "ProcessRegistry",
    "bind_worker_healthy",
    "bind_worker_snapshot",
    "exposition",
    "mount_metrics",
    "registry",
    "router",
    "worker",
]

Role = Literal["worker", "router"]

METRIC_NAMES: dict[Role, tuple[str, ...]] = {
    "worker": worker.METRIC_NAMES,
    "router": router.METRIC_NAMES,
}


def registry() -> CollectorRegistry:
    """This process's registry (for tests and for adding collectors)."""
    return _registry.current().registry


def exposition(registry: ProcessRegistry | None = None) -> bytes:
    """The current metrics of ``registry`` (the process's by default) in Prometheus text format."""
    return generate_latest((registry if registry is not None else _registry.current()).registry)


def mount_metrics(
    app: Any, role: Role, path: str = "/metrics", registry: ProcessRegistry | None = None
) -> None:
    """Adds ``GET <path>`` (Prometheus text format of ``registry``, the process's by
    default) to a FastAPI app.

    Creates the role's metric families first so they appear on the first
    scrape, before anything happened. Call once per app, at import or
    start-up of the patched worker or router.
    """
    if role == "worker":
        worker.ensure_families(registry)
    elif role == "router":
        router.ensure_families()
    else:
        raise ValueError(f"role must be 'worker' or 'router', not {role!r}")

    from starlette.responses import Response

    async def metrics_endpoint() -> Response:
        return Response(content=exposition(registry), media_type=CONTENT_TYPE_LATEST)

    app.add_api_route(path, metrics_endpoint, methods=["GET"], include_in_schema=False)

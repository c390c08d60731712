"""MinerU 4.0's router reads its workers' answers within bounds (``runtime.router.upstream_reads``).

The bounds themselves sit under the pool's client (the fleet installs them);
``bound_reads(namespace)`` (``app.py``'s globals, from ``install_app``)
rebinds the helpers through which 4.0 reads a worker, in every module of
``mineru/kit/router/`` that looks them up:

- ``request_upstream``: a bound broken is a 502 ``upstream_bound_broken``
  naming the worker and the bound (4.0 would say only "unavailable");
- ``stream_upstream`` (a file's content, relayed as it comes),
  ``copy_file_to_worker`` (an output copied to another worker) and
  ``RouterTaskBackend.read_output`` (the task API's outputs, read whole) fetch
  results: MAX_RESULT_MB and MAX_RESULT_S, not a status's bounds.

Idempotent (``create_app`` may run more than once in a process).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, MutableMapping
from typing import Any

__all__ = ["bound_reads"]

_BOUND = "_mineru_health_bound_reads"


def bound_reads(namespace: MutableMapping[str, Any]) -> None:
    """Rebinds 4.0's upstream helpers (see the module's doc); ``namespace`` is app.py's."""
    from mineru_health.runtime.router import upstream_reads  # imports httpx: at install

    package = str(namespace["__name__"]).rpartition(".")[0]
    proxy, tasks = (importlib.import_module(f"{package}.{name}") for name in ("proxy", "tasks"))
    if getattr(proxy, _BOUND, False):
        return
    error = namespace["RouterProxyError"]

    def naming_the_bound(call: Callable[..., Any], *, result: bool) -> Callable[..., Any]:
        @functools.wraps(call)
        async def bounded(pool: Any, worker: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                if not result:
                    return await call(pool, worker, *args, **kwargs)
                with upstream_reads.results():
                    return await call(pool, worker, *args, **kwargs)
            except error as exc:
                broken = exc.__cause__
                if not isinstance(broken, upstream_reads.BoundBroken):
                    raise
                raise error(
                    502, "upstream_bound_broken", f"Upstream {worker.worker_id}: {broken}"
                ) from broken

        return bounded

    def fetching_results(call: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(call)
        async def fetching(*args: Any, **kwargs: Any) -> Any:
            with upstream_reads.results():
                return await call(*args, **kwargs)

        return fetching

    request = naming_the_bound(proxy.request_upstream, result=False)
    for module_globals in (vars(proxy), vars(tasks), namespace):
        if "request_upstream" in module_globals:
            module_globals["request_upstream"] = request
    namespace["stream_upstream"] = naming_the_bound(namespace["stream_upstream"], result=True)
    namespace["copy_file_to_worker"] = fetching_results(namespace["copy_file_to_worker"])
    backend = tasks.RouterTaskBackend
    backend.read_output = fetching_results(backend.read_output)
    setattr(proxy, _BOUND, True)

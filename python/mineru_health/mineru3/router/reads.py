"""MinerU 3.x's router reads a worker's answer to a submission within bounds too.

Every other read goes through the router's async client, which the fleet
bounds (``runtime.router.upstream_reads``). MinerU 3.x submits from a thread
with a blocking ``httpx.Client`` it makes per submission, looked up as
``httpx.Client`` in the router module's globals: ``bound_submissions``
rebinds that module's ``httpx`` to one whose ``Client`` reads with the
router's bounds (everything else is httpx's own). A submission answered
beyond a bound is MinerU's "worker unavailable" for that worker (an
``httpx.HTTPError``): tried on another one, as a connection error is.
"""

from __future__ import annotations

import types
from collections.abc import MutableMapping
from typing import Any

__all__ = ["bound_submissions"]

_BOUND = "_mineru_health_bound_submissions"
_APP = "_mineru_health_submissions_app"


class _Httpx(types.ModuleType):
    """httpx, but for ``Client``."""

    def __init__(self, real: types.ModuleType, client: Any) -> None:
        super().__init__(real.__name__, real.__doc__)
        self._real = real
        self.Client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def bound_submissions(app: Any, namespace: MutableMapping[str, Any]) -> None:
    """Rebinds ``httpx`` in the 3.x router module's globals, for ``app``'s client's bounds.

    The module makes an app when imported and ``main`` makes the one it
    serves: the bounds are the last app's (``httpx`` is rebound once).
    """
    from mineru_health.runtime.router import upstream_reads  # imports httpx: at install

    namespace[_APP] = app
    if namespace.get(_BOUND):
        return

    def reads() -> Any:
        state = getattr(namespace.get(_APP), "state", None)
        return upstream_reads.reads_of(getattr(state, "http_client", None))

    namespace["httpx"] = _Httpx(namespace["httpx"], upstream_reads.bounded_sync_client(reads))
    namespace[_BOUND] = True

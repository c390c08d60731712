"""One worker as a MinerU line's pool holds it: what the fleet and its local workers' part
need of MinerU's worker object (``fleet.py``, ``local_workers.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

__all__ = ["Member"]


class Member(Protocol):
    """One worker as the line's pool holds it (MinerU's own worker object underneath)."""

    id: str
    local: bool  # launched, watched and restarted by this router

    def base_url(self) -> str:
        """The worker's base URL ("" while it has none, e.g. being restarted)."""

    def probe_base(self) -> str:
        """The URL the poller appends ``/health`` to ("" while the worker has none)."""

    def connect_host(self) -> str:
        """Where the router reaches a local worker (its native endpoint binds there)."""

    def process(self) -> Any:
        """A local worker's current process (``subprocess.Popen``), or None."""

    def show(self, event: Any) -> None:
        """Writes a poller event (rotation, probe, reason) onto MinerU's worker object."""

    def show_rotation(self, in_rotation: bool, reason: str | None = None) -> None:
        """Writes the policy's rotation (and why it left it) onto MinerU's worker object."""

    async def launch(self, env: Mapping[str, str]) -> None:
        """Starts a local worker's process with ``env`` added, without waiting for health."""

    async def stop(self) -> None:
        """Stops a local worker's process, keeping what the instance finished (a restart)."""

"""One router's runtime, built the one way both MinerU lines build it and closed in one place.

A patched router's pool (3.x's ``mineru3/router/pool.py``, 4.0's
``mineru4/router/pool.py``) keeps only what touches its MinerU; what every
router has is built here, in this order:

1. the settings (``router_settings``): a bad value refuses the router before
   any worker process is spawned, the message naming the variable;
2. the scratch directory (``scratch.py``): every temporary directory of the
   router from here on, MinerU's included, in one that a killed router's
   successor removes;
3. MinerU's own pool (the line's ``open_mineru``): its worker objects, the
   HTTP client the fleet probes with, and the outputs of replaced instances
   it keeps (``Retired``);
4. the fleet (``fleet.py``), refusing a bad setting as step 1 does;
5. the supervisor over the fleet and the line's :class:`Line`, with its
   store in the router's durable state directory (``Supervisor.over``);
6. the discovery of remote workers by DNS (``discovery.py``), when
   ``UPSTREAM_DNS`` asks for it.

    runtime = open_runtime(pool, line, open_mineru=..., expect=...)   # the pool's __init__
    await runtime.close(mineru_close)                                  # the pool's shutdown

``close`` undoes it in the one order that loses nothing: the discovery; the
supervisor (its uploads deleted, or left in the store for the next router);
the fleet (every local worker's processes ended); MinerU's own shutdown
(``mineru_close``: it stops the instances, deleting their outputs); the
retired outputs (only now: MinerU's shutdown may still read them); the
fleet's files (audit log); the scratch directory, with whatever MinerU made
there and did not remove. Runs on the router's event loop; not thread-safe.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from mineru_health.runtime.settings import HealthSettings

from .discovery import Discovery, Workers
from .fleet import Fleet, router_settings
from .line import Line
from .scratch import claim_scratch, release_scratch
from .supervisor import Supervisor

__all__ = ["Retired", "RouterRuntime", "RuntimeParts", "open_runtime"]


class Retired(Protocol):
    """The outputs of instances a restart replaced, kept by the line's pool."""

    def close(self) -> None: ...


R = TypeVar("R", bound=Retired)


@dataclass(frozen=True)
class RouterRuntime(Generic[R]):
    """What every patched router has, whichever MinerU line it serves."""

    fleet: Fleet
    supervisor: Supervisor
    retired: R
    discovery: Discovery | None

    @property
    def settings(self) -> HealthSettings:
        return self.fleet.settings

    async def close(self, mineru_close: Callable[[], Awaitable[None]]) -> None:
        """Shuts the router down, MinerU's own shutdown (``mineru_close``) in its place."""
        if self.discovery is not None:
            await self.discovery.close()
        await self.supervisor.close()  # the uploads it kept are deleted (or stay, with a store)
        await self.fleet.close()  # every local worker's processes ended
        await mineru_close()  # MinerU stops the current instances
        self.retired.close()  # only after that: MinerU's stop may still serve from them
        self.fleet.close_files()
        release_scratch()  # what MinerU made there and did not remove


class RuntimeParts(Generic[R]):
    """A line's pool, mixed in: its parts read from its runtime (``self.runtime``), never
    kept twice."""

    runtime: RouterRuntime[R]

    @property
    def fleet(self) -> Fleet:
        return self.runtime.fleet

    @property
    def supervisor(self) -> Supervisor:
        return self.runtime.supervisor

    @property
    def retired(self) -> R:
        return self.runtime.retired

    @property
    def discovery(self) -> Discovery | None:
        return self.runtime.discovery


def open_runtime(
    workers: Workers,
    line: Line,
    *,
    open_mineru: Callable[[], tuple[Any, R]],
    expect: Callable[[HealthSettings], Any],
    native_probes: bool = True,
) -> RouterRuntime[R]:
    """The router's runtime for the line's pool ``workers`` and its :class:`Line`.

    ``open_mineru`` builds MinerU's own pool and returns the HTTP client
    the fleet probes with and the retired outputs; ``expect`` gives the
    probe expectations of the line; ``native_probes`` False probes the
    workers' main port whatever the settings say (workers that do not serve
    the native port).
    """
    settings = router_settings()  # first: a bad value refuses the start, naming the variable
    claim_scratch()
    client, retired = open_mineru()
    fleet = Fleet.refusing(
        settings,
        expect(settings),
        client=client,
        native_probes=bool(settings.native_probes) and native_probes,
    )
    supervisor = Supervisor.over(fleet, line)
    # Remote workers found by DNS (UPSTREAM_DNS), beside --upstream-url's.
    discovery = Discovery.configured(
        fleet, workers, kept_on=lambda: {kept.worker for kept in supervisor.kept()}
    )
    return RouterRuntime(fleet, supervisor, retired, discovery)

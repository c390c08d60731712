"""A router's lease in a shared store, renewed while it runs, and its dead peers' submissions.

Several routers on one PostgreSQL (``STORE_URL``; docs/architecture.md, "Several routers,
one fleet") each hold a lease (``routers.lease_until``, the database's clock). The
:class:`Lease` keeps this router's: it renews it every third of ``LEASE_S``, off the event
loop, and after each renewal takes over the unfinished submissions of a router whose lease
expired (``PostgresStore.take_over``: one transaction, one survivor), handing them to the
supervisor, which resumes them as a restarted router resumes its own (``take_back``)::

    lease = Lease(store, lease_s, take_back=..., disown=..., kept=...)
    lease.renew_now()      # start-up, before the router's own rows are read (blocking)
    lease.start()          # the loop, on the running event loop
    lease.holds()          # False once the last renewal is LEASE_S old: send nothing
    lease.counts()         # {"fenced", "lapses", "takeovers"}: /metrics reads it at scrapes
    await lease.close()    # shutdown: stops, and ends the lease (a survivor takes over now)

A renewal that finds the lease lapsed (this router was paused, partitioned, or the database
unreachable for LEASE_S) means another router may have taken its rows: the keys it keeps
that the store no longer names as its own are let go (``disown``: not driven here any
more), logged and audited; the store already refuses their writes (fenced).

After renewals that failed (the database unreachable), a router takes over no one for one
lease from its first renewal that succeeds again: an outage longer than the lease lapses
every router's lease, and its live peers renew theirs within that lease (a peer still
expired after it is really gone).

``holds()`` is this router's own view, on its monotonic clock, from the moment it *asked*
for its last successful renewal: never later than the database's ``lease_until``, so a
router never sends a submission again once a survivor may have taken it over.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, TypeVar

from mineru_health import metrics, safe_text

from .store import Saved

__all__ = ["MAX_TAKEOVERS", "Lease", "SharedStore", "shared"]

_log = safe_text.logger("mineru_health.router.lease")

#: Expired routers taken over after one renewal at most (the next renewal goes on).
MAX_TAKEOVERS = 8

T = TypeVar("T")


class SharedStore(Protocol):
    """What the lease uses of a store several routers share (``pg_store.PostgresStore``)."""

    router_id: str

    def renew(self, lease_s: float) -> bool: ...

    def release(self) -> None: ...

    def take_over(self) -> tuple[str, list[Saved]] | None: ...

    def rows(self) -> list[Saved]: ...


def shared(store: Any) -> SharedStore | None:
    """``store`` when several routers share it (it has leases), else None (SQLite's file)."""
    needed = ("renew", "release", "take_over", "rows")
    return store if all(callable(getattr(store, name, None)) for name in needed) else None


async def _in_thread(call: Callable[[], T]) -> T:
    return await asyncio.to_thread(call)


class Lease:
    """This router's lease in a shared store (module docstring)."""

    def __init__(
        self,
        store: SharedStore,
        lease_s: float,
        *,
        take_back: Callable[[str, list[Saved]], Any],
        disown: Callable[[list[str], str], Any],
        kept: Callable[[], Iterable[str]],
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        in_thread: Callable[[Callable[[], Any]], Awaitable[Any]] = _in_thread,
        take_in: Callable[[list[Saved]], list[Saved]] = list,
    ) -> None:
        """``take_back(router id, rows)`` resumes a dead router's rows, now this one's;
        ``disown(keys, why)`` stops driving keys another router took; ``kept()`` are the
        keys driven here. ``clock``, ``sleep`` and ``in_thread`` (how a store call leaves
        the event loop) are injected: the unit tests never wait. ``take_in(rows)``
        readies taken-over rows for ``take_back`` in the takeover's thread (their kept
        uploads read back: kept_uploads.py), off the event loop."""
        self.store = store
        self.lease_s = float(lease_s)
        #: Seconds between two renewals: a lease survives two failed ones.
        self.every_s = self.lease_s / 3.0
        self._take_back = take_back
        self._disown = disown
        self._kept = kept
        self._clock = clock
        self._sleep = sleep
        self._in_thread = in_thread
        self._take_in = take_in
        self._valid_until = -math.inf  # this router's clock: its last renewal + lease_s
        self._renewed = False  # a renewal succeeded (a later lapse means rows may be gone)
        self._failing = False
        #: This router's clock: no takeover before it (one lease after failed renewals).
        self._takes_over_from = -math.inf
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.renewals = 0
        self.lapses = 0
        self.taken_over: list[tuple[str, int]] = []  # (router id, rows), in order

    # -- what the supervisor asks ---------------------------------------------------------
    def holds(self) -> bool:
        """True while this router's lease is surely held (no one can have taken its rows)."""
        return self._clock() < self._valid_until

    def counts(self) -> dict[str, int]:
        """What /metrics shows of the lease: the store's fenced writes (0 where it counts
        none), the lapses found, the expired routers taken over."""
        return {
            "fenced": int(getattr(self.store, "fenced", 0)),
            "lapses": self.lapses,
            "takeovers": len(self.taken_over),
        }

    # -- renewing -------------------------------------------------------------------------
    def renew_now(self) -> None:
        """The start-up renewal, blocking (before the router reads its own rows, so that no
        survivor takes them while it resumes them). A database that fails is logged; the
        loop tries again."""
        started = self._clock()
        try:
            self.store.renew(self.lease_s)
        except Exception as error:  # noqa: BLE001 -- the loop retries; nothing is sent meanwhile
            self._cannot_renew(error)
            return
        self._renewed_at(started, lapsed_rows=None)

    async def renew(self) -> bool:
        """One renewal, off the event loop; a lapse lets go of what was taken meanwhile.
        False when the database could not be asked (logged once per streak)."""
        started = self._clock()
        try:
            held = await self._in_thread(lambda: self.store.renew(self.lease_s))
            lapsed_rows = None
            if not held and self._renewed:
                lapsed_rows = await self._in_thread(self.store.rows)
        except Exception as error:  # noqa: BLE001 -- the database down must not stop the router
            self._cannot_renew(error)
            return False
        # Held, or taken anew after a lapse: either way this router holds its lease now.
        self._renewed_at(started, lapsed_rows)
        return True

    def _renewed_at(self, started: float, lapsed_rows: list[Saved] | None) -> None:
        if self._failing:
            # The database was unreachable: every live peer's lease may have lapsed in it
            # meanwhile too, and each renews within a lease of now; taking over before
            # then would move a live router's rows for nothing (its cells' jobs, on its
            # own local worker, sent again elsewhere: parsed twice).
            self._takes_over_from = self._clock() + self.lease_s
            _log.warning(
                "the router's lease is renewed again; it takes over no expired router for "
                "%g s (its peers renew theirs meanwhile)",
                self.lease_s,
            )
        self._failing = False
        self._valid_until = started + self.lease_s
        self.renewals += 1
        if lapsed_rows is not None:
            self._lapsed(lapsed_rows)
        self._renewed = True

    def _lapsed(self, rows: list[Saved]) -> None:
        """Its lease had expired: the keys another router took are not driven here now."""
        self.lapses += 1
        mine = {saved.key for saved in rows}
        gone = [key for key in self._kept() if key not in mine]
        why = (
            f"router {self.store.router_id!r} found its lease lapsed (not renewed for "
            f"{self.lease_s:g} s, MINERU_ROUTER_HEALTH_LEASE_S): another router took over "
            "its submissions and drives them now"
        )
        if not gone:  # an outage that lapsed every lease, and no peer took any of them
            _log.warning(
                "router %r found its lease lapsed and took it anew: no other router had moved "
                "any of its submissions",
                self.store.router_id,
            )
            return
        _log.error("%s; %d submission(s) let go here", why, len(gone))
        self._disown(gone, why)

    def _cannot_renew(self, error: Exception) -> None:
        if not self._failing:  # once per streak
            _log.error(
                "router %r cannot renew its lease (%s): it sends nothing again once its "
                "lease is %g s old, and tries every %g s",
                self.store.router_id,
                safe_text.describe_exception(error),
                self.lease_s,
                self.every_s,
            )
        self._failing = True

    # -- taking over ----------------------------------------------------------------------
    async def take_over(self) -> int:
        """Takes over the rows of expired routers (``MAX_TAKEOVERS`` at most); how many."""
        if not self.holds():
            return 0  # a router that may itself be taken over takes nothing
        if self._clock() < self._takes_over_from:
            return 0  # just after an outage: its peers have not had a lease to renew
        count = 0
        for _ in range(MAX_TAKEOVERS):
            try:
                taken = await self._in_thread(self._take_over_one)
            except Exception as error:  # noqa: BLE001 -- nothing moved; the next renewal retries
                _log.error(
                    "taking over an expired router's submissions failed (%s)",
                    safe_text.describe_exception(error),
                )
                break
            if taken is None or self._closed:
                break
            dead, rows = taken
            self.taken_over.append((dead, len(rows)))
            self._take_back(dead, rows)
            count += 1
        return count

    def _take_over_one(self) -> tuple[str, list[Saved]] | None:
        taken = self.store.take_over()
        return None if taken is None else (taken[0], self._take_in(taken[1]))

    # -- the loop -------------------------------------------------------------------------
    async def tick(self) -> None:
        """One round: renew, then take over what expired (only after a renewal)."""
        if await self.renew() and not self._closed:
            await self.take_over()

    async def run(self) -> None:
        """Rounds every ``every_s`` until closed."""
        while not self._closed:
            await self._sleep(self.every_s)
            if self._closed:
                break
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 -- one bad round must not end the lease
                _log.exception("the router's lease round failed")

    def start(self) -> None:
        """Starts the loop on the running event loop, and takes over at once what expired
        before this router started (one round now)."""
        self._task = asyncio.get_running_loop().create_task(self._first(), name="mineru-lease")
        metrics.router.bind_lease(self.counts)

    async def _first(self) -> None:
        await self.take_over()
        await self.run()

    async def close(self) -> None:
        """Stops the loop and ends the lease now (a clean shutdown: a survivor takes this
        router's unfinished submissions over at its next round)."""
        self._closed = True
        metrics.router.bind_lease(None)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if not self._renewed:
            return
        try:
            await self._in_thread(self.store.release)
        except Exception as error:  # noqa: BLE001 -- it expires by itself then
            _log.warning(
                "the router's lease could not be ended (%s): it expires by itself",
                safe_text.describe_exception(error),
            )
        self._valid_until = -math.inf

"""What a router takes back from its store: at start-up its own rows, later a dead peer's.

A router started on a store ``resume``s: each row goes back into MinerU's
records at once (``Line.revive``: cheap, no I/O but the store's read), so that
every submission is answered from the first request on; what had ended is
served as before, what had not is kept again and *reconciled* in the
background, newest first, ``RECONCILE_LANES`` at a time, while the router
serves: its worker's current instance may know it (followed there), else it
is sent again under the same id (neither a retry nor counted by the budget).
The poison guard gets its memory back. In a store several routers share
(``leases.py``), this router's lease is taken first and renewed from then on;
the rows of a router whose lease expired are taken over the same way
(``take_over``), and those another router took from this one are let go
(``disown``); what the other routers quarantine is read every
``POISON_REFRESH_S``.

    resuming = Resuming(store, fleet, line, kept, caps, poison, background, resending,
                        clock=..., lease_s=..., add=..., check=...)
    resuming.resume()             # start-up: returns at once, reconciles in the background
    resuming.lease                # this router's lease in a shared store, else None
    resuming.waiting(key)         # resumed, not reconciled yet: the background pass has it
    resuming.disown(keys, why)    # another router took these over

``kept`` is the supervisor's map of kept submissions; ``add`` keeps one there,
``check`` asks its worker about one now (the supervisor's). Runs on the
router's event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Iterable

from mineru_health import _native, safe_text

from . import kept_uploads
from .background import Background
from .caps import Caps
from .fleet import Fleet
from .leases import Lease, shared
from .line import Kept, Line
from .poison import Death, PoisonGuard
from .policy import ResubmitReason
from .resubmission import Resubmission
from .store import Saved
from .stores import Store

__all__ = ["POISON_REFRESH_S", "RECONCILE_LANES", "RESUMED", "Resuming"]

_log = safe_text.logger("mineru_health.router.supervisor")

_P = _native.WorkerPhase
#: How often a router whose store other routers share reads their poison guards' memory.
POISON_REFRESH_S = 5.0
#: The resubmission reason of a submission a new router took back from its store.
RESUMED = ResubmitReason.ROUTER_RESTART.value
#: Resumed submissions reconciled at once (each a status request, then maybe an upload):
#: enough to keep the workers busy, few enough that the router's own requests go first.
RECONCILE_LANES = 8


class Resuming:
    """Takes back a store's rows (resume, takeover) and reconciles them in the background."""

    def __init__(
        self,
        store: Store,
        fleet: Fleet,
        line: Line,
        kept: dict[str, Kept],
        caps: Caps,
        poison: PoisonGuard,
        background: Background,
        resending: Resubmission,
        *,
        clock: Callable[[], float],
        lease_s: float,
        add: Callable[[Kept], None],
        check: Callable[[Kept], Awaitable[None]],
    ) -> None:
        self.store = store
        self.fleet = fleet
        self.line = line
        self._kept = kept
        self._caps = caps
        self._poison = poison
        self._background = background
        self._resending = resending
        self._clock = clock
        self._lease_s = lease_s
        self._add = add
        self._check = check
        #: This router's lease in a shared store (leases.py), from ``resume`` on; else None.
        self.lease: Lease | None = None
        # Resumed submissions the background pass has not reconciled yet, newest first.
        self._unreconciled: collections.deque[Kept] = collections.deque()
        self._unreconciled_keys: set[str] = set()
        self.poison_watch: asyncio.Task[None] | None = None

    def resume(self) -> tuple[int, int]:
        """Takes back what the store holds; returns (ended, unfinished) submissions.

        Once, at start-up, once the workers had their first answers and before
        any request is served; returns at once (issue 32: a store of
        thousands must not keep the router from serving). Each row goes back
        into MinerU's records now (``Line.revive``, cheap: no I/O but the
        store's read), so that every submission is answered from the first
        request on. An unfinished one is kept again and *reconciled* in the
        background (:meth:`_reconcile`), newest first, ``RECONCILE_LANES`` at
        a time: its worker's current instance may know it (a remote worker
        that kept running, a local one that restored it from its task store:
        followed there), else it is sent again under the same id. A client
        asking about one not reconciled yet has it checked at once
        (``Supervisor.refresh``). A row the line cannot put back is logged and
        dropped. The poison guard gets its memory back.
        """
        started = self._clock()
        store = shared(self.store)
        if store is not None:
            # Several routers share it: the lease first, so that no survivor takes these
            # rows over while they are resumed; renewed from now on (leases.py).
            self.lease = Lease(
                store,
                self._lease_s,
                take_back=self.take_over,
                disown=self.disown,
                kept=lambda: list(self._kept),
                take_in=lambda rows: [kept_uploads.restore(store, row) for row in rows],
            )
            self.lease.renew_now()
        self._load_poison(self.store.poison())
        if store is not None:  # what the other routers quarantine is refused here too
            self.poison_watch = asyncio.get_running_loop().create_task(
                self._watch_poison(), name="mineru-health-poison-watch"
            )
        counts = self._take_back(self.store.rows(), started, "resumed from the router's store")
        if self.lease is not None:
            self.lease.start()
        return counts

    def take_over(self, owner: str, rows: list[Saved]) -> tuple[int, int]:
        """Resumes the rows of router ``owner``, whose lease expired, now this router's
        (the lease's takeover): exactly as :meth:`resume` resumes the router's own, at
        any time; returns (ended, unfinished) submissions."""
        if self._background.closed:
            return 0, 0
        return self._take_back(rows, self._clock(), f"taken over from router {owner!r}")

    def _take_back(self, rows: list[Saved], started: float, how: str) -> tuple[int, int]:
        """The rows ``rows`` back into MinerU's records and kept (``resume``'s docstring)."""
        ended: list[str] = []
        unfinished: list[Kept] = []
        dropped: list[str] = []
        for saved in rows:
            try:
                # Its uploads read back from a shared store when its directory is not here.
                revived = self.line.revive(kept_uploads.restore(self.store, saved))
            except Exception:  # noqa: BLE001 -- e.g. a record of another MinerU version
                _log.exception("%s: cannot be resumed from the router's store; dropped", saved.key)
                dropped.append(saved.key)
                continue
            if revived is None:
                ended.append(saved.key)
                continue
            kept = Kept(
                saved.key,
                revived.item,
                revived.workers,
                saved.instance,
                saved.digest,
                revived.size_bytes,
            )
            kept.accepted_at, kept.resumed = saved.accepted_at, True
            self._add(kept)
            unfinished.append(kept)
        self.store.forget(dropped)
        # Newest first: the submissions their clients most likely still ask about.
        unfinished.sort(key=lambda k: k.accepted_at, reverse=True)
        self._unreconciled.extend(unfinished)
        self._unreconciled_keys.update(k.key for k in unfinished)
        if unfinished:
            self._background.spawn(self._reconcile(len(unfinished), started, how), "reconcile")
        if ended or unfinished:
            _log.warning(
                "%s in %.2f s: %d finished submission(s) served again, %d unfinished "
                "one(s) being reconciled in the background (checked, and sent again if lost)",
                how,
                self._clock() - started,
                len(ended),
                len(unfinished),
            )
        return len(ended), len(unfinished)

    def disown(self, keys: list[str], why: str) -> None:
        """Stops driving ``keys``: another router took them over while this one's lease had
        lapsed (leases.py). Nothing is written (the store refuses it anyway: fenced); what
        this router still had under way for them is cancelled; audited."""
        for key in keys:
            kept = self._kept.pop(key, None)
            if kept is None:
                continue
            self._caps.let_go(kept.size_bytes)
            self._unreconciled_keys.discard(key)
            for task in (kept.check, self._resending.sending(key)):
                if task is not None and not task.done():
                    task.cancel()
            self.line.disowned(kept)
        self.fleet.audit.write_record(
            "submissions_taken_over", worker_id="", reason=why, task_ids=list(keys)
        )

    def waiting(self, key: str) -> bool:
        """``key`` was resumed and the background pass has not reconciled it yet."""
        return key in self._unreconciled_keys

    @property
    def reconciling(self) -> int:
        """Resumed submissions not reconciled yet (0 once the background pass is done)."""
        return len(self._unreconciled_keys)

    async def _reconcile(self, count: int, started: float, how: str) -> None:
        """Reconciles what ``resume`` or a takeover took back, ``RECONCILE_LANES`` at a time
        (a takeover while a pass is under way adds lanes to the same queue)."""
        await asyncio.gather(*(self._reconcile_lane() for _ in range(RECONCILE_LANES)))
        if not self._background.closed:
            _log.warning(
                "reconciled the %d unfinished submission(s) %s in %.1f s",
                count,
                how,
                self._clock() - started,
            )

    async def _reconcile_lane(self) -> None:
        while self._unreconciled and not self._background.closed:
            kept = self._unreconciled.popleft()
            try:
                await self._reconcile_one(kept)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 -- one submission's trouble must not stop the rest
                _log.exception("%s: reconciling it failed", kept.key)
            finally:
                self._unreconciled_keys.discard(kept.key)

    async def _reconcile_one(self, kept: Kept) -> None:
        """One resumed submission: checked, and its resubmission awaited (it holds a lane)."""
        if self._kept.get(kept.key) is not kept or not kept.resumed:
            return  # ended, or a client's request reconciled it already
        if not kept.workers:
            self._resending.hold(kept)  # waits for a worker in its own task: no lane held
            return
        if not kept.busy and self._booting(kept.worker):
            # Its worker boots with this router: asked now, it could not answer, and
            # the task would wait for a sweep. Holds a lane; the others go on.
            await self._resending.wait_for_worker(lambda: not self._booting(kept.worker))
        if not kept.busy and self._kept.get(kept.key) is kept and kept.resumed:
            if self.fleet.status(kept.worker) is None:
                self._resending.resubmit(
                    kept,
                    RESUMED,
                    f"worker {kept.worker} is not in this router's fleet any more",
                    None,
                )
            else:
                await self._check(kept)
        sending = self._resending.sending(kept.key)
        if sending is not None:
            await asyncio.shield(sending)

    def _booting(self, worker_id: str) -> bool:
        """A local worker launched by this router and not yet answered healthy."""
        status = self.fleet.status(worker_id)
        return status is not None and status.restartable and status.phase == _P.STARTING

    def _load_poison(self, held: Iterable[tuple[str, list[tuple[str, str]]]]) -> None:
        for digest, deaths in held:
            self._poison.load(digest, [Death(worker, rule) for worker, rule in deaths])

    async def _watch_poison(self) -> None:
        """Takes in what the other routers sharing the store quarantined, so that every
        router refuses a quarantined document at submission, not only the one that saw
        its deaths."""
        while not self._background.closed:
            await asyncio.sleep(POISON_REFRESH_S)
            try:
                held = await asyncio.to_thread(self.store.poison)
            except Exception:  # noqa: BLE001 -- the database is away: the next read may work
                _log.debug("the poison guards' memory could not be read", exc_info=True)
                continue
            self._load_poison(held)

    def __repr__(self) -> str:
        return f"Resuming(reconciling={self.reconciling}, lease={self.lease!r})"

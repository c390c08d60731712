"""Submissions the router keeps until they end, and sends again when their worker lost them.

MinerU's routers hand a submission (a 3.x task, a 4.0 job) to one worker and
keep nothing they could send again: when that worker dies, stalls, is killed
or restarted, the client's submission fails. The ``Supervisor`` keeps each
unfinished submission (a ``Kept``, holding what the MinerU line needs to send
it again) until it is terminal, and sends it again under the same router id
when

(a) its worker's status says it failed because the engine died (the worker's
    own verdict, ``"engine_dead": true``) or its parse hung (the task
    watchdog's verdict);
(b) its worker is declared failed (failure threshold, definitive 503,
    process exit, stall) or is being restarted: the supervisor reacts to the
    poller's events at once, not when a client polls;
(c) the worker's current instance does not know it (404).

Before sending again for (b) or (c) it asks the worker's *current* instance:
a restarted worker that restored the submission from its store keeps it
(adopted, no duplicate); a local worker whose process is gone has its store
read directly when the line can (``Line.stored``). A worker that is merely
slow (below the failure threshold) is left alone. The decisions are pure
(``policy.py``).

The supervisor keeps the map of kept submissions and their rows in the
store, checks them and hears the fleet's events; it composes three parts,
each given the state it needs:

- ``resubmission.py`` (``Resubmission``): sending a lost submission again:
  the poison guard (``poison.py``) stops a document that killed two workers'
  engines; ``TASK_RETRIES`` and the fleet-wide retry budget bound the
  resubmissions; it waits for a healthy worker at most ``BOOT_TIMEOUT_S``; a
  submission not sent again fails with its upstream error and a note saying why;
- ``resuming.py`` (``Resuming``): what it takes back from its store (below),
  a shared store's lease and takeovers;
- ``caps.py`` (``Caps``): admission (below).

With a store (``store.py``, the router's state directory), every
submission it keeps is written there before its client hears of it, again
each time it is sent again and when it ends; a router started on that
directory ``resume``s: what had ended is served as before, what had not is
kept again and reconciled in the background, newest first and a few at a
time, while the router serves (its worker's new instance does not know it:
it is sent again under the same id, neither a retry nor counted by the
budget; one a client asks about is checked at once), and the poison guard
remembers its documents.

Admission (``admission.py``): a submission is admitted (``admit``) before
the line stages it, its declared size reserved under the caps
(``MAX_KEPT_TASKS``, ``MAX_KEPT_MB``) and checked against the room on disk;
``keep`` takes the reservation over. One that cannot be kept (a cap: 503; no
room, or its row not written: 507; its store a database out of reach: 503) is refused
and counted (``refusal_counts``).
The account of what is kept, admitted and refused is the supervisor's ``Caps``
(``caps.py``).

What differs between MinerU lines (how a status is asked and written back,
how a submission is sent or failed) is the line's :class:`Line`; the
supervisor never knows which line it serves. Its view of the workers is the
:class:`~mineru_health.runtime.router.fleet.Fleet`.

    supervisor = Supervisor.over(fleet, line)   # both lines: the fleet's store, its events
    supervisor.resume()                  # start-up, workers up: reconciles in the background
    admission = supervisor.admit(size)   # before staging: the caps and the disk (admission.py)
    kept = supervisor.keep(key, item, worker_id, instance_url, admission=admission)
                                         # after the line submitted it; Refused (507) unkept
    kept = supervisor.keep(key, ..., save=False)  # the same, its row written next:
    await supervisor.commit_off_loop(kept)        # on a thread; Refused (507, 503) unkept
    await supervisor.refresh(kept)       # a client asked for its status
    supervisor.decide(kept, answer)      # an answer the line read itself
    supervisor.hold(kept)                # no worker took it yet: send it once one is back
    supervisor.on_event(event)           # every poller event (the fleet calls it)
    supervisor.forget(keys)              # MinerU's retention expired them: out of the store
    await supervisor.close()             # router shutdown: released, or left for the next one

Runs on the router's event loop; not thread-safe. Its store writes run on a thread
where the caller can await them (``*_off_loop``: ``store_writes.py``).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from mineru_health import _native, metrics, safe_text
from mineru_health.runtime.settings import HealthSettings

from . import kept_uploads
from .admission import STORAGE, STORE_DOWN, UNDESCRIBED, Admission, Refused
from .background import Background
from .caps import Caps
from .fleet import DECLARED_FAILED, Fleet
from .leases import Lease
from .line import Kept, Line
from .poison import PoisonGuard
from .policy import (
    Action,
    Answer,
    AnswerKind,
    Step,
    WorkerView,
    next_step,
    passive_reason,
    trigger_rule,
)
from .resubmission import Resubmission
from .resuming import RECONCILE_LANES, RESUMED, Resuming
from .store import Saved
from .store_writes import StoreWrites
from .stores import Store, open_store

__all__ = ["RECONCILE_LANES", "RESUMED", "Supervisor"]

_log = safe_text.logger("mineru_health.router.supervisor")

_P = _native.WorkerPhase
_AUDIT = _native.PollerEventKind.AUDIT
_RESTART = _native.PollerEventKind.RESTART_REQUESTED
#: Phases of a local worker on its way (back) into rotation: booting with the router
#: (which serves before its workers are up), ejected (it returns, or fails and is
#: restarted), or a restart is due or under way. Ejected counts: a single worker whose
#: engine just died is out of rotation a moment before it is declared failed, and a
#: submission MinerU answered 503 then was refused (2 of 13 in one real-vLLM run).
HEALING = frozenset({_P.STARTING, _P.UNHEALTHY, _P.FAILED, _P.RESTART_SCHEDULED, _P.RESTARTING})
#: Seconds between two checks of a submission nobody asks about, so that a
#: finished one lets go of what it kept even if no client polls it.
SWEEP_S = 30.0
_SWEEP_BATCH = 32


class Supervisor:
    """Keeps unfinished submissions and sends again those a worker lost."""

    @classmethod
    def over(cls, fleet: Fleet, line: Line) -> Supervisor:
        """The router's supervisor, built the one way both lines build it: ``fleet``'s
        settings, the store in its durable state directory, every event of ``fleet`` heard."""
        supervisor = cls(fleet, line, fleet.settings, store=open_store(fleet))
        fleet.listen(supervisor.on_event)
        if supervisor.store is not None:
            # A store file that lost pages under the router is rewritten with these too.
            supervisor.store.recall = supervisor.saved_rows
        metrics.router.bind_admission_refusals(supervisor.refusal_counts)
        supervisor.say_if_full()
        return supervisor

    def __init__(
        self,
        fleet: Fleet,
        line: Line,
        settings: HealthSettings,
        *,
        store: Store | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fleet = fleet
        self.line = line
        self._clock = clock
        self._lease_s = float(settings.lease_s)
        self.poison = PoisonGuard()
        self.status_timeout_s = max(3.0, 2.0 * float(settings.probe_timeout_s))
        #: Retry-After of a refused submission or result request while the fleet heals.
        self.retry_after_s = max(1, math.ceil(2 * float(settings.interval_s)))
        self._kept: dict[str, Kept] = {}
        #: The caps on what is kept and admitted, the room on disk, the refusals (caps.py).
        self.caps = Caps(
            settings,
            kept_count=lambda: len(self._kept),
            state_dir=self._state_dir,
            retry_after_s=self.retry_after_s,
            unreachable=lambda: None if self.store is None else self.store.unreachable,
        )
        #: Checks, resubmissions, reconciling: cancelled together at close.
        self.background = Background()
        self._sweeper: asyncio.Task[None] | None = None
        #: Sending again what a worker lost (resubmission.py).
        self.resending = Resubmission(
            settings,
            fleet,
            line,
            store,
            self.poison,
            self._kept,
            self.background,
            clock=clock,
            save=self.save_off_loop,
            release=self.release_off_loop,
            may_send=lambda: self.lease is None or self.lease.holds(),
        )
        self.store = store  # None: nothing outlives this router

    @property
    def store(self) -> Store | None:
        """The router's store; None: nothing outlives this router."""
        return self._store

    @store.setter
    def store(self, store: Store | None) -> None:
        """The store of this supervisor and of its parts (set again before ``resume``: a
        test's own backend): one store for all of them."""
        self._store = store
        #: Its writes made on a thread (store_writes.py); None without a store.
        self.writes = None if store is None else StoreWrites(store)
        self.resending.store = store
        #: Taking back what the store holds (resuming.py); None without a store.
        self.resuming = None if store is None else self._resuming_on(store)

    def _resuming_on(self, store: Store) -> Resuming:
        return Resuming(
            store,
            self.fleet,
            self.line,
            self._kept,
            self.caps,
            self.poison,
            self.background,
            self.resending,
            clock=self._clock,
            lease_s=self._lease_s,
            add=self._add,
            check=self._spawn_check,
        )

    # -- keeping --------------------------------------------------------------------------
    def keep(
        self,
        key: str,
        item: Any,
        worker_id: str,
        instance: str,
        *,
        digest: str | None = None,
        size_bytes: int = 0,
        workers: list[str] | None = None,
        save: bool = True,
        admission: Admission | None = None,
    ) -> Kept:
        """Keeps a submission its line made (``worker_id`` "" for one no worker took yet).

        ``workers`` is the list to record the workers tried in (the line may
        show it to clients); it gets ``worker_id``. ``admission`` (its
        reservation under the caps) is taken over. Written to the store now
        (before its client hears of it), unless not ``save``: then the line
        calls :meth:`commit_off_loop` (or :meth:`commit`) itself before it
        answers. Raises :class:`Refused`
        (507) when its row cannot be written: it is not kept then (its uploads
        are released), and the line takes it out of MinerU's records.
        """
        tried = workers if workers is not None else []
        tried[:] = [worker_id] if worker_id else []
        kept = Kept(key, item, tried, instance, digest, size_bytes)
        self._add(kept)
        if admission is not None:
            admission.close()
        if save:
            self.commit(kept)
        return kept

    async def commit_off_loop(self, kept: Kept) -> None:
        """:meth:`commit`, the row written on a thread (``store_writes.py``): its client
        still waits for it, the router's other requests do not. No check nor
        resubmission of ``kept`` starts meanwhile (busy)."""
        if self.writes is None:
            return
        saved, store = self._first_row(kept), self.writes.store
        kept.busy = True
        try:
            # A shared store keeps its uploads too, for whichever router resumes it.
            written = await self.writes.run(
                lambda: store.save(saved) and kept_uploads.keep(store, saved)
            )
        finally:
            kept.busy = False
        if not written:
            raise self._not_written(kept)

    def commit(self, kept: Kept) -> None:
        """Writes the row of a submission just kept, before its client's answer; when the
        store cannot, drops it (:meth:`drop`) and raises :class:`Refused` (507, 503 while
        its database is out of reach; 500 when the line could not describe it: no row, so
        not accepted either). On the event loop: for a line that cannot await there."""
        if self.store is None:
            return
        saved = self._first_row(kept)
        # A shared store keeps its uploads too, for whichever router resumes it.
        if not self.store.save(saved) or not kept_uploads.keep(self.store, saved):
            raise self._not_written(kept)

    def _first_row(self, kept: Kept) -> Saved:
        """The row of ``kept`` to commit; when the line cannot describe it, drops it and
        raises :class:`Refused` (500)."""
        saved = self._saved(kept)
        if saved is None:
            self.drop(kept)
            raise self.refuse(
                UNDESCRIBED,
                "the router could not describe this submission for "
                "its store (its log has the error), so it could not "
                "survive a restart of the router: not accepted",
            )
        return saved

    def _not_written(self, kept: Kept) -> Refused:
        """Drops ``kept``, whose first row the store did not write; the refusal to raise:
        503 while its database is out of reach, else 507."""
        assert self.store is not None
        self.drop(kept)
        down = self.store.unreachable
        if down is not None:  # a transient outage (503), not a full store (507)
            return self.refuse(STORE_DOWN, self.caps.unreachable_detail(down))
        directory = str(self.store.path.parent) if self.store.path else ""
        return self.refuse(
            STORAGE,
            f"insufficient storage: the router's store in {directory} "
            "cannot write this submission's row, so it could not "
            "survive a restart of the router; retry once room "
            "returns",
            directory,
        )

    def drop(self, kept: Kept) -> None:
        """Forgets a submission that was never accepted (its row could not be written) and
        lets go of its uploads; nothing is written."""
        if self._kept.get(kept.key) is kept:
            del self._kept[kept.key]
            self.caps.let_go(kept.size_bytes)
        self.line.release(kept)

    def _add(self, kept: Kept) -> None:
        self._kept[kept.key] = kept
        self.caps.hold(kept.size_bytes)
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(
                self._sweep(), name="mineru-health-sweep"
            )

    def save(self, kept: Kept) -> bool:
        """Writes what the router knows of ``kept`` to the store (no store: nothing);
        False when the store could not write it."""
        if self.store is None:
            return True
        saved = self._saved(kept)
        return True if saved is None else self.store.save(saved)

    async def save_off_loop(self, kept: Kept) -> bool:
        """:meth:`save`, the row written on a thread (``store_writes.py``)."""
        if self.writes is None:
            return True
        saved = self._saved(kept)  # now, on the loop: what the router knows of it now
        return True if saved is None else await self.writes.save(saved)

    def _saved(self, kept: Kept) -> Saved | None:
        """The store's row of ``kept``; None (logged) when the line cannot describe it."""
        try:
            snapshot = self.line.snapshot(kept)
        except Exception:  # noqa: BLE001 -- the submission goes on; only its row is missing
            _log.exception("%s: cannot describe it for the router's store", kept.key)
            return None
        return Saved(
            kept.key,
            snapshot.state,
            kept.worker,
            snapshot.upstream_id,
            kept.instance,
            list(kept.workers),
            snapshot.source,
            kept.digest,
            snapshot.record,
            kept.accepted_at,
        )

    def saved_rows(self) -> list[Saved]:
        """The rows of every submission kept now (what a rewritten store file must hold)."""
        return [
            saved for kept in list(self._kept.values()) if (saved := self._saved(kept)) is not None
        ]

    def forget(self, keys: Iterable[str]) -> None:
        """MinerU forgot these submissions (its retention): so does the store."""
        if self.store is not None:
            self.store.forget(keys)

    def kept(self) -> list[Kept]:
        """Every submission kept now."""
        return list(self._kept.values())

    # -- resuming (resuming.py) ------------------------------------------------------------
    def resume(self) -> tuple[int, int]:
        """Takes back what the store holds; returns (ended, unfinished) submissions
        (:meth:`Resuming.resume`: at once, reconciled in the background)."""
        return (0, 0) if self.resuming is None else self.resuming.resume()

    def take_over(self, owner: str, rows: list[Saved]) -> tuple[int, int]:
        """Resumes the rows of router ``owner``, whose lease expired (``Resuming.take_over``)."""
        return (0, 0) if self.resuming is None else self.resuming.take_over(owner, rows)

    def disown(self, keys: list[str], why: str) -> None:
        """Stops driving ``keys``, taken over by another router (:meth:`Resuming.disown`)."""
        if self.resuming is not None:
            self.resuming.disown(keys, why)

    @property
    def lease(self) -> Lease | None:
        """This router's lease in a shared store (leases.py), from ``resume`` on; else None."""
        return None if self.resuming is None else self.resuming.lease

    @property
    def reconciling(self) -> int:
        """Resumed submissions not reconciled yet (0 once the background pass is done)."""
        return 0 if self.resuming is None else self.resuming.reconciling

    def _waiting(self, key: str) -> bool:
        """Resumed and not reconciled yet: the background pass checks it (bounded)."""
        return self.resuming is not None and self.resuming.waiting(key)

    def find(self, key: str) -> Kept | None:
        return self._kept.get(key)

    # -- admission (admission.py, caps.py) -----------------------------------------------
    def admit(self, size_bytes: int) -> Admission:
        """Reserves a place and ``size_bytes`` (the upload's declared size) for a submission
        about to be staged; raises :class:`Refused`: 503 past the caps on kept submissions
        and bytes, 507 when a directory it is written to has no room for it.

        Held until the submission is kept (``keep`` takes it over) or refused
        (:meth:`Admission.close`): a burst of concurrent submissions cannot pass
        the caps, each one counting from here.
        """
        return self.caps.admit(size_bytes)

    def _state_dir(self) -> Path | None:
        """Where the store writes (its rows, the uploads it keeps), or None."""
        return self.store.path.parent if self.store is not None and self.store.path else None

    def refuse(self, reason: str, detail: str, directory: str | None = None) -> Refused:
        """A refusal of a submission (``admission.CAP`` or ``STORAGE``), counted, to raise."""
        return self.caps.refuse(reason, detail, directory)

    def refusal_counts(self) -> dict[str, int]:
        """Submissions refused so far, by reason (the metrics read it at scrape time)."""
        return dict(self.caps.refusals)

    def say_if_full(self) -> None:
        self.caps.say_if_full()

    @property
    def max_kept(self) -> int:
        return self.caps.max_kept

    @max_kept.setter
    def max_kept(self, count: int) -> None:
        self.caps.max_kept = count

    @property
    def admitted_bytes(self) -> int:
        """Bytes reserved by the submissions admitted and not yet kept or refused."""
        return self.caps.admitted_bytes

    @property
    def kept_bytes(self) -> int:
        return self.caps.kept_bytes

    def healing(self) -> bool:
        """A local worker is booting, ejected, failed or being restarted: it will be in
        rotation (again) soon. (A worker that refused a submission for its own dead engine
        is failed at once, the fleet's last one too: such a verdict is definitive.)"""
        return any(s.restartable and s.phase in HEALING for s in self.fleet.statuses())

    @property
    def in_flight(self) -> int:
        return len(self._kept)

    # -- checks ---------------------------------------------------------------------------
    async def refresh(self, kept: Kept) -> None:
        """Checks ``kept`` now (a client asked), unless it is being sent again or is over."""
        if not kept.busy and not self.line.terminal(kept):
            # Shielded: a client that goes away must not cancel a check under way.
            check = self._spawn_check(kept)
            try:
                await asyncio.shield(check)
            except asyncio.CancelledError:
                if not check.cancelled():
                    raise  # the client's request was cancelled, not the check
                # Let go meanwhile (disown: another router drives it): the line answers.

    def on_event(self, event: Any) -> None:
        """Reacts to a worker declared failed, being restarted, or back healthy."""
        if self.background.closed:
            return
        if event.kind == _RESTART:
            # The fleet is stopping that instance now: what it holds is lost.
            self._check_all(event.worker_id, lambda k: True)
            return
        if event.kind != _AUDIT:
            return
        to = event.audit.to_phase
        if to in DECLARED_FAILED:
            self._check_all(event.worker_id, lambda k: True)
        elif to == _P.HEALTHY:
            # A restarted instance: what it restored from its store is adopted there.
            url = self.fleet.base_url(event.worker_id)
            self._check_all(event.worker_id, lambda k: k.instance != url)
            self.resending.worker_back()

    def _check_all(self, worker_id: str, which: Callable[[Kept], bool]) -> None:
        # Those still waiting for the background pass get their turn there (bounded).
        for kept in list(self._kept.values()):
            if (
                kept.worker == worker_id
                and not kept.busy
                and which(kept)
                and not self._waiting(kept.key)
            ):
                self._spawn_check(kept)

    def _spawn_check(self, kept: Kept) -> asyncio.Task[None]:
        if kept.check is None or kept.check.done():
            kept.check = self.background.spawn(self._check(kept), "check")
        return kept.check

    async def _check(self, kept: Kept) -> None:
        generation, worker_id = kept.generation, kept.worker
        url = self.fleet.base_url(worker_id) or kept.instance
        answer = await self.line.ask(kept, url)
        kept.last_check = self._clock()
        if answer.kind is AnswerKind.UNREACHABLE:
            # A local worker's process that died is reported now, not at the
            # next process poll: the view below then says "declared failed".
            self.fleet.local.check_process(worker_id)
            if self._declared_failed(worker_id):
                answer = await self.line.stored(kept) or answer
        if kept.generation != generation or kept.busy or self._kept.get(kept.key) is not kept:
            return  # sent again or let go meanwhile: this answer is about the past
        if self.line.terminal(kept):
            await self.release_off_loop(kept)  # it ended meanwhile (the line read it itself)
            return
        try:
            await self._act(kept, self.decide_step(kept, answer, url), answer, url)
        except Exception:  # noqa: BLE001 -- one submission's trouble must not stop the others
            _log.exception("%s: handling its status failed", kept.key)

    def _declared_failed(self, worker_id: str) -> bool:
        status = self.fleet.status(worker_id)
        return status is not None and status.phase in DECLARED_FAILED

    def decide_step(self, kept: Kept, answer: Answer, url: str) -> Step:
        """The policy's step for ``answer`` about ``kept``, given by the instance at ``url``."""
        status = self.fleet.status(kept.worker)
        view = WorkerView(
            in_rotation=bool(status is not None and status.in_rotation),
            declared_failed=status is not None and status.phase in DECLARED_FAILED,
            # A dead worker's store speaks for the instance it was submitted to.
            same_instance=answer.from_store or url == kept.instance,
            replaced=status is not None and status.phase == _P.RESTARTING,
        )
        return next_step(answer, view)

    def decide(self, kept: Kept, answer: Answer) -> Step:
        """Acts on an answer the line read itself from ``kept``'s instance; returns the step.

        Only a resubmission is acted on here (the line takes every other
        status as it already does); it starts in the background.
        """
        step = self.decide_step(kept, answer, kept.instance)
        if step.action is Action.RESUBMIT and not kept.busy:
            self._lost(kept, step, answer)
        return step

    async def _act(self, kept: Kept, step: Step, answer: Answer, url: str) -> None:
        if step.action in (Action.APPLY, Action.ADOPT):
            kept.resumed = False  # its worker has it: a later loss is that worker's
            adopt = step.action is Action.ADOPT
            if adopt:
                _log.info("%s: %s restored it; following it there", kept.key, kept.worker)
                kept.instance = url
            await self.line.apply(kept, answer, url, adopt=adopt)
        elif step.action is Action.RESUBMIT:
            self._lost(kept, step, answer)
        elif step.action is Action.UPSTREAM_ERROR:
            await self.line.count_error(kept, step.detail)
        if self.line.terminal(kept):
            await self.release_off_loop(kept)

    def _lost(self, kept: Kept, step: Step, answer: Answer) -> None:
        # The current instance's own verdict: out of rotation before the next probe.
        # A dead process's store speaks of an instance already declared failed.
        reason = None if answer.from_store else passive_reason(answer)
        if reason:
            self.fleet.report_passive(kept.worker, reason)
        error = answer.error or self._lost_text(kept, step)
        reason = (
            RESUMED if kept.resumed and step.reason in ("lost", "worker_failed") else step.reason
        )
        self.resubmit(kept, reason, error, trigger_rule(answer))

    @staticmethod
    def _lost_text(kept: Kept, step: Step) -> str:
        what = "does not know it any more" if step.reason == "lost" else "was declared failed"
        return f"worker {kept.worker} {what}: {step.detail}"

    # -- sending again (resubmission.py) ---------------------------------------------------
    def resubmit(self, kept: Kept, reason: str, error: str, trigger: str | None) -> None:
        """Starts sending ``kept`` again, elsewhere if it can (no-op while one is under way)."""
        self.resending.resubmit(kept, reason, error, trigger)

    def hold(self, kept: Kept) -> None:
        """Sends a kept submission that no worker took (the fleet heals) once one is back."""
        self.resending.hold(kept)

    async def wait_for_worker(self, ready: Callable[[], bool]) -> bool:
        """Until ``ready()``, checked when a worker comes back and each probe interval, for at
        most ``BOOT_TIMEOUT_S``; False when it never was."""
        return await self.resending.wait_for_worker(ready)

    @property
    def retry_interval_s(self) -> float:
        return self.resending.retry_interval_s

    def retries_in_flight(self, exclude: Kept | None = None) -> int:
        return self.resending.retries_in_flight(exclude)

    # -- the end ----------------------------------------------------------------------------
    def release(self, kept: Kept) -> None:
        """Forgets ``kept`` and lets go of what it holds (it is over; the store keeps its end)."""
        if self._let_go(kept) and self.save(kept):
            kept_uploads.drop(self.store, kept.key)  # ended: never sent again
        self.line.release(kept)

    async def release_off_loop(self, kept: Kept) -> None:
        """:meth:`release`, its last row written on a thread before its uploads go."""
        if self._let_go(kept) and await self.save_off_loop(kept) and self.writes is not None:
            store, key = self.writes.store, kept.key
            await self.writes.run(lambda: kept_uploads.drop(store, key))  # never sent again
        self.line.release(kept)

    def _let_go(self, kept: Kept) -> bool:
        """Forgets ``kept``; False when it was not kept (any more)."""
        if self._kept.get(kept.key) is not kept:
            return False
        del self._kept[kept.key]
        if kept.counted:
            self.resending.turned_over()
        self.caps.let_go(kept.size_bytes)
        return True

    async def _sweep(self) -> None:
        """Checks submissions nobody asked about lately, so that finished ones are let go."""
        while not self.background.closed:
            await asyncio.sleep(SWEEP_S)
            if self.store is not None:
                self.store.check()  # a file gone under an idle router is noticed now
            stale = [
                k
                for k in self._kept.values()
                if not k.busy
                and self._clock() - k.last_check >= SWEEP_S
                and not self._waiting(k.key)
            ]
            for start in range(0, len(stale), _SWEEP_BATCH):
                batch = [self._spawn_check(k) for k in stale[start : start + _SWEEP_BATCH]]
                await asyncio.gather(*batch, return_exceptions=True)

    async def close(self) -> None:
        """Stops checks and resubmissions (router shutdown).

        Without a store everything kept is released (its uploads deleted);
        with one it stays as it is, on disk, for the next router to resume.
        """
        self.background.closed = True
        if self.lease is not None:
            await self.lease.close()  # a survivor takes over what is unfinished here
        watch = None if self.resuming is None else self.resuming.poison_watch
        await self.background.cancel(self._sweeper, watch)
        if self.store is not None:
            for kept in self._kept.values():
                self.caps.let_go(kept.size_bytes)
            self._kept.clear()
            if self.writes is not None:
                await self.writes.finish()  # a cancelled check's last write included
            self.store.close()
            return
        for kept in list(self._kept.values()):
            self.release(kept)

    def __repr__(self) -> str:
        return (
            f"Supervisor(in_flight={self.in_flight}, retries_in_flight={self.retries_in_flight()})"
        )

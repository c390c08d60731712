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
(``policy.py``); the poison guard (``poison.py``) stops a document that
killed two workers' engines; ``TASK_RETRIES`` and the fleet-wide retry
budget bound the resubmissions; a resubmission waits for a healthy worker
at most ``BOOT_TIMEOUT_S``. A submission not sent again fails with its
upstream error and a note saying why.

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
room, or its row not written: 507) is refused and counted (``refusals``).

What differs between MinerU lines (how a status is asked and written back,
how a submission is sent or failed) is the line's :class:`Line`; the
supervisor never knows which line it serves. Its view of the workers is the
:class:`~mineru_health.runtime.router.fleet.Fleet`.

    supervisor = Supervisor.over(fleet, line)   # both lines: the fleet's store, its events
    supervisor.resume()                  # start-up, workers up: reconciles in the background
    admission = supervisor.admit(size)   # before staging: the caps and the disk (admission.py)
    kept = supervisor.keep(key, item, worker_id, instance_url, admission=admission)
                                         # after the line submitted it; Refused (507) unkept
    await supervisor.refresh(kept)       # a client asked for its status
    supervisor.decide(kept, answer)      # an answer the line read itself
    supervisor.hold(kept)                # no worker took it yet: send it once one is back
    supervisor.on_event(event)           # every poller event (the fleet calls it)
    supervisor.forget(keys)              # MinerU's retention expired them: out of the store
    await supervisor.close()             # router shutdown: released, or left for the next one

Runs on the router's event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

from mineru_health import _native, metrics, safe_text
from mineru_health.settings import HealthSettings

from .admission import CAP, ROW_MARGIN_BYTES, STORAGE, UNDESCRIBED, Admission, Refused, lack_of_room
from .fleet import DECLARED_FAILED, Fleet
from .line import Kept, Line, NotSent, Sent, Unavailable
from .poison import Death, PoisonGuard, Quarantine
from .policy import (
    Action,
    Answer,
    AnswerKind,
    Refusal,
    ResubmitReason,
    RetryBudget,
    Step,
    WorkerView,
    failure_text,
    next_step,
    passive_reason,
    refuse_resubmission,
    trigger_rule,
)
from .store import RouterStore, Saved

__all__ = ["RESUMED", "Supervisor"]

_log = safe_text.logger("mineru_health.router.supervisor")

_P = _native.WorkerPhase
_AUDIT = _native.PollerEventKind.AUDIT
_RESTART = _native.PollerEventKind.RESTART_REQUESTED
#: Phases of a local worker on its way back: ejected (it returns, or fails and is
#: restarted), or a restart is due or under way. Ejected counts: a single worker whose
#: engine just died is out of rotation a moment before it is declared failed, and a
#: submission MinerU answered 503 then was refused (2 of 13 in one real-vLLM run).
HEALING = frozenset({_P.UNHEALTHY, _P.FAILED, _P.RESTART_SCHEDULED, _P.RESTARTING})
#: Seconds between two checks of a submission nobody asks about, so that a
#: finished one lets go of what it kept even if no client polls it.
SWEEP_S = 30.0
_SWEEP_BATCH = 32
#: The resubmission reason of a submission a new router took back from its store.
RESUMED = ResubmitReason.ROUTER_RESTART.value
#: Resumed submissions reconciled at once (each a status request, then maybe an upload):
#: enough to keep the workers busy, few enough that the router's own requests go first.
RECONCILE_LANES = 8


class Supervisor:
    """Keeps unfinished submissions and sends again those a worker lost."""

    @classmethod
    def over(cls, fleet: Fleet, line: Line) -> Supervisor:
        """The router's supervisor, built the one way both lines build it: ``fleet``'s
        settings, the store in its durable state directory, every event of ``fleet`` heard."""
        supervisor = cls(fleet, line, fleet.settings, store=RouterStore.of(fleet))
        fleet.listen(supervisor.on_event)
        if supervisor.store is not None:
            # A store file that lost pages under the router is rewritten with these too.
            supervisor.store.recall = supervisor.saved_rows
        metrics.router.bind_admission_refusals(supervisor.refusal_counts)
        supervisor.say_if_full()
        return supervisor

    def __init__(self, fleet: Fleet, line: Line, settings: HealthSettings, *,
                 store: RouterStore | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.fleet = fleet
        self.line = line
        self.store = store  # None: nothing outlives this router
        self._clock = clock
        self.task_retries = int(settings.task_retries)
        self.budget = RetryBudget(float(settings.retry_budget_percent),
                                  int(settings.retry_budget_min))
        self.poison = PoisonGuard()
        self.wait_for_worker_s = float(settings.boot_timeout_s)
        self.retry_interval_s = float(settings.interval_s)
        self.status_timeout_s = max(3.0, 2.0 * float(settings.probe_timeout_s))
        #: Retry-After of a refused submission or result request while the fleet heals.
        self.retry_after_s = max(1, math.ceil(2 * float(settings.interval_s)))
        self.max_kept = int(settings.max_kept_tasks)
        self.max_kept_bytes = int(settings.max_kept_mb) * 1024 * 1024
        self._kept_bytes = 0
        self._admitted: set[Admission] = set()  # admitted, not yet kept or refused
        self._admitted_bytes = 0
        #: Submissions refused, by ``admission.CAP`` (503) and ``admission.STORAGE`` (507).
        self.refusals = {CAP: 0, STORAGE: 0}
        self._refusing_storage = False  # logged once per streak of 507s
        self._kept: dict[str, Kept] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._sending: dict[str, asyncio.Task[Any]] = {}  # key -> its resubmission under way
        # Resumed submissions the background pass has not reconciled yet, newest first.
        self._unreconciled: collections.deque[Kept] = collections.deque()
        self._unreconciled_keys: set[str] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._worker_back = asyncio.Event()
        self._closed = False

    # -- keeping --------------------------------------------------------------------------
    def keep(self, key: str, item: Any, worker_id: str, instance: str, *,
             digest: str | None = None, size_bytes: int = 0,
             workers: list[str] | None = None, save: bool = True,
             admission: Admission | None = None) -> Kept:
        """Keeps a submission its line made (``worker_id`` "" for one no worker took yet).

        ``workers`` is the list to record the workers tried in (the line may
        show it to clients); it gets ``worker_id``. ``admission`` (its
        reservation under the caps) is taken over. Written to the store now
        (before its client hears of it), unless not ``save``: then the line
        calls :meth:`commit` itself before it answers. Raises :class:`Refused`
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

    def commit(self, kept: Kept) -> None:
        """Writes the row of a submission just kept, before its client's answer; when the
        store cannot, drops it (:meth:`drop`) and raises :class:`Refused` (507; 500 when
        the line could not describe it: no row, so not accepted either)."""
        if self.store is None:
            return
        saved = self._saved(kept)
        if saved is None:
            self.drop(kept)
            raise self.refuse(UNDESCRIBED, "the router could not describe this submission for "
                                           "its store (its log has the error), so it could not "
                                           "survive a restart of the router: not accepted")
        if not self.store.save(saved):
            self.drop(kept)
            directory = str(self.store.path.parent) if self.store and self.store.path else ""
            raise self.refuse(STORAGE, f"insufficient storage: the router's store in {directory} "
                                       "cannot write this submission's row, so it could not "
                                       "survive a restart of the router; retry once room "
                                       "returns", directory)

    def drop(self, kept: Kept) -> None:
        """Forgets a submission that was never accepted (its row could not be written) and
        lets go of its uploads; nothing is written."""
        if self._kept.get(kept.key) is kept:
            del self._kept[kept.key]
            self._kept_bytes -= kept.size_bytes
        self.line.release(kept)

    def _add(self, kept: Kept) -> None:
        self._kept[kept.key] = kept
        self._kept_bytes += kept.size_bytes
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(
                self._sweep(), name="mineru-health-sweep")

    def save(self, kept: Kept) -> bool:
        """Writes what the router knows of ``kept`` to the store (no store: nothing);
        False when the store could not write it."""
        if self.store is None:
            return True
        saved = self._saved(kept)
        return True if saved is None else self.store.save(saved)

    def _saved(self, kept: Kept) -> Saved | None:
        """The store's row of ``kept``; None (logged) when the line cannot describe it."""
        try:
            snapshot = self.line.snapshot(kept)
        except Exception:  # noqa: BLE001 -- the submission goes on; only its row is missing
            _log.exception("%s: cannot describe it for the router's store", kept.key)
            return None
        return Saved(kept.key, snapshot.state, kept.worker, snapshot.upstream_id, kept.instance,
                     list(kept.workers), snapshot.source, kept.digest, snapshot.record,
                     kept.accepted_at)

    def saved_rows(self) -> list[Saved]:
        """The rows of every submission kept now (what a rewritten store file must hold)."""
        return [saved for kept in list(self._kept.values())
                if (saved := self._saved(kept)) is not None]

    def forget(self, keys: Iterable[str]) -> None:
        """MinerU forgot these submissions (its retention): so does the store."""
        if self.store is not None:
            self.store.forget(keys)

    def kept(self) -> list[Kept]:
        """Every submission kept now."""
        return list(self._kept.values())

    # -- resuming ---------------------------------------------------------------------------
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
        (:meth:`refresh`). A row the line cannot put back is logged and
        dropped. The poison guard gets its memory back.
        """
        if self.store is None:
            return 0, 0
        started = self._clock()
        for digest, deaths in self.store.poison():
            self.poison.load(digest, [Death(worker, rule) for worker, rule in deaths])
        ended: list[str] = []
        unfinished: list[Kept] = []
        dropped: list[str] = []
        for saved in self.store.rows():
            try:
                revived = self.line.revive(saved)
            except Exception:  # noqa: BLE001 -- e.g. a record of another MinerU version
                _log.exception("%s: cannot be resumed from the router's store; dropped",
                               saved.key)
                dropped.append(saved.key)
                continue
            if revived is None:
                ended.append(saved.key)
                continue
            kept = Kept(saved.key, revived.item, revived.workers, saved.instance, saved.digest,
                        revived.size_bytes)
            kept.accepted_at, kept.resumed = saved.accepted_at, True
            self._add(kept)
            unfinished.append(kept)
        self.store.forget(dropped)
        # Newest first: the submissions their clients most likely still ask about.
        unfinished.sort(key=lambda k: k.accepted_at, reverse=True)
        self._unreconciled = collections.deque(unfinished)
        self._unreconciled_keys = {k.key for k in unfinished}
        if unfinished:
            self._spawn(self._reconcile(len(unfinished), started), "reconcile")
        if ended or unfinished:
            _log.warning("resumed from the router's store in %.2f s: %d finished submission(s) "
                         "served again, %d unfinished one(s) being reconciled in the background "
                         "(checked, and sent again if lost)", self._clock() - started,
                         len(ended), len(unfinished))
        return len(ended), len(unfinished)

    @property
    def reconciling(self) -> int:
        """Resumed submissions not reconciled yet (0 once the background pass is done)."""
        return len(self._unreconciled_keys)

    async def _reconcile(self, count: int, started: float) -> None:
        """Reconciles what ``resume`` took back, ``RECONCILE_LANES`` at a time."""
        await asyncio.gather(*(self._reconcile_lane() for _ in range(RECONCILE_LANES)))
        if not self._closed:
            _log.warning("reconciled the %d unfinished submission(s) resumed from the router's "
                         "store in %.1f s", count, self._clock() - started)

    async def _reconcile_lane(self) -> None:
        while self._unreconciled and not self._closed:
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
            self.hold(kept)  # waits for a worker in its own task: no lane held meanwhile
            return
        if not kept.busy:
            if self.fleet.status(kept.worker) is None:
                self.resubmit(kept, RESUMED, f"worker {kept.worker} is not in this router's "
                                             "fleet any more", None)
            else:
                await self._spawn_check(kept)
        sending = self._sending.get(kept.key)
        if sending is not None:
            await asyncio.shield(sending)

    def find(self, key: str) -> Kept | None:
        return self._kept.get(key)

    # -- admission (admission.py) ----------------------------------------------------------
    def admit(self, size_bytes: int) -> Admission:
        """Reserves a place and ``size_bytes`` (the upload's declared size) for a submission
        about to be staged; raises :class:`Refused`: 503 past the caps on kept submissions
        and bytes, 507 when a directory it is written to has no room for it.

        Held until the submission is kept (``keep`` takes it over) or refused
        (:meth:`Admission.close`): a burst of concurrent submissions cannot pass
        the caps, each one counting from here.
        """
        size_bytes = max(0, int(size_bytes))
        count = len(self._kept) + len(self._admitted)
        if count >= self.max_kept:
            raise self.refuse(CAP, f"the router keeps {count} submissions for resubmission "
                                   f"(MINERU_ROUTER_HEALTH_MAX_KEPT_TASKS={self.max_kept}); "
                                   "retry shortly")
        self._check_bytes(size_bytes)
        room = self._lack_of_room(size_bytes)
        if room is not None:
            directory, why = room
            raise self.refuse(STORAGE, f"insufficient storage: {why}; retry once room "
                                       "returns", directory)
        if self._refusing_storage:
            self._refusing_storage = False
            _log.warning("the router's storage has room again: submissions are accepted")
        admission = Admission(size_bytes, self._resize, self._unreserve)
        self._admitted.add(admission)
        self._admitted_bytes += size_bytes
        return admission

    def _check_bytes(self, more: int) -> None:
        held = self._kept_bytes + self._admitted_bytes
        # One upload larger than the whole cap is taken alone, never refused for good.
        if held + more > self.max_kept_bytes and (held > 0 or len(self._kept) > 0):
            mib = 1024 * 1024
            raise self.refuse(CAP, f"the router keeps {held / mib:.0f} MiB of uploads for "
                                   f"resubmission and this one adds {more / mib:.1f} MiB "
                                   f"(MINERU_ROUTER_HEALTH_MAX_KEPT_MB="
                                   f"{self.max_kept_bytes // mib}); retry shortly")

    def _resize(self, admission: Admission, size_bytes: int) -> None:
        more = max(0, int(size_bytes)) - admission.size_bytes
        if more > 0:
            try:
                self._check_bytes(more)
            except Refused:
                admission.close()
                raise
        self._admitted_bytes += more
        admission.size_bytes += more

    def _unreserve(self, admission: Admission) -> None:
        if admission in self._admitted:
            self._admitted.remove(admission)
            self._admitted_bytes -= admission.size_bytes

    def _lack_of_room(self, size_bytes: int) -> tuple[str, str] | None:
        """The directory the submission would be written to that has no room for it."""
        reserved = self._admitted_bytes
        state = self.store.path.parent if self.store is not None and self.store.path else None
        if state is not None:
            room = lack_of_room([state], size_bytes + ROW_MARGIN_BYTES, reserved)
            if room is not None:
                return room
        # MinerU stages every upload in the router's scratch (tempfile's directory) first.
        return lack_of_room([tempfile.gettempdir()], size_bytes, reserved)

    def refuse(self, reason: str, detail: str, directory: str | None = None) -> Refused:
        """A refusal of a submission (``admission.CAP`` or ``STORAGE``), counted, to raise."""
        self.refusals[reason] = self.refusals.get(reason, 0) + 1
        if reason == STORAGE and not self._refusing_storage:  # once per streak
            self._refusing_storage = True
            _log.error("submissions refused with 507 until room returns: %s", detail)
        return Refused(reason, detail, self.retry_after_s, directory)

    def refusal_counts(self) -> dict[str, int]:
        """Submissions refused so far, by reason (the metrics read it at scrape time)."""
        return dict(self.refusals)

    def say_if_full(self) -> None:
        """At start-up: one log line when the state directory has no room for a submission
        (what the router holds is served; new submissions get 507 until room returns)."""
        room = self._lack_of_room(0)
        if room is not None:
            self._refusing_storage = True
            _log.error("the router's storage is full: %s; new submissions are refused with "
                       "507 until room returns, what it holds is served", room[1])

    @property
    def admitted_bytes(self) -> int:
        """Bytes reserved by the submissions admitted and not yet kept or refused."""
        return self._admitted_bytes

    @property
    def kept_bytes(self) -> int:
        return self._kept_bytes

    def healing(self) -> bool:
        """A local worker is ejected, failed or being restarted: it will be back."""
        return any(s.restartable and s.phase in HEALING for s in self.fleet.statuses())

    @property
    def in_flight(self) -> int:
        return len(self._kept)

    def retries_in_flight(self, exclude: Kept | None = None) -> int:
        return sum(1 for k in self._kept.values() if k is not exclude and k.counted)

    # -- checks ---------------------------------------------------------------------------
    async def refresh(self, kept: Kept) -> None:
        """Checks ``kept`` now (a client asked), unless it is being sent again or is over."""
        if not kept.busy and not self.line.terminal(kept):
            # Shielded: a client that goes away must not cancel a check under way.
            await asyncio.shield(self._spawn_check(kept))

    def on_event(self, event: Any) -> None:
        """Reacts to a worker declared failed, being restarted, or back healthy."""
        if self._closed:
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
            self._worker_back.set()

    def _check_all(self, worker_id: str, which: Callable[[Kept], bool]) -> None:
        # Those still waiting for the background pass get their turn there (bounded).
        for kept in list(self._kept.values()):
            if kept.worker == worker_id and not kept.busy and which(kept) \
                    and kept.key not in self._unreconciled_keys:
                self._spawn_check(kept)

    def _spawn_check(self, kept: Kept) -> asyncio.Task[None]:
        if kept.check is None or kept.check.done():
            kept.check = self._spawn(self._check(kept), "check")
        return kept.check

    async def _check(self, kept: Kept) -> None:
        generation, worker_id = kept.generation, kept.worker
        url = self.fleet.base_url(worker_id) or kept.instance
        answer = await self.line.ask(kept, url)
        kept.last_check = self._clock()
        if answer.kind is AnswerKind.UNREACHABLE:
            # A local worker's process that died is reported now, not at the
            # next process poll: the view below then says "declared failed".
            self.fleet.check_process(worker_id)
            if self._declared_failed(worker_id):
                answer = await self.line.stored(kept) or answer
        if kept.generation != generation or kept.busy or self._kept.get(kept.key) is not kept:
            return  # sent again or let go meanwhile: this answer is about the past
        if self.line.terminal(kept):
            self.release(kept)  # it ended meanwhile (the line read its status itself)
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
            self.release(kept)

    def _lost(self, kept: Kept, step: Step, answer: Answer) -> None:
        payload = answer.payload or {}
        # The current instance's own verdict: out of rotation before the next probe.
        # A dead process's store speaks of an instance already declared failed.
        reason = None if answer.from_store else passive_reason(payload)
        if reason:
            self.fleet.report_passive(kept.worker, reason)
        error = str(payload.get("error") or "") or self._lost_text(kept, step)
        reason = RESUMED if kept.resumed and step.reason in ("lost", "worker_failed") \
            else step.reason
        self.resubmit(kept, reason, error, trigger_rule(payload) if payload else None)

    @staticmethod
    def _lost_text(kept: Kept, step: Step) -> str:
        what = "does not know it any more" if step.reason == "lost" else "was declared failed"
        return f"worker {kept.worker} {what}: {step.detail}"

    # -- sending again --------------------------------------------------------------------
    def resubmit(self, kept: Kept, reason: str, error: str, trigger: str | None) -> None:
        """Starts sending ``kept`` again, elsewhere if it can (no-op while one is under way)."""
        if kept.busy:
            return
        kept.busy = True
        self.line.lost(kept)
        self._track_sending(kept, self._spawn(self._resubmit(kept, reason, error, trigger),
                                              "resubmit"))

    def _track_sending(self, kept: Kept, task: asyncio.Task[Any]) -> None:
        """Remembers ``kept``'s resubmission until it ends (the reconciler waits for it)."""
        self._sending[kept.key] = task

        def ended(done: asyncio.Task[Any]) -> None:
            if self._sending.get(kept.key) is done:
                del self._sending[kept.key]

        task.add_done_callback(ended)

    def hold(self, kept: Kept) -> None:
        """Sends a kept submission that no worker took (the fleet heals) once one is back."""
        kept.busy = True
        self._spawn(self._resubmit(kept, "", "", None), "hold")
        _log.warning("%s: no healthy worker while the fleet heals; held until one is back",
                     kept.key)

    async def _resubmit(self, kept: Kept, reason: str, error: str, trigger: str | None) -> None:
        # A resumed submission's worker did nothing wrong: it may take it again.
        lost_on = kept.worker
        failed_on = "" if kept.resumed and trigger is None else lost_on
        try:
            refusal = await self._refusal(kept, failed_on, trigger)
            if refusal is not None:
                await self._fail(kept, failure_text(error, refusal.note), refusal.refusal)
                return
            outcome = await self._send_elsewhere(kept, failed_on)
            if isinstance(outcome, NotSent):
                await self._fail(kept, failure_text(error, outcome.note), outcome.refusal)
                return
            kept.workers.append(outcome.worker_id)
            kept.instance = outcome.instance
            kept.generation += 1
            kept.resumed = False
            self.save(kept)
            if reason:
                metrics.router.record_resubmission(reason)
                _log.warning("%s: sent again to %s (%s on %s; submission %d)", kept.key,
                             outcome.worker_id, reason, lost_on, len(kept.workers))
            else:
                _log.info("%s: held submission sent to %s", kept.key, outcome.worker_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 -- the submission must still end, with a reason
            _log.exception("%s: sending it again failed", kept.key)
            await self._fail(kept, failure_text(error, f"resubmission failed: {exc}"),
                             Refusal.REJECTED)
        finally:
            kept.busy = False

    async def _refusal(self, kept: Kept, failed_on: str, trigger: str | None) -> NotSent | None:
        """None once ``kept`` may be sent again; else why not (poison, retries, budget)."""
        if trigger is not None or self.poison.suspects():
            if kept.digest is None:
                kept.digest = await self.line.digest(kept)
            if kept.digest is not None:
                if trigger is not None:
                    quarantine = self.poison.record_trigger(kept.digest, failed_on, trigger)
                    if self.store is not None:
                        self.store.save_poison(kept.digest, [
                            (d.worker_id, d.rule) for d in self.poison.deaths(kept.digest)])
                    if quarantine is not None:
                        self._quarantined(kept, quarantine)
                quarantine = self.poison.quarantined(kept.digest)
                if quarantine is not None:
                    return NotSent(Refusal.POISON, quarantine.message(self.line.names(kept)))
        if not kept.workers:
            return None  # held: its first submission
        if kept.resumed and trigger is None:
            # Its router died, not its worker's engine: no retry, not the budget's.
            return None
        refusal = await self._within_budget(kept)
        return None if refusal is None else NotSent(refusal, self._refusal_note(refusal, kept))

    async def _within_budget(self, kept: Kept) -> Refusal | None:
        """None once one more resubmission of ``kept`` is allowed; else why not.

        The retry budget bounds how many resubmissions run at once, not
        whether a submission is sent again: one over it waits, pending for its
        client and adding no load, until earlier ones end (checked every probe
        interval), for at most ``BOOT_TIMEOUT_S``. ``TASK_RETRIES`` is final.
        """
        deadline = self._clock() + self.wait_for_worker_s
        while True:
            refusal = refuse_resubmission(
                submissions=len(kept.workers), task_retries=self.task_retries,
                budget=self.budget, retries_in_flight=self.retries_in_flight(exclude=kept),
                tasks_in_flight=len(self._kept))
            left = deadline - self._clock()
            if refusal is None:
                # No await since the check: two waiters cannot take one place.
                kept.counted = True
                return None
            if refusal is not Refusal.BUDGET or self._closed or left <= 0:
                return refusal
            await asyncio.sleep(min(self.retry_interval_s, left))

    async def _send_elsewhere(self, kept: Kept, failed_on: str) -> Sent | NotSent:
        """Another healthy worker first; the one it failed on only if it is the only one."""
        deadline = self._clock() + self.wait_for_worker_s
        tried: set[str] = set()
        last_error = ""
        while not self._closed:
            outcome = await self.line.send(kept, {failed_on, *tried} - {""})
            if outcome is None and failed_on and failed_on not in tried:
                outcome = await self.line.send(kept, tried)
            if isinstance(outcome, Unavailable):
                tried.add(outcome.worker_id)
                last_error = f"{outcome.worker_id}: {outcome.error}"
                self.fleet.check_process(outcome.worker_id)
                continue
            if outcome is not None:
                return outcome
            if self._clock() >= deadline:
                break
            await self._wait_for_worker(min(self.retry_interval_s,
                                            max(0.0, deadline - self._clock())))
            tried.clear()
        detail = f" (last error: {last_error})" if last_error else ""
        return NotSent(Refusal.NO_WORKER, f"no healthy worker to send it to within "
                                          f"{self.wait_for_worker_s:g} s{detail}")

    async def wait_for_worker(self, ready: Callable[[], bool]) -> bool:
        """Until ``ready()``, checked when a worker comes back and each probe interval, for at
        most ``BOOT_TIMEOUT_S``; False when it never was."""
        deadline = self._clock() + self.wait_for_worker_s
        while not ready():
            left = deadline - self._clock()
            if self._closed or left <= 0:
                return False
            await self._wait_for_worker(min(self.retry_interval_s, left))
        return True

    async def _wait_for_worker(self, timeout_s: float) -> None:
        self._worker_back.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._worker_back.wait(), timeout=timeout_s)

    def _refusal_note(self, refusal: Refusal, kept: Kept) -> str:
        tried = ", ".join(kept.workers)
        if refusal is Refusal.RETRIES:
            return (f"not resubmitted: {self.task_retries} resubmission(s) already made "
                    f"(MINERU_ROUTER_HEALTH_TASK_RETRIES); workers tried: {tried}")
        limit = self.budget.limit(len(self._kept))
        return (f"not resubmitted: the retry budget stayed spent for "
                f"{self.wait_for_worker_s:g} s ({self.retries_in_flight()} of "
                f"{len(self._kept)} submissions in flight are resubmissions, limit {limit}: "
                f"MINERU_ROUTER_HEALTH_RETRY_BUDGET_PERCENT={self.budget.percent:g}, "
                f"MINERU_ROUTER_HEALTH_RETRY_BUDGET_MIN={self.budget.minimum})")

    def _quarantined(self, kept: Kept, quarantine: Quarantine) -> None:
        names = self.line.names(kept)
        metrics.router.record_poison_document()
        self.fleet.audit.write_record(
            "poison_document_quarantined", worker_id=kept.worker,
            reason=quarantine.message(names), task_id=kept.key,
            document_sha256=quarantine.digest, file_names=names,
            workers=quarantine.workers, rules=quarantine.rules)
        _log.error("%s: %s", kept.key, quarantine.message(names))

    async def _fail(self, kept: Kept, text: str, refusal: Refusal) -> None:
        metrics.router.record_resubmission_refused(refusal.value)
        _log.warning("%s: failed, not sent again (%s): %s", kept.key, refusal.value, text)
        await self.line.fail(kept, text)
        self.release(kept)

    # -- the end ----------------------------------------------------------------------------
    def release(self, kept: Kept) -> None:
        """Forgets ``kept`` and lets go of what it holds (it is over; the store keeps its end)."""
        if self._kept.get(kept.key) is kept:
            del self._kept[kept.key]
            self._kept_bytes -= kept.size_bytes
            self.save(kept)
        self.line.release(kept)

    async def _sweep(self) -> None:
        """Checks submissions nobody asked about lately, so that finished ones are let go."""
        while not self._closed:
            await asyncio.sleep(SWEEP_S)
            if self.store is not None:
                self.store.check()  # a file gone under an idle router is noticed now
            stale = [k for k in self._kept.values()
                     if not k.busy and self._clock() - k.last_check >= SWEEP_S
                     and k.key not in self._unreconciled_keys]
            for start in range(0, len(stale), _SWEEP_BATCH):
                batch = [self._spawn_check(k) for k in stale[start:start + _SWEEP_BATCH]]
                await asyncio.gather(*batch, return_exceptions=True)

    def _spawn(self, coro: Any, what: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=f"mineru-health-{what}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def close(self) -> None:
        """Stops checks and resubmissions (router shutdown).

        Without a store everything kept is released (its uploads deleted);
        with one it stays as it is, on disk, for the next router to resume.
        """
        self._closed = True
        pending = [t for t in (*self._background, self._sweeper) if t is not None and not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        if self.store is not None:
            self._kept.clear()
            self._kept_bytes = 0
            self.store.close()
            return
        for kept in list(self._kept.values()):
            self.release(kept)

    def __repr__(self) -> str:
        return (f"Supervisor(in_flight={self.in_flight}, "
                f"retries_in_flight={self.retries_in_flight()})")

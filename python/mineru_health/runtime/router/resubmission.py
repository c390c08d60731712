"""Sending a kept submission again once its worker lost it, or failing it with a note.

The supervisor (``supervisor.py``) decides that a submission was lost; a
``Resubmission`` sends it again under the same router id, in a task of its own:

- the poison guard (``poison.py``) first: a document that killed two workers'
  engines is not sent again (with a store, every router's deaths count);
- ``TASK_RETRIES`` and the fleet-wide retry budget: one over the budget waits
  until earlier resubmissions end, and fails only when ``BOOT_TIMEOUT_S``
  passes with none ending;
- then another healthy worker, the one it was lost on only if it is the only
  one, waiting for one at most ``BOOT_TIMEOUT_S``;
- a submission not sent again fails with its upstream error and a note saying why.

    resending = Resubmission(settings, fleet, line, store, poison, kept, background,
                             clock=..., save=..., release=..., may_send=...)
    resending.resubmit(kept, reason, error, trigger)  # lost: sent again (no-op if under way)
    resending.hold(kept)          # no worker took it yet: sent once one is back
    resending.worker_back()       # a worker came back healthy (the supervisor's events)
    resending.turned_over()       # a resubmission ended: the budget turns over

``kept`` is the supervisor's map of kept submissions (read here, never
changed); ``save`` and ``release`` are the supervisor's. Runs on the router's
event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from mineru_health import metrics, safe_text
from mineru_health.runtime.settings import HealthSettings

from .background import Background
from .fleet import Fleet
from .line import Kept, Line, NotSent, Sent, Unavailable
from .poison import Death, PoisonGuard, Quarantine
from .policy import Refusal, RetryBudget, failure_text, refuse_resubmission
from .stores import Store

__all__ = ["Resubmission"]

_log = safe_text.logger("mineru_health.router.supervisor")


class Resubmission:
    """Sends lost submissions again, within the retries, the budget and the poison guard."""

    def __init__(
        self,
        settings: HealthSettings,
        fleet: Fleet,
        line: Line,
        store: Store | None,
        poison: PoisonGuard,
        kept: Mapping[str, Kept],
        background: Background,
        *,
        clock: Callable[[], float],
        save: Callable[[Kept], Awaitable[bool]],
        release: Callable[[Kept], Awaitable[None]],
        may_send: Callable[[], bool],
    ) -> None:
        self.fleet = fleet
        self.line = line
        self.store = store
        self.poison = poison
        self._kept = kept
        self._background = background
        self._clock = clock
        self._save = save
        self._release = release
        #: False while this router's lease in a shared store has lapsed (a survivor may
        #: have taken its submissions over): nothing is sent meanwhile.
        self._may_send = may_send
        self.task_retries = int(settings.task_retries)
        self.budget = RetryBudget(
            float(settings.retry_budget_percent), int(settings.retry_budget_min)
        )
        self.wait_for_worker_s = float(settings.boot_timeout_s)
        self.retry_interval_s = float(settings.interval_s)
        self._retries_ended = 0  # resubmissions over: the budget turning over
        self._sending: dict[str, asyncio.Task[Any]] = {}  # key -> its resubmission under way
        self._worker_back = asyncio.Event()

    def retries_in_flight(self, exclude: Kept | None = None) -> int:
        return sum(1 for k in self._kept.values() if k is not exclude and k.counted)

    def turned_over(self) -> None:
        """One resubmission ended (its submission let go): the budget turns over."""
        self._retries_ended += 1

    def worker_back(self) -> None:
        """A worker came back healthy: what waits for one looks again now."""
        self._worker_back.set()

    def sending(self, key: str) -> asyncio.Task[Any] | None:
        """The resubmission of ``key`` under way, or None."""
        return self._sending.get(key)

    def resubmit(self, kept: Kept, reason: str, error: str, trigger: str | None) -> None:
        """Starts sending ``kept`` again, elsewhere if it can (no-op while one is under way)."""
        if kept.busy:
            return
        kept.busy = True
        self.line.lost(kept)
        self._track_sending(
            kept, self._background.spawn(self._resubmit(kept, reason, error, trigger), "resubmit")
        )

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
        self._background.spawn(self._resubmit(kept, "", "", None), "hold")
        _log.warning(
            "%s: no healthy worker while the fleet heals; held until one is back", kept.key
        )

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
            if self._kept.get(kept.key) is not kept:
                return  # taken over by another router meanwhile (disown): it drives it
            if isinstance(outcome, NotSent):
                await self._fail(kept, failure_text(error, outcome.note), outcome.refusal)
                return
            kept.workers.append(outcome.worker_id)
            kept.instance = outcome.instance
            kept.generation += 1
            kept.resumed = False
            await self._save(kept)
            if reason:
                metrics.router.record_resubmission(reason)
                _log.warning(
                    "%s: sent again to %s (%s on %s; submission %d)",
                    kept.key,
                    outcome.worker_id,
                    reason,
                    lost_on,
                    len(kept.workers),
                )
            else:
                _log.info("%s: held submission sent to %s", kept.key, outcome.worker_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 -- the submission must still end, with a reason
            _log.exception("%s: sending it again failed", kept.key)
            await self._fail(
                kept, failure_text(error, f"resubmission failed: {exc}"), Refusal.REJECTED
            )
        finally:
            kept.busy = False

    async def _refusal(self, kept: Kept, failed_on: str, trigger: str | None) -> NotSent | None:
        """None once ``kept`` may be sent again; else why not (poison, retries, budget)."""
        if trigger is not None or self.poison.suspects():
            if kept.digest is None:
                kept.digest = await self.line.digest(kept)
            if kept.digest is not None:
                if trigger is not None:
                    quarantine = await self._record_death(kept.digest, failed_on, trigger)
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

    async def _record_death(self, digest: str, worker_id: str, rule: str) -> Quarantine | None:
        """Counts one trigger death of a document; the Quarantine when this one completes it.

        With a store the death is added there first, and the guard takes back every death
        the store holds: in a store several routers share, those are every router's, so
        two routers that each saw one death quarantine the document together. There a
        local worker is named with its router (each router has its own ``local-gpu-0``).
        """
        if self.store is None:
            return self.poison.record_trigger(digest, worker_id, rule)
        member = self.fleet.member(worker_id)
        if self.store.router_id and member is not None and member.local:
            worker_id = f"{self.store.router_id}/{worker_id}"
        before = self.poison.quarantined(digest)
        deaths = await asyncio.to_thread(self.store.add_poison_death, digest, worker_id, rule)
        if deaths is None:  # the store failed (logged): this router still counts it
            return self.poison.record_trigger(digest, worker_id, rule)
        self.poison.load(digest, [Death(worker, held_rule) for worker, held_rule in deaths])
        return self.poison.quarantined(digest) if before is None else None

    async def _within_budget(self, kept: Kept) -> Refusal | None:
        """None once one more resubmission of ``kept`` is allowed; else why not.

        The retry budget bounds how many resubmissions run at once, not
        whether a submission is sent again: one over it waits, pending for its
        client and adding no load, until earlier ones end (checked every probe
        interval). It fails only when ``BOOT_TIMEOUT_S`` passes with none of
        them ending (a fleet that makes no progress): a large backlog on a slow
        fleet turns the budget over slowly, and each of its tasks was accepted
        (one real-vLLM run lost 20 of 85 jobs to a fixed wait). ``TASK_RETRIES``
        is final.
        """
        deadline = self._clock() + self.wait_for_worker_s
        ended = self._retries_ended
        while True:
            if self._retries_ended != ended:  # the budget turned over: progress
                ended = self._retries_ended
                deadline = self._clock() + self.wait_for_worker_s
            refusal = refuse_resubmission(
                submissions=len(kept.workers),
                task_retries=self.task_retries,
                budget=self.budget,
                retries_in_flight=self.retries_in_flight(exclude=kept),
                tasks_in_flight=len(self._kept),
            )
            left = deadline - self._clock()
            if refusal is None:
                # No await since the check: two waiters cannot take one place.
                kept.counted = True
                return None
            if refusal is not Refusal.BUDGET or self._background.closed or left <= 0:
                return refusal
            await asyncio.sleep(min(self.retry_interval_s, left))

    async def _send_elsewhere(self, kept: Kept, failed_on: str) -> Sent | NotSent:
        """Another healthy worker first; the one it failed on only if it is the only one."""
        deadline = self._clock() + self.wait_for_worker_s
        tried: set[str] = set()
        last_error = ""
        while not self._background.closed and self._kept.get(kept.key) is kept:
            outcome: Sent | Unavailable | NotSent | None = None
            if self._may_send():
                # A lapsed lease sends nothing (waits as for a worker): a survivor may
                # have taken this submission over and sent it already.
                outcome = await self.line.send(kept, {failed_on, *tried} - {""})
                if outcome is None and failed_on and failed_on not in tried:
                    outcome = await self.line.send(kept, tried)
            if isinstance(outcome, Unavailable):
                tried.add(outcome.worker_id)
                last_error = f"{outcome.worker_id}: {outcome.error}"
                self.fleet.local.check_process(outcome.worker_id)
                continue
            if outcome is not None:
                return outcome
            if self._clock() >= deadline:
                break
            await self._wait_for_worker(
                min(self.retry_interval_s, max(0.0, deadline - self._clock()))
            )
            tried.clear()
        detail = f" (last error: {last_error})" if last_error else ""
        return NotSent(
            Refusal.NO_WORKER,
            f"no healthy worker to send it to within {self.wait_for_worker_s:g} s{detail}",
        )

    async def wait_for_worker(self, ready: Callable[[], bool]) -> bool:
        """Until ``ready()``, checked when a worker comes back and each probe interval, for at
        most ``BOOT_TIMEOUT_S``; False when it never was."""
        deadline = self._clock() + self.wait_for_worker_s
        while not ready():
            left = deadline - self._clock()
            if self._background.closed or left <= 0:
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
            return (
                f"not resubmitted: {self.task_retries} resubmission(s) already made "
                f"(MINERU_ROUTER_HEALTH_TASK_RETRIES); workers tried: {tried}"
            )
        limit = self.budget.limit(len(self._kept))
        return (
            f"not resubmitted: the retry budget stayed spent for "
            f"{self.wait_for_worker_s:g} s with no resubmission ending "
            f"({self.retries_in_flight()} of "
            f"{len(self._kept)} submissions in flight are resubmissions, limit {limit}: "
            f"MINERU_ROUTER_HEALTH_RETRY_BUDGET_PERCENT={self.budget.percent:g}, "
            f"MINERU_ROUTER_HEALTH_RETRY_BUDGET_MIN={self.budget.minimum})"
        )

    def _quarantined(self, kept: Kept, quarantine: Quarantine) -> None:
        names = self.line.names(kept)
        metrics.router.record_poison_document()
        self.fleet.audit.write_record(
            "poison_document_quarantined",
            worker_id=kept.worker,
            reason=quarantine.message(names),
            task_id=kept.key,
            document_sha256=quarantine.digest,
            file_names=names,
            workers=quarantine.workers,
            rules=quarantine.rules,
        )
        _log.error("%s: %s", kept.key, quarantine.message(names))

    async def _fail(self, kept: Kept, text: str, refusal: Refusal) -> None:
        metrics.router.record_resubmission_refused(refusal.value)
        _log.warning("%s: failed, not sent again (%s): %s", kept.key, refusal.value, text)
        await self.line.fail(kept, text)
        await self._release(kept)

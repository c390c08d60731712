"""Sending a task again: the resubmission, the wait for a healthy worker, and the refusals.

``TaskSending`` is the half of the task supervisor (``tasks.py``) that acts
once a check decided a task must go elsewhere, or that a new task must be
held while the fleet heals:

- the poison guard first (a trigger death is counted; a quarantined
  document fails with a message naming the workers and rules, an audit
  record and a metric);
- then ``TASK_RETRIES`` (final) and the retry budget (``resubmit_policy.py``;
  a task over it waits for earlier resubmissions to end, bounded);
- then another healthy worker (the one it failed on only if it is the only
  healthy one), retried every probe interval for at most ``BOOT_TIMEOUT_S``.

A task that is not sent fails with its upstream error and a note saying why.
Runs on the router's event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from mineru_health import metrics

from ... import safe_text
from .poison import PoisonGuard, Quarantine, content_digest
from .resubmit_policy import Refusal, RetryBudget, failure_text, refuse_resubmission
from .tracked import WORKERS_ATTR, TrackedTask, upload_names, workers_tried

__all__ = ["NotSent", "TaskSending"]

_log = safe_text.logger("mineru_health.router.tasks")


@dataclass(frozen=True, slots=True)
class NotSent:
    refusal: Refusal
    note: str


class TaskSending:
    """Resubmission and held tasks; mixed into ``TaskSupervisor``."""

    # Provided by TaskSupervisor (for type checkers).
    _pool: Any
    _ns: Mapping[str, Any]
    _audit: Any
    _clock: Callable[[], float]
    _tasks: dict[str, TrackedTask]
    _registry: Any
    _worker_back: asyncio.Event
    _closed: bool
    task_retries: int
    budget: RetryBudget
    poison: PoisonGuard
    wait_for_worker_s: float
    retry_interval_s: float
    _background_task: Callable[..., asyncio.Task[Any]]
    _keep: Callable[..., TrackedTask]
    _release: Callable[[TrackedTask], None]
    retries_in_flight: Callable[..., int]

    async def hold(self, payload: Any, digest: str | None, registry: Any) -> Any:
        """Registers a pending task for ``payload`` and sends it once a worker is healthy.

        Bounded like a resubmission: ``BOOT_TIMEOUT_S``, then the task fails
        with a clear error. Returns MinerU's RouterTaskRecord.
        """
        names = upload_names(payload)
        record = await registry.register(
            upstream_server_id="", upstream_base_url="", upstream_task_id="",
            backend=payload.get_field_value("backend") or "",
            file_names=[PurePath(self._ns["normalize_upload_filename"](n)).stem for n in names],
            created_at=self._ns["utc_now_iso"](), status="pending", started_at=None,
            completed_at=None, error=None, queued_ahead=None)
        tracked = self._keep(record, payload, digest, registry, [])
        tracked.busy = True
        self._background_task(self._send_held(tracked), "hold")
        _log.warning("task %s: no healthy worker while the fleet heals; held until one is back",
                     record.task_id)
        return record

    async def _send_held(self, tracked: TrackedTask) -> None:
        try:
            outcome = await self._submit_elsewhere(tracked, "")
            if isinstance(outcome, NotSent):
                await self._fail(tracked, failure_text("", outcome.note), outcome.refusal)
            else:
                self._resubmitted(tracked, "", *outcome)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 -- the task must still end, with a reason
            _log.exception("task %s: sending the held task failed", tracked.record.task_id)
            await self._fail(tracked, failure_text("", f"submission failed: {exc}"),
                             Refusal.REJECTED)
        finally:
            tracked.busy = False

    # -- resubmission -------------------------------------------------------------------
    def _start_resubmission(self, tracked: TrackedTask, reason: str, error: str,
                            trigger: str | None) -> None:
        if tracked.busy:
            return
        tracked.busy = True
        self._background_task(self._resubmit(tracked, reason, error, trigger), "resubmit")

    async def _resubmit(self, tracked: TrackedTask, reason: str, error: str,
                        trigger: str | None) -> None:
        record = tracked.record
        failed_on = record.upstream_server_id
        try:
            digest = await self._digest(tracked)
            if trigger is not None:
                quarantine = self.poison.record_trigger(digest, failed_on, trigger)
                if quarantine is not None:
                    self._quarantined(tracked, quarantine)
            quarantine = self.poison.quarantined(digest)
            if quarantine is not None:
                await self._fail(tracked, failure_text(error, quarantine.message(
                    tracked.upload_names)), Refusal.POISON)
                return
            refusal = await self._within_budget(tracked)
            if refusal is not None:
                await self._fail(tracked, failure_text(error, self._refusal_note(refusal, record)),
                                 refusal)
                return
            tracked.resubmitting = True
            outcome = await self._submit_elsewhere(tracked, failed_on)
            if isinstance(outcome, NotSent):
                await self._fail(tracked, failure_text(error, outcome.note), outcome.refusal)
            else:
                self._resubmitted(tracked, reason, *outcome)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 -- the task must still end, with a reason
            _log.exception("task %s: resubmission failed", record.task_id)
            await self._fail(tracked, failure_text(error, f"resubmission failed: {exc}"),
                             Refusal.REJECTED)
        finally:
            tracked.busy = False

    async def _within_budget(self, tracked: TrackedTask) -> Refusal | None:
        """None once one more resubmission of ``tracked`` is allowed; else why not.

        The retry budget bounds how many resubmissions run at once, not
        whether a task is sent again: a task over the budget waits, pending
        for its client and adding no load, until earlier resubmissions end
        (checked every probe interval), for at most ``BOOT_TIMEOUT_S`` as
        for a healthy worker. ``TASK_RETRIES`` is final at once.
        """
        deadline = self._clock() + self.wait_for_worker_s
        while True:
            # No await between this check and the caller's ``resubmitting = True``:
            # two waiters cannot both take the last place in the budget.
            refusal = refuse_resubmission(
                submissions=len(workers_tried(tracked.record)), task_retries=self.task_retries,
                budget=self.budget, retries_in_flight=self.retries_in_flight(exclude=tracked),
                tasks_in_flight=len(self._tasks))
            left = deadline - self._clock()
            if refusal is not Refusal.BUDGET or self._closed or left <= 0:
                return refusal
            await asyncio.sleep(min(self.retry_interval_s, left))

    @staticmethod
    async def _digest(tracked: TrackedTask) -> str:
        """The document's digest, hashed on first need (a resubmission), then kept."""
        if tracked.digest is None:
            tracked.digest = await asyncio.to_thread(content_digest,
                                                     [u.path for u in tracked.payload.uploads])
        return tracked.digest

    async def _submit_elsewhere(
        self, tracked: TrackedTask, failed_on: str
    ) -> tuple[Any, dict[str, Any]] | NotSent:
        """(server, upstream submit payload), or why it cannot be sent."""
        pool = self._pool
        unavailable = self._ns["UpstreamSubmissionUnavailable"]
        rejected = self._ns["UpstreamSubmissionRejected"]
        deadline = self._clock() + self.wait_for_worker_s
        tried: set[str] = set()
        last_error = ""
        while not self._closed:
            # Another worker first; the one it failed on only if it is the
            # only healthy one (then it was restarted: a fresh engine).
            server = await pool.acquire_submission_server(excluded_server_ids={failed_on, *tried})
            if server is None and failed_on not in tried:
                server = await pool.acquire_submission_server(excluded_server_ids=tried)
            if server is None:
                if self._clock() >= deadline:
                    break
                await self._wait_for_worker(min(self.retry_interval_s,
                                                max(0.0, deadline - self._clock())))
                tried.clear()
                continue
            try:
                upstream = await self._ns["submit_payload_to_upstream"](server.base_url,
                                                                         tracked.payload)
            except unavailable as exc:
                tried.add(server.server_id)
                last_error = f"{server.server_id}: {exc}"
                await pool.mark_submission_failure(server.server_id, str(exc))
                continue
            except rejected as exc:
                return NotSent(Refusal.REJECTED, f"submission to {server.server_id} refused: "
                                                 f"{exc.status_code} {exc.detail}")
            finally:
                await pool.release_submission_server(server.server_id)
            return server, upstream
        detail = f" (last error: {last_error})" if last_error else ""
        return NotSent(Refusal.NO_WORKER, f"no healthy worker to send it to within "
                                          f"{self.wait_for_worker_s:g} s{detail}")

    async def _wait_for_worker(self, timeout_s: float) -> None:
        self._worker_back.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._worker_back.wait(), timeout=timeout_s)

    def _resubmitted(self, tracked: TrackedTask, reason: str, server: Any,
                     upstream: dict[str, Any]) -> None:
        record = tracked.record
        previous = record.upstream_server_id
        record.upstream_server_id = server.server_id
        record.upstream_base_url = server.base_url
        record.upstream_task_id = upstream["task_id"]
        record.status = upstream["status"]
        started = upstream.get("started_at")
        record.started_at = started if isinstance(started, str) else None
        record.completed_at = None
        record.error = None
        record.queued_ahead = upstream.get("queued_ahead")
        record.upstream_error_count = 0
        setattr(record, WORKERS_ATTR, [*workers_tried(record), server.server_id])
        tracked.generation += 1
        if not reason:  # a held task's first submission
            _log.info("task %s: held task sent to %s as %s", record.task_id, server.server_id,
                      record.upstream_task_id)
            return
        metrics.router.record_resubmission(reason)
        _log.warning("task %s: resubmitted to %s as %s (%s on %s; attempt %d)", record.task_id,
                     server.server_id, record.upstream_task_id, reason, previous,
                     len(workers_tried(record)))

    def _refusal_note(self, refusal: Refusal, record: Any) -> str:
        tried = ", ".join(workers_tried(record))
        if refusal is Refusal.RETRIES:
            return (f"not resubmitted: {self.task_retries} resubmission(s) already made "
                    f"(MINERU_ROUTER_HEALTH_TASK_RETRIES); workers tried: {tried}")
        limit = self.budget.limit(len(self._tasks))
        return (f"not resubmitted: the retry budget stayed spent for "
                f"{self.wait_for_worker_s:g} s ({self.retries_in_flight()} of "
                f"{len(self._tasks)} tasks in flight are resubmissions, limit {limit}: "
                f"MINERU_ROUTER_HEALTH_RETRY_BUDGET_PERCENT={self.budget.percent:g}, "
                f"MINERU_ROUTER_HEALTH_RETRY_BUDGET_MIN={self.budget.minimum})")

    def _quarantined(self, tracked: TrackedTask, quarantine: Quarantine) -> None:
        record = tracked.record
        names = tracked.upload_names
        metrics.router.record_poison_document()
        self._audit.write_record(
            "poison_document_quarantined", worker_id=record.upstream_server_id,
            reason=quarantine.message(names), task_id=record.task_id,
            document_sha256=quarantine.digest, file_names=names,
            workers=quarantine.workers, rules=quarantine.rules)
        _log.error("task %s: %s", record.task_id, quarantine.message(names))

    async def _fail(self, tracked: TrackedTask, text: str, refusal: Refusal) -> None:
        record = tracked.record
        metrics.router.record_resubmission_refused(refusal.value)
        _log.warning("task %s: failed, not resubmitted (%s): %s", record.task_id,
                     refusal.value, text)
        if self._registry is not None:
            await self._registry.mark_failed(record.task_id, text)
        self._release(tracked)

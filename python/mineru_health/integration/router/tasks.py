"""Tasks the router keeps until they finish, and sends again when a worker lost them.

MinerU's router forwards an upload to one worker and forgets the upload; a
task whose worker dies, stalls or is killed fails for the client. The
``TaskSupervisor`` (one per pool, ``pool.task_supervisor``) keeps each
task's staged upload (``endpoints.py`` defers MinerU's cleanup) until the
task is terminal, and resubmits it, under the same router task id, when:

(a) its upstream status says ``failed`` with ``"engine_dead": true`` (the
    worker's verdict);
(b) its worker is declared failed (failure threshold, definitive 503,
    process exit, stall) or comes back restarted while the task is pending
    or processing: the supervisor reacts to the poller's events at once, not
    when a client polls;
(c) a status request finds that the worker's current instance does not know
    the task (404), or cannot be reached while the worker is declared failed.

A task submitted while no worker is healthy but one is being restarted (the
fleet is healing, e.g. both workers of a pair killed by one poison document)
is accepted and held the same way, instead of MinerU's 503, and sent when a
worker is back (``hold``).

Before resubmitting for (b) or (c) it asks the worker's *current* instance
(same server id, maybe a new URL) for the upstream task id: a restarted
worker that restored the task from its task store keeps it (adopted, no
duplicate). Tasks on a worker that is merely slow (ejected below the failure
threshold) are left alone. The decisions are pure (``resubmit_policy.py``);
so is the poison guard (``poison.py``). Limits: ``TASK_RETRIES``
resubmissions per task, a fleet-wide retry budget, and a bounded wait
(``BOOT_TIMEOUT_S``) for a healthy worker while the fleet heals; past them
the task fails with its error and a note that says why.

    supervisor.track(record, payload, digest, registry)   # after MinerU registered it
    supervisor.healing()                                  # no healthy worker, but one restarts
    await supervisor.hold(payload, digest, registry)      # then: a pending task, sent later
    await supervisor.refresh(record)                      # a client asked for its status
    supervisor.on_event(event)                            # every poller event
    await supervisor.close()                              # router shutdown: uploads deleted

The status payload shows ``attempts`` and ``workers_tried``
(``workers_tried(record)``). Runs on the router's event loop; not
thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import PurePath
from typing import Any

from mineru_health import _native, metrics
from mineru_health.settings import HealthSettings

from .poison import PoisonGuard, Quarantine
from .resubmit_policy import (
    Action,
    Answer,
    AnswerKind,
    Refusal,
    RetryBudget,
    Step,
    WorkerView,
    failure_text,
    is_terminal,
    next_step,
    refuse_resubmission,
    trigger_rule,
)

__all__ = ["TaskSupervisor", "TrackedTask", "workers_tried"]

_log = logging.getLogger("mineru_health.router.tasks")

_P = _native.WorkerPhase
_AUDIT = _native.PollerEventKind.AUDIT
_RESTART = _native.PollerEventKind.RESTART_REQUESTED
#: Phases in which the worker is declared failed: its tasks will not finish there.
DECLARED_FAILED = frozenset({_P.FAILED, _P.RESTART_SCHEDULED, _P.RESTARTING, _P.GAVE_UP})
#: Phases of a local worker on its way back (a restart is due or under way).
HEALING = frozenset({_P.FAILED, _P.RESTART_SCHEDULED, _P.RESTARTING})
#: Attribute on MinerU's RouterTaskRecord: the server ids it was submitted to, in order.
WORKERS_ATTR = "_mineru_health_workers_tried"
#: Seconds between two status checks of a task no client asks about (so a
#: finished task's upload is deleted even if nobody polls it).
SWEEP_S = 30.0
_SWEEP_BATCH = 32


def workers_tried(record: Any) -> list[str]:
    """Server ids the task was submitted to, first one first."""
    tried = getattr(record, WORKERS_ATTR, None)
    if isinstance(tried, list):  # empty: a held task not sent yet
        return list(tried)
    server = getattr(record, "upstream_server_id", "")
    return [server] if server else []


@dataclass(frozen=True, slots=True)
class NotSent:
    refusal: Refusal
    note: str


class TrackedTask:
    """A non-terminal router task and what is needed to send it again."""

    __slots__ = ("busy", "check", "digest", "generation", "last_check", "payload", "record",
                 "resubmitting")

    def __init__(self, record: Any, payload: Any, digest: str) -> None:
        self.record = record
        self.payload = payload  # endpoints.RetainedPayload
        self.digest = digest
        self.busy = False  # a resubmission (or the wait for a worker) is under way
        self.resubmitting = False  # counted as a retry in flight from its first resubmission
        self.generation = 0  # +1 per resubmission: answers about an older upstream are stale
        self.check: asyncio.Task[None] | None = None
        self.last_check = 0.0

    @property
    def upload_names(self) -> list[str]:
        return [str(u.upload_name) for u in getattr(self.payload, "uploads", [])]


class TaskSupervisor:
    """Keeps the uploads of unfinished tasks and resubmits those a worker lost."""

    def __init__(
        self,
        pool: Any,
        *,
        settings: HealthSettings,
        namespace: Mapping[str, Any],
        audit: Any,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pool = pool
        self._ns = namespace
        self._audit = audit
        self._clock = clock
        self.task_retries = int(settings.task_retries)
        self.budget = RetryBudget(float(settings.retry_budget_percent),
                                  int(settings.retry_budget_min))
        self.poison = PoisonGuard()
        self.wait_for_worker_s = float(settings.boot_timeout_s)
        self.retry_interval_s = float(settings.interval_s)
        self.status_timeout_s = max(3.0, 2.0 * float(settings.probe_timeout_s))
        #: Retry-After of a result request while the task's worker restarts.
        self.retry_after_s = max(1, math.ceil(2 * float(settings.interval_s)))
        self._tasks: dict[str, TrackedTask] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._registry: Any = None
        self._worker_back = asyncio.Event()
        self._closed = False

    # -- registration -------------------------------------------------------------
    def quarantined(self, digest: str) -> Quarantine | None:
        return self.poison.quarantined(digest)

    def track(self, record: Any, payload: Any, digest: str, registry: Any) -> None:
        """Keeps ``payload`` for ``record`` (MinerU's RouterTaskRecord) until it is terminal."""
        self._registry = registry
        setattr(record, WORKERS_ATTR, [record.upstream_server_id])
        if self._closed or is_terminal(record.status):
            payload.release()
            return
        payload.retained = True
        self._tasks[record.task_id] = TrackedTask(record, payload, digest)
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(
                self._sweep(), name="mineru-health-task-sweep")

    def healing(self) -> bool:
        """A local worker is failed or restarting: it will be back (called after a 503).

        MinerU answered 503 because no worker took the task just now; one in
        rotation by the policy may have refused it already (its engine died
        a moment before the next probe), so only the workers coming back
        count. A fleet that gave up gets MinerU's 503 at once.
        """
        return any(s.restartable and s.phase in HEALING for s in self._pool._monitor.statuses())

    async def hold(self, payload: Any, digest: str, registry: Any) -> Any:
        """Registers a pending task for ``payload`` and sends it once a worker is healthy.

        Bounded like a resubmission: ``BOOT_TIMEOUT_S``, then the task fails
        with a clear error. Returns MinerU's RouterTaskRecord.
        """
        self._registry = registry
        names = [str(u.upload_name) for u in payload.uploads]
        record = await registry.register(
            upstream_server_id="", upstream_base_url="", upstream_task_id="",
            backend=payload.get_field_value("backend") or "",
            file_names=[PurePath(self._ns["normalize_upload_filename"](n)).stem for n in names],
            created_at=self._ns["utc_now_iso"](), status="pending", started_at=None,
            completed_at=None, error=None, queued_ahead=None)
        setattr(record, WORKERS_ATTR, [])
        payload.retained = True
        tracked = TrackedTask(record, payload, digest)
        tracked.busy = True
        self._tasks[record.task_id] = tracked
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

    def tracks(self, record: Any) -> bool:
        return getattr(record, "task_id", None) in self._tasks

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def retries_in_flight(self, exclude: TrackedTask | None = None) -> int:
        return sum(1 for t in self._tasks.values()
                   if t is not exclude and (t.resubmitting or len(workers_tried(t.record)) > 1))

    # -- status requests ------------------------------------------------------------
    async def refresh(self, record: Any) -> Any:
        """MinerU's status refresh for a tracked task; returns the (updated) record."""
        tracked = self._tasks.get(record.task_id)
        if tracked is None:
            return record
        if not tracked.busy and not is_terminal(record.status):
            # Shielded: a client that goes away must not cancel a check under way.
            await asyncio.shield(self._spawn_check(tracked))
        return record

    def follow_restart(self, record: Any) -> bool:
        """Points a finished task's result request at its worker's *current* instance.

        A restarted local worker restored the task from its task store; only
        a restart changes a local worker's URL, so the new URL is the right
        one. False while that worker is declared failed or restarting: the
        caller answers 503 rather than let MinerU count upstream errors (at
        three, MinerU turns a completed task into a failed one).
        """
        server = self._pool.get_server(getattr(record, "upstream_server_id", ""))
        if server is None or not is_terminal(record.status):
            return True
        if server.local_server is not None and server.base_url:
            record.upstream_base_url = server.base_url
        status = self._pool._monitor.status(server.server_id)
        return status is None or status.in_rotation or status.phase not in DECLARED_FAILED

    # -- poller events ----------------------------------------------------------------
    def on_event(self, event: Any) -> None:
        """Reacts to a worker declared failed, restarted or back healthy (on the loop)."""
        if self._closed:
            return
        if event.kind == _RESTART:
            # The pool is stopping the old instance now: what it still holds is lost.
            for tracked in self._on_worker(event.worker_id):
                self._spawn_check(tracked)
            return
        if event.kind != _AUDIT:
            return
        to = event.audit.to_phase
        if to in DECLARED_FAILED:
            for tracked in self._on_worker(event.worker_id):
                self._spawn_check(tracked)
        elif to == _P.HEALTHY:
            server = self._pool.get_server(event.worker_id)
            for tracked in self._on_worker(event.worker_id):
                if server is not None and server.base_url != tracked.record.upstream_base_url:
                    self._spawn_check(tracked)  # restarted: ask the new instance
            self._worker_back.set()

    def _on_worker(self, worker_id: str) -> list[TrackedTask]:
        return [t for t in self._tasks.values()
                if t.record.upstream_server_id == worker_id and not t.busy]

    # -- one check: ask the current instance, then act ---------------------------------
    def _spawn_check(self, tracked: TrackedTask) -> asyncio.Task[None]:
        if tracked.check is None or tracked.check.done():
            tracked.check = self._background_task(self._check(tracked), "check")
        return tracked.check

    async def _check(self, tracked: TrackedTask) -> None:
        record = tracked.record
        generation = tracked.generation
        server = self._pool.get_server(record.upstream_server_id)
        url = (server.base_url if server is not None and server.base_url
               else record.upstream_base_url)
        answer = await self._ask(url, record.upstream_task_id)
        tracked.last_check = self._clock()
        if answer.kind is AnswerKind.UNREACHABLE and server is not None:
            # A local worker's process that died is reported now, not at the
            # next process poll: the view below then says "declared failed".
            self._pool._check_process(server)
            answer = await self._stored_answer(server, record, answer)
        if (tracked.generation != generation or tracked.busy or is_terminal(record.status)
                or self._tasks.get(record.task_id) is not tracked):
            return  # resubmitted or finished meanwhile: this answer is about the past
        view = self._worker_view(record, url)
        if answer.from_store:  # it speaks for the instance the task was submitted to
            view = replace(view, same_instance=True)
        step = next_step(answer, view)
        try:
            await self._act(tracked, step, answer, url)
        except Exception:  # noqa: BLE001 -- one task's trouble must not stop the others
            _log.exception("task %s: handling its status failed", record.task_id)

    async def _ask(self, url: str, upstream_task_id: str) -> Answer:
        import httpx  # MinerU's router depends on it; this package does not

        if not url:
            return Answer(AnswerKind.UNREACHABLE, detail="the worker has no URL (restarting)")
        try:
            response = await self._pool.client.get(f"{url}/tasks/{upstream_task_id}",
                                                   timeout=self.status_timeout_s)
        except httpx.HTTPError as exc:
            return Answer(AnswerKind.UNREACHABLE, detail=f"{type(exc).__name__}: {exc}".strip())
        if response.status_code == 404:
            return Answer(AnswerKind.NOT_FOUND, detail=f"404 from {url}")
        if response.status_code != 200:
            return Answer(AnswerKind.BAD_ANSWER, detail=f"{response.status_code} from {url}")
        try:
            payload = response.json()
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            return Answer(AnswerKind.BAD_ANSWER, detail="Invalid task status payload")
        return Answer(AnswerKind.STATUS, payload=payload)

    async def _stored_answer(self, server: Any, record: Any, answer: Answer) -> Answer:
        """The task store of a dead local worker, for the instance that cannot answer.

        Its current instance is gone (killed, crashed, hung and declared
        failed); its replacement may take minutes to boot. The store lives in
        the worker's state directory on this machine: a task that finished
        before the crash is there, and is kept rather than sent again (the
        restarted worker serves its result). Remote workers: no store to read.
        """
        dirs = getattr(self._pool, "_instance_dirs", None)
        status = self._pool._monitor.status(server.server_id)
        if (dirs is None or server.local_server is None or status is None
                or status.phase not in DECLARED_FAILED):
            return answer
        from mineru_health.integration import task_store

        stored = await asyncio.to_thread(task_store.read_task,
                                         dirs.state_dir(server.server_id),
                                         record.upstream_task_id)
        if stored is None:
            return answer
        fields, verdict = stored
        payload = {k: fields.get(k) for k in ("status", "backend", "file_names", "started_at",
                                              "completed_at", "error")}
        if verdict is not None:
            payload["engine_dead"] = bool(verdict.get("engine_dead"))
            payload["verdict"] = verdict
        _log.info("task %s: %s is gone; its task store says %s", record.task_id,
                  server.server_id, payload["status"])
        return Answer(AnswerKind.STATUS, payload=payload, detail="task store", from_store=True)

    def _worker_view(self, record: Any, url: str) -> WorkerView:
        status = self._pool._monitor.status(record.upstream_server_id)
        return WorkerView(
            in_rotation=bool(status is not None and status.in_rotation),
            declared_failed=status is not None and status.phase in DECLARED_FAILED,
            same_instance=url == record.upstream_base_url,
            replaced=status is not None and status.phase == _P.RESTARTING,
        )

    async def _act(self, tracked: TrackedTask, step: Step, answer: Answer, url: str) -> None:
        record = tracked.record
        payload = dict(answer.payload or {})
        if step.action in (Action.APPLY, Action.ADOPT):
            if step.action is Action.ADOPT:
                _log.info("task %s: %s restored upstream task %s; following it there",
                          record.task_id, record.upstream_server_id, record.upstream_task_id)
                record.upstream_base_url = url
            self._pool.observe_task_status(record, payload)
            payload["created_at"] = record.created_at  # the client's task began then
            await self._registry.update_from_upstream_payload(record.task_id, payload)
        elif step.action is Action.RESUBMIT:
            if payload:
                self._pool.observe_task_status(record, payload)  # passive ejection
            trigger = trigger_rule(payload) if payload else None
            error = str(payload.get("error") or "") or self._lost_text(record, step)
            self._start_resubmission(tracked, step.reason, error, trigger)
        elif step.action is Action.UPSTREAM_ERROR:
            await self._registry.increment_upstream_error(record.task_id, step.detail)
        self._release_if_terminal(tracked)

    @staticmethod
    def _lost_text(record: Any, step: Step) -> str:
        what = ("does not know it any more" if step.reason == "lost"
                else "was declared failed")
        return (f"worker {record.upstream_server_id} {what} (upstream task "
                f"{record.upstream_task_id}, last seen {record.status}): {step.detail}")

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
            if trigger is not None:
                quarantine = self.poison.record_trigger(tracked.digest, failed_on, trigger)
                if quarantine is not None:
                    self._quarantined(tracked, quarantine)
            quarantine = self.poison.quarantined(tracked.digest)
            if quarantine is not None:
                await self._fail(tracked, failure_text(error, quarantine.message(
                    tracked.upload_names)), Refusal.POISON)
                return
            refusal = refuse_resubmission(
                submissions=len(workers_tried(record)), task_retries=self.task_retries,
                budget=self.budget, retries_in_flight=self.retries_in_flight(exclude=tracked),
                tasks_in_flight=self.in_flight)
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
        with contextlib.suppress(TimeoutError):
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
        limit = self.budget.limit(self.in_flight)
        return (f"not resubmitted: the retry budget is spent ({self.retries_in_flight()} of "
                f"{self.in_flight} tasks in flight are resubmissions, limit {limit}: "
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

    # -- end of a task ---------------------------------------------------------------
    def _release_if_terminal(self, tracked: TrackedTask) -> None:
        if is_terminal(tracked.record.status):
            self._release(tracked)

    def _release(self, tracked: TrackedTask) -> None:
        if self._tasks.get(tracked.record.task_id) is tracked:
            del self._tasks[tracked.record.task_id]
        tracked.payload.release()

    async def _sweep(self) -> None:
        """Checks tasks nobody asked about lately, so finished ones let go of their upload."""
        while not self._closed:
            await asyncio.sleep(SWEEP_S)
            stale = [t for t in self._tasks.values()
                     if not t.busy and self._clock() - t.last_check >= SWEEP_S]
            for start in range(0, len(stale), _SWEEP_BATCH):
                batch = [self._spawn_check(t) for t in stale[start:start + _SWEEP_BATCH]]
                await asyncio.gather(*batch, return_exceptions=True)

    def _background_task(self, coro: Any, what: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=f"mineru-health-task-{what}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def close(self) -> None:
        """Stops checks and resubmissions and deletes every kept upload (router shutdown)."""
        self._closed = True
        pending = [t for t in (*self._background, self._sweeper) if t is not None and not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        for tracked in list(self._tasks.values()):
            self._release(tracked)

    def __repr__(self) -> str:
        return (f"TaskSupervisor(in_flight={self.in_flight}, "
                f"retries_in_flight={self.retries_in_flight()})")

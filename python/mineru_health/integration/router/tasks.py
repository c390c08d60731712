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
duplicate); when a local worker's process is gone and its replacement not up
yet, its task store is read directly (same machine), so a task it finished
just before dying is kept too. Tasks on a worker that is merely slow
(ejected below the failure threshold) are left alone. The decisions are
pure (``resubmit_policy.py``); sending again, with its limits
(``TASK_RETRIES``, the retry budget, the poison guard, a bounded wait for a
healthy worker), is ``sending.py``.

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
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from mineru_health import _native
from mineru_health.settings import HealthSettings

from ... import safe_text
from .poison import PoisonGuard, Quarantine
from .projection import DECLARED_FAILED
from .resubmit_policy import (
    Action,
    Answer,
    AnswerKind,
    RetryBudget,
    Step,
    WorkerView,
    is_terminal,
    next_step,
    trigger_rule,
)
from .sending import TaskSending
from .tracked import WORKERS_ATTR, TrackedTask, workers_tried

__all__ = ["TaskSupervisor", "TrackedTask", "workers_tried"]

_log = safe_text.logger("mineru_health.router.tasks")

_P = _native.WorkerPhase
_AUDIT = _native.PollerEventKind.AUDIT
_RESTART = _native.PollerEventKind.RESTART_REQUESTED
#: Phases of a local worker on its way back (a restart is due or under way).
HEALING = frozenset({_P.FAILED, _P.RESTART_SCHEDULED, _P.RESTARTING})
#: Seconds between two status checks of a task no client asks about (so a
#: finished task's upload is deleted even if nobody polls it).
SWEEP_S = 30.0
_SWEEP_BATCH = 32


class TaskSupervisor(TaskSending):
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
        self.max_kept_tasks = int(settings.max_kept_tasks)
        self.max_kept_bytes = int(settings.max_kept_mb) * 1024 * 1024
        self._kept_bytes = 0
        self._tasks: dict[str, TrackedTask] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._registry: Any = None
        self._worker_back = asyncio.Event()
        self._closed = False

    # -- registration -------------------------------------------------------------
    def quarantined(self, digest: str) -> Quarantine | None:
        return self.poison.quarantined(digest)

    def track(self, record: Any, payload: Any, digest: str | None, registry: Any) -> None:
        """Keeps ``payload`` for ``record`` (MinerU's RouterTaskRecord) until it is terminal."""
        if self._closed or is_terminal(record.status):
            setattr(record, WORKERS_ATTR, [record.upstream_server_id])
            payload.release()
            return
        self._keep(record, payload, digest, registry, [record.upstream_server_id])

    def _keep(self, record: Any, payload: Any, digest: str | None, registry: Any,
              workers: list[str]) -> TrackedTask:
        """Registers a task to keep (``track``, ``hold``); the sweeper runs while any is kept."""
        self._registry = registry
        setattr(record, WORKERS_ATTR, workers)
        payload.retained = True
        tracked = TrackedTask(record, payload, digest)
        self._tasks[record.task_id] = tracked
        self._kept_bytes += tracked.size_bytes
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(
                self._sweep(), name="mineru-health-task-sweep")
        return tracked

    def healing(self) -> bool:
        """A local worker is failed or restarting: it will be back (called after a 503).

        MinerU answered 503 because no worker took the task just now; one in
        rotation by the policy may have refused it already (its engine died
        a moment before the next probe), so only the workers coming back
        count. A fleet that gave up gets MinerU's 503 at once.
        """
        return any(s.restartable and s.phase in HEALING for s in self._pool._monitor.statuses())

    def full(self) -> str | None:
        """Why no more uploads can be kept now (the caps on kept tasks and bytes), or None.

        A submission then gets 503 with Retry-After before its upload is
        staged: the router's memory and disk stay bounded however many
        clients submit at once.
        """
        if len(self._tasks) >= self.max_kept_tasks:
            return (f"the router keeps {len(self._tasks)} tasks for resubmission "
                    f"(MINERU_ROUTER_HEALTH_MAX_KEPT_TASKS={self.max_kept_tasks})")
        if self._kept_bytes >= self.max_kept_bytes:
            return (f"the router keeps {self._kept_bytes // (1024 * 1024)} MiB of uploads for "
                    f"resubmission (MINERU_ROUTER_HEALTH_MAX_KEPT_MB="
                    f"{self.max_kept_bytes // (1024 * 1024)})")
        return None

    def tracks(self, record: Any) -> bool:
        return getattr(record, "task_id", None) in self._tasks

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def retries_in_flight(self, exclude: TrackedTask | None = None) -> int:
        return sum(1 for t in self._tasks.values() if t is not exclude and t.resubmitting)

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

    # -- end of a task ---------------------------------------------------------------
    def _release_if_terminal(self, tracked: TrackedTask) -> None:
        if is_terminal(tracked.record.status):
            self._release(tracked)

    def _release(self, tracked: TrackedTask) -> None:
        if self._tasks.get(tracked.record.task_id) is tracked:
            del self._tasks[tracked.record.task_id]
            self._kept_bytes -= tracked.size_bytes
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

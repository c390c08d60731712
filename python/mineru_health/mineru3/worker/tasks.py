"""MinerU 3.x's tasks for the runtime (:class:`TaskLine`), and its failed tasks handed to the judge.

The runtime decides when a task fails (hung, a remote wait past its bound,
an engine death: :mod:`mineru_health.runtime.worker.line`); here is how a
3.x task is failed, figures read and a status payload given its verdict.
Runs on the worker's event loop thread, except the judge, which runs on two
threads of our own (the native matcher releases the GIL; verification waits).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import sys
from typing import Any

from ...runtime.verdict import TaskVerdict
from ...runtime.worker import dependency, engine_calls, judge, line, remote_waits
from ...runtime.worker.health import FatalInfo, Recorded, WorkerHealth, fatal_cause
from ...runtime.worker.log import log
from ...runtime.worker.loop_watch import int_or
from ...runtime.worker.worker_runtime import (
    WorkerRuntime,
    mineru_version,
    runtime_of,
    utc_now_iso,
)
from ...safe_text import describe_exception
from . import fairness, task_store
from .task_store import VERDICT_ATTR

#: MinerU 3.x's task statuses this module sets or looks for.
PENDING = "pending"
PROCESSING = "processing"
FAILED = "failed"

#: Set on a task while its failure hook runs: the watcher may act on the death
#: that failure recorded before the hook resumes, and leaves the task to the
#: hook (its verdict is the trigger's; it is not failed as collateral or cancelled).
IN_FAILURE_HOOK_ATTR = "_mineru_health_in_failure_hook"


def task_managers(runtime: WorkerRuntime) -> list[Any]:
    """The task manager of every app of ``runtime``."""
    managers = []
    for app in runtime.apps:
        manager = getattr(getattr(app, "state", None), "task_manager", None)
        if manager is not None:
            managers.append(manager)
    return managers


def _set_verdict(task: Any, verdict: TaskVerdict) -> None:
    with contextlib.suppress(Exception):  # a task object that refuses attributes keeps working
        setattr(task, VERDICT_ATTR, verdict.to_wire())


def wrap_status_payload(task_class: type) -> None:
    """Adds the verdict to ``AsyncParseTask.to_status_payload`` (once)."""
    current = task_class.__dict__.get("to_status_payload")
    if current is None or getattr(current, "__mineru_health__", False):
        return

    @functools.wraps(current)
    def to_status_payload(task: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        payload: dict[str, Any] = current(task, *args, **kwargs)
        verdict = getattr(task, VERDICT_ATTR, None)
        if isinstance(verdict, dict):  # the wire form (also as a task store kept it)
            payload["engine_dead"] = verdict.get("engine_dead") is True
            payload["verdict"] = dict(verdict)
        return payload

    to_status_payload.__mineru_health__ = True  # type: ignore[attr-defined]
    task_class.to_status_payload = to_status_payload  # type: ignore[attr-defined]


# --- failing outstanding tasks -------------------------------------------------------------


def _collateral_error(fatal: FatalInfo | None) -> str:
    """The error other users' tasks get: names the engine death, never another task's text."""
    if fatal is None:
        return (
            "Task failed because the inference engine of this worker became unusable; "
            "resubmit it to a healthy worker"
        )
    return (
        f"Task failed because the inference engine of this worker became unusable "
        f"({fatal.cause}) while it was queued or running; "
        "resubmit it to a healthy worker"
    )


def _processes(processor: asyncio.Task[Any], task_id: object) -> bool:
    """Whether ``processor`` is the one MinerU started for ``task_id`` (named ``...-task-<id>``)."""
    return processor.get_name().endswith(f"-task-{task_id}")


def fail_outstanding_tasks(runtime: WorkerRuntime, manager: Any, fatal: FatalInfo | None) -> int:
    """Fails every pending or running task of ``manager``; returns how many.

    A task whose failure hook is running is left to that hook.
    They are *collateral*: their status says ``engine_dead`` with the rule and
    category, and a generic error. Their processors are cancelled (including
    those still waiting for MinerU's concurrency semaphore), queued ids are
    drained, and every waiter is woken so that no ``/file_parse`` request keeps
    waiting for a dead engine. Must run on the event loop thread.
    """
    module = sys.modules.get(type(manager).__module__)
    pending = getattr(module, "TASK_PENDING", PENDING)
    processing = getattr(module, "TASK_PROCESSING", PROCESSING)
    failed_status = getattr(module, "TASK_FAILED", FAILED)
    now = utc_now_iso()
    reason = _collateral_error(fatal)
    verdict = judge.collateral_verdict(fatal)

    failed = 0
    spared = []
    for task in list(getattr(manager, "tasks", {}).values()):
        if getattr(task, IN_FAILURE_HOOK_ATTR, False):
            spared.append(getattr(task, "task_id", None))
            continue
        if getattr(task, "status", None) not in (pending, processing):
            continue
        task.status = failed_status
        task.error = reason
        task.completed_at = now
        _set_verdict(task, verdict)
        task_store.record(runtime.store, manager, task)  # task store: MinerU does not signal these
        failed += 1

    try:
        current = asyncio.current_task()
    except RuntimeError:
        current = None
    for processor in list(getattr(manager, "active_tasks", ())):
        if (
            processor is current
            or processor.done()
            or any(_processes(processor, task_id) for task_id in spared)
        ):
            continue
        processor.cancel()

    queue = getattr(manager, "queue", None)
    if queue is not None:
        while True:
            try:
                queue.get_nowait()
            except asyncio.QueueEmpty:
                break
            queue.task_done()

    wake = getattr(manager, "_wake_waiters", None)
    if callable(wake):
        wake()
    return failed


def _remote_wait_exceeded(exc: BaseException) -> bool:
    current: BaseException | None = exc
    for _ in range(16):
        if current is None:
            return False
        if isinstance(current, remote_waits.RemoteWaitExceeded):
            return True
        current = current.__cause__ or current.__context__
    return False


def _engine_dead(runtime: WorkerRuntime, manager: Any, fatal: FatalInfo | None) -> int:
    """Marks the task manager unhealthy and fails all its outstanding tasks; returns how many."""
    manager.last_worker_error = f"inference engine unusable ({fatal_cause(fatal)})"
    return fail_outstanding_tasks(runtime, manager, fatal)


def on_engine_dead(runtime: WorkerRuntime, manager: Any, fatal: FatalInfo | None) -> None:
    """Marks the task manager unhealthy and fails all outstanding tasks (loop thread)."""
    if manager is None:
        return
    count = _engine_dead(runtime, manager, fatal)
    log("ERROR", f"inference engine unusable ({fatal_cause(fatal)}); failed {count} other task(s)")


def act_on_fatal(runtime: WorkerRuntime, *, also_manager: Any = None) -> None:
    """Once per fatal record of ``runtime``: fail every manager's outstanding tasks (loop thread).

    ``also_manager``: the failing task's manager, acted on too when its app is
    not among ``runtime``'s.
    """
    line.act_on_fatal(runtime, TaskLine(runtime, also_manager=also_manager))


def _classify_pool(runtime: WorkerRuntime) -> concurrent.futures.ThreadPoolExecutor:
    # Our own two threads: MinerU's parse work fills asyncio's default pool for
    # minutes at a time, and a verdict must not wait behind it.
    if runtime.classify_pool is None:
        runtime.classify_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=2, thread_name_prefix="mineru-health-classify"
        )
    return runtime.classify_pool


def _remote_backend(task: Any) -> bool:
    """The task's engine is a remote server (an ``*-http-client`` backend)."""
    return str(getattr(task, "backend", "") or "").endswith("http-client")


def _own_server(task: Any) -> str:
    """host:port of the task's server when it is the worker's own (``MINERU_VL_SERVER``,
    the operator's), "" for a local engine or a tenant's ``server_url``."""
    if not _remote_backend(task):
        return ""
    own = dependency.configured_server()
    return own if dependency.is_own(getattr(task, "server_url", None), own) else ""


async def on_task_failed(manager: Any, task: Any, exc: BaseException) -> Recorded | None:
    """Hook at the top of ``AsyncTaskManager._process_task``'s except block. Never raises.

    Classifies ``exc`` off the event loop, attaches the verdict to ``task``,
    and on a fatal outcome fails every other outstanding task. MinerU then
    marks ``task`` failed as usual. The runtime is the one ``install`` put on
    the manager's app (MinerU's ``AsyncTaskManager(app)``).
    """
    try:
        runtime = runtime_of(getattr(manager, "app", None))
    except Exception:  # noqa: BLE001 - a hostile manager must not break MinerU's handling
        runtime = None
    if runtime is None:
        log("WARNING", "on_task_failed: the task manager's app has no mineru-health runtime")
        return None
    with contextlib.suppress(Exception):  # a task refusing attributes is only less spared
        setattr(task, IN_FAILURE_HOOK_ATTR, True)
    try:
        return await _judge_failure(runtime, manager, task, exc)
    finally:
        with contextlib.suppress(Exception):
            setattr(task, IN_FAILURE_HOOK_ATTR, False)


async def _judge_failure(
    runtime: WorkerRuntime, manager: Any, task: Any, exc: BaseException
) -> Recorded | None:
    if _remote_wait_exceeded(exc):  # counted where it was raised; the error names the server
        _set_verdict(task, line.remote_wait_verdict())
        return None
    try:
        ask = functools.partial(
            judge.judge,
            runtime,
            exc,
            remote_engine=_remote_backend(task),
            item_id=str(getattr(task, "task_id", "") or ""),
            own_server=_own_server(task),
        )
        outcome = await asyncio.get_running_loop().run_in_executor(_classify_pool(runtime), ask)
    except asyncio.CancelledError:
        raise
    except Exception as error:  # noqa: BLE001 - MinerU must keep its own failure handling
        log("ERROR", f"on_task_failed hook failed: {describe_exception(error)}")
        return None
    try:
        _set_verdict(task, judge.task_verdict(outcome))
        judge.log_outcome(getattr(task, "task_id", "?"), outcome)
        if outcome.fatal:
            act_on_fatal(runtime, also_manager=manager)
        return outcome
    except Exception as error:  # noqa: BLE001
        log("ERROR", f"on_task_failed hook failed: {describe_exception(error)}")
        return outcome


# --- the line, for the runtime ----------------------------------------------------------------


def _report_service(health: WorkerHealth, manager: Any) -> None:
    """The static part of MinerU's /health body, as its own handler computes it."""
    module = sys.modules.get(type(manager).__module__)
    try:
        max_requests = module.get_max_concurrent_requests()  # type: ignore[union-attr]
        window = module.get_processing_window_size(  # type: ignore[union-attr]
            default=module.DEFAULT_PROCESSING_WINDOW_SIZE  # type: ignore[union-attr]
        )
    except Exception:  # noqa: BLE001 - a renamed helper must not stop the worker
        max_requests, window = 1, 1
    health.set_service(
        version=mineru_version(),
        protocol_version=int_or(getattr(module, "API_PROTOCOL_VERSION", 0), 0),
        max_concurrent_requests=int_or(max_requests, 1),
        processing_window_size=max(1, int_or(window, 1)),
        task_retention_seconds=int_or(getattr(manager, "task_retention_seconds", 0), 0),
        task_cleanup_interval_seconds=int_or(
            getattr(manager, "task_cleanup_interval_seconds", 0), 0
        ),
    )


def _report_tasks(runtime: WorkerRuntime) -> None:
    """MinerU's task figures and its own health verdict, as its /health computes them."""
    counts = [0, 0, 0, 0]
    errors = []
    for manager in task_managers(runtime):
        module = sys.modules.get(type(manager).__module__)
        stats = manager.get_stats()
        for index, (name, default) in enumerate(
            (
                ("TASK_PENDING", PENDING),
                ("TASK_PROCESSING", PROCESSING),
                ("TASK_COMPLETED", "completed"),
                ("TASK_FAILED", FAILED),
            )
        ):
            counts[index] += int_or(stats.get(getattr(module, name, default), 0), 0)
        if not manager.is_healthy():
            errors.append(str(manager.last_worker_error or "task manager unhealthy"))
    queued, processing, completed, failed = counts
    runtime.health.set_tasks(queued, processing, completed, failed, "; ".join(errors))


class TaskLine:
    """3.x's tasks, for the runtime (:class:`~mineru_health.runtime.worker.line.Line`).

    ``also_manager``: a failing task's manager whose app is not among the runtime's.
    """

    item = "task"
    fails_remote_waits = True

    def __init__(self, runtime: WorkerRuntime, *, also_manager: Any = None) -> None:
        self.runtime = runtime
        self.also_manager = also_manager

    def managers(self) -> list[Any]:
        managers = task_managers(self.runtime)
        also = self.also_manager
        if also is not None and not any(m is also for m in managers):
            managers.append(also)
        return managers

    def started(self) -> None:
        runtime = self.runtime
        managers = task_managers(runtime)
        for manager in managers:
            module = sys.modules.get(type(manager).__module__)
            task_class = getattr(module, "AsyncParseTask", None)
            if isinstance(task_class, type):
                wrap_status_payload(task_class)
            task_store.attach(
                runtime.store, manager
            )  # task store: restore finished tasks, record new ones
            # The task in context (its id): its progress for the task watchdog.
            engine_calls.follow_tasks(manager, lambda: runtime.health)
            fairness.share_slots(manager, runtime.settings.remote_server_share)
            _report_service(runtime.health, manager)
        if managers:
            _report_tasks(runtime)

    def report(self) -> None:
        _report_tasks(self.runtime)

    def remote_engine(self, item_id: str) -> bool:
        for manager in self.managers():
            task = getattr(manager, "tasks", {}).get(item_id)
            if task is not None:
                return _remote_backend(task)
        return False

    def fail(self, item_id: str, text: str, verdict: TaskVerdict) -> bool:
        """Its status, error and verdict set, its waiters woken (the task store keeps it
        there) and its processor cancelled, which frees its concurrency slot."""
        failed = False
        for manager in self.managers():
            module = sys.modules.get(type(manager).__module__)
            unfinished = (
                getattr(module, "TASK_PENDING", PENDING),
                getattr(module, "TASK_PROCESSING", PROCESSING),
            )
            task = getattr(manager, "tasks", {}).get(item_id)
            if task is None or getattr(task, "status", None) not in unfinished:
                continue
            task.status = getattr(module, "TASK_FAILED", FAILED)
            task.error = text
            task.completed_at = utc_now_iso()
            _set_verdict(task, verdict)
            manager._signal_task_event(item_id)  # wakes waiters; the task store keeps it
            for processor in list(getattr(manager, "active_tasks", ())):
                if _processes(processor, item_id) and not processor.done():
                    processor.cancel()
            failed = True
        return failed

    def fail_with_engine(self, first: FatalInfo | None) -> str:
        count = sum(_engine_dead(self.runtime, manager, first) for manager in self.managers())
        return f"failed {count} other task(s)"

"""MinerU 3.x's failed tasks handed to the judge, and every outstanding task failed once the engine is dead.

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

from ...runtime.verdict import Kind, TaskVerdict
from ...runtime.worker import judge, remote_waits
from ...runtime.worker.context import runtime, utc_now_iso, worker_health
from ...runtime.worker.log import log
from ...safe_text import describe_exception
from ...worker import FatalInfo, Recorded, fatal_cause
from . import task_store
from .task_store import VERDICT_ATTR

#: MinerU 3.x's task statuses this module sets or looks for.
PENDING = "pending"
PROCESSING = "processing"
FAILED = "failed"

#: The rule of a task failed by its remote wait's bounds (issue 32).
REMOTE_WAIT_RULE = "watchdog.remote_wait"

#: Set on a task while its failure hook runs: the watcher may act on the death
#: that failure recorded before the hook resumes, and leaves the task to the
#: hook (its verdict is the trigger's; it is not failed as collateral or cancelled).
IN_FAILURE_HOOK_ATTR = "_mineru_health_in_failure_hook"


def task_managers() -> list[Any]:
    """The task manager of every app the hooks were installed on."""
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
        return "Task failed because the inference engine of this worker became unusable; " \
               "resubmit it to a healthy worker"
    return (
        f"Task failed because the inference engine of this worker became unusable "
        f"({fatal.cause}) while it was queued or running; "
        "resubmit it to a healthy worker"
    )


def _processes(processor: asyncio.Task[Any], task_id: object) -> bool:
    """Whether ``processor`` is the one MinerU started for ``task_id`` (named ``...-task-<id>``)."""
    return processor.get_name().endswith(f"-task-{task_id}")


def fail_outstanding_tasks(manager: Any, fatal: FatalInfo | None) -> int:
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
        task_store.record(manager, task)  # task store: MinerU does not signal these
        failed += 1

    try:
        current = asyncio.current_task()
    except RuntimeError:
        current = None
    for processor in list(getattr(manager, "active_tasks", ())):
        if processor is current or processor.done() or any(
                _processes(processor, task_id) for task_id in spared):
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


def fail_hung_tasks() -> int:
    """Fails the tasks the native task watchdog found hung (loop thread); returns how many.

    Each one's parse has made no progress for ``MINERU_HEALTH_TASK_HANG_S``
    (in or out of engine calls): it is failed with a ``hung`` verdict, its
    waiters are woken and its processor is cancelled, which frees its
    concurrency slot (a thread stuck inside the parse cannot be stopped; when
    every task is hung the worker is stalled, and its restart ends them).
    """
    health = worker_health()
    hung = set(health.take_hung_tasks())
    if not hung:
        return 0
    failed = 0
    for manager in task_managers():
        module = sys.modules.get(type(manager).__module__)
        processing = getattr(module, "TASK_PROCESSING", PROCESSING)
        pending = getattr(module, "TASK_PENDING", PENDING)
        for task_id in sorted(hung):
            task = getattr(manager, "tasks", {}).get(task_id)
            if task is None or getattr(task, "status", None) not in (pending, processing):
                continue
            task.status = getattr(module, "TASK_FAILED", FAILED)
            task.error = ("mineru-health: the parse made no progress for "
                          f"{runtime.settings.task_hang_s:g} s (hung); resubmit it")
            task.completed_at = utc_now_iso()
            _set_verdict(task, TaskVerdict.hung(remote_engine=_remote_backend(task)))
            manager._signal_task_event(task_id)  # wakes waiters; the task store keeps it
            for processor in list(getattr(manager, "active_tasks", ())):
                if _processes(processor, task_id) and not processor.done():
                    processor.cancel()
            failed += 1
            log("ERROR", f"task {task_id} failed: no progress for "
                         f"{runtime.settings.task_hang_s:g} s (hung parse)")
    return failed


def remote_wait_verdict() -> TaskVerdict:
    """A task whose remote wait went past a bound: its server's failure, task-local."""
    return TaskVerdict(Kind.TASK_LOCAL, None, REMOTE_WAIT_RULE, "remote_engine",
                       remote_engine=True)


def fail_remote_waits() -> int:
    """Fails the tasks whose remote wait went past a bound (loop thread); returns how many.

    Their server sent nothing for ``MINERU_HEALTH_TASK_HANG_S`` or kept them
    waiting ``MINERU_HEALTH_REMOTE_WAIT_S``: each fails alone, with an error
    naming the server and a task-local, remote-engine verdict (never the
    worker's fault, never counted against the document); its waiters are
    woken and its processor cancelled, which frees its slot (the wait's own
    I/O ends at its next read, :mod:`~mineru_health.runtime.worker.remote_waits`).
    """
    expired = worker_health().take_expired_remote_waits()
    if not expired:
        return 0
    settings = runtime.settings
    failed = 0
    for manager in task_managers():
        module = sys.modules.get(type(manager).__module__)
        processing = getattr(module, "TASK_PROCESSING", PROCESSING)
        pending = getattr(module, "TASK_PENDING", PENDING)
        for status in expired:
            task = getattr(manager, "tasks", {}).get(status.task_id)
            if task is None or getattr(task, "status", None) not in (pending, processing):
                continue
            task.status = getattr(module, "TASK_FAILED", FAILED)
            task.error = remote_waits.describe(status, task_hang_s=settings.task_hang_s,
                                               remote_wait_s=settings.remote_wait_s)
            task.completed_at = utc_now_iso()
            _set_verdict(task, remote_wait_verdict())
            manager._signal_task_event(status.task_id)  # wakes waiters; the task store keeps it
            for processor in list(getattr(manager, "active_tasks", ())):
                if _processes(processor, status.task_id) and not processor.done():
                    processor.cancel()
            failed += 1
            log("ERROR", f"task {status.task_id} failed: {task.error}")
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


def on_engine_dead(manager: Any, fatal: FatalInfo | None) -> None:
    """Marks the task manager unhealthy and fails all outstanding tasks (loop thread)."""
    if manager is None:
        return
    what = fatal_cause(fatal)
    manager.last_worker_error = f"inference engine unusable ({what})"
    count = fail_outstanding_tasks(manager, fatal)
    log("ERROR", f"inference engine unusable ({what}); failed {count} other task(s)")


def act_on_fatal(*, also_manager: Any = None) -> None:
    """Once per fatal record: fail every manager's outstanding tasks (loop thread).

    ``also_manager``: the failing task's manager, acted on too when its app is
    not among those the hooks were installed on.
    """
    health = worker_health()
    if health.healthy or runtime.acted_on_fatal:
        return
    runtime.acted_on_fatal = True
    first = health.snapshot().first_fatal
    managers = task_managers()
    if also_manager is not None and not any(m is also_manager for m in managers):
        managers.append(also_manager)
    for manager in managers:
        on_engine_dead(manager, first)


def _classify_pool() -> concurrent.futures.ThreadPoolExecutor:
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


async def on_task_failed(manager: Any, task: Any, exc: BaseException) -> Recorded | None:
    """Hook at the top of ``AsyncTaskManager._process_task``'s except block. Never raises.

    Classifies ``exc`` off the event loop, attaches the verdict to ``task``,
    and on a fatal outcome fails every other outstanding task. MinerU then
    marks ``task`` failed as usual.
    """
    with contextlib.suppress(Exception):  # a task refusing attributes is only less spared
        setattr(task, IN_FAILURE_HOOK_ATTR, True)
    try:
        return await _judge_failure(manager, task, exc)
    finally:
        with contextlib.suppress(Exception):
            setattr(task, IN_FAILURE_HOOK_ATTR, False)


async def _judge_failure(manager: Any, task: Any, exc: BaseException) -> Recorded | None:
    health = worker_health()
    if _remote_wait_exceeded(exc):  # counted where it was raised; the error names the server
        _set_verdict(task, remote_wait_verdict())
        return None
    try:
        ask = functools.partial(judge.judge, health, exc, remote_engine=_remote_backend(task))
        outcome = await asyncio.get_running_loop().run_in_executor(_classify_pool(), ask)
    except asyncio.CancelledError:
        raise
    except Exception as error:  # noqa: BLE001 - MinerU must keep its own failure handling
        log("ERROR", f"on_task_failed hook failed: {describe_exception(error)}")
        return None
    try:
        _set_verdict(task, judge.task_verdict(outcome))
        judge.log_outcome(getattr(task, "task_id", "?"), outcome)
        if outcome.fatal:
            act_on_fatal(also_manager=manager)
        return outcome
    except Exception as error:  # noqa: BLE001
        log("ERROR", f"on_task_failed hook failed: {describe_exception(error)}")
        return outcome

"""MinerU 3.x's finished tasks in the runtime's task store
(:mod:`~mineru_health.runtime.worker.store`).

A row is a task's fields, as its dataclass declares them (options, names,
timestamps, the path of its output directory), and our verdict::

    runtime.defer_store(settings, state_dir(settings))  # install(); unset: MinerU's output root
    task_store.attach(runtime.store, manager)  # start-up complete: tasks back, manager wrapped
    task_store.record(runtime.store, manager, task)  # a task we failed ourselves (collateral)

``attach`` wraps two methods of the ``AsyncTaskManager`` instance:
``_signal_task_event(task_id)``, which MinerU calls when a task turns
completed or failed (the row is written right there), and
``cleanup_expired_tasks()`` (rows of the tasks MinerU expired go with them).
A task comes back only if its output directory still exists.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from ...runtime.settings import WorkerSettings
from ...runtime.worker import store

__all__ = ["VERDICT_ATTR", "attach", "record", "state_dir"]

#: MinerU's own default when MINERU_API_OUTPUT_ROOT is unset (relative to the cwd).
_MINERU_OUTPUT_ROOT_DEFAULT = "./output"
#: Attribute set on MinerU's task objects: the verdict its status payload
#: carries (set by the worker hooks, kept here with the task).
VERDICT_ATTR = "_mineru_health_verdict"
_COMPLETED, _FAILED = "completed", "failed"


def state_dir(settings: WorkerSettings) -> Path:
    """``MINERU_HEALTH_STATE_DIR``, or MinerU's output root when it is unset."""
    return store.state_dir(
        settings, os.environ.get("MINERU_API_OUTPUT_ROOT") or _MINERU_OUTPUT_ROOT_DEFAULT
    )


def _terminal(manager: Any) -> tuple[str, str]:
    module = sys.modules.get(type(manager).__module__)
    return (getattr(module, "TASK_COMPLETED", _COMPLETED), getattr(module, "TASK_FAILED", _FAILED))


def _row(manager: Any, task: Any) -> store.Row | None:
    """The row of ``task`` if it is finished."""
    if getattr(task, "status", None) not in _terminal(manager):
        return None
    if dataclasses.is_dataclass(task) and not isinstance(task, type):
        fields = {f.name: getattr(task, f.name) for f in dataclasses.fields(task)}
    else:
        fields = dict(vars(task))
    verdict = getattr(task, VERDICT_ATTR, None)
    return str(fields["task_id"]), fields, verdict if isinstance(verdict, dict) else None


def record(current: store.Store | None, manager: Any, task: Any) -> None:
    """Writes ``task``'s row into ``current`` (a runtime's store) if finished. Never raises."""
    store.keep(current, _row, manager, task)


def attach(current: store.Store | None, manager: Any) -> int:
    """Loads the tasks stored in ``current`` (a runtime's store) into ``manager`` and records
    its finished tasks from now on.

    Idempotent per manager; returns how many tasks were loaded. Never raises.
    """
    if manager is None:
        return 0
    task_class: Any = getattr(sys.modules.get(type(manager).__module__), "AsyncParseTask", None)
    names = (
        {f.name for f in dataclasses.fields(task_class)}
        if isinstance(task_class, type) and dataclasses.is_dataclass(task_class)
        else None
    )
    terminal = _terminal(manager)

    def put_back(
        task_id: str, fields: dict[str, Any], verdict: dict[str, Any] | None
    ) -> bool | None:
        if task_id in manager.tasks or names is None:  # no task class: rows kept, not loaded
            return None
        output_dir = fields.get("output_dir")
        if fields.get("status") not in terminal or not output_dir or not os.path.isdir(output_dir):
            return False
        # A row from another MinerU version raises TypeError: the store drops it.
        task = task_class(**{k: v for k, v in fields.items() if k in names})
        if verdict is not None:
            setattr(task, VERDICT_ATTR, verdict)
        task.submit_order = 0  # not queued: never counted in queued_ahead
        manager.tasks[task_id] = task
        event = asyncio.Event()
        event.set()
        manager.task_events[task_id] = event
        return True

    return store.attach(
        current,
        manager,
        put_back,
        finish="_signal_task_event",
        row_of=lambda task_id: _row(manager, manager.tasks.get(task_id)),
        expire="cleanup_expired_tasks",
        live=lambda: manager.tasks,
    )

"""The worker's task store: finished tasks kept on disk, so that a restarted worker still serves them.

MinerU keeps its tasks in memory only. A worker restarted after an engine
death forgets every task that had completed but whose result was not
downloaded yet, and ``/tasks/{id}/result`` answers 404 for good. This store
keeps one row per finished task in a SQLite file (standard library) in a
stable state directory (``MINERU_HEALTH_STATE_DIR``, default MinerU's output
root); a worker started on the same directory loads them back::

    task_store.configure(settings)   # install(): opens the file; ConfigError names the variable
    task_store.attach(manager)       # start-up complete: load rows, wrap the manager
    task_store.record(manager, task) # a task we failed ourselves (collateral of an engine death)

``attach`` wraps two methods of the ``AsyncTaskManager`` instance:

- ``_signal_task_event(task_id)``, which MinerU calls when a task turns
  completed or failed: the row (the task's fields, as its dataclass declares
  them, and our verdict) is written right there, synchronously, so a task is
  never reported finished before it is on disk. WAL mode with
  ``synchronous=NORMAL``: a commit is one append to the log, no fsync; a
  process crash (``kill -9``, ``os._exit``) loses nothing, a power loss at
  most the last commits. bench/task_store measures the cost.
- ``cleanup_expired_tasks()``: rows of the tasks MinerU expired (task
  retention) are deleted with them.

Rows whose output directory is gone are dropped at load. A file that is not
a usable database is moved aside (``<name>.damaged-<time>``, named in a
warning) and a fresh store started: damaged state never stops the worker. The router reads
the store of a local worker whose process is gone (``read_task``), to learn
whether a task it had not seen finish did finish before the crash. A row holds no
document content, only the task's options, names, timestamps and the path
of its output directory.

Thread-safety: one connection behind a lock; each call is one short
statement. Nothing here may break MinerU: failures after start-up are logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ... import safe_text, state_dirs
from ...errors import ConfigError
from ...settings import WorkerSettings

__all__ = ["DB_NAME", "VERDICT_ATTR", "TaskStore", "attach", "configure", "read_task", "record",
           "store"]

#: File name of the store inside the state directory.
DB_NAME = "mineru-health-tasks.sqlite3"
#: MinerU's own default when MINERU_API_OUTPUT_ROOT is unset (relative to the cwd).
_MINERU_OUTPUT_ROOT_DEFAULT = "./output"
#: Attribute set on MinerU's task objects: the verdict its status payload
#: carries (set by the worker hooks, kept here with the task).
VERDICT_ATTR = "_mineru_health_verdict"
_COMPLETED, _FAILED = "completed", "failed"
_ATTACHED = "_mineru_health_task_store"

_log = safe_text.logger("mineru_health.task_store")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    task_id    TEXT PRIMARY KEY,
    status     TEXT NOT NULL,
    output_dir TEXT NOT NULL,
    task       TEXT NOT NULL,   -- the task's dataclass fields, JSON
    verdict    TEXT,            -- our verdict, JSON, or NULL
    stored_at  REAL NOT NULL
)
"""


def _task_fields(task: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(task) and not isinstance(task, type):
        return {f.name: getattr(task, f.name) for f in dataclasses.fields(task)}
    return dict(vars(task))


class TaskStore:
    """One SQLite file of finished tasks. Thread-safe (one connection, one lock)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(_SCHEMA)
        except sqlite3.Error:
            self._db.close()
            raise

    def save(self, task: Any, verdict: dict[str, Any] | None = None) -> None:
        """Writes (or replaces) the row of one finished task."""
        fields = _task_fields(task)
        row = (
            str(fields["task_id"]),
            str(fields.get("status", "")),
            str(fields.get("output_dir", "")),
            json.dumps(fields, ensure_ascii=False, default=str),
            None if verdict is None else json.dumps(verdict, ensure_ascii=False),
            time.time(),
        )
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO tasks VALUES (?, ?, ?, ?, ?, ?)", row)

    def delete(self, task_ids: Iterable[str]) -> None:
        ids = [(str(task_id),) for task_id in task_ids]
        if ids:
            with self._lock:
                self._db.executemany("DELETE FROM tasks WHERE task_id = ?", ids)

    def rows(self) -> list[tuple[str, dict[str, Any], dict[str, Any] | None]]:
        """(task_id, fields, verdict) of every row, oldest first; unreadable rows are deleted."""
        with self._lock:
            raw = self._db.execute(
                "SELECT task_id, task, verdict FROM tasks ORDER BY stored_at"
            ).fetchall()
        rows, bad = [], []
        for task_id, task_json, verdict_json in raw:
            try:
                fields = json.loads(task_json)
                verdict = None if verdict_json is None else json.loads(verdict_json)
            except ValueError:
                bad.append(task_id)
                continue
            if isinstance(fields, dict) and (verdict is None or isinstance(verdict, dict)):
                rows.append((task_id, fields, verdict))
            else:
                bad.append(task_id)
        self.delete(bad)
        return rows

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM tasks").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __repr__(self) -> str:
        return f"TaskStore({str(self.path)!r})"


def read_task(directory: str | os.PathLike[str],
              task_id: str) -> tuple[dict[str, Any], dict[str, Any] | None] | None:
    """(fields, verdict) of one stored task, read from another process; None if absent.

    For the router, about a local worker that died: blocking (run it in a
    thread); a missing, locked or damaged file is "absent".
    """
    path = Path(directory) / DB_NAME
    if not path.is_file():
        return None
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=1.0)) as db:
            row = db.execute("SELECT task, verdict FROM tasks WHERE task_id = ?",
                             (task_id,)).fetchone()
    except sqlite3.Error:
        return None
    if row is None:
        return None
    try:
        fields = json.loads(row[0])
        verdict = None if row[1] is None else json.loads(row[1])
    except ValueError:
        return None
    if not isinstance(fields, dict) or not (verdict is None or isinstance(verdict, dict)):
        return None
    return fields, verdict


_store: TaskStore | None = None


def store() -> TaskStore | None:
    """This process's store (None before ``configure`` or with MINERU_HEALTH_TASK_STORE=0)."""
    return _store


def state_dir(settings: WorkerSettings) -> Path:
    """``MINERU_HEALTH_STATE_DIR``, or MinerU's output root when it is unset."""
    configured = str(settings.state_dir)
    root = configured or os.environ.get("MINERU_API_OUTPUT_ROOT") or _MINERU_OUTPUT_ROOT_DEFAULT
    return Path(root).expanduser().resolve()


def open_store(path: Path) -> TaskStore:
    """The store at ``path``; a file that is not a usable database is set aside first.

    A damaged store must not keep the worker down (and with it every restart
    the router tries): it is renamed, kept for the operator, and replaced by
    an empty one. Only an error that a fresh file would hit too (a directory
    that cannot be written) is raised.
    """
    current: TaskStore | None = None
    try:
        current = TaskStore(path)
        current.count()  # reads the table: a damaged page shows here, not mid-run
        return current
    except sqlite3.DatabaseError as error:
        if current is not None:
            current.close()
        if isinstance(error, sqlite3.OperationalError):  # cannot open, locked: not damage
            raise
        state_dirs.set_aside(path, error)
    return TaskStore(path)


def configure(settings: WorkerSettings) -> TaskStore | None:
    """Opens the store in the state directory (created if missing); called once, by install().

    Raises ``ConfigError`` naming ``MINERU_HEALTH_STATE_DIR`` when the
    directory or the file cannot be created or opened, so the worker refuses
    to start rather than lose results silently later.
    """
    global _store
    if _store is not None or not settings.task_store:
        return _store
    directory = state_dir(settings)
    variable = WorkerSettings.variable_name("state_dir")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        _store = open_store(directory / DB_NAME)
    except (OSError, sqlite3.Error) as error:
        where = "" if settings.state_dir else " (unset: MinerU's output root)"
        raise ConfigError(
            f"{variable}={directory}{where}: cannot open the task store: {error}",
            variable=variable,
        ) from error
    return _store


def record(manager: Any, task: Any) -> None:
    """Writes ``task``'s row if it is finished. Never raises."""
    current = _store
    if current is None or getattr(task, "status", None) not in _terminal(manager):
        return
    try:
        verdict = getattr(task, VERDICT_ATTR, None)
        current.save(task, verdict if isinstance(verdict, dict) else None)
    except Exception as error:  # noqa: BLE001 -- a full disk must not fail the task
        _log.warning("task store: cannot save task %s: %s", getattr(task, "task_id", "?"), error)


def _terminal(manager: Any) -> tuple[str, str]:
    module = sys.modules.get(type(manager).__module__)
    return (getattr(module, "TASK_COMPLETED", _COMPLETED), getattr(module, "TASK_FAILED", _FAILED))


def _load(manager: Any, current: TaskStore) -> int:
    """Puts the stored tasks whose output still exists back into ``manager``; returns how many."""
    module = sys.modules.get(type(manager).__module__)
    task_class = getattr(module, "AsyncParseTask", None)
    if not (isinstance(task_class, type) and dataclasses.is_dataclass(task_class)):
        return 0
    names = {f.name for f in dataclasses.fields(task_class)}
    terminal = _terminal(manager)
    loaded, stale = 0, []
    for task_id, fields, verdict in current.rows():
        output_dir = fields.get("output_dir")
        if task_id in manager.tasks:
            continue
        if fields.get("status") not in terminal or not output_dir or not os.path.isdir(output_dir):
            stale.append(task_id)
            continue
        try:
            task: Any = task_class(**{k: v for k, v in fields.items() if k in names})
        except TypeError:  # a row from another MinerU version
            stale.append(task_id)
            continue
        if verdict is not None:
            setattr(task, VERDICT_ATTR, verdict)
        task.submit_order = 0  # not queued: never counted in queued_ahead
        manager.tasks[task_id] = task
        event = asyncio.Event()
        event.set()
        manager.task_events[task_id] = event
        loaded += 1
    current.delete(stale)
    return loaded


def attach(manager: Any) -> int:
    """Loads stored tasks into ``manager`` and records its finished tasks from now on.

    Idempotent per manager; returns how many tasks were loaded. Never raises.
    """
    current = _store
    if current is None or manager is None or getattr(manager, _ATTACHED, False):
        return 0
    try:
        loaded = _load(manager, current)
    except Exception as error:  # noqa: BLE001 -- a damaged file must not stop the worker
        _log.warning("task store %s: loading failed: %s", current.path, error)
        loaded = 0
    signal = manager._signal_task_event
    cleanup = manager.cleanup_expired_tasks

    def signal_and_store(task_id: str) -> None:
        signal(task_id)
        task = manager.tasks.get(task_id)
        if task is not None:
            record(manager, task)

    def cleanup_and_forget() -> int:
        before = set(manager.tasks)
        expired = cleanup()
        try:
            current.delete(before.difference(manager.tasks))
        except Exception as error:  # noqa: BLE001
            _log.warning("task store: cannot delete expired rows: %s", error)
        return int(expired)

    manager._signal_task_event = signal_and_store
    manager.cleanup_expired_tasks = cleanup_and_forget
    setattr(manager, _ATTACHED, True)
    if loaded:
        _log.warning("task store %s: %d finished task(s) restored", current.path, loaded)
    return loaded

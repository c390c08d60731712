"""The task store: finished work kept on disk, so that a restarted worker still serves it.

MinerU keeps its tasks (3.x) and jobs (4.0) in memory only: a worker
restarted after an engine death forgets those that had finished but whose
result was not downloaded yet. The store keeps one row per finished task or
job (its id, the line's record of it as JSON, our verdict, when stored; no
document content) in a SQLite file in a state directory that outlives the
process (``MINERU_HEALTH_STATE_DIR``; unset: 3.x's output root, 4.0's upload
directory), and a worker started on it loads them back::

    runtime.defer_store(settings, directory)  # install(), at import: where, nothing written
    runtime.open_store()              # serving starts: open_store(); ConfigError names the variable
    attach(runtime.store, owner, put_back, finish=..., row_of=..., expire=..., live=...)
    keep(runtime.store, row_of, *args)  # finished work that MinerU does not signal
    read(directory, key)              # the router, about a local worker whose process is gone

What a record holds, how it goes back into MinerU and which of MinerU's
methods mark work finished or expired is each line's adapter's
(``mineru3.worker.task_store``, ``mineru4.worker.job_store``). A row is
written where MinerU marks the work finished, before anyone can see it
finished. WAL with ``synchronous=NORMAL``: a commit is one append to the
log, no fsync; a process crash loses nothing, a power loss at most the last
commits (bench/task_store). Rows that cannot be put back are dropped at
load; a file that is not a usable database is moved aside (named in a
warning) and a fresh one started: damaged state never stops the worker.

One file name for both lines: the file is the runtime's, the router reads
it without knowing the line, and a state directory is one worker's. Earlier
releases' files (``mineru-health-tasks.sqlite3``, ``-jobs.sqlite3``) are
not read: left for the operator to delete.

Thread-safety: one connection behind a lock; each call is one short
statement. Nothing here may break MinerU: failures after start-up are logged.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ...safe_text import describe_exception
from .. import state_dirs
from ..settings import WorkerSettings
from ..verdict import TaskVerdict
from .log import log

__all__ = [
    "DB_NAME",
    "PutBack",
    "Row",
    "Store",
    "attach",
    "keep",
    "open_store",
    "read",
    "state_dir",
]

#: File name of the store inside the state directory.
DB_NAME = "mineru-health-finished.sqlite3"
#: (key, record, verdict): one finished task or job.
Row = tuple[str, dict[str, Any], dict[str, Any] | None]
#: Puts one row back into MinerU: True, back; False, cannot be (the row is dropped); None, left.
PutBack = Callable[[str, dict[str, Any], dict[str, Any] | None], bool | None]
_ATTACHED = "_mineru_health_task_store"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS finished (
    key       TEXT PRIMARY KEY,  -- the task or job id
    record    TEXT NOT NULL,     -- the line's record of it, JSON
    verdict   TEXT,              -- our verdict, JSON, or NULL
    stored_at REAL NOT NULL
);
"""


def _decoded(record: Any, verdict: Any) -> tuple[dict[str, Any], dict[str, Any] | None] | None:
    """(record, verdict) of a row as written, or None for one that is not what we write."""
    try:
        fields = json.loads(record)
        judged = None if verdict is None else json.loads(verdict)
    except (TypeError, ValueError):
        return None
    if isinstance(fields, dict) and (judged is None or isinstance(judged, dict)):
        return fields, judged
    return None


class Store:
    """One SQLite file of finished tasks or jobs. Thread-safe (one connection, one lock)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        """Opens ``path``; a damaged file is set aside first (``state_dirs.open_database``)."""
        self.path = Path(path)
        self._lock = threading.Lock()
        self._sealed = False
        self._db, self.set_aside = state_dirs.open_database(
            self.path, _SCHEMA, check="SELECT COUNT(*) FROM finished"
        )

    def seal(self) -> None:
        """Writes nothing more: this worker is being ended with the router that launched it.

        Ending its own processes (a page renderer among them) fails the parses
        in flight with errors of no document's making (``BrokenProcessPool``,
        judged task-local); kept, the next instance would serve them as final
        failures, and the next router would take them as ended rather than send
        them again. Whatever finishes from now on is the next router's to send.
        """
        with self._lock:
            self._sealed = True

    def save(self, key: str, record: dict[str, Any], verdict: dict[str, Any] | None = None) -> None:
        """Writes (or replaces) the row of one finished task or job (nothing once sealed)."""
        row = (
            key,
            json.dumps(record, ensure_ascii=False, default=str),
            None if verdict is None else json.dumps(verdict, ensure_ascii=False),
            time.time(),
        )
        with self._lock:
            if not self._sealed:
                self._db.execute("INSERT OR REPLACE INTO finished VALUES (?, ?, ?, ?)", row)

    def delete(self, keys: Iterable[str]) -> None:
        gone = [(str(key),) for key in keys]
        if gone:
            with self._lock:
                self._db.executemany("DELETE FROM finished WHERE key = ?", gone)

    def rows(self) -> list[Row]:
        """Every row, oldest first; unreadable rows are deleted."""
        with self._lock:
            raw = self._db.execute(
                "SELECT key, record, verdict FROM finished ORDER BY stored_at"
            ).fetchall()
        rows, bad = [], []
        for key, record, verdict in raw:
            decoded = _decoded(record, verdict)
            if decoded is None:
                bad.append(key)
            else:
                rows.append((key, *decoded))
        self.delete(bad)
        return rows

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM finished").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r})"


def read(
    directory: str | os.PathLike[str], key: str
) -> tuple[dict[str, Any], dict[str, Any] | None] | None:
    """(record, verdict) of one stored task or job, read from another process; None if absent.

    For the router, about a local worker that died: blocking (run it in a
    thread); a missing, locked or damaged file is "absent".
    """
    path = Path(directory) / DB_NAME
    if not path.is_file():
        return None
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=1.0)) as db:
            row = db.execute(
                "SELECT record, verdict FROM finished WHERE key = ?", (key,)
            ).fetchone()
    except sqlite3.Error:
        return None
    return None if row is None else _decoded(*row)


def state_dir(settings: WorkerSettings, default: str | os.PathLike[str]) -> Path:
    """``MINERU_HEALTH_STATE_DIR``, or the line's ``default`` when it is unset."""
    return Path(str(settings.state_dir) or default).expanduser().resolve()


def open_store(settings: WorkerSettings, directory: Path) -> Store | None:
    """Opens a worker's store in ``directory`` (created if missing).

    None with ``MINERU_HEALTH_TASK_STORE=0``. Raises ``ConfigError`` naming
    ``MINERU_HEALTH_STATE_DIR`` when the directory or the file cannot be
    created or opened, so the worker refuses to start rather than lose
    results silently later.
    """
    if not settings.task_store:
        return None
    variable = WorkerSettings.variable_name("state_dir")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        return Store(directory / DB_NAME)
    except (OSError, sqlite3.Error) as error:
        where = "" if settings.state_dir else " (unset: MinerU's own directory)"
        raise ConfigError(
            f"{variable}={directory}{where}: cannot open the task store: {error}",
            variable=variable,
        ) from error


def keep(current: Store | None, row_of: Callable[..., Row | None], *args: Any) -> None:
    """Writes the row ``row_of(*args)`` gives (None: not finished) in ``current`` (None:
    no store). Never raises."""
    if current is None:
        return
    row = None
    try:
        row = row_of(*args)
        if row is not None:
            current.save(*row)
    except Exception as error:  # noqa: BLE001 -- a full disk must not fail the task
        what = f" {row[0]}" if row is not None else ""
        log("WARNING", f"task store: cannot keep{what}: {describe_exception(error)}")


def _put_back_all(current: Store, put_back: PutBack) -> int:
    """Each row through ``put_back`` (one that raises is dropped); returns how many came back.

    Its verdict goes back marked ``restored``: an earlier instance gave it,
    and a router must never take it for this instance's (issue 32).
    """
    loaded, dropped, failures = 0, [], []
    for key, record, verdict in current.rows():
        try:
            back = put_back(
                key, record, None if verdict is None else TaskVerdict.restored_wire(verdict)
            )
        except Exception as error:  # noqa: BLE001 -- e.g. a row of another MinerU version
            back = False
            failures.append(f"{key}: {describe_exception(error)}")
        if back is False:
            dropped.append(key)
        loaded += back is True
    current.delete(dropped)
    if failures:
        log(
            "WARNING",
            f"task store: {len(failures)} row(s) could not be put back, dropped "
            f"(first: {failures[0]})",
        )
    return loaded


def attach(
    current: Store | None,
    owner: Any,
    put_back: PutBack,
    *,
    finish: str,
    row_of: Callable[..., Row | None],
    expire: str,
    live: Callable[[], Collection[str]],
) -> int:
    """Loads ``current``'s rows back (``put_back``), then keeps ``owner``'s finished work there.

    Wraps two of ``owner``'s methods: after ``owner.<finish>(*args)``, the
    row ``row_of(*args)`` is written; ``owner.<expire>()`` deletes the rows
    of the keys it took out of ``live()``. Once per owner; returns how many
    rows came back. Failures after the methods are found are logged.
    """
    if current is None or owner is None or getattr(owner, _ATTACHED, False):
        return 0
    try:
        loaded = _put_back_all(current, put_back)
    except Exception as error:  # noqa: BLE001 -- a damaged file must not stop the worker
        log("WARNING", f"task store {current.path}: loading failed: {describe_exception(error)}")
        loaded = 0
    finished, expired = getattr(owner, finish), getattr(owner, expire)

    @functools.wraps(finished)
    def finish_and_keep(*args: Any) -> Any:
        result = finished(*args)
        keep(current, row_of, *args)
        return result

    @functools.wraps(expired)
    def expire_and_forget() -> Any:
        before = set(live())
        result = expired()
        try:
            current.delete(before.difference(live()))
        except Exception as error:  # noqa: BLE001
            log("WARNING", f"task store: cannot delete expired rows: {describe_exception(error)}")
        return result

    setattr(owner, finish, finish_and_keep)
    setattr(owner, expire, expire_and_forget)
    setattr(owner, _ATTACHED, True)
    if loaded:
        log("WARNING", f"task store {current.path}: {loaded} finished task(s) restored")
    return loaded

"""The router's store: every submission it accepted, on disk, so that a new router resumes them.

MinerU's routers keep their tasks (3.x) and jobs (4.0) in memory: a router
restarted (a redeploy, an OOM kill, a node drain) answers 404 for every one
it had accepted, although the workers still hold their results. The
``RouterStore`` keeps one row per accepted submission in a SQLite file in
the router's state directory (``MINERU_HEALTH_STATE_DIR``), written before
the client hears of the submission; a router started on that directory
reads them back (``Supervisor.resume``)::

    store = RouterStore.of(fleet)                # None without a durable state directory
    store = RouterStore.open(directory, audit)   # a damaged file is set aside and audited
    store.save(Saved(key, state, worker, ...))   # accepted, sent again, ended
    store.rows()                                 # at start-up, oldest first
    store.forget(keys)                           # MinerU's retention expired them
    store.save_poison(digest, deaths)            # the poison guard's memory

A row holds what the router knows of a submission: its router id, its state
as the router last knew it, the worker it was last submitted to and that
worker's id of it (where its result is), the workers tried, where its kept
upload lives while it may be sent again, its documents' digest (the poison
guard's key) and the line's own record (MinerU's task record, 4.0's route
and job body), as JSON; no document content. A row is written when a
submission is accepted, each time it is sent again, and when it ends; a
status change in between (queued, processing) is not: a resumed submission
asks its worker anyway. WAL with ``synchronous=NORMAL`` (``state_dirs.
open_database``): a commit is one append to the log, no fsync; a router
killed with ``kill -9`` loses nothing, a power loss at most the last commits
(bench/router_store).

Thread-safety: one connection behind a lock; each call is one short
statement. After opening, nothing here raises: a write that fails (a full
disk) is logged and the router carries on without it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mineru_health import safe_text, state_dirs

__all__ = ["DB_NAME", "KEPT_NAME", "RouterStore", "Saved"]

#: File name of the store inside the router's state directory.
DB_NAME = "mineru-health-router.sqlite3"
#: Directory of kept uploads inside the router's state directory, one directory per submission.
KEPT_NAME = "kept"

_log = safe_text.logger("mineru_health.router.store")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS submissions (
    key         TEXT PRIMARY KEY,  -- the router's id, as its client knows it
    state       TEXT NOT NULL,     -- its status as the router last knew it
    worker      TEXT NOT NULL,     -- the worker it was last submitted to ("" while held)
    upstream_id TEXT NOT NULL,     -- that worker's id of it: where its result is
    instance    TEXT NOT NULL,     -- base URL of the instance it was last submitted to
    workers     TEXT NOT NULL,     -- JSON list: the workers tried, in order
    source      TEXT NOT NULL,     -- its kept upload while it may be sent again, else ""
    digest      TEXT,              -- of its documents (the poison guard's key), or NULL
    record      TEXT NOT NULL,     -- the line's record of it, JSON
    accepted_at REAL NOT NULL,
    updated_at  REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS poison (
    digest     TEXT PRIMARY KEY,   -- a document that was the trigger of engine deaths
    deaths     TEXT NOT NULL,      -- JSON list of [worker id, rule]
    updated_at REAL NOT NULL
);
"""


@dataclass
class Saved:
    """One submission as the store holds it (``Supervisor`` builds it, the line fills ``record``)."""

    key: str
    state: str
    worker: str
    upstream_id: str
    instance: str
    workers: list[str]
    source: str
    digest: str | None
    record: dict[str, Any]
    accepted_at: float = field(default_factory=time.time)

    @property
    def attempts(self) -> int:
        """Submissions made (1 without resubmission; 0 while held)."""
        return len(self.workers)


class RouterStore:
    """The SQLite file of a router's accepted submissions. Thread-safe (one connection, one lock)."""

    def __init__(self, path: str | Path) -> None:
        """Opens ``path`` (``":memory:"``: nothing kept, for benchmarks); a damaged file is set
        aside first (``set_aside`` says where it went)."""
        self.path = Path(path) if str(path) != ":memory:" else None
        self._lock = threading.Lock()
        self._db, self.set_aside = state_dirs.open_database(
            path, _SCHEMA, check="SELECT COUNT(*) FROM submissions")
        self._failing = False

    @classmethod
    def open(cls, directory: Path, audit: Any) -> RouterStore | None:
        """The store in ``directory``; a damaged file is set aside and audited
        (``state_file_set_aside``). None, logged, when the file cannot be opened at
        all: the router runs on, as it did before it had a store."""
        try:
            store = cls(directory / DB_NAME)
        except Exception as error:  # noqa: BLE001 -- the router must start anyway
            _log.error("the router's store %s cannot be opened (%s); submissions will not "
                       "survive a restart of this router", directory / DB_NAME, error)
            return None
        if store.set_aside is not None:
            record = audit.write_record(
                "state_file_set_aside", worker_id="router", path=str(store.set_aside),
                reason=f"{store.set_aside.name}: the router's store could not be used; kept for "
                       "the operator, a fresh one started (what it held is not resumed)")
            _log.warning("%s", record["reason"])
        return store

    @classmethod
    def of(cls, fleet: Any) -> RouterStore | None:
        """The store of ``fleet``'s router: in its durable state directory, else None."""
        directory = fleet.state_dirs.router_dir()
        return None if directory is None else cls.open(directory, fleet.audit)

    @property
    def kept_dir(self) -> Path | None:
        """Where kept uploads live (beside the file), or None for ``:memory:``."""
        return self.path.parent / KEPT_NAME if self.path is not None else None

    # -- writes ------------------------------------------------------------------------------
    def save(self, saved: Saved) -> bool:
        """Writes (or replaces) one submission's row; False when the write failed (logged)."""
        row = (saved.key, saved.state, saved.worker, saved.upstream_id, saved.instance,
               json.dumps(saved.workers), saved.source, saved.digest,
               json.dumps(saved.record, ensure_ascii=False, default=str), saved.accepted_at,
               time.time())
        return self._write("INSERT OR REPLACE INTO submissions VALUES "
                           "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [row], saved.key)

    def forget(self, keys: Iterable[str]) -> None:
        """Deletes the rows of ``keys`` (MinerU forgot them: retention)."""
        gone = [(str(key),) for key in keys]
        if gone:
            self._write("DELETE FROM submissions WHERE key = ?", gone, f"{len(gone)} row(s)")

    def save_poison(self, digest: str, deaths: Sequence[tuple[str, str]]) -> None:
        """Writes the poison guard's deaths of one document (an empty list deletes it)."""
        if deaths:
            self._write("INSERT OR REPLACE INTO poison VALUES (?, ?, ?)",
                        [(digest, json.dumps([list(d) for d in deaths]), time.time())], digest)
        else:
            self._write("DELETE FROM poison WHERE digest = ?", [(digest,)], digest)

    def _write(self, sql: str, rows: list[tuple[Any, ...]], what: str) -> bool:
        try:
            with self._lock:
                self._db.executemany(sql, rows)
        except Exception as error:  # noqa: BLE001 -- a full disk must not fail the submission
            if not self._failing:  # once per streak of failures
                _log.error("the router's store cannot write %s (%s): submissions accepted now "
                           "will not survive a restart of this router", what, error)
            self._failing = True
            return False
        if self._failing:
            _log.warning("the router's store writes again")
        self._failing = False
        return True

    # -- reads ---------------------------------------------------------------------------
    def rows(self) -> list[Saved]:
        """Every submission, oldest first; rows that are not what we write are deleted."""
        with self._lock:
            raw = self._db.execute(
                "SELECT key, state, worker, upstream_id, instance, workers, source, digest, "
                "record, accepted_at FROM submissions ORDER BY accepted_at").fetchall()
        rows, bad = [], []
        for key, state, worker, upstream_id, instance, workers, source, digest, record, at in raw:
            try:
                tried, fields = json.loads(workers), json.loads(record)
            except (TypeError, ValueError):
                tried = fields = None
            if not (isinstance(tried, list) and isinstance(fields, dict)):
                bad.append(key)
                continue
            rows.append(Saved(str(key), str(state), str(worker), str(upstream_id), str(instance),
                              [str(w) for w in tried], str(source),
                              None if digest is None else str(digest), fields, float(at)))
        if bad:
            _log.warning("the router's store: %d unreadable row(s) dropped", len(bad))
            self.forget(bad)
        return rows

    def poison(self) -> list[tuple[str, list[tuple[str, str]]]]:
        """The poison guard's memory: (digest, [(worker id, rule), ...]), oldest first."""
        with self._lock:
            raw = self._db.execute(
                "SELECT digest, deaths FROM poison ORDER BY updated_at").fetchall()
        found = []
        for digest, deaths in raw:
            try:
                found.append((str(digest), [(str(w), str(r)) for w, r in json.loads(deaths)]))
            except (TypeError, ValueError):
                continue
        return found

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM submissions").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __repr__(self) -> str:
        return f"RouterStore({str(self.path or ':memory:')!r})"

"""The router's store: every submission it accepted, kept, so that a new router resumes them.

This is the SQLite backend of the store's interface (``stores.Store``, chosen by
``MINERU_ROUTER_HEALTH_STORE_URL``): one router, nothing to run. The other,
``pg_store.PostgresStore``, is one database that several routers share.

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
    store.add_poison_death(digest, worker, rule) # the poison guard's memory, all it holds
    store.check()                                # how its file vanished, or None (saves check)
    store.recall = lambda: [...]                 # Saved rows to write if a vanished file lost some

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

A store that vanishes is noticed. A file deleted, replaced or truncated
under a running router still takes every write (SQLite writes to the inode
it opened), and a new router would find nothing. So just before each write
the store checks that the files at its path are the ones it writes: same
device and inode as at open, not shorter than it last saw them, the
database header intact, and its write-ahead log (``-wal``, which holds the
commits since the last checkpoint) neither deleted, replaced nor truncated
(a stat and a pread of each, ~3 us: bench/router_store). When they are not,
it writes a fresh file at its path holding every row its open connection
can still read (SQLite's backup API; a file whose pages are gone is copied
row by row, what cannot be read is counted; ``recall`` may add what the
router still knows), sets aside what it found there for the operator,
audits it (``state_file_vanished``) and makes the write in the fresh file;
until one is written ``save`` returns False and writes nothing. A file
that vanishes between the check and the write is found by the next write
and copied with it. A deleted ``-shm`` loses nothing (it is an index
rebuilt from the log). A new router on a store that was emptied (0 bytes),
damaged (set aside: what can still be read from it is copied into the
fresh one) or deleted says what it could not resume: the kept uploads that
no row names are submissions lost with it.

Thread-safety: one connection behind a lock; each call is one short
statement. After opening, nothing here raises: a write that fails (a full
disk) is logged and the router carries on without it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mineru_health import safe_text
from mineru_health.runtime import state_dirs

__all__ = [
    "DB_NAME",
    "KEPT_NAME",
    "RouterStore",
    "Saved",
    "decode_poison",
    "decode_row",
    "encode_row",
    "with_death",
]

#: File name of the store inside the router's state directory.
DB_NAME = "mineru-health-router.sqlite3"
#: Directory of kept uploads inside the router's state directory, one directory per submission.
KEPT_NAME = "kept"

_log = safe_text.logger("mineru_health.router.store")

#: The first bytes of every SQLite database file.
_HEADER = b"SQLite format 3\x00"
#: Seconds between two tries to write a fresh file while one cannot be written (a full disk).
_RETRY_FRESH_S = 1.0
#: The connection's page cache, KiB (SQLite's default: 2000).
_CACHE_KIB = 16384
#: Runs of unreadable pages stepped over when a damaged file is copied row by row.
_MAX_SKIPS = 48
#: The first bytes of a write-ahead log (two byte orders of its checksums), and its header's size.
_WAL_MAGIC = (b"\x37\x7f\x06\x82", b"\x37\x7f\x06\x83")
_WAL_HEADER_SIZE = 32
#: Suffix of the fresh file being written beside the store's, renamed over it once whole.
_FRESH = ".fresh"
#: How a file that was deleted under the store is described.
_DELETED = "deleted"
#: How the loss of the write-ahead log alone begins (the database file is the store's own).
_WAL_LOST = "stripped of its write-ahead log"
#: The store's tables and their columns' count, in the order a copy writes them.
_TABLES = (("submissions", 11), ("poison", 3))

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

_SAVE = "INSERT OR REPLACE INTO submissions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"


@dataclass
class Saved:
    """One submission as the store holds it (``Supervisor`` builds it; the line, ``record``)."""

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
    """The SQLite file of a router's accepted submissions. Thread-safe (one connection, a lock)."""

    #: A file is never out of reach: what fails there is the disk (507).
    unreachable: str | None = None

    def __init__(self, path: str | Path, *, audit: Any = None) -> None:
        """Opens ``path`` (``":memory:"``: nothing kept, for benchmarks); a damaged file is set
        aside first (``set_aside`` says where it went). ``audit`` (an ``AuditLog``, or None)
        hears of a file that vanished under it."""
        self.path = Path(path) if str(path) != ":memory:" else None
        self._audit = audit
        self._lock = threading.Lock()
        self._db, self.set_aside = state_dirs.open_database(
            path, _SCHEMA, check="SELECT COUNT(*) FROM submissions"
        )
        self._failing = False
        #: What the router still knows of its submissions (``Saved`` rows), written into a
        #: fresh file when rows of the old one could not be read; None: nothing more known.
        self.recall: Callable[[], Iterable[Saved]] | None = None
        self._lost: str | None = None  # how the file vanished, until a fresh one is written
        self._next_try = 0.0
        self._closed = False
        self._fd = self._wal_fd = -1  # descriptors of the file and its log, to read headers
        self._watch()

    @classmethod
    def open(cls, directory: Path, audit: Any) -> RouterStore | None:
        """The store in ``directory``; a damaged file is set aside and audited
        (``state_file_set_aside``), the rows it still has copied into the fresh one; a file
        found empty, or missing while kept uploads remain, is audited
        (``state_file_vanished``): what could not be resumed is said. None, logged, when the
        file cannot be opened at all: the router runs on, as it did before it had a store."""
        path = directory / DB_NAME
        found = _size(path)
        _remove(path.with_name(DB_NAME + _FRESH))  # a router killed while writing one
        try:
            store = cls(path, audit=audit)
        except Exception as error:  # noqa: BLE001 -- the router must start anyway
            _log.error(
                "the router's store %s cannot be opened (%s); submissions will not "
                "survive a restart of this router",
                path,
                error,
            )
            return None
        if store.set_aside is not None:
            copied, unreadable = store._take_from(store.set_aside)
            record = audit.write_record(
                "state_file_set_aside",
                worker_id="router",
                path=str(store.set_aside),
                rows=copied,
                unreadable=unreadable,
                reason=f"{store.set_aside.name}: the router's store could not be used; kept for "
                f"the operator, a fresh one started{_resumed(copied, unreadable)}",
            )
            _log.warning("%s", record["reason"])
        without_row = store.uploads_without_row()
        if found == 0 or (found is None and without_row):
            what = "empty (0 bytes)" if found == 0 else "missing"
            lost = (
                f"{without_row} kept upload(s) have no row: up to {without_row} "
                "unfinished submission(s) could not be resumed"
                if without_row
                else "how many submissions it held, and could not be resumed, is not known"
            )
            record = audit.write_record(
                "state_file_vanished",
                worker_id="router",
                path=str(path),
                rows=0,
                unreadable=without_row or None,
                reason=f"the router's store {path} was {what} at start-up: {lost}",
            )
            _log.error("%s", record["reason"])
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
        """Writes (or replaces) one submission's row; True only once it is committed in the
        file at the store's path; False when the write failed (logged)."""
        return self._write(_SAVE, [_row(saved)], saved.key)

    def forget(self, keys: Iterable[str]) -> None:
        """Deletes the rows of ``keys`` (MinerU forgot them: retention)."""
        gone = [(str(key),) for key in keys]
        if gone:
            self._write("DELETE FROM submissions WHERE key = ?", gone, f"{len(gone)} row(s)")

    #: One router uses this store (see ``stores.Store``).
    router_id = ""

    def add_poison_death(self, digest: str, worker: str, rule: str) -> list[tuple[str, str]] | None:
        """Adds one trigger death of ``digest`` (see ``stores.Store``): read and written
        under one hold of the lock, so two deaths added at once both count."""
        with self._lock:
            row = None
            if not self._closed:
                with contextlib.suppress(sqlite3.Error):
                    row = self._db.execute(
                        "SELECT deaths FROM poison WHERE digest = ?", (digest,)
                    ).fetchone()
            held = decode_poison([(digest, row[0])]) if row else []
            deaths = with_death(held[0][1] if held else [], worker, rule)
            error = self._commit_if_open(
                "INSERT OR REPLACE INTO poison VALUES (?, ?, ?)",
                [(digest, json.dumps([list(d) for d in deaths]), time.time())],
            )
        return deaths if self._reported(error, digest) else None

    def _write(self, sql: str, rows: list[tuple[Any, ...]], what: str) -> bool:
        with self._lock:
            error = self._commit_if_open(sql, rows)
        return self._reported(error, what)

    def _commit_if_open(self, sql: str, rows: list[tuple[Any, ...]]) -> Exception | None:
        if self._closed:
            return sqlite3.ProgrammingError("the store is closed")
        return self._commit(sql, rows)

    def _reported(self, error: Exception | None, what: str) -> bool:
        """True when the write went through; a failure logged once per streak."""
        if error is not None:
            if not self._failing:  # once per streak of failures
                _log.error(
                    "the router's store cannot write %s (%s): submissions accepted now "
                    "will not survive a restart of this router",
                    what,
                    error,
                )
            self._failing = True
            return False
        if self._failing:
            _log.warning("the router's store writes again")
        self._failing = False
        return True

    def _commit(self, sql: str, rows: list[tuple[Any, ...]]) -> Exception | None:
        """Writes ``rows``: None once committed in the file at the store's path, else why not.

        The files are checked just before the write, not after: a write to a file no longer at
        the path is made in a fresh one instead (or, while none can be written, not at all: a
        refused submission must not come back in it later), and no write is rolled back (a
        rollback reloads pages from the log, which may be what was truncated). A file that
        vanishes between the check and the write is found by the next write, and copied."""
        if self.path is None:
            try:
                self._db.executemany(sql, rows)
            except Exception as error:  # noqa: BLE001 -- a full disk must not fail the router
                return error
            return None
        lost = self._lost or self._vanished()
        if lost is None:
            try:
                self._db.executemany(sql, rows)
            except Exception as error:  # noqa: BLE001 -- as above
                lost = self._vanished()
                if lost is None:
                    return error
            else:
                return None
        if not self._write_fresh(lost):
            return OSError(f"the store's file was {lost}; no fresh one is written yet")
        try:
            self._db.executemany(sql, rows)
        except Exception as error:  # noqa: BLE001 -- as above
            return error
        return None

    # -- a file that vanished --------------------------------------------------------------
    def check(self) -> str | None:
        """How the store's file vanished, if it did (a fresh one is written now), or None.

        Every write checks on its own; this is for a caller that wants to know sooner."""
        if self.path is None:
            return None
        with self._lock:
            if self._closed:
                return None
            lost = self._lost or self._vanished()
            if lost is not None:
                self._write_fresh(lost)
            return lost

    def _watch(self) -> None:
        """Records the files the connection writes: the database's device, inode and size
        (and a descriptor of it, to read its header), and its write-ahead log's."""
        if self.path is None:
            return
        # The pages the connection has read or written stay in its cache: what a file
        # truncated under it can still be rebuilt from. Allocated as pages are read.
        self._db.execute(f"PRAGMA cache_size=-{_CACHE_KIB}")
        self._at, self._wal_at = str(self.path), str(_wal_of(self.path))
        # Closed only after the connection: closing a descriptor of a file drops every POSIX
        # lock this process holds on it, SQLite's included.
        self._fd = os.open(self._at, os.O_RDONLY | os.O_CLOEXEC)
        seen = os.fstat(self._fd)
        self._file = (seen.st_dev, seen.st_ino)
        self._size = seen.st_size
        self._wal: tuple[int, int, int] | None = None
        self._wal_fd = -1
        self._watch_wal()

    def _watch_wal(self) -> None:
        """Records the write-ahead log once SQLite has made it (at the first read)."""
        with contextlib.suppress(OSError):
            self._wal_fd = os.open(self._wal_at, os.O_RDONLY | os.O_CLOEXEC)
            seen = os.fstat(self._wal_fd)
            self._wal = (seen.st_dev, seen.st_ino, seen.st_size)

    def _vanished(self) -> str | None:
        """How the files at the store's path differ from the ones it writes, or None."""
        try:
            now = os.stat(self._at)
            header = os.pread(self._fd, len(_HEADER), 0)
        except FileNotFoundError:
            return _DELETED
        except OSError as error:
            return f"unreadable ({error.strerror or error})"
        if (now.st_dev, now.st_ino) != self._file:
            return "replaced by another file"
        if now.st_size < self._size:
            return f"truncated (to {now.st_size} of {self._size} bytes)"
        if header != _HEADER:
            return "overwritten (its header is gone)"
        self._size = now.st_size
        if self._wal is None:
            self._watch_wal()
            return None
        wal = _identity(self._wal_at)
        if wal is None:
            return f"{_WAL_LOST} (-wal deleted)"
        if wal[:2] != self._wal[:2]:
            return f"{_WAL_LOST} (-wal replaced)"
        # Truncated, it still grows back at once: SQLite writes each frame at its offset.
        if wal[2] < self._wal[2] or (
            wal[2] >= _WAL_HEADER_SIZE and os.pread(self._wal_fd, 4, 0) not in _WAL_MAGIC
        ):
            return f"{_WAL_LOST} (-wal truncated)"
        self._wal = wal
        return None

    def _write_fresh(self, lost: str) -> bool:
        """Writes a fresh file at the store's path holding every row the connection can still
        read (and ``recall``'s, when some could not be), sets aside what is found there,
        audits it and writes there from now on. False (tried again a second later) when it
        cannot: ``save`` acknowledges nothing until it can."""
        assert self.path is not None
        now = time.monotonic()
        if self._lost is not None and now < self._next_try:
            return False
        self._lost, self._next_try = lost, now + _RETRY_FRESH_S
        fresh = self.path.with_name(self.path.name + _FRESH)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            copied, unreadable = _copy(self._db, fresh)
            if unreadable != 0 and self.recall is not None:
                _put(fresh, self.recall())
            _sync(fresh)
        except Exception as error:  # noqa: BLE001 -- a full disk: tried again later
            _remove(fresh)
            _log.error(
                "the router's store %s was %s; a fresh one cannot be written yet (%s): "
                "submissions are not acknowledged until it is",
                self.path,
                lost,
                error,
            )
            return False
        # Closing the old connection checkpoints into the file it opened and removes its
        # "-wal" and "-shm", unless that file was moved (SQLite checks): then they are
        # removed here, so that what is set aside is only what was found at the path.
        wal = self._wal
        self._release()
        if wal is not None and (_identity(self._wal_at) or ())[:2] == wal[:2]:
            with contextlib.suppress(OSError):
                os.unlink(self._wal_at)
        aside = None
        if os.path.lexists(self.path) and not lost.startswith(_WAL_LOST):
            with contextlib.suppress(OSError):  # not ours, or not whole: kept for the operator
                aside = state_dirs.set_aside(self.path, lost)
        try:
            for companion in ("-wal", "-shm"):  # never to be read with the fresh file
                self.path.with_name(self.path.name + companion).unlink(missing_ok=True)
            os.replace(fresh, self.path)
            self._db, _aside = state_dirs.open_database(
                self.path, _SCHEMA, check="SELECT COUNT(*) FROM submissions"
            )
            self._watch()
            for table, _columns in _TABLES:  # into the cache, as a router's start-up reads them
                self._db.execute(f"SELECT * FROM {table}").fetchall()
        except Exception as error:  # noqa: BLE001 -- rare: the file just written cannot be used
            _log.error(
                "the router's store %s cannot be used any more (%s): submissions are "
                "not acknowledged until the router is restarted",
                self.path,
                error,
            )
            self._db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
            self._db.executescript(_SCHEMA)
            self._next_try = float("inf")
            return False
        self._lost = None
        self._audit_fresh(lost, copied, unreadable, aside)
        return True

    def _audit_fresh(
        self, lost: str, copied: int, unreadable: int | None, aside: Path | None
    ) -> None:
        reason = (
            f"the router's store {self.path} was {lost} under the running router; a "
            f"fresh one was written at its path holding the {copied} submission(s) it "
            "could still read"
        )
        if unreadable:
            reason += (
                f"; {unreadable} could not be read (their pages were gone): they will "
                "not survive a restart of this router unless it saves them again"
            )
        elif unreadable is None:
            reason += "; how many could not be read is not known"
        if aside is not None:
            reason += f"; the file found at its path was kept at {aside}"
        if self._audit is not None:
            self._audit.write_record(
                "state_file_vanished",
                worker_id="router",
                path=str(self.path),
                rows=copied,
                unreadable=unreadable,
                set_aside=None if aside is None else str(aside),
                reason=reason,
            )
        (_log.warning if unreadable == 0 else _log.error)("%s", reason)

    def _take_from(self, damaged: Path) -> tuple[int, int | None]:
        """Copies the rows ``damaged`` (a file set aside) can still give into this store:
        (rows copied, rows that could not be read or None when not known)."""
        try:
            with (
                contextlib.closing(sqlite3.connect(damaged, isolation_level=None)) as source,
                self._lock,
            ):
                return _salvage(source, self._db)
        except Exception as error:  # noqa: BLE001 -- what it held is then not resumed
            _log.warning("nothing could be read from %s (%s)", damaged, error)
            return 0, None

    def _release(self) -> None:
        with contextlib.suppress(Exception):
            self._db.close()
        for fd in (self._fd, self._wal_fd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._wal_fd = -1

    def uploads_without_row(self) -> int:
        """Kept uploads that no row names: submissions a vanished store lost (3.x keeps
        them under ``kept_dir``; the line's start-up removes them)."""
        kept = self.kept_dir
        try:
            entries = [str(entry) for entry in kept.iterdir()] if kept is not None else []
        except OSError:
            return 0
        with self._lock:
            named = {
                path
                for (source,) in self._db.execute(
                    "SELECT source FROM submissions WHERE source != ''"
                )
                for path in str(source).split("\n")
            }
        return sum(1 for entry in entries if entry not in named)

    # -- reads ---------------------------------------------------------------------------
    def rows(self) -> list[Saved]:
        """Every submission, oldest first; rows that are not what we write are deleted."""
        with self._lock:
            raw = self._db.execute(
                "SELECT key, state, worker, upstream_id, instance, workers, source, digest, "
                "record, accepted_at FROM submissions ORDER BY accepted_at"
            ).fetchall()
        rows, bad = [], []
        for columns in raw:
            saved = decode_row(*columns)
            if saved is None:
                bad.append(columns[0])
            else:
                rows.append(saved)
        if bad:
            _log.warning("the router's store: %d unreadable row(s) dropped", len(bad))
            self.forget(bad)
        return rows

    def poison(self) -> list[tuple[str, list[tuple[str, str]]]]:
        """The poison guard's memory: (digest, [(worker id, rule), ...]), oldest first."""
        with self._lock:
            raw = self._db.execute(
                "SELECT digest, deaths FROM poison ORDER BY updated_at"
            ).fetchall()
        return decode_poison(raw)

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM submissions").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._release()

    def __repr__(self) -> str:
        return f"RouterStore({str(self.path or ':memory:')!r})"


def encode_row(saved: Saved) -> tuple[Any, ...]:
    """The columns both backends store of ``saved``, key to accepted_at (JSON as text)."""
    return (
        saved.key,
        saved.state,
        saved.worker,
        saved.upstream_id,
        saved.instance,
        json.dumps(saved.workers),
        saved.source,
        saved.digest,
        json.dumps(saved.record, ensure_ascii=False, default=str),
        saved.accepted_at,
    )


def decode_row(
    key: Any,
    state: Any,
    worker: Any,
    upstream_id: Any,
    instance: Any,
    workers: Any,
    source: Any,
    digest: Any,
    record: Any,
    at: Any,
) -> Saved | None:
    """The ``Saved`` of stored columns (``encode_row``'s), or None when they are not what a
    router writes (its JSON unreadable)."""
    try:
        tried, fields = json.loads(workers), json.loads(record)
    except (TypeError, ValueError):
        return None
    if not (isinstance(tried, list) and isinstance(fields, dict)):
        return None
    return Saved(
        str(key),
        str(state),
        str(worker),
        str(upstream_id),
        str(instance),
        [str(w) for w in tried],
        str(source),
        None if digest is None else str(digest),
        fields,
        float(at),
    )


def decode_poison(raw: Iterable[Sequence[Any]]) -> list[tuple[str, list[tuple[str, str]]]]:
    """The poison guard's memory of stored (digest, deaths JSON) rows; unreadable ones left out."""
    found = []
    for digest, deaths in raw:
        try:
            found.append((str(digest), [(str(w), str(r)) for w, r in json.loads(deaths)]))
        except (TypeError, ValueError):
            continue
    return found


def with_death(deaths: Sequence[tuple[str, str]], worker: str, rule: str) -> list[tuple[str, str]]:
    """``deaths`` and ``worker``'s, unless it has one already (two deaths on one worker are
    one worker: the guard counts workers)."""
    if any(held == worker for held, _ in deaths):
        return list(deaths)
    return [*deaths, (worker, rule)]


def _row(saved: Saved) -> tuple[Any, ...]:
    return (*encode_row(saved), time.time())


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def _wal_of(path: Path) -> Path:
    return path.with_name(path.name + "-wal")


def _identity(path: str) -> tuple[int, int, int] | None:
    """(device, inode, size) of ``path``, or None when there is none."""
    try:
        seen = os.stat(path)
    except OSError:
        return None
    return seen.st_dev, seen.st_ino, seen.st_size


def _remove(path: Path) -> None:
    for suffix in ("", "-journal", "-wal", "-shm"):
        with contextlib.suppress(OSError):
            path.with_name(path.name + suffix).unlink()


def _resumed(copied: int, unreadable: int | None) -> str:
    """What of a damaged store could be resumed, in words."""
    if unreadable is None and not copied:
        return " (what it held is not resumed; how much that was is not known)"
    if unreadable is None:
        return (
            f"; {copied} submission(s) read from it are resumed, how many more it held is not known"
        )
    return (
        f"; {copied} submission(s) read from it are resumed, {unreadable} could not be "
        "read and are not"
    )


def _copy(source: sqlite3.Connection, fresh: Path) -> tuple[int, int | None]:
    """Writes ``fresh``, a copy of every row ``source`` can read: (rows of submissions copied,
    rows that could not be read, None when not known)."""
    _remove(fresh)
    target = sqlite3.connect(fresh, isolation_level=None)
    try:
        target.execute("PRAGMA synchronous=OFF")  # renamed into place only once closed
        with contextlib.suppress(sqlite3.DatabaseError):  # a page is gone: row by row below
            source.backup(target)
            if target.execute("PRAGMA quick_check").fetchone()[0] == "ok":
                return int(target.execute("SELECT COUNT(*) FROM submissions").fetchone()[0]), 0
        target.close()
        _remove(fresh)
        target = sqlite3.connect(fresh, isolation_level=None)
        target.execute("PRAGMA synchronous=OFF")
        target.executescript(_SCHEMA)
        return _salvage(source, target)
    finally:
        target.close()


def _salvage(source: sqlite3.Connection, target: sqlite3.Connection) -> tuple[int, int | None]:
    """Copies the rows ``source`` can read into ``target`` (whose tables exist): (rows of
    submissions copied, rows that could not be read, None when not known)."""
    copied = 0
    with contextlib.suppress(sqlite3.Error):  # reads past the end of a truncated file as empty
        source.execute("PRAGMA writable_schema=ON")
    target.execute("BEGIN")
    try:
        for table, columns in _TABLES:
            insert = f"INSERT OR IGNORE INTO {table} VALUES ({', '.join('?' * columns)})"
            count = 0
            for row in _readable(source, table):
                target.execute(insert, row)
                count += 1
            if table == "submissions":
                copied = count
        target.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            target.execute("ROLLBACK")
        raise
    try:
        held = int(source.execute("SELECT COUNT(*) FROM submissions").fetchone()[0])
    except sqlite3.DatabaseError:
        return copied, None
    return copied, max(0, held - copied)


def _readable(source: sqlite3.Connection, table: str) -> Iterator[tuple[Any, ...]]:
    """The rows of ``table`` that ``source`` can read, in rowid order: a run of pages that
    cannot be read is stepped over by rowids doubling from the last row read (at most
    ``_MAX_SKIPS`` runs)."""
    after, step = 0, 1
    for _ in range(_MAX_SKIPS):
        try:
            cursor = source.execute(
                f"SELECT rowid, * FROM {table} WHERE rowid > ? ORDER BY rowid", (after,)
            )
            while (row := cursor.fetchone()) is not None:
                yield tuple(row[1:])
                after, step = row[0], 1
            return
        except sqlite3.DatabaseError:
            after, step = after + step, step * 2


def _sync(path: Path) -> None:
    """Flushes ``path`` to the disk: the fresh file replaces the store's in one rename."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _put(fresh: Path, rows: Iterable[Saved]) -> None:
    """Writes ``rows`` into ``fresh`` (what the router still knows of its submissions)."""
    with contextlib.closing(sqlite3.connect(fresh, isolation_level=None)) as target:
        target.execute("BEGIN")
        for saved in rows:
            target.execute(_SAVE, _row(saved))
        target.execute("COMMIT")

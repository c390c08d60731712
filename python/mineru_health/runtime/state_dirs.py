"""Ownership of state directories, and stores that a damaged file never stops.

    dirs = StateDirs()                  # a router's own directory and its local workers'
    dirs.state_dir("local-gpu-0")       # MINERU_HEALTH_STATE_DIR of every launch of that worker
    dirs.durable                        # True under an operator's MINERU_HEALTH_STATE_DIR
    lock = claim(directory)             # ConfigError if another live process owns it
    sweep_abandoned(tmp, "mineru-health-state-")   # what a SIGKILLed router left behind
    path = set_aside(db_path, error)    # a damaged store moved aside, kept for the operator
    db, aside = open_database(path, schema, check="SELECT COUNT(*) FROM t")  # both stores

A claim is an advisory ``flock`` on ``<directory>/.mineru-health.lock``, a
file that also holds the owner's pid for the message. The kernel drops the
lock when its process ends, however it ends, so a lock left by a dead
process is no lock at all: it is taken over without asking. The lock's file
descriptor is not inherited by the workers a router starts (Python opens it
close-on-exec), so only the claiming process holds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

from .. import safe_text
from ..errors import ConfigError

__all__ = [
    "LOCK_NAME",
    "OUTPUTS_NAME",
    "OUTPUT_DIR_ENV",
    "STATE_DIR_ENV",
    "StateDirs",
    "StateLock",
    "claim",
    "open_database",
    "remove_claimed",
    "set_aside",
    "sweep_abandoned",
]

LOCK_NAME = ".mineru-health.lock"
STATE_DIR_ENV = "MINERU_HEALTH_STATE_DIR"
#: Where a local worker of a router with a durable state directory writes its outputs.
OUTPUT_DIR_ENV = "MINERU_HEALTH_OUTPUT_DIR"
#: That directory's name inside the worker's state directory.
OUTPUTS_NAME = "outputs"
_TEMP_PREFIX = "mineru-health-state-"

_log = safe_text.logger("mineru_health.state")


class StateLock:
    """A held claim on a directory; released by ``release()`` or when the process ends."""

    __slots__ = ("_fd", "directory")

    def __init__(self, directory: Path, fd: int) -> None:
        self.directory = directory
        self._fd = fd

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __repr__(self) -> str:
        return f"StateLock({str(self.directory)!r})"


def _try_lock(directory: Path) -> tuple[int, str]:
    """(fd, "") with the lock held, or (-1, the owner's pid as written) if another holds it."""
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
        os.close(fd)
        return -1, owner
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    return fd, ""


def claim(directory: str | os.PathLike[str], *, variable: str = "") -> StateLock:
    """Claims ``directory`` (created if missing) for this process.

    Raises ``ConfigError`` naming ``variable`` when another live process
    holds it: two routers on one state directory would serve each other's
    tasks.
    """
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, owner = _try_lock(path)
    except OSError as error:
        raise ConfigError(
            f"{variable or 'state directory'}={path}: cannot lock it: {error}", variable=variable
        ) from error
    if fd < 0:
        raise ConfigError(
            f"{variable or 'state directory'}={path} is in use by another live process "
            f"(pid {owner or 'unknown'}, lock {path / LOCK_NAME}); give each router its own "
            "state directory",
            variable=variable,
        )
    return StateLock(path, fd)


def remove_claimed(directory: str | os.PathLike[str]) -> None:
    """Removes a claimed directory, its lock file last: a process killed midway leaves a
    directory that is still claimed (by nobody), so the next sweep finishes the work."""
    path = Path(directory)
    with contextlib.suppress(OSError):
        for entry in path.iterdir():
            if entry.name == LOCK_NAME:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
    (path / LOCK_NAME).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        path.rmdir()


def creator_named_gone(name: str, prefix: str) -> bool:
    """True when ``name`` is ``<prefix><pid>-...`` and that process is gone (or a zombie): a
    directory made by ``mkdtemp(prefix=f"{prefix}{os.getpid()}-")`` whose maker died before
    it could claim it. Anything else (no pid, a live pid) is never judged gone."""
    pid_text = name[len(prefix) :].partition("-")[0] if name.startswith(prefix) else ""
    if not pid_text.isdigit() or int(pid_text) <= 1:
        return False
    try:
        with open(f"/proc/{pid_text}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[:1] == [b"Z"]
    except FileNotFoundError:
        return True
    except OSError:
        return False


def sweep_abandoned(parent: str | os.PathLike[str], prefix: str) -> list[Path]:
    """Removes the directories ``parent/prefix*`` whose claim no live process holds.

    A directory without a lock file is left alone (it is not one of ours, or
    its creator has not claimed it yet) unless its name carries its creator's
    pid (``<prefix><pid>-``) and that process is gone: it died between
    making the directory and claiming it.
    """
    removed = []
    with contextlib.suppress(OSError):
        candidates = sorted(Path(parent).glob(f"{prefix}*"))
        for candidate in candidates:
            if candidate.is_symlink() or not candidate.is_dir():
                continue
            if not (candidate / LOCK_NAME).is_file():
                if creator_named_gone(candidate.name, prefix):
                    remove_claimed(candidate)
                    removed.append(candidate)
                continue
            try:
                fd, _owner = _try_lock(candidate)
            except OSError:
                continue
            if fd < 0:
                continue  # a live owner
            try:
                remove_claimed(candidate)
            finally:
                os.close(fd)
            removed.append(candidate)
    if removed:
        _log.warning(
            "removed %d state director(ies) left by processes that died: %s",
            len(removed),
            ", ".join(str(p) for p in removed),
        )
    return removed


def set_aside(path: str | os.PathLike[str], reason: object) -> Path:
    """Renames a damaged file (and its SQLite ``-wal``/``-shm`` companions) out of the way.

    Returns the new name, ``<name>.damaged-<UTC time>``; the operator keeps
    the file to inspect, and the caller starts a fresh one.
    """
    original = Path(path)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = original.with_name(f"{original.name}.damaged-{stamp}")
    suffix = 0
    while target.exists():
        suffix += 1
        target = original.with_name(f"{original.name}.damaged-{stamp}-{suffix}")
    os.replace(original, target)
    for companion in ("-wal", "-shm"):
        side = original.with_name(original.name + companion)
        with contextlib.suppress(FileNotFoundError):
            os.replace(side, target.with_name(target.name + companion))
    _log.warning(
        "%s could not be used (%s); moved aside to %s and started afresh", original, reason, target
    )
    return target


def open_database(
    path: str | os.PathLike[str], schema: str, *, check: str
) -> tuple[sqlite3.Connection, Path | None]:
    """A connection to the SQLite file ``path`` (WAL, ``synchronous=NORMAL``, ``schema`` run).

    ``check`` is a query read once, so that a damaged page shows now and not
    mid-run. A file that is not a usable database is set aside first (kept
    for the operator) and a fresh one started: returns the connection and
    where the damaged file went (None when it was fine). Only an error that a
    fresh file would hit too (cannot open, locked: ``OperationalError``) is
    raised. The connection may be used from any thread, one at a time (the
    caller holds the lock).

    WAL with ``synchronous=NORMAL``: a commit is one append to the log and no
    fsync; a process crash (``kill -9``) loses nothing, a power loss at most
    the last commits.
    """

    def connect() -> sqlite3.Connection:
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(schema)
            db.execute(check).fetchall()
        except sqlite3.Error:
            db.close()
            raise
        return db

    try:
        return connect(), None
    except sqlite3.DatabaseError as error:
        if isinstance(error, sqlite3.OperationalError):  # cannot open, locked: not damage
            raise
        aside = set_aside(path, error)
    return connect(), aside


def _set_aside_in(directory: Path) -> list[Path]:
    """The files ``set_aside`` left in ``directory`` (their SQLite companions not counted)."""
    try:
        return sorted(
            path
            for path in directory.glob("*.damaged-*")
            if not path.name.endswith(("-wal", "-shm"))
        )
    except OSError:
        return []


class StateDirs:
    """The router's state directory and its local workers', one per worker for its whole life.

    Each worker's holds its task store (finished results survive its
    restarts) and is passed in its per-launch variables. Under an operator's
    ``MINERU_HEALTH_STATE_DIR`` in the router's environment (``durable``):
    the router's own files (its store of accepted submissions, their kept
    uploads: ``runtime/router/store.py``) and one subdirectory per worker
    (its task store and its outputs, ``outputs_dir``), kept across router
    restarts, the directory claimed for this router alone (``ConfigError``
    if another live router holds it: its workers would serve each other's
    tasks). Otherwise temporary directories, claimed too, so that the next
    router sweeps those a killed one left behind; ``close`` removes them;
    nothing of the router's own is kept. Not thread-safe: the router's loop
    owns it.
    """

    def __init__(self, *, base: str | None = None) -> None:
        self._base = base if base is not None else os.environ.get(STATE_DIR_ENV, "")
        self._dirs: dict[str, tuple[Path, bool]] = {}  # worker id -> (dir, ours to remove)
        self._set_aside_seen: set[Path] = set()
        self._locks: list[StateLock] = []
        if self._base:
            self._locks.append(claim(Path(self._base).expanduser(), variable=STATE_DIR_ENV))
        else:
            # Opt-in, not a default under $HOME: the directory holds users' uploaded
            # documents, so the operator chooses where (and on what storage) they persist.
            _log.warning(
                "%s is not set: the tasks this router accepts do not survive its "
                "restart; set it to a directory on persistent storage (README: "
                "Configure)",
                STATE_DIR_ENV,
            )
            sweep_abandoned(tempfile.gettempdir(), _TEMP_PREFIX)

    @property
    def durable(self) -> bool:
        """True when the directories outlive this router (an operator's state directory)."""
        return bool(self._base)

    def router_dir(self) -> Path | None:
        """The router's own state directory when ``durable``, else None."""
        return Path(self._base).expanduser() if self._base else None

    def outputs_dir(self, worker_id: str) -> Path | None:
        """Where the worker's outputs outlive the router (``durable`` only, else None)."""
        return self.state_dir(worker_id) / OUTPUTS_NAME if self._base else None

    def state_dir(self, worker_id: str) -> Path:
        """The worker's state directory (created on first use)."""
        known = self._dirs.get(worker_id)
        if known is not None:
            return known[0]
        if self._base:
            path = Path(self._base).expanduser() / worker_id
            path.mkdir(parents=True, exist_ok=True)
            self._dirs[worker_id] = (path, False)
            # What an earlier router's workers set aside was reported then.
            self._set_aside_seen.update(_set_aside_in(path))
        else:
            # The creator's pid in the name: a router killed before its claim is swept too.
            path = Path(tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{os.getpid()}-{worker_id}-"))
            self._locks.append(claim(path))
            self._dirs[worker_id] = (path, True)
        return path

    def newly_set_aside(self, worker_id: str) -> list[Path]:
        """The files (``set_aside``) the worker moved aside in its directory since the last look."""
        known = self._dirs.get(worker_id)
        if known is None:
            return []
        found = [path for path in _set_aside_in(known[0]) if path not in self._set_aside_seen]
        self._set_aside_seen.update(found)
        return found

    def close(self) -> None:
        """Removes the temporary state directories and lets go of every claim."""
        for path, ours in self._dirs.values():
            if ours:
                remove_claimed(path)
        self._dirs.clear()
        for lock in self._locks:
            lock.release()
        self._locks.clear()

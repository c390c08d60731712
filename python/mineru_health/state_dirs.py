"""Ownership of state directories, and stores that a damaged file never stops.

    lock = claim(directory)             # ConfigError if another live process owns it
    sweep_abandoned(tmp, "mineru-health-state-")   # what a SIGKILLed router left behind
    path = set_aside(db_path, error)    # a damaged store moved aside, kept for the operator

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
import logging
import os
import shutil
import time
from pathlib import Path

from .errors import ConfigError

__all__ = ["LOCK_NAME", "StateLock", "claim", "set_aside", "sweep_abandoned"]

LOCK_NAME = ".mineru-health.lock"

_log = logging.getLogger("mineru_health.state")


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
        raise ConfigError(f"{variable or 'state directory'}={path}: cannot lock it: {error}",
                          variable=variable) from error
    if fd < 0:
        raise ConfigError(
            f"{variable or 'state directory'}={path} is in use by another live process "
            f"(pid {owner or 'unknown'}, lock {path / LOCK_NAME}); give each router its own "
            "state directory",
            variable=variable,
        )
    return StateLock(path, fd)


def sweep_abandoned(parent: str | os.PathLike[str], prefix: str) -> list[Path]:
    """Removes the directories ``parent/prefix*`` whose claim no live process holds.

    A directory without a lock file is left alone: it is not one of ours, or
    its creator has not claimed it yet.
    """
    removed = []
    with contextlib.suppress(OSError):
        candidates = sorted(Path(parent).glob(f"{prefix}*"))
        for candidate in candidates:
            if candidate.is_symlink() or not (candidate / LOCK_NAME).is_file():
                continue
            try:
                fd, _owner = _try_lock(candidate)
            except OSError:
                continue
            if fd < 0:
                continue  # a live owner
            try:
                shutil.rmtree(candidate, ignore_errors=True)
            finally:
                os.close(fd)
            removed.append(candidate)
    if removed:
        _log.warning("removed %d state director(ies) left by processes that died: %s",
                     len(removed), ", ".join(str(p) for p in removed))
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
    _log.warning("%s could not be used (%s); moved aside to %s and started afresh",
                 original, reason, target)
    return target

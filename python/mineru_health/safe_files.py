"""Writing files in a directory someone else owns (MinerU's package), without surprises.

Used by :mod:`mineru_health.patching`, often as root:

* no symbolic link is ever followed: files are read with ``O_NOFOLLOW`` and
  written through a temporary file created with ``O_EXCL`` next to the
  target, then renamed over it (a rename replaces the directory entry, never
  what a link points to);
* ``Transaction`` replaces several files all or nothing;
* ``clean_temporaries`` removes what a run killed between writing a
  temporary file and renaming it left behind;
* ``locked`` serialises runs on one directory with an advisory lock on the
  directory itself, so no lock file is left in the tree.

    with locked(directory, timeout_s=30):
        clean_temporaries([target], extra_suffixes=(".orig",))
        txn = Transaction()
        try:
            txn.write(target, data)
            txn.commit()
        except Exception:
            txn.rollback()
            raise

Not thread-safe; one Transaction per run.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = [
    "Transaction",
    "clean_temporaries",
    "locked",
    "lstat_or_none",
    "read_regular",
    "replace_file",
]


def lstat_or_none(path: Path) -> os.stat_result | None:
    """``path.lstat()``, or None when nothing is there."""
    try:
        return path.lstat()
    except FileNotFoundError:
        return None


def read_regular(path: Path) -> bytes:
    """The bytes of ``path``, which must be a regular file and not a symbolic link.

    A link raises OSError (ELOOP); a directory, FIFO or device raises
    OSError (EINVAL) without blocking on it.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return handle.read()


def replace_file(path: Path, data: bytes, mode: int) -> None:
    """Writes ``data`` over ``path`` atomically: a new temporary file, then a rename."""
    handle, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fchmod(out.fileno(), mode)
            os.fsync(out.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise


def _temporaries(path: Path, extra_suffixes: Sequence[str]) -> list[Path]:
    """Temporary files ``replace_file`` may have left for ``path`` (or ``path`` + a suffix)."""
    suffixes = "|".join(re.escape(suffix) for suffix in extra_suffixes)
    pattern = re.compile(rf"^\.{re.escape(path.name)}(?:{suffixes})?\.[a-z0-9_]{{8}}\.tmp$")
    try:
        names = os.listdir(path.parent)
    except OSError:
        return []
    return [path.parent / name for name in sorted(names) if pattern.match(name)]


def clean_temporaries(
    paths: Sequence[Path], *, extra_suffixes: Sequence[str] = ()
) -> tuple[Path, ...]:
    """Removes the temporary files an interrupted ``replace_file`` left; returns them.

    Call it under ``locked``: another run's temporary file is in use.
    """
    cleaned = []
    for path in paths:
        for leftover in _temporaries(path, extra_suffixes):
            info = lstat_or_none(leftover)
            if info is None or not (stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)):
                continue
            os.unlink(leftover)  # removes a link itself, never what it points to
            cleaned.append(leftover)
    return tuple(cleaned)


@contextlib.contextmanager
def locked(directory: Path, *, timeout_s: float) -> Iterator[None]:
    """An exclusive advisory lock on ``directory``; TimeoutError after ``timeout_s``."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"{directory} is locked by another run") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock


class Transaction:
    """Replaces files one at a time, remembering how to undo each: all or nothing.

    Removals are deferred to ``commit``: they come last, once every write has
    succeeded, and a removal that fails leaves only a stale backup behind.
    """

    def __init__(self) -> None:
        self._undo: list[tuple[Path, bytes | None, int]] = []
        self._removals: list[Path] = []

    def write(self, path: Path, data: bytes) -> None:
        info = lstat_or_none(path)
        previous = read_regular(path) if info is not None else None
        mode = stat.S_IMODE(info.st_mode) if info is not None else 0o644
        # Recorded before writing: whatever step of the write fails, rolling
        # back restores the file (or removes one that did not exist).
        self._undo.append((path, previous, mode))
        replace_file(path, data, mode)

    def remove_at_commit(self, path: Path) -> None:
        self._removals.append(path)

    def commit(self) -> list[Path]:
        """Performs the deferred removals; returns the paths that could not be removed."""
        failed = []
        for path in self._removals:
            try:
                path.unlink(missing_ok=True)
            except OSError:
                failed.append(path)
        self._undo.clear()
        self._removals.clear()
        return failed

    def rollback(self) -> list[str]:
        """Restores every written file; returns the ones that could not be restored."""
        failures = []
        for path, previous, mode in reversed(self._undo):
            try:
                if previous is None:
                    path.unlink(missing_ok=True)
                else:
                    replace_file(path, previous, mode)
            except OSError as error:
                failures.append(f"{path}: {error.strerror or error}")
        self._undo.clear()
        self._removals.clear()
        return failures

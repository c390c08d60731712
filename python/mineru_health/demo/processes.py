"""Child processes for tests and the demo that are always reaped, their descendants too.

    with Processes() as procs:
        router = procs.start("router", argv, env=env, log_path=tmp / "router.log",
                             stdin_pipe=True)
        ...
        procs.record_descendants(router)    # now and then: a router's workers
    # left the block: every group signalled, stdin pipes closed, leftovers killed

Each child starts in a session of its own, so a stop signals its whole group.
What escapes the group is found two ways: descendants recorded while they run
(a router's workers, in sessions of their own), and the members left in the
session of a child that already exited (a worker that called ``os._exit``
leaves its multiprocessing helpers behind). Every pid is matched with its
kernel start time before it is signalled, so a reused pid is never hit.
Linux only (reads /proc). Not thread-safe: use one ``Processes`` from one
thread at a time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["ManagedProcess", "Processes"]

# Fields of /proc/<pid>/stat after the command name, counted from 0 (state is field 3).
_STATE, _SESSION, _START = 0, 3, 19


def _stat(pid: int | str) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces; fields after it are plain.
    fields = text.rsplit(")", 1)[-1].split()
    return fields if len(fields) > _START else None


def _start_time(pid: int) -> str | None:
    """The start time of a living ``pid`` (clock ticks since boot), to detect pid reuse."""
    fields = _stat(pid)
    if fields is None or fields[_STATE] == "Z":
        return None  # gone, or a zombie: nothing left to stop
    return fields[_START]


def _children_of(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                found.extend(int(x) for x in (task / "children").read_text().split())
    return found


def _session_members(session: int) -> dict[int, str]:
    """Living processes of ``session``: pid -> start time."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat(entry.name)
        if fields is None or fields[_STATE] == "Z" or fields[_SESSION] != str(session):
            continue
        found[int(entry.name)] = fields[_START]
    return found


def _signal(pid: int, sig: signal.Signals) -> None:
    """Signals ``pid``'s process group when it leads one, else ``pid`` alone."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    except PermissionError:
        pass


class ManagedProcess:
    """One child process with its output in a log file; stopped by its ``Processes``."""

    def __init__(
        self, name: str, popen: subprocess.Popen[bytes], log_path: Path, log_file: IO[bytes]
    ) -> None:
        self.name = name
        self.popen = popen
        self.log_path = log_path
        self.log_file = log_file
        self.base_url = ""
        # Its kernel start time (readable until we reap it): its session id is
        # its pid, and a pid can be reused.
        fields = _stat(popen.pid)
        self.start_time = fields[_START] if fields is not None else None

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout_s: float) -> int | None:
        """The exit code, or None if still running after ``timeout_s``."""
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def session_leftovers(self) -> dict[int, str]:
        """Living processes still in this child's session (pid -> start time).

        Empty when its pid now belongs to another process: a new session with
        that id would be that process's, not this child's.
        """
        now = _stat(self.pid)
        if now is not None and now[_START] != self.start_time:
            return {}
        return {pid: start for pid, start in _session_members(self.pid).items() if pid != self.pid}

    def log(self) -> str:
        with contextlib.suppress(ValueError):  # closed after stop: the file is complete
            self.log_file.flush()
        try:
            return self.log_path.read_bytes().decode("utf-8", "replace")
        except OSError:
            return ""

    def log_tail(self, chars: int = 4000) -> str:
        return self.log()[-chars:]

    def __repr__(self) -> str:
        state = "running" if self.popen.poll() is None else f"exited {self.popen.returncode}"
        return f"ManagedProcess({self.name!r}, pid={self.pid}, {state})"


class Processes:
    """Children started in sessions of their own; all of them and what they left reaped on stop."""

    def __init__(self) -> None:
        self._procs: list[ManagedProcess] = []
        # Descendants seen while running (a router's workers): pid -> start time.
        self._descendants: dict[int, str] = {}

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_all()

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        log_path: Path,
        cwd: Path | None = None,
        stdin_pipe: bool = False,
    ) -> ManagedProcess:
        """Starts ``argv`` with stdout and stderr appended to ``log_path``.

        ``stdin_pipe``: stdin is a pipe that ``stop_all`` closes (MinerU's
        workers exit on its EOF with ``MINERU_API_SHUTDOWN_ON_STDIN_EOF=1``,
        even when their router was killed); otherwise /dev/null.
        """
        log_file = open(log_path, "ab")  # noqa: SIM115 -- closed in stop_all
        try:
            popen = subprocess.Popen(
                list(argv),
                env=dict(env),
                cwd=cwd,
                stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except BaseException:
            log_file.close()
            raise
        proc = ManagedProcess(name, popen, log_path, log_file)
        self._procs.append(proc)
        return proc

    def record_descendants(self, proc: ManagedProcess | None = None) -> None:
        """Remembers the living descendants of ``proc`` (default: of every child) for reaping."""
        roots = [proc] if proc is not None else self._procs
        pending = [p.pid for p in roots if p.poll() is None]
        seen: set[int] = set()
        while pending:
            pid = pending.pop()
            for child in _children_of(pid):
                if child in seen:
                    continue
                seen.add(child)
                start = _start_time(child)
                if start is not None:
                    self._descendants.setdefault(child, start)
                pending.append(child)

    def stop_all(self, grace_s: float = 15.0) -> None:
        """SIGTERM every group, wait (bounded), close stdin pipes, SIGKILL what is left.

        Then the same for recorded descendants and for what exited children
        left in their sessions. Safe to call twice.
        """
        self.record_descendants()
        for proc in reversed(self._procs):
            if proc.poll() is None:
                _signal(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in reversed(self._procs):
            proc.wait(max(0.1, deadline - time.monotonic()))
        for proc in self._procs:
            if proc.popen.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.popen.stdin.close()
        for proc in self._procs:
            if proc.poll() is None:
                _signal(proc.pid, signal.SIGKILL)
                proc.wait(5.0)
        for proc in self._procs:
            for pid, start in proc.session_leftovers().items():
                self._descendants.setdefault(pid, start)
        self._reap_descendants()
        for proc in self._procs:
            with contextlib.suppress(OSError):
                proc.log_file.close()

    def _reap_descendants(self) -> None:
        def alive() -> list[int]:
            return [p for p, start in self._descendants.items() if _start_time(p) == start]

        leftovers = alive()
        for pid in leftovers:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while leftovers and time.monotonic() < deadline:
            time.sleep(0.1)
            leftovers = alive()
        for pid in leftovers:
            _signal(pid, signal.SIGKILL)
        self._descendants.clear()

"""A real PostgreSQL server for the tests: Debian's binaries, a cluster in a temporary directory.

    server = PostgresServer.start()      # initdb + pg_ctl start on a free 127.0.0.1 port
    url = server.new_database()          # postgresql://mineru@127.0.0.1:PORT/test_3
    server.pause(); server.resume()      # pg_ctl stop -m fast, then start again (same port)
    server.stop()                        # the postmaster, by its pid; the directory removed
    with running() as server: ...        # started and stopped around a block; pytest skips
                                         # where none can be started

``unavailable()`` says why none can be started here (no binaries, no psycopg), for a
skip. PostgreSQL refuses to run as root: as root, initdb and the server run as Debian's
``postgres`` account, which the same package creates (no user of our own to make, and
not ``nobody``, which other daemons share); the process's uid is switched by
``subprocess`` itself (no ``runuser`` in between, no PAM). The cluster trusts loopback
connections and runs with ``fsync=off`` (but for benchmarks: ``durable``): nothing in it
outlives the test session.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import select
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["PostgresServer", "bin_dir", "running", "unavailable"]

#: The superuser the cluster is made with (clients connect as it, trusted on loopback).
USER = "mineru"
#: Seconds at most for initdb, for the server to accept connections and to stop.
INITDB_S = 60
START_S = 30
STOP_S = 10
#: Where Debian puts the binaries (not on PATH), newest version first.
_DEBIAN_BINS = "/usr/lib/postgresql/*/bin"


def bin_dir() -> Path | None:
    """The directory of ``initdb``, ``pg_ctl`` and ``postgres``, or None."""
    found = sorted(glob.glob(_DEBIAN_BINS), key=lambda p: int(Path(p).parent.name), reverse=True)
    for candidate in found:
        if (Path(candidate) / "initdb").is_file():
            return Path(candidate)
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


def unavailable() -> str | None:
    """Why no PostgreSQL can be started here (a skip's reason), or None."""
    if bin_dir() is None:
        return (
            "PostgreSQL's server binaries are not installed (Debian: apt-get install "
            "postgresql; scripts/setup.sh does)"
        )
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'mineru-health[postgres]')"
    if os.getuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root without the postgres account PostgreSQL's package creates"
    return None


@contextlib.contextmanager
def running() -> Iterator[PostgresServer]:
    """A server for the block, stopped after it; a pytest skip where none can start."""
    import pytest

    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    server = PostgresServer.start()
    try:
        yield server
    finally:
        server.stop()


class PostgresServer:
    """One PostgreSQL cluster on 127.0.0.1, started and stopped by the tests."""

    def __init__(self, root: Path, port: int, run_as: dict[str, Any]) -> None:
        self.root = root
        self.data = root / "data"
        self.port = port
        self._run_as = run_as
        self.pid = 0
        self.options = ""  # the postmaster's command-line settings (port, sockets, fsync)
        self._databases = itertools.count(1)

    @classmethod
    def start(cls, *, durable: bool = False) -> PostgresServer:
        """initdb into a new temporary directory, then ``pg_ctl start`` (waits until the
        server accepts connections, at most ``START_S``). ``durable``: PostgreSQL's own
        settings (every commit flushed), for benchmarks; else nothing is flushed."""
        bins = bin_dir()
        assert bins is not None, unavailable()
        run_as: dict[str, Any] = {}
        root = Path(tempfile.mkdtemp(prefix="mineru-health-pg-"))
        if os.getuid() == 0:
            account = pwd.getpwnam("postgres")
            run_as = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
            os.chown(root, account.pw_uid, account.pw_gid)
        with socket.socket() as probe:  # a free port; PostgreSQL binds it a moment later
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        server = cls(root, port, run_as)
        try:
            server._run(
                [
                    str(bins / "initdb"),
                    "-D",
                    str(server.data),
                    "-U",
                    USER,
                    "--auth=trust",
                    "--no-sync",
                    "--encoding=UTF8",
                    "--locale=C",
                ],
                INITDB_S,
            )
            options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1"
            if not durable:
                options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            server.options = options  # resume() starts it again with them
            server._run(
                [
                    str(bins / "pg_ctl"),
                    "start",
                    "-D",
                    str(server.data),
                    "-w",
                    "-t",
                    str(START_S),
                    "-l",
                    str(root / "server.log"),
                    "-o",
                    options,
                ],
                START_S + 5,
            )
            server.pid = int((server.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except BaseException:
            server.stop()
            raise
        return server

    def pause(self) -> None:
        """``pg_ctl stop -m fast``: the server ends its sessions and stops (its data kept)."""
        bins = bin_dir()
        assert bins is not None and self.pid > 0
        self._run(
            [str(bins / "pg_ctl"), "stop", "-D", str(self.data), "-m", "fast", "-w"], STOP_S + 5
        )
        self.pid = 0

    def resume(self) -> None:
        """``pg_ctl start`` again on the same data and port, after :meth:`pause`."""
        bins = bin_dir()
        assert bins is not None and self.pid == 0
        self._run(
            [
                str(bins / "pg_ctl"),
                "start",
                "-D",
                str(self.data),
                "-w",
                "-t",
                str(START_S),
                "-l",
                str(self.root / "server.log"),
                "-o",
                self.options,
            ],
            START_S + 5,
        )
        self.pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])

    def _run(self, command: list[str], timeout_s: float) -> None:
        done = subprocess.run(
            command,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            **self._run_as,
        )
        if done.returncode != 0:
            log = self.root / "server.log"
            tail = log.read_text(errors="replace")[-2000:] if log.is_file() else ""
            raise RuntimeError(
                f"{command[0]} failed ({done.returncode}): {done.stderr.strip()}\n{tail}"
            )

    @property
    def url(self) -> str:
        """The ``postgres`` database (to create others in)."""
        return self.url_of("postgres")

    def url_of(self, database: str) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """The URL of a new, empty database: one per test, none sees another's rows."""
        import psycopg

        name = f"test_{next(self._databases)}"
        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url_of(name)

    def stop(self) -> None:
        """Stops the postmaster by its pid (fast shutdown, then SIGKILL past ``STOP_S``)
        and removes the directory."""
        if self.pid > 0:
            with contextlib.suppress(ProcessLookupError):
                _signal_and_wait(self.pid, signal.SIGINT, STOP_S) or _signal_and_wait(
                    self.pid, signal.SIGKILL, STOP_S
                )
            self.pid = 0
        shutil.rmtree(self.root, ignore_errors=True)


def _signal_and_wait(pid: int, signum: int, timeout_s: float) -> bool:
    """Sends ``signum`` to ``pid`` (not our child: pg_ctl started it) and waits, at most
    ``timeout_s``, for it to exit: True once it has."""
    fd = os.pidfd_open(pid)
    try:
        os.kill(pid, signum)
        readable, _, _ = select.select([fd], [], [], timeout_s)
        return bool(readable)
    finally:
        os.close(fd)

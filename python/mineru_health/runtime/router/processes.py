"""A router's local workers' processes: each worker's kept together, and ended together.

    procs = WorkerProcesses(cgroups=True, grace_s=10.0)   # ends what dead routers left
    launch = procs.prepare("local-gpu-0")                  # one launch: its tag, its cgroup
    env.update(launch.env)                                 # ... spawn the worker with it ...
    procs.adopt(launch, pid)                               # into its cgroup, right after
    report = procs.end(launch)                             # SIGTERM, grace, SIGKILL: blocks
    report = procs.end(launch, condemned=True)             # engine dead: SIGKILL, wait for exit
    procs.release(launch)                                  # its cgroup, once the worker is reaped
    procs.close()                                          # what is left of ours, and our cgroups

A worker's processes are found three ways at once (``process_scope.h``):
its process group (the worker leads one: 3.x's router starts it in a session
of its own, a 4.0 worker makes one at start-up), its cgroup v2 where the
router may make one (``cgroups.h``), and its tag, ``MINERU_HEALTH_WORKER_TAG``,
which every process it starts inherits: a child that started its own
session, or an orphan reparented to init, still carries it; and, without a
cgroup, the session the worker leads. Without a cgroup, a process that starts
a session of its own AND clears its environment is seen by none of these: an
ending in process-group mode reports what it found left and says that it
cannot see such a process (``Launch.unseen``). The tag names
the router (pid namespace, pid and start time: no reused pid is mistaken for
it), the worker and the launch, so what a router that died left behind is
found by the next one (``sweep``) and never what a live one runs.

Blocking calls (``end``, ``close``, the sweep) run off the event loop.
Not thread-safe: one owner (the fleet) calls it, ``end`` from worker threads
on distinct launches.
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mineru_health import _native, safe_text

__all__ = ["ROUTER_CGROUP_PREFIX", "WORKER_TAG_ENV", "Launch", "WorkerProcesses", "owner_id"]

#: Every process a launched worker starts inherits it (the worker reads it too).
WORKER_TAG_ENV = "MINERU_HEALTH_WORKER_TAG"
#: A router's cgroup directory: this prefix, then its owner id.
ROUTER_CGROUP_PREFIX = "mineru-health-router."
#: How long removing a cgroup waits for what cgroup.kill ended to leave it.
CGROUP_REMOVAL_S = 2.0
#: How long removing a dead router's cgroups waits for what is inside to exit (a process
#: the kernel is still tearing down, e.g. releasing device memory): a bound, not a delay.
SWEEP_REMOVAL_S = 30.0
#: How long ending a condemned launch (its engine dead) waits for every process of it to
#: exit after SIGKILL: a bound on a process stuck in the kernel, not a delay.
KILL_WAIT_S = 30.0
#: /proc/<pid>/stat's flag of a process in exit (PF_EXITING): it serves nothing any more.
_PF_EXITING = 0x4

_log = safe_text.logger("mineru_health.router")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _pid_namespace() -> str:
    """This process's pid namespace (inode number), so that a tag is read only where its
    pids mean what they meant to its router."""
    try:
        link = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return "0"
    return link.rsplit("[", 1)[-1].rstrip("]") or "0"


def owner_id(pid: int | None = None) -> str:
    """``<pid namespace>.<pid>.<start ticks>`` of a living process ("" when it is gone)."""
    process = _native.process_id(os.getpid() if pid is None else pid)
    if process is None:
        return ""
    return f"{_pid_namespace()}.{process.pid}.{process.start_ticks}"


def _exiting(pid: int) -> bool:
    """True when ``pid`` is in the kernel's exit path (a router killed a moment ago, still
    tearing down its memory): what it owns is abandoned already."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
        return bool(int(fields[6]) & _PF_EXITING)  # state ppid pgrp session tty tpgid flags
    except (OSError, ValueError, IndexError):
        return False


def _owner_alive(owner: str) -> bool:
    """True while the process ``owner`` names runs (and is not exiting), or when its pids
    are not ours to read."""
    namespace, _, rest = owner.partition(".")
    pid_text = rest.partition(".")[0]
    if namespace != _pid_namespace() or not pid_text.isdigit():
        return True  # another pid namespace's router: never judged from here
    return owner_id(int(pid_text)) == owner and not _exiting(int(pid_text))


@dataclass
class Launch:
    """One launch of a local worker: its tag, its cgroup, the process it started."""

    worker_id: str
    tag: str  # the value of WORKER_TAG_ENV; ends with "/"
    cgroup: str = ""  # its cgroup directory, "" when it has none
    pid: int = 0
    no_cgroup: str = ""  # why it has none

    @property
    def env(self) -> dict[str, str]:
        return {WORKER_TAG_ENV: self.tag}

    @property
    def kind(self) -> str:
        """How its processes are kept: "cgroup", or "process_group" (group and tag)."""
        return "cgroup" if self.cgroup else "process_group"

    @property
    def found_by(self) -> str:
        """What finds its processes, in words (what an ending's count of survivors covers)."""
        if self.cgroup:
            return "its cgroup"
        return "its process group, its session, its descendants and its tag"

    @property
    def unseen(self) -> str:
        """What could be left that nothing here sees ("" with a cgroup: the kernel keeps
        every process there)."""
        if self.cgroup:
            return ""
        return (
            "unknown: a process that started a session of its own and cleared its "
            "environment is in none of them (only a cgroup keeps it)"
        )

    def scope(self) -> Any:
        scope = _native.ProcessScope()
        scope.leader = self.pid
        scope.cgroup = self.cgroup
        scope.tag = f"{WORKER_TAG_ENV}={self.tag}"
        return scope


class WorkerProcesses:
    """Where a router keeps its local workers' processes, and how it ends them."""

    def __init__(self, *, cgroups: bool, grace_s: float) -> None:
        self.grace_s = grace_s
        self.owner = owner_id()
        self._launches: dict[str, itertools.count[int]] = {}  # worker id -> launch numbers
        self.home = ""
        self.no_cgroup = "MINERU_ROUTER_HEALTH_WORKER_CGROUPS=0"
        if cgroups:
            home = _native.find_cgroup_home()
            self.home, self.no_cgroup = ("", home.error) if home.error else (home.path, "")
        self._router_cgroup = ""
        self.leftover: list[str] = []  # dead routers' cgroups the last sweep could not remove
        self.swept = self.sweep()

    @property
    def kind(self) -> str:
        """What launches get where nothing fails: "cgroup" or "process_group"."""
        return "cgroup" if self.home else "process_group"

    def describe(self) -> str:
        if self.home:
            return f"a cgroup each, under {self.home}/{ROUTER_CGROUP_PREFIX}{self.owner}"
        return f"their process group and tag (no cgroup: {self.no_cgroup})"

    # -- one launch -------------------------------------------------------------------------
    def prepare(self, worker_id: str) -> Launch:
        """A new launch of ``worker_id``: its tag, and its cgroup made (if the machine allows)."""
        serial = next(self._launches.setdefault(worker_id, itertools.count(1)))
        name = f"{_UNSAFE.sub('_', worker_id)}.{serial}"
        launch = Launch(worker_id, f"{self.owner}/{name}/", no_cgroup=self.no_cgroup)
        if self.home:
            made = self._router_dir()
            path = f"{made}/{name}" if made else ""
            error = _native.make_cgroup(path) if path else self.no_cgroup
            if error:
                self._give_up_cgroups(error)
                launch.no_cgroup = error
            else:
                launch.cgroup = path
        return launch

    def adopt(self, launch: Launch, pid: int) -> None:
        """``pid`` is the launch's worker: moved into its cgroup (called right after the spawn,
        before the worker can start anything)."""
        launch.pid = pid
        if not launch.cgroup:
            return
        error = _native.move_to_cgroup(launch.cgroup, pid)
        if error:
            self.discard(launch)
            launch.no_cgroup = error
            self._give_up_cgroups(error)

    def discard(self, launch: Launch) -> None:
        """Removes the launch's cgroup (nothing was spawned into it, or it could not be)."""
        self.release(launch)
        launch.cgroup = ""

    def end(self, launch: Launch, *, condemned: bool = False) -> Any:
        """Ends every process of the launch; the native ``EndReport``. Blocks.

        A healthy one (a shutdown, a restart it may drain for) gets SIGTERM and
        the grace, then SIGKILL. A ``condemned`` one (its engine is dead, its
        loop hung, its process gone: nothing left to drain) gets SIGKILL at
        once, and this returns when every process of it has exited (its device
        memory free for the next launch), not after a timer.
        """
        if condemned:
            return _native.kill_scope(launch.scope(), KILL_WAIT_S)
        return _native.end_scope(launch.scope(), self.grace_s)

    def release(self, launch: Launch) -> None:
        """Removes the launch's cgroup (its processes ended, and the worker reaped: an
        unreaped one still holds the cgroup). Blocks for a moment at most."""
        if launch.cgroup:
            removal = _native.remove_cgroup_tree(launch.cgroup, CGROUP_REMOVAL_S)
            if removal.error:
                _log.warning("worker %s: %s", launch.worker_id, removal.error)

    # -- this router's, and what dead routers left ---------------------------------------
    def close(self) -> None:
        """Ends whatever still carries this router's tag and removes its cgroups. Blocks."""
        scope = _native.ProcessScope()
        scope.tag = f"{WORKER_TAG_ENV}={self.owner}/"
        scope.cgroup = self._router_cgroup
        if self.owner:
            _native.end_scope(scope, self.grace_s)
        if self._router_cgroup:
            _native.remove_cgroup_tree(self._router_cgroup, CGROUP_REMOVAL_S)
            self._router_cgroup = ""
        self.sweep_again()

    def sweep(self) -> list[dict[str, Any]]:
        """Ends the processes and cgroups of routers that died (a ``kill -9`` leaves its
        workers' children behind when they were orphaned first); what it found, per
        worker: ``{"owner", "worker", "ended", "killed", "survivors"}``. Blocks.

        A router killed a moment ago (still exiting) counts as dead; a cgroup
        that another router removes meanwhile is skipped, never the end of
        the sweep; one that cannot be removed yet stays in ``leftover`` for
        ``sweep_again``."""
        found: list[dict[str, Any]] = []
        launches: set[str] = set()
        for _process, value in _native.tagged_processes(f"{WORKER_TAG_ENV}="):
            owner, _, rest = value.partition("/")
            if owner and owner != self.owner and not _owner_alive(owner):
                launches.add(f"{owner}/{rest.partition('/')[0]}/")
        for tag in sorted(launches):
            scope = _native.ProcessScope()
            scope.tag = f"{WORKER_TAG_ENV}={tag}"
            found.append(_swept(tag, _native.end_scope(scope, self.grace_s)))
        if self.home:
            found.extend(self._sweep_cgroups())
        return found

    def sweep_again(self) -> list[dict[str, Any]]:
        """``sweep`` once more when the last one left a dead router's cgroup; else
        nothing. Blocks."""
        return self.sweep() if self.leftover else []

    def _sweep_cgroups(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        self.leftover = []
        try:
            entries = sorted(Path(self.home).glob(f"{ROUTER_CGROUP_PREFIX}*"))
        except OSError as error:
            _log.warning("cannot list the cgroups of routers that died: %s", error)
            return found
        for entry in entries:
            owner = entry.name[len(ROUTER_CGROUP_PREFIX) :]
            if owner == self.owner or _owner_alive(owner):
                continue
            try:
                workers = sorted(p for p in entry.iterdir() if p.is_dir())
            except OSError:
                continue  # removed meanwhile (another router swept it), or not a directory
            for worker in workers:
                scope = _native.ProcessScope()
                scope.cgroup = str(worker)
                found.append(
                    _swept(f"{owner}/{worker.name}/", _native.end_scope(scope, self.grace_s))
                )
            removal = _native.remove_cgroup_tree(str(entry), SWEEP_REMOVAL_S)
            if removal.error and entry.exists():
                self.leftover.append(str(entry))
                _log.warning("a dead router's cgroup stays for now: %s", removal.error)
        return found

    def _router_dir(self) -> str:
        """This router's cgroup directory, made on first use ("" if it cannot be)."""
        if not self._router_cgroup and self.home:
            path = f"{self.home}/{ROUTER_CGROUP_PREFIX}{self.owner}"
            error = _native.make_cgroup(path)
            if error:
                self._give_up_cgroups(error)
                return ""
            self._router_cgroup = path
        return self._router_cgroup

    def _give_up_cgroups(self, error: str) -> None:
        """Later launches keep to process groups and tags: the machine said no once."""
        if self.home:
            _log.warning(
                "local workers' processes: no cgroups after all (%s); their process "
                "group and tag keep them",
                error,
            )
            self.home, self.no_cgroup = "", error

    def __repr__(self) -> str:
        return f"WorkerProcesses({self.kind}, owner={self.owner!r})"


def _swept(tag: str, report: Any) -> dict[str, Any]:
    owner, _, rest = tag.partition("/")
    return {
        "owner": owner,
        "worker": rest.rstrip("/").rpartition(".")[0] or rest.rstrip("/"),
        "ended": report.terminated,
        "killed": report.killed,
        "survivors": report.survivors,
    }

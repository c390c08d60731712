"""A router's local workers' processes: each worker's kept together, and ended together.

    procs = WorkerProcesses(cgroups=True, grace_s=10.0)   # ends what dead routers left
    launch = procs.prepare("local-gpu-0")                  # one launch: its tag, its cgroup
    env.update(launch.env)                                 # ... spawn the worker with it ...
    procs.adopt(launch, pid)                               # into its cgroup, right after
    report = procs.end(launch)                             # SIGTERM, grace, SIGKILL: blocks
    procs.release(launch)                                  # its cgroup, once the worker is reaped
    procs.close()                                          # what is left of ours, and our cgroups

A worker's processes are found three ways at once (``process_scope.h``):
its process group (the worker leads one: 3.x's router starts it in a session
of its own, a 4.0 worker makes one at start-up), its cgroup v2 where the
router may make one (``cgroups.h``), and its tag, ``MINERU_HEALTH_WORKER_TAG``,
which every process it starts inherits: a child that started its own
session, or an orphan reparented to init, still carries it. The tag names
the router (pid namespace, pid and start time: no reused pid is mistaken for
it), the worker and the launch, so what a router that died left behind is
found by the next one (``sweep``) and never what a live one runs.

Blocking calls (``end``, ``close``, the sweep) run off the event loop.
Not thread-safe: one owner (the fleet) calls it, ``end`` from worker threads
on distinct launches.
"""

from __future__ import annotations

import contextlib
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


def _owner_alive(owner: str) -> bool:
    """True while the process ``owner`` names runs, or when its pids are not ours to read."""
    namespace, _, rest = owner.partition(".")
    pid_text = rest.partition(".")[0]
    if namespace != _pid_namespace() or not pid_text.isdigit():
        return True  # another pid namespace's router: never judged from here
    return owner_id(int(pid_text)) == owner


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

    def end(self, launch: Launch) -> Any:
        """Ends every process of the launch (SIGTERM, the grace, SIGKILL); the native
        ``EndReport``. Blocks."""
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

    def sweep(self) -> list[dict[str, Any]]:
        """Ends the processes and cgroups of routers that died (a ``kill -9`` leaves its
        workers' children behind when they were orphaned first); what it found, per
        worker: ``{"owner", "worker", "ended", "killed", "survivors"}``. Blocks."""
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

    def _sweep_cgroups(self) -> list[dict[str, Any]]:
        found = []
        with contextlib.suppress(OSError):
            for entry in sorted(Path(self.home).glob(f"{ROUTER_CGROUP_PREFIX}*")):
                owner = entry.name[len(ROUTER_CGROUP_PREFIX):]
                if owner == self.owner or _owner_alive(owner) or not entry.is_dir():
                    continue
                for worker in sorted(p for p in entry.iterdir() if p.is_dir()):
                    scope = _native.ProcessScope()
                    scope.cgroup = str(worker)
                    found.append(_swept(f"{owner}/{worker.name}/",
                                        _native.end_scope(scope, self.grace_s)))
                removal = _native.remove_cgroup_tree(str(entry), CGROUP_REMOVAL_S)
                if removal.error:
                    _log.warning("a dead router's cgroup stays: %s", removal.error)
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
            _log.warning("local workers' processes: no cgroups after all (%s); their process "
                         "group and tag keep them", error)
            self.home, self.no_cgroup = "", error

    def __repr__(self) -> str:
        return f"WorkerProcesses({self.kind}, owner={self.owner!r})"


def _swept(tag: str, report: Any) -> dict[str, Any]:
    owner, _, rest = tag.partition("/")
    return {"owner": owner, "worker": rest.rstrip("/").rpartition(".")[0] or rest.rstrip("/"),
            "ended": report.terminated, "killed": report.killed,
            "survivors": report.survivors}

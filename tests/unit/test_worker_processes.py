"""A router's local workers' processes, with real processes: kept, ended, swept.

``runtime/router/processes.py`` (the router's side), ``runtime/worker/threads.py``'s
``take_children_along`` (the worker's side) and ``runtime/router/scratch.py``
(the router's temporary directories). Each "worker" here is a small Python
process that leads its own group and starts a child in it and a daemon (an
orphan in a session of its own that ignores SIGTERM). Bounded waits only;
every process is ended by pid.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mineru_health import _native
from mineru_health.runtime.router.processes import (
    WORKER_TAG_ENV,
    WorkerProcesses,
    owner_id,
)
from mineru_health.runtime.router.scratch import SCRATCH_PREFIX

WAIT_S = 30.0

# A worker: leads its group, starts a child there and a daemon that escapes
# both (own session, orphaned, deaf to SIGTERM), prints their pids, waits.
WORKER = r"""
import json, os, signal, subprocess, sys, time
if os.getpgid(0) != os.getpid():
    os.setpgid(0, 0)
if len(sys.argv) > 1:
    from mineru_health.runtime.worker.threads import take_children_along
    take_children_along(sys.argv[1])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
daemon = subprocess.run([sys.executable, "-c", '''
import os, signal, sys, time
os.setsid()
pid = os.fork()
if pid == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    time.sleep(120)
    os._exit(0)
print(pid)
'''], capture_output=True, check=True).stdout.decode().strip()
print(json.dumps({"worker": os.getpid(), "child": child.pid, "daemon": int(daemon)}), flush=True)
time.sleep(120)
"""


def _family(proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, "the worker printed nothing"
    return {name: _native.process_id(pid) for name, pid in json.loads(line).items()}


def _alive(family: dict[str, Any]) -> dict[str, int]:
    return {n: p.pid for n, p in family.items() if _native.process_id(p.pid) == p}


def _wait_gone(family: dict[str, Any]) -> dict[str, int]:
    deadline = time.monotonic() + WAIT_S
    while _alive(family) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _alive(family)


class Started:
    """Processes a test started, ended by pid at teardown whatever happened."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.families: list[dict[str, Any]] = []

    def worker(
        self, env: dict[str, str], *args: str
    ) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
        proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, *args], env={**os.environ, **env}, stdout=subprocess.PIPE
        )
        self.procs.append(proc)
        family = _family(proc)
        self.families.append(family)
        return proc, family

    def close(self) -> None:
        for family in self.families:
            for process in family.values():
                if _native.process_id(process.pid) == process:
                    os.kill(process.pid, signal.SIGKILL)
        for proc in self.procs:
            proc.kill()
            proc.wait(WAIT_S)
            if proc.stdout is not None:
                proc.stdout.close()


@pytest.fixture
def started() -> Iterator[Started]:
    s = Started()
    yield s
    s.close()


def _modes() -> list[bool]:
    return [False] + ([True] if not _native.find_cgroup_home().error else [])


@pytest.mark.parametrize("cgroups", _modes(), ids=lambda c: "cgroup" if c else "process_group")
def test_a_launch_is_ended_whole(started: Started, cgroups: bool) -> None:
    procs = WorkerProcesses(cgroups=cgroups, grace_s=0.5)
    assert procs.kind == ("cgroup" if cgroups else "process_group")
    launch = procs.prepare("local-gpu-0")
    assert launch.tag.startswith(f"{procs.owner}/local-gpu-0.1/")
    assert procs.prepare("local-gpu-0").tag.startswith(f"{procs.owner}/local-gpu-0.2/")
    worker, family = started.worker(launch.env)
    procs.adopt(launch, worker.pid)
    assert launch.kind == procs.kind
    if cgroups:
        assert Path(launch.cgroup).is_dir()
        assert set(_native.scope_members(launch.scope())) >= set(family.values())

    report = procs.end(launch)
    worker.wait(WAIT_S)  # its owner reaps it (a zombie still holds its cgroup)
    procs.release(launch)
    assert _wait_gone(family) == {}
    assert (report.terminated, report.killed, report.survivors) == (3, 1, 0)  # the daemon: -9
    assert not launch.cgroup or not Path(launch.cgroup).exists()
    procs.close()


def test_a_killed_workers_orphans_are_ended(started: Started) -> None:
    procs = WorkerProcesses(cgroups=False, grace_s=0.5)
    launch = procs.prepare("w")
    worker, family = started.worker(launch.env)
    procs.adopt(launch, worker.pid)
    worker.kill()
    worker.wait(WAIT_S)
    report = procs.end(launch)
    assert report.survivors == 0 and report.terminated == 2, report
    assert _wait_gone(family) == {}


def test_what_a_dead_router_left_is_swept_and_a_live_ones_is_not(started: Started) -> None:
    # A "router" that dies, and one that lives: their workers' tags name them.
    dead = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    started.procs += [dead, live]
    dead_owner, live_owner = owner_id(dead.pid), owner_id(live.pid)
    assert dead_owner and live_owner
    _, orphaned = started.worker({WORKER_TAG_ENV: f"{dead_owner}/local-0.1/"})
    _, kept = started.worker({WORKER_TAG_ENV: f"{live_owner}/local-0.1/"})
    dead.kill()
    dead.wait(WAIT_S)

    procs = WorkerProcesses(cgroups=False, grace_s=0.5)
    swept = [s for s in procs.swept if s["owner"] == dead_owner]
    assert swept == [
        {"owner": dead_owner, "worker": "local-0", "ended": 3, "killed": 1, "survivors": 0}
    ]
    assert _wait_gone(orphaned) == {}
    assert _alive(kept) == {name: p.pid for name, p in kept.items()}
    assert not [s for s in procs.swept if s["owner"] == live_owner]


def test_a_worker_takes_its_children_along_on_sigterm(started: Started) -> None:
    tag = "test-owner/w.1/"
    worker, family = started.worker({WORKER_TAG_ENV: tag}, tag)
    worker.send_signal(signal.SIGTERM)
    # Its handler ends them (the deaf daemon after its 5 s grace), then SIGTERM ends it.
    assert worker.wait(WAIT_S) == -signal.SIGTERM
    assert _wait_gone(family) == {}


SCRATCH = r"""
import os, signal, sys, tempfile
from mineru_health.runtime.router.scratch import claim_scratch, release_scratch
root = claim_scratch()
made = tempfile.mkdtemp(prefix="mineru-router-request-")
print(root, made, flush=True)
if sys.argv[1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
release_scratch()
print(os.path.exists(root), tempfile.gettempdir(), flush=True)
"""


def _scratch(tmp: Path, how: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", SCRATCH, how],
        env={**os.environ, "TMPDIR": str(tmp)},
        capture_output=True,
        timeout=60,
        check=False,
    )
    return done.stdout.decode().split()


def test_a_killed_routers_scratch_is_swept_by_the_next(tmp_path: Path) -> None:
    root, made = _scratch(tmp_path, "kill")
    assert Path(made).parent == Path(root) and Path(root).parent == tmp_path
    assert Path(made).is_dir()  # a killed router cannot remove it
    stranger = tmp_path / f"{SCRATCH_PREFIX}not-claimed"
    stranger.mkdir()  # no lock file: not one of ours

    second_root, _made, exists, tempdir = _scratch(tmp_path, "release")
    assert not Path(root).exists()
    assert exists == "False" and not Path(second_root).exists()
    assert tempdir == str(tmp_path)  # tempfile is back to the system's directory
    assert stranger.is_dir()


# A worker leading its own session, as 3.x's router starts one, with two children that
# clear their environment (no tag): one leaves its group but stays in the session, the
# other starts a session of its own (setsid) and is orphaned. It starts them once told
# (a line on stdin): a real worker (MinerU) imports for seconds before it starts anything,
# and the fleet adopts it meanwhile; one line of Python would race the adoption (a child
# forked while the kernel moves its parent stays in the parent's old cgroup).
STRAYS = r"""
import json, os, subprocess, sys, time
sys.stdin.readline()
stay = subprocess.Popen(["/bin/sleep", "120"], env={}, process_group=0,
                        stdout=subprocess.DEVNULL)
escape = subprocess.run([sys.executable, "-c", '''
import os, subprocess
print(subprocess.Popen(["/bin/sleep", "120"], env={}, start_new_session=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)
'''], capture_output=True, check=True, env={}).stdout.decode().strip()
print(json.dumps({"worker": os.getpid(), "stay": stay.pid, "escape": int(escape)}), flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("cgroups", _modes(), ids=lambda c: "cgroup" if c else "process_group")
def test_what_an_ending_cannot_see_is_said_not_counted(started: Started, cgroups: bool) -> None:
    procs = WorkerProcesses(cgroups=cgroups, grace_s=5.0)
    launch = procs.prepare("w")
    worker = subprocess.Popen(
        [sys.executable, "-c", STRAYS],
        env={**os.environ, **launch.env},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    started.procs.append(worker)
    if cgroups:  # in its cgroup before it starts anything (as the fleet adopts it)
        procs.adopt(launch, worker.pid)
    assert worker.stdin is not None
    worker.stdin.write(b"go\n")
    worker.stdin.close()
    family = _family(worker)
    started.families.append(family)
    if not cgroups:
        procs.adopt(launch, worker.pid)

    report = procs.end(launch, condemned=True)  # SIGKILL at once, no grace
    worker.wait(WAIT_S)
    procs.release(launch)
    assert report.terminated == 0 and report.survivors == 0, report
    left = _wait_gone({n: p for n, p in family.items() if n != "escape"})
    assert left == {}  # the one that stayed in the session included
    if cgroups:
        assert _wait_gone(family) == {} and launch.unseen == ""
    else:
        # Out of the group, the session and the tag: still running, and the ending says
        # that it cannot know, rather than "0 left".
        assert _alive(family) == {"escape": family["escape"].pid}
        assert launch.unseen.startswith("unknown")
        assert "session" in launch.found_by and "tag" in launch.found_by
    procs.close()


# A router's process handling in the order of a router's life, stopped (for a kill -9) at
# one of its points: scratch claimed, workers' state directories, the sweep, a cgroup made,
# a worker spawned (tagged, not yet in its cgroup), serving, a shutdown's ending, closed.
ROUTER = r"""
import json, os, subprocess, sys
from mineru_health.runtime.router.processes import ROUTER_CGROUP_PREFIX, WorkerProcesses
from mineru_health.runtime.router.scratch import claim_scratch, release_scratch
from mineru_health.runtime.state_dirs import STATE_DIR_ENV, StateDirs
stop_at, cgroups, worker_code = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
seen = set()
def at(point):
    if point == stop_at and point not in seen:
        seen.add(point)
        print(json.dumps({"at": point}), flush=True)
        sys.stdin.readline()  # killed here
root = claim_scratch()
at("claimed")
dirs = StateDirs()
procs = WorkerProcesses(cgroups=cgroups, grace_s=0.5)
print(json.dumps({"root": str(root), "owner": procs.owner, "home": procs.home,
                  "swept": len(procs.swept)}), flush=True)
at("swept")
launches = []
for n in range(2):
    launch = procs.prepare(f"w{n}")
    at("prepared")
    env = {**os.environ, **launch.env, STATE_DIR_ENV: str(dirs.state_dir(f"w{n}"))}
    worker = subprocess.Popen([sys.executable, "-c", worker_code], env=env,
                              stdout=subprocess.PIPE)
    print(worker.stdout.readline().decode().strip(), flush=True)  # its family
    at("spawned")
    procs.adopt(launch, worker.pid)
    launches.append((launch, worker))
at("serving")
for launch, worker in launches:
    procs.end(launch)
    worker.wait(30)
    at("ending")
    procs.release(launch)
procs.close()
at("closed")
dirs.close()
release_scratch()
print(json.dumps({"done": True}), flush=True)
"""
KILL_POINTS = ["claimed", "swept", "prepared", "spawned", "serving", "ending", "closed"]


class Run:
    """One run of ROUTER, stopped at a point: what it made, read from its lines."""

    def __init__(self, tmp: Path, stop_at: str, cgroups: bool) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ROUTER, stop_at, "1" if cgroups else "0", WORKER],
            env={**os.environ, "TMPDIR": str(tmp)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.info: dict[str, Any] = {}
        self.families: list[dict[str, Any]] = []
        assert self.proc.stdout is not None
        for _ in range(8):  # bounded: one line per step
            line = self.proc.stdout.readline()
            assert line, f"the run stopped early (stop at {stop_at})"
            record = json.loads(line)
            if "worker" in record:
                self.families.append({n: _native.process_id(p) for n, p in record.items()})
            else:
                self.info.update(record)
            if "at" in record or "done" in record:
                break

    @property
    def cgroup(self) -> Path | None:
        home = self.info.get("home")
        return Path(home) / f"mineru-health-router.{self.info['owner']}" if home else None

    def left(self, tmp: Path) -> list[str]:
        """What of this (dead) run is still there: scratch, state, cgroup, processes."""
        left = [str(p) for p in tmp.iterdir() if self.info.get("root") == str(p)]
        if self.cgroup is not None and self.cgroup.exists():
            left.append(str(self.cgroup))
        left += [f"{n} {pid}" for f in self.families for n, pid in _alive(f).items()]
        return left

    def kill(self) -> None:
        """SIGKILL (when it still runs), reaped, its pipes closed."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(WAIT_S)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.stdout.close()


@pytest.mark.parametrize("cgroups", _modes(), ids=lambda c: "cgroup" if c else "process_group")
def test_a_router_killed_at_any_point_is_swept_whole_by_the_next(
    started: Started, tmp_path: Path, cgroups: bool
) -> None:
    """Each run is killed at one point of its life; the next run's start leaves nothing of
    it: its scratch (with its workers' state directories), its cgroups, its processes."""
    dead: Run | None = None
    runs: list[Run] = []
    try:
        for point in [*KILL_POINTS, "done"]:
            run = Run(tmp_path, point, cgroups)
            runs.append(run)
            if point != "swept":
                assert run.info.get("at", "done") == point, run.info
            if dead is not None:
                assert dead.left(tmp_path) == [], f"{point}: {dead.info}"
            if point != "done":
                run.kill()
                if point in ("spawned", "serving", "ending"):
                    assert [n for f in run.families for n in _alive(f)], point
            dead = run
        assert runs[-1].proc.wait(WAIT_S) == 0
        runs[-1].kill()  # its pipes
        assert list(tmp_path.iterdir()) == []  # the last one, shut down, removed its own
        if runs[-1].cgroup is not None:
            assert not runs[-1].cgroup.exists()
    finally:
        for run in runs:
            started.families += run.families
            if not run.proc.stdout or not run.proc.stdout.closed:
                run.kill()

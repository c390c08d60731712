"""Child processes in a worker, as an engine starts them (the test sandbox only).

When ``MINERU_HEALTH_FAULT_CHILDREN`` names a directory, the fault plan
plugin (:mod:`.fault_plugin`) calls :func:`start_from_env` once the worker's
start-up is over (when its loop watcher starts), and the worker starts:

* a child in its process group, as vLLM starts its EngineCore;
* a daemon: a child that starts a session of its own and forks a grandchild
  that ignores SIGTERM, then exits, so that the grandchild is an orphan in a
  session of its own, reparented away from the worker: what escapes a
  process-group kill and a walk of the worker's descendants.

Both sleep for :data:`LIFE_S` at most (bounded). Their pids go to
``<dir>/<worker pid>.json`` as ``{"worker", "group_child", "daemon"}``,
written atomically. Production code never imports this module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from mineru_health.demo.fault_plugin import CHILDREN_ENV  # one name: the plugin reads it

__all__ = [
    "CHILDREN_ENV",
    "LIFE_S",
    "cgroups_here",
    "family",
    "read_children",
    "start_from_env",
    "survivors",
]

#: How long a test child lives if nothing ends it.
LIFE_S = 600

_SLEEPER = f"import time; time.sleep({LIFE_S})"
# Prints the grandchild's pid; the grandchild lets go of the pipe first.
_DAEMON = f"""
import os, signal, sys, time
os.setsid()
pid = os.fork()
if pid == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    time.sleep({LIFE_S})
    os._exit(0)
sys.stdout.write(str(pid))
sys.stdout.flush()
os._exit(0)
"""

_lock = threading.Lock()
_started: list[Any] = []  # this process's group child (a Popen), kept referenced


def start_from_env() -> None:
    """Starts the children once per process when ``MINERU_HEALTH_FAULT_CHILDREN`` is set."""
    directory = os.environ.get(CHILDREN_ENV)
    if not directory:
        return
    with _lock:
        if _started:
            return
        group_child = subprocess.Popen([sys.executable, "-c", _SLEEPER], stdin=subprocess.DEVNULL)
        _started.append(group_child)
        done = subprocess.run(
            [sys.executable, "-c", _DAEMON],
            capture_output=True,
            timeout=60,
            check=True,
            stdin=subprocess.DEVNULL,
        )
        record = {
            "worker": os.getpid(),
            "group_child": group_child.pid,
            "daemon": int(done.stdout.decode("ascii").strip()),
        }
        path = Path(directory) / f"{os.getpid()}.json"
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(record), encoding="utf-8")
        os.replace(temporary, path)


def read_children(directory: Path, worker_pid: int) -> dict[str, int] | None:
    """What :func:`start_from_env` recorded for ``worker_pid`` (None: nothing yet)."""
    try:
        data = json.loads((directory / f"{worker_pid}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return {str(k): int(v) for k, v in data.items()}


def family(directory: Path, worker_pid: int, timeout_s: float = 60.0) -> dict[str, Any]:
    """The worker and the children it recorded, each a ``ProcessId`` (pid and start time,
    so that a reused pid is never taken for one of them); waits for the record, bounded.

    Raises ``TimeoutError`` when the record does not come, ``ProcessLookupError`` when one
    of them is gone already.
    """
    from mineru_health import _native
    from mineru_health.demo.sandbox import wait_until

    recorded = wait_until(lambda: read_children(directory, worker_pid), timeout_s, 0.1)
    if not recorded:
        raise TimeoutError(f"worker {worker_pid} recorded no children in {directory}")
    found = {name: _native.process_id(pid) for name, pid in recorded.items()}
    gone = [name for name, process in found.items() if process is None]
    if gone:
        raise ProcessLookupError(f"already gone: {gone} of {recorded}")
    return found


def cgroups_here() -> str:
    """Why a router here would keep its workers in process groups, not cgroups ("": it
    would not): a real process is put in a cgroup the way a router puts a worker there."""
    from mineru_health.runtime.router.processes import WorkerProcesses

    processes = WorkerProcesses(cgroups=True, grace_s=1.0)
    launch = processes.prepare("cgroup-probe")
    probe = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], stdin=subprocess.DEVNULL
    )
    try:
        processes.adopt(launch, probe.pid)
        return "" if launch.cgroup else launch.no_cgroup or processes.no_cgroup
    finally:
        processes.end(launch)
        probe.wait(30)
        processes.release(launch)
        processes.close()


def survivors(members: dict[str, Any]) -> dict[str, int]:
    """Those of ``members`` (a :func:`family`) still running: name -> pid."""
    from mineru_health import _native

    return {
        name: process.pid
        for name, process in members.items()
        if _native.process_id(process.pid) == process
    }

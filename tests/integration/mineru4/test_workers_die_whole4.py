"""Workers die whole (MinerU 4.0): no process a worker started outlives it, however it goes.

As ``tests/integration/test_workers_die_whole.py`` for 3.x: the patched 4.0
``mineru-router`` with two local workers (flash tier, offline), each of which
starts, once up, a child in its process group and a daemon (an orphan in a
session of its own that ignores SIGTERM). 4.0 starts its workers in the
router's own process group; a patched worker makes a group of its own. For
each way a worker goes, the worker and both children must be gone (by pid and
start time; bounded waits): its ``kill -9``, its engine's death (llama.cpp's
``EngineError`` in 4.0's parse call), a hung event loop, and the router's own
``kill -9`` (the workers end theirs; the next router removes the killed one's
temporary directories, job sources included, and its cgroups). Once with a
cgroup per worker where this machine allows it, once with process groups and
tags; one fleet per mode, its router killed by the last test. Runs when
``MINERU_HEALTH_MINERU4_PYTHON`` names a MinerU 4.0 environment's Python.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from harness.children import CHILDREN_ENV, cgroups_here, family, survivors
from mineru_health.demo import sandbox
from mineru_health.demo.fleet import (
    FLEET4_ENV,
    LINE4,
    Client,
    Router,
    start_router,
    text_pdf,
)
from mineru_health.demo.sandbox import HOST, Processes, wait_until
from mineru_health.runtime.router.scratch import SCRATCH_PREFIX

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        sandbox.mineru4_python() is None,
        reason=f"set {sandbox.MINERU4_PYTHON_ENV} to a MinerU 4.0 Python",
    ),
]

GONE_WITHIN_S = 60.0
RESTARTED_WITHIN_S = 180.0
ENV = {**FLEET4_ENV, "MINERU_ROUTER_HEALTH_STOP_GRACE_S": "2"}


@dataclass
class Fleet:
    router: Router
    mode: str  # "cgroup" or "process_group"
    children: Path
    tmp: Path
    env: dict[str, str]
    site: Path
    python: str


@pytest.fixture(scope="module", params=["cgroup", "process_group"])
def fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    mode = str(request.param)
    no_cgroup = cgroups_here() if mode == "cgroup" else ""
    if no_cgroup:
        pytest.skip(f"no cgroup for the router here: {no_cgroup}")
    python = sandbox.mineru4_python()
    assert python is not None
    scratch = tmp_path_factory.mktemp(f"whole4-{mode}")
    children, tmp = scratch / "children", scratch / "tmp"
    children.mkdir()
    tmp.mkdir()
    site = LINE4.site(scratch / "mineru-site", python)
    env = {
        **ENV,
        CHILDREN_ENV: str(children),
        "TMPDIR": str(tmp),
        "MINERU_ROUTER_HEALTH_WORKER_CGROUPS": "1" if mode == "cgroup" else "0",
    }
    with Processes() as procs:
        router = start_router(
            procs, LINE4, site, python, scratch / "router", env=env, fault_plan="plan-{port}"
        )
        router.wait_in_rotation()
        yield Fleet(router, mode, children, tmp, env, site, python)


def _launches(router: Router, worker_id: str = "") -> list[dict[str, Any]]:
    return [
        r
        for r in router.audit_records()
        if r["action"] == "worker_processes" and (not worker_id or r["worker_id"] == worker_id)
    ]


def _worker_url(pid: int) -> str:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return f"http://{HOST}:{argv[argv.index('--port') + 1]}"


def _current(fleet: Fleet, worker_id: str) -> dict[str, Any]:
    """The worker's latest launch record, once its process is in rotation."""
    fleet.router.wait_in_rotation()
    return _launches(fleet.router, worker_id)[-1]


def _assert_gone_after(
    fleet: Fleet, worker_id: str, inject: Callable[[str, int], object], after: str
) -> None:
    launch = _current(fleet, worker_id)
    assert launch["scope"] == fleet.mode, launch
    pid = int(launch["pid"])
    members = family(fleet.children, pid)
    ended_before = [
        r for r in fleet.router.audit_records() if r["action"] == "worker_processes_ended"
    ]
    inject(_worker_url(pid), pid)

    def replaced() -> bool:
        return (
            int(_launches(fleet.router, worker_id)[-1]["pid"]) != pid
            and fleet.router.routable() == 2
        )

    assert wait_until(replaced, RESTARTED_WITHIN_S, 0.5), fleet.router.proc.log_tail()
    assert wait_until(lambda: not survivors(members), GONE_WITHIN_S, 0.2), survivors(members)
    ended = [r for r in fleet.router.audit_records() if r["action"] == "worker_processes_ended"][
        len(ended_before) :
    ]
    mine = [r for r in ended if r["worker_id"] == worker_id]
    assert mine and mine[0]["after"] == after and mine[0]["survivors"] == 0, ended
    new = _current(fleet, worker_id)
    new_members = family(fleet.children, int(new["pid"]))
    assert not set(new_members.values()) & set(members.values())


def _worker_ids(fleet: Fleet) -> list[str]:
    return sorted({str(r["worker_id"]) for r in _launches(fleet.router)})


def test_kill_9_of_a_worker_ends_its_children(fleet: Fleet) -> None:
    _assert_gone_after(
        fleet, _worker_ids(fleet)[0], lambda url, pid: os.kill(pid, signal.SIGKILL), "exit"
    )


def test_engine_death_ends_the_replaced_workers_children(fleet: Fleet) -> None:
    def engine_dies(url: str, pid: int) -> None:
        fleet.router.write_plan("llama_engine_dead", url)
        # Sent to the worker itself: its parse call raises llama.cpp's EngineError.
        task_id, refusal = Client(url, LINE4).submit("doc.pdf", text_pdf(1))
        assert task_id, refusal

    worker_id = _worker_ids(fleet)[1]
    _assert_gone_after(fleet, worker_id, engine_dies, "restart")
    assert any(
        r["action"] == "health_failed"
        and r["cause"] == "engine_dead"
        and r["worker_id"] == worker_id
        for r in fleet.router.audit_records()
    )


def test_hung_worker_is_restarted_without_its_children(fleet: Fleet) -> None:
    _assert_gone_after(
        fleet,
        _worker_ids(fleet)[0],
        lambda url, pid: fleet.router.write_plan("hang", url),
        "restart",
    )


def test_zz_router_kill_9_leaves_no_process_and_the_next_router_sweeps(fleet: Fleet) -> None:
    """Last of the module: kills the fleet's router."""
    router = fleet.router
    router.wait_in_rotation()
    current = [_current(fleet, worker_id) for worker_id in _worker_ids(fleet)]
    families = [family(fleet.children, int(r["pid"])) for r in current]
    scratch_dirs = sorted(fleet.tmp.glob(f"{SCRATCH_PREFIX}*"))
    assert len(scratch_dirs) == 1, scratch_dirs
    # 4.0's job sources and the workers' upload directories are in it.
    names = [p.name for p in scratch_dirs[0].iterdir()]
    assert any(n.startswith("mineru-v1-router-sources-") for n in names), names
    assert sum(n.startswith("mineru-router-local") for n in names) >= 2, names
    cgroups = {str(r["cgroup"]).rsplit("/", 1)[0] for r in current if r.get("cgroup")}
    assert len(cgroups) == (1 if fleet.mode == "cgroup" else 0), cgroups

    os.kill(router.proc.pid, signal.SIGKILL)
    assert router.proc.wait(30.0) == -signal.SIGKILL
    assert wait_until(lambda: not any(survivors(f) for f in families), GONE_WITHIN_S, 0.2), [
        survivors(f) for f in families
    ]
    assert scratch_dirs[0].is_dir()  # a killed router cannot remove it...

    with Processes() as procs:  # ... the next one does
        started = time.time()
        nxt = start_router(
            procs,
            LINE4,
            fleet.site,
            fleet.python,
            fleet.children.parent / "router-next",
            env=fleet.env,
        )
        nxt.wait_in_rotation()
        assert not scratch_dirs[0].exists()
        assert all(not Path(c).exists() for c in cgroups), cgroups
        assert nxt.audit_records(since=started)
    assert nxt.proc.returncode == -signal.SIGTERM, nxt.proc.log_tail()
    assert not list(fleet.tmp.glob(f"{SCRATCH_PREFIX}*"))

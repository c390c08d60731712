"""Workers die whole (MinerU 3.x): no process a worker started outlives it, however it goes.

The patched ``mineru-router`` with two local workers, each of which starts,
once up (the sandbox's ``children.py``), a child in its process group and a
daemon: an orphan in a session of its own that ignores SIGTERM, as an
engine's helper can be. For each way a worker goes, the worker's pid and
both children's must be gone (by pid and start time; bounded waits): its
``kill -9`` (the router sees the exit), its engine's death (the router
replaces it), a hung event loop (the router restarts it), and the router's
own ``kill -9`` (the workers end theirs; the next router ends what is left
and removes the killed one's temporary directories and cgroups). Run once
with a cgroup per worker where this machine allows it and once with process
groups and tags (``MINERU_ROUTER_HEALTH_WORKER_CGROUPS=0``); one fleet per
mode, its router killed by the last test.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import submit_task, wait_until
from harness.children import CHILDREN_ENV, cgroups_here, family, survivors
from mineru_health.demo.fleet import LINE3, Router, start_router
from mineru_health.demo.sandbox import Processes
from mineru_health.runtime.router.scratch import SCRATCH_PREFIX

pytestmark = pytest.mark.integration

#: Bounds, not timings: a worker's processes get STOP_GRACE_S (2 s here) after
#: SIGTERM, the worker's own ending (router gone) 5 s, and the daemon needs SIGKILL.
GONE_WITHIN_S = 60.0
RESTARTED_WITHIN_S = 120.0
ENV = {
    "MINERU_ROUTER_HEALTH_PRESET": "fast",
    "MINERU_ROUTER_HEALTH_STOP_GRACE_S": "2",
    "MINERU_HEALTH_LOOP_HANG_S": "5",
}


@dataclass
class Fleet:
    router: Router
    mode: str  # "cgroup" or "process_group"
    children: Path  # where the workers record their children
    tmp: Path  # the routers' TMPDIR
    env: dict[str, str]


@pytest.fixture(scope="module", params=["cgroup", "process_group"])
def fleet(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    patched_mineru_site: Path,
    mineru_python: str,
) -> Iterator[Fleet]:
    mode = str(request.param)
    no_cgroup = cgroups_here() if mode == "cgroup" else ""
    if no_cgroup:
        pytest.skip(f"no cgroup for the router here: {no_cgroup}")
    scratch = tmp_path_factory.mktemp(f"whole-{mode}")
    children, tmp = scratch / "children", scratch / "tmp"
    children.mkdir()
    tmp.mkdir()
    env = {
        **ENV,
        CHILDREN_ENV: str(children),
        "TMPDIR": str(tmp),
        "MINERU_ROUTER_HEALTH_WORKER_CGROUPS": "1" if mode == "cgroup" else "0",
    }
    with Processes() as procs:
        router = start_router(
            procs,
            LINE3,
            patched_mineru_site,
            mineru_python,
            scratch / "router",
            env=env,
            fault_plan="plan-{port}",
        )
        router.wait_in_rotation()
        yield Fleet(router, mode, children, tmp, env)


def _records(router: Router, action: str, worker_id: str = "") -> list[dict[str, object]]:
    return [
        r
        for r in router.audit_records()
        if r["action"] == action and (not worker_id or r["worker_id"] == worker_id)
    ]


def _victim(fleet: Fleet, server_id: str) -> tuple[str, dict[str, object]]:
    """The worker's URL and its family (worker and children, all running)."""
    servers = fleet.router.wait_in_rotation()
    url = str(servers[server_id]["base_url"])
    assert servers[server_id]["process_scope"] == fleet.mode, servers[server_id]
    pid = fleet.router.worker_pid(url)
    assert pid is not None, servers
    return url, family(fleet.children, pid)


def _assert_gone_after(
    fleet: Fleet, server_id: str, inject: Callable[[str], object], after: str
) -> None:
    url, members = _victim(fleet, server_id)
    ended_before = len(_records(fleet.router, "worker_processes_ended", server_id))
    inject(url)
    fleet.router.wait_restarted(server_id, url, RESTARTED_WITHIN_S)
    assert wait_until(lambda: not survivors(members), GONE_WITHIN_S, 0.2), survivors(members)
    ended = _records(fleet.router, "worker_processes_ended", server_id)[ended_before:]
    assert ended and ended[0]["after"] == after, ended
    assert ended[0]["survivors"] == 0, ended
    assert ended[0]["scope"] == fleet.mode, ended
    # The new instance is kept the same way, and its children are its own.
    _url, new_members = _victim(fleet, server_id)
    assert not set(new_members.values()) & set(members.values())


def test_kill_9_of_a_worker_ends_its_children(fleet: Fleet) -> None:
    def kill(url: str) -> None:
        pid = fleet.router.worker_pid(url)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)

    _assert_gone_after(fleet, "local-gpu-0", kill, "exit")


def test_engine_death_ends_the_replaced_workers_children(
    fleet: Fleet, fake_vlm_url: str, tiny_pdf: bytes
) -> None:
    def engine_dies(url: str) -> None:
        fleet.router.write_plan("engine_dead", url)
        # Sent to the worker itself: its engine call raises EngineDeadError.
        response = submit_task(url, tiny_pdf, fake_vlm_url)
        assert response.status_code == 202, response.text

    _assert_gone_after(fleet, "local-gpu-1", engine_dies, "restart")
    records = fleet.router.audit_records()
    assert any(
        r["action"] == "health_failed"
        and r["cause"] == "engine_dead"
        and r["worker_id"] == "local-gpu-1"
        for r in records
    ), records


def test_hung_worker_is_restarted_without_its_children(fleet: Fleet) -> None:
    def hang(url: str) -> None:
        fleet.router.write_plan("hang", url)

    _assert_gone_after(fleet, "local-gpu-0", hang, "restart")


def test_zz_router_kill_9_leaves_no_process_and_the_next_router_sweeps(
    fleet: Fleet, patched_mineru_site: Path, mineru_python: str
) -> None:
    """Last of the module: kills the fleet's router."""
    router = fleet.router
    servers = router.wait_in_rotation()
    families = [
        family(fleet.children, pid)
        for pid in router.worker_pids(
            {str(s["base_url"]).rsplit(":", 1)[1] for s in servers.values()}
        )
    ]
    assert len(families) == 2
    scratch_dirs = sorted(fleet.tmp.glob(f"{SCRATCH_PREFIX}*"))
    assert len(scratch_dirs) == 1, scratch_dirs
    cgroups = {
        str(r["cgroup"]).rsplit("/", 1)[0]
        for r in _records(router, "worker_processes")
        if r.get("cgroup")
    }
    assert len(cgroups) == (1 if fleet.mode == "cgroup" else 0), cgroups

    os.kill(router.proc.pid, signal.SIGKILL)
    assert router.proc.wait(30.0) == -signal.SIGKILL
    left = [m for f in families for m in f.values()]
    assert wait_until(lambda: not any(survivors(f) for f in families), GONE_WITHIN_S, 0.2), (
        [survivors(f) for f in families],
        left,
    )
    # What a killed router cannot remove itself is still there...
    assert scratch_dirs[0].is_dir()

    # ... until the next router starts on this machine.
    with Processes() as procs:
        scratch = fleet.children.parent / "router-next"
        started = time.time()
        nxt = start_router(procs, LINE3, patched_mineru_site, mineru_python, scratch, env=fleet.env)
        nxt.wait_in_rotation()
        assert not scratch_dirs[0].exists()
        assert all(not Path(c).exists() for c in cgroups), cgroups
        assert nxt.audit_records(since=started)
        new_scratch = sorted(fleet.tmp.glob(f"{SCRATCH_PREFIX}*"))
        assert len(new_scratch) == 1 and new_scratch != scratch_dirs
    # A router that shuts down (SIGTERM) removes its own.
    assert nxt.proc.returncode == -signal.SIGTERM, nxt.proc.log_tail()
    assert not list(fleet.tmp.glob(f"{SCRATCH_PREFIX}*"))

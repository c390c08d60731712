"""No orphans: the workers a router launched die with it, even when it is SIGKILLed."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import pytest
from conftest import Router, http_get, wait_until

pytestmark = pytest.mark.integration

# The kernel's SIGTERM starts uvicorn's graceful shutdown at once; the
# worker's own watcher exits after 30 s if that shutdown hangs.
WORKER_EXIT_BOUND_S = 60.0


def test_workers_die_with_a_killed_router(
    launch_router: Callable[..., Router],
) -> None:
    router = launch_router({"MINERU_ROUTER_HEALTH_PRESET": "fast"})
    servers = router.wait_in_rotation()
    ports = {s["base_url"].rsplit(":", 1)[1] for s in servers.values()}
    assert len(ports) == 2, servers
    pids = router.worker_pids(ports)
    assert len(pids) == 2, (ports, pids)

    os.kill(router.proc.pid, signal.SIGKILL)
    assert router.proc.wait(30.0) == -signal.SIGKILL

    assert wait_until(lambda: not router.worker_pids(ports), WORKER_EXIT_BOUND_S, 0.5), (
        "workers outlived their router",
        router.worker_pids(ports),
    )
    for worker_port in ports:
        assert http_get(f"http://127.0.0.1:{worker_port}/health", 2.0) is None

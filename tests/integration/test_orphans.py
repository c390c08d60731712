"""No orphans: the workers a router launched die with it, even when it is SIGKILLed."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import pytest
from conftest import (
    ROUTER_START_TIMEOUT_S,
    ManagedProcess,
    http_get,
    wait_until,
    worker_pids,
)

pytestmark = pytest.mark.integration

# The kernel's SIGTERM starts uvicorn's graceful shutdown at once; the
# worker's own watcher exits after 30 s if that shutdown hangs.
WORKER_EXIT_BOUND_S = 60.0


def test_workers_die_with_a_killed_router(
    launch_router: Callable[..., ManagedProcess],
) -> None:
    router = launch_router({"MINERU_ROUTER_HEALTH_PRESET": "fast"})
    base = router.base_url

    def worker_ports() -> set[str] | None:
        assert router.poll() is None, router.log_tail()
        response = http_get(f"{base}/health", 5.0)
        if response is None:
            return None
        servers = response.json().get("servers", [])
        if len(servers) == 2 and all(s["in_rotation"] for s in servers):
            return {s["base_url"].rsplit(":", 1)[1] for s in servers}
        return None

    ports = wait_until(worker_ports, ROUTER_START_TIMEOUT_S, 0.5)
    assert ports, router.log_tail()
    pids = worker_pids(ports)
    assert len(pids) == 2, (ports, pids)

    os.kill(router.pid, signal.SIGKILL)
    assert router.wait(30.0) == -signal.SIGKILL

    assert wait_until(lambda: not worker_pids(ports), WORKER_EXIT_BOUND_S, 0.5), (
        "workers outlived their router", worker_pids(ports))
    for worker_port in ports:
        assert http_get(f"http://127.0.0.1:{worker_port}/health", 2.0) is None

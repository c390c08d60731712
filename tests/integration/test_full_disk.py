"""The router's own disk fills and empties under a stream (issue 31), MinerU 3.x.

Before: with its state directory on an 8 MiB file system, filled, the router
answered uploads with a bare 500, accepted some whose store row could not be
written, and after a ``kill -9`` a new router answered 404 for them. Now: a
patched ``mineru-router`` whose state directory is an 8 MiB tmpfs, its
worker a ``mineru-api`` at ``--upstream-url`` (outside that file system, and
it outlives the router), a steady stream of tasks; the file system is filled,
the router killed with ``SIGKILL`` and a new one started on the full
directory, then the file system emptied. Every answer is 202, or 503/507
with Retry-After (never a 500); the new router says its storage is full,
serves every task accepted before (no 404), accepts again once room returns,
and every accepted task completes. Needs root for the tmpfs (skips without).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from admission_runs import fill_and_empty, small_tmpfs
from conftest import ManagedProcess, Router, free_port, make_pdf
from mineru_health.demo.fleet import LINE3, Client
from mineru_health.demo.sandbox import HOST, Processes

pytestmark = pytest.mark.integration


def test_a_full_disk_refuses_with_507_and_loses_nothing_accepted(
    processes: Processes,
    mineru_api_factory: Callable[..., ManagedProcess],
    patched_mineru_site: Path,
    mineru_python: str,
    fake_vlm_url: str,
    tmp_path: Path,
) -> None:
    pytest.importorskip("reportlab")
    worker = mineru_api_factory(patched_mineru_site)
    pdf = make_pdf(text="mineru-health full disk page")
    with small_tmpfs(tmp_path / "router-state") as state:
        env = {"MINERU_ROUTER_HEALTH_PRESET": "fast", "MINERU_HEALTH_STATE_DIR": str(state)}
        count = 0

        def start() -> Router:
            nonlocal count
            count += 1
            scratch = tmp_path / f"router-{count}"
            scratch.mkdir()
            port = free_port()
            argv = [
                *LINE3.router_argv(mineru_python, port, "none"),
                "--upstream-url",
                worker.base_url,
            ]
            proc = processes.start(
                "mineru-router",
                argv,
                env=LINE3.env(patched_mineru_site, scratch, mineru_python, env),
                log_path=scratch / "router.log",
                cwd=scratch,
            )
            proc.base_url = f"http://{HOST}:{port}"
            router = Router(LINE3, proc, scratch, 1)
            router.wait_in_rotation()
            return router

        def client(router: Router) -> Client:
            return Client(router.base, LINE3, engine_url=f"{fake_vlm_url}/delay/300/")

        run = fill_and_empty(start, client, lambda n: (f"full-{n:03d}.pdf", pdf), state)
        log = run.second.proc.log_tail(8000)
        codes = {code for code, _, _ in run.answers} - {0}  # 0: no router up (the kill)
        assert codes <= {202, 503, 507}, (sorted(codes), log)
        assert all(retry for code, retry, _ in run.answers if code in (503, 507)), run.answers
        assert run.count(507) >= 6, run.answers
        assert set(run.full_statuses) == {200}, (run.full_statuses, log)
        assert run.not_found == [] and run.lost == [], (run.not_found, run.lost, log)
        assert str(state) in log and "storage is full" in log, log
        assert run.second.metric("mineru_router_storage_full_refusals_total") >= 3
        processes.stop_all(10.0)  # before the file system goes

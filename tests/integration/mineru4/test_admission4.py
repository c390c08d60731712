# ruff: noqa: F811 - the fixtures are imported from mineru4_support and named as parameters
"""Acknowledged means kept on 4.0 (issue 31): the caps under a burst, a full disk.

4.0's router enforced neither cap (MAX_KEPT_TASKS=5: 21 accepted; 375 MiB
kept against 100), and on a full disk answered 500 or accepted jobs it could
not keep. A patched MinerU 4.0 ``mineru-router``:

- one local worker whose first parse hangs (fault plan ``parse_hang``: no
  job ends during the test), 20 x 19 MiB through ``/v1/tasks`` at once with
  ``MAX_KEPT_MB=100``, then 20 small ones with ``MAX_KEPT_TASKS=8``: at most
  100 MiB and 8 jobs kept, every other submission 503 with Retry-After;
- its state directory on an 8 MiB tmpfs, its worker a ``mineru-api`` at
  ``--upstream-url`` (it outlives the router), a steady stream of jobs; the
  file system filled, the router killed with ``SIGKILL``, a new one started
  on the full directory, the file system emptied: only 202, or 503/507 with
  Retry-After, no job accepted lost, each completed (needs root, skips
  without).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from admission_runs import burst, fill_and_empty, padded, small_tmpfs
from mineru4_support import (
    python4,  # noqa: F401 - fixture
    site4,  # noqa: F401 - fixture
)
from mineru_health.demo.fleet import (
    FLEET4_ENV,
    LINE4,
    Client,
    Router,
    start_router,
    start_worker,
    text_pdf,
)
from mineru_health.demo.sandbox import HOST, Processes, free_port, wait_until

pytestmark = pytest.mark.integration

MIB = 1024 * 1024


def test_4_0_holds_the_byte_and_count_caps_under_a_burst(
    python4: str, site4: Path, tmp_path: Path
) -> None:
    env = {
        **FLEET4_ENV,
        "MINERU_ROUTER_HEALTH_MAX_KEPT_MB": "100",
        "MINERU_ROUTER_HEALTH_MAX_KEPT_TASKS": "8",
        "MINERU_HEALTH_STATE_DIR": str(tmp_path / "router-state"),
    }
    with Processes() as procs:
        router = start_router(
            procs,
            LINE4,
            site4,
            python4,
            tmp_path / "router",
            env=env,
            fault_plan="plan",
            local_gpus="0",
        )
        router.wait_in_rotation()
        plan = router.write_plan("parse_hang")
        assert wait_until(lambda: not plan.exists(), 30.0, 0.05), router.proc.log_tail()
        client = Client(router.base, LINE4, submit_timeout_s=120.0)
        large = burst(
            client,
            [(f"large-{n:02d}.pdf", padded(text_pdf(1, seed=n), 19 * MIB)) for n in range(20)],
            20,
        )
        sources = tmp_path / "router-state" / "sources" / "uploads"
        kept = sum(p.stat().st_size for p in sources.iterdir() if p.is_file())
        accepted = sum(1 for code, _, _ in large if code == 202)
        assert 1 <= accepted <= 5 and kept <= 100 * MIB, (accepted, kept, large)
        assert all(code == 503 and retry for code, retry, _ in large if code != 202), large
        small = burst(
            client, [(f"small-{n:02d}.pdf", text_pdf(1, seed=100 + n)) for n in range(20)], 20
        )
        more = sum(1 for code, _, _ in small if code == 202)
        assert 1 <= more <= 8 - accepted, (accepted, small)
        assert all(code == 503 and retry for code, retry, _ in small if code != 202), small
        assert router.metric("mineru_router_kept_cap_refusals_total") == 40 - accepted - more


def test_4_0_on_a_full_disk_refuses_with_507_and_loses_nothing_accepted(
    python4: str,
    site4: Path,
    tmp_path: Path,
) -> None:
    with Processes() as procs, small_tmpfs(tmp_path / "router-state") as state:
        worker = start_worker(
            procs, LINE4, site4, python4, tmp_path / "worker", native=True, name="mineru-api-4"
        )
        env = {**FLEET4_ENV, "MINERU_HEALTH_STATE_DIR": str(state)}
        count = 0

        def start() -> Router:
            nonlocal count
            count += 1
            scratch = tmp_path / f"router-{count}"
            scratch.mkdir()
            port = free_port()
            argv = [*LINE4.router_argv(python4, port, "none"), "--upstream-url", worker.base_url]
            proc = procs.start(
                "mineru-router",
                argv,
                env=LINE4.env(site4, scratch, python4, env),
                log_path=scratch / "router.log",
                cwd=scratch,
            )
            proc.base_url = f"http://{HOST}:{port}"
            router = Router(LINE4, proc, scratch, 1)
            router.wait_in_rotation()
            return router

        run = fill_and_empty(
            start,
            lambda r: Client(r.base, LINE4),
            lambda n: (f"doc{n}.pdf", text_pdf(2, seed=n)),
            state,
        )
        log = run.second.proc.log_tail(8000)
        codes = {code for code, _, _ in run.answers} - {0}  # 0: no router up (the kill)
        assert codes <= {202, 503, 507}, (sorted(codes), log)
        assert all(retry for code, retry, _ in run.answers if code in (503, 507)), run.answers
        assert set(run.full_statuses) == {200}, (run.full_statuses, log)
        assert run.not_found == [] and run.lost == [], (run.not_found, run.lost, log)
        assert str(state) in log and "storage is full" in log, log
        assert run.second.metric("mineru_router_storage_full_refusals_total") >= 3
        procs.stop_all(10.0)  # before the file system goes

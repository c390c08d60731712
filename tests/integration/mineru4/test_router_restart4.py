"""A router restart loses nothing (issue 24): ``kill -9`` of the 4.0 router mid-stream.

The patched MinerU 4.0 ``mineru-router`` with two real local workers (flash
tier, text PDFs) and ``MINERU_HEALTH_STATE_DIR`` set; a steady stream of
jobs through ``/v1/tasks``; ``kill -9`` of the router (its workers die with
it); a new router on the same state directory. Every job the first router
accepted answers through the new one (no 404), the ones in flight are
finished (sent again under the same id), every result and output file is
downloadable and is its own document's, none lost. A router killed while
a worker restarts after an engine death leaves a next router that restarts
nothing: the worker's new instance restored the job as its previous
instance failed it, and that verdict is not the new instance's (issue 32).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from mineru_health.demo import sandbox
from mineru_health.demo.fleet import (
    FLEET4_ENV,
    LINE4,
    Client,
    Router,
    start_router,
    text_pdf,
)
from mineru_health.demo.sandbox import Processes
from router_restart import DISRUPTIONS, kill_and_restart, kill_during_a_restart

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        sandbox.mineru4_python() is None,
        reason=f"set {sandbox.MINERU4_PYTHON_ENV} to a MinerU 4.0 Python",
    ),
]


def test_a_router_killed_mid_stream_resumes_every_job(tmp_path: Path) -> None:
    python = sandbox.mineru4_python()
    assert python is not None
    site = LINE4.site(tmp_path / "mineru-site", python)
    env = {**FLEET4_ENV, "MINERU_HEALTH_STATE_DIR": str(tmp_path / "router-state")}
    with Processes() as procs:
        count = 0

        def start() -> Router:
            nonlocal count
            count += 1
            router = start_router(
                procs, LINE4, site, python, tmp_path / f"router-{count}", env=env, fault_plan=None
            )
            router.wait_in_rotation()
            return router

        # Eight pages a job, one every 0.3 s: both workers hold queued jobs at the kill.
        run = kill_and_restart(
            start(),
            start,
            lambda r: Client(r.base, r.line),
            lambda n: (f"doc{n}.pdf", text_pdf(8, seed=n)),
            every_s=0.3,
        )
        log = run.second.proc.log_tail(8000)
        assert run.completed_before and run.in_flight, (run.completed_before, run.in_flight)
        assert run.not_found == [], (run.not_found, log)
        assert run.lost == [], (run.lost, log)
        with httpx.Client(base_url=run.second.base, timeout=60) as client:
            for number, task_id in run.accepted:
                result = client.get(f"/v1/tasks/{task_id}/result")
                assert result.status_code == 200, (number, result.text[:300], log)
                output = run.outcomes[task_id]["files"][0]["output_files"]["markdown"]
                content = client.get(f"/v1/files/{output['file_id']}/content")
                assert content.status_code == 200, (number, content.text[:300], log)
                assert f"Document {number}," in content.text
        assert (
            run.second.metric("mineru_router_task_resubmissions_total", reason="router_restart")
            >= 1
        ), log


def test_a_router_killed_during_an_engine_death_restart_restarts_nothing_healthy(
    tmp_path: Path,
) -> None:
    python = sandbox.mineru4_python()
    assert python is not None
    site = LINE4.site(tmp_path / "mineru-site", python)
    env = {**FLEET4_ENV, "MINERU_HEALTH_STATE_DIR": str(tmp_path / "router-state")}
    with Processes() as procs:
        # No retry budget: the job the engine death failed waits for the kill unsent.
        first = start_router(
            procs,
            LINE4,
            site,
            python,
            tmp_path / "router-1",
            env={
                **env,
                "MINERU_ROUTER_HEALTH_RETRY_BUDGET_MIN": "0",
                "MINERU_ROUTER_HEALTH_RETRY_BUDGET_PERCENT": "0",
            },
            fault_plan="fault-plan",
        )
        first.wait_in_rotation()

        def second() -> Router:
            router = start_router(
                procs, LINE4, site, python, tmp_path / "router-2", env=env, fault_plan=None
            )
            router.wait_in_rotation()
            return router

        new, ids = kill_during_a_restart(
            first,
            second,
            Client(first.base, first.line),
            [(f"doc{n}.pdf", text_pdf(8, seed=n)) for n in range(8)],
        )
        client = Client(new.base, new.line)
        outcomes = [client.wait(job_id) for job_id in ids]
        log = new.proc.log_tail(8000)
        assert [o.status for o in outcomes] == ["completed"] * len(ids), (
            [o.detail for o in outcomes],
            log,
        )
        assert client.run("after.pdf", text_pdf(1, seed=9)).status == "completed", log
        assert [r for r in new.audit_records() if r["action"] in DISRUPTIONS] == [], log

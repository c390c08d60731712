"""The patched MinerU 4.0 ``mineru-router`` with two real local ``mineru-api`` workers.

Offline, flash tier, text PDFs (harness: ``testing/router4.py``). A steady
stream of jobs goes through the router's ``/v1/tasks`` while one worker is
killed with ``kill -9``, its engine dies (vLLM's ``EngineDeadError`` raised
in 4.0's real parse call) or its event loop hangs. Every job submitted must
complete (0 failed, 0 hung, no refused submission); the faulty worker is
taken out, restarted and back in rotation (audit file, ``/metrics``), and
the results of jobs that finished before the fault are still downloadable.
Runs when ``MINERU_HEALTH_MINERU4_PYTHON`` names a MinerU 4.0 environment's
Python.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from mineru_health.testing import router4, sandbox
from mineru_health.testing.router4 import FaultRun, Fleet, Job

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(sandbox.mineru4_python() is None,
                       reason=f"set {sandbox.MINERU4_PYTHON_ENV} to a MinerU 4.0 Python"),
]


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    python = sandbox.mineru4_python()
    assert python is not None
    with router4.start_fleet(tmp_path, python) as fleet:
        yield fleet


def _metrics_states(fleet: Fleet) -> dict[str, str]:
    text = httpx.get(f"{fleet.base}/metrics", timeout=10).text
    states = {}
    for line in text.splitlines():
        if line.startswith("mineru_router_worker_state{") and line.endswith(" 1.0"):
            labels = dict(part.split("=", 1) for part in line[line.index("{") + 1:
                                                              line.index("}")].split(","))
            states[labels["worker"].strip('"')] = labels["state"].strip('"')
    return states


def _check(fleet: Fleet, inject: Callable[[], None], cause: str) -> FaultRun:
    run = router4.run_fault(fleet, inject)
    records = fleet.audit_records(since=run.fault_at)
    assert cause in {r["cause"] for r in records}, records
    assert any(r["action"] == "admitted" and r["from"] == "restarting" for r in records), records
    assert run.back_at is not None, fleet.router.log_tail()
    assert _metrics_states(fleet) == {"local-0-1": "healthy", "local-1-2": "healthy"}
    lost = [(j.seed, j.error or j.payload.get("files")) for j in run.lost]
    assert lost == [], (lost, fleet.router.log_tail(6000))
    assert len(run.jobs) > len(run.before)
    _assert_downloadable(fleet, run.before)
    return run


def _assert_downloadable(fleet: Fleet, jobs: list[Job]) -> None:
    with httpx.Client(base_url=fleet.base, timeout=30) as client:
        for job in jobs:
            output = job.payload["files"][0]["output_files"]["markdown"]
            content = client.get(f"/v1/files/{output['file_id']}/content")
            assert content.status_code == 200, (job.seed, content.text[:300])
            assert f"Document {job.seed}," in content.text
            assert client.get(f"/v1/tasks/{job.task_id}/result").status_code == 200


def test_kill_9_of_a_worker_loses_no_job(fleet: Fleet) -> None:
    _check(fleet, lambda: os.kill(fleet.worker_pids()[0], signal.SIGKILL), "process_exit")


def test_engine_death_loses_no_job(fleet: Fleet) -> None:
    _check(fleet, lambda: router4.write_plan(fleet.plan, "engine_dead"), "engine_dead")


def test_hung_event_loop_loses_no_job(fleet: Fleet) -> None:
    """The native endpoint says loop_hung (definitive) while the main port answers nothing."""
    _check(fleet, lambda: router4.write_plan(fleet.plan, "hang"), "loop_hung")


def test_stalled_engine_loses_no_job(fleet: Fleet) -> None:
    """The engine call never returns; the worker's stall watchdog condemns it."""
    _check(fleet, lambda: router4.write_plan(fleet.plan, "engine_stall"), "engine_dead")

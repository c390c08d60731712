"""The patched MinerU 4.0 ``mineru-router`` with two real local ``mineru-api`` workers.

Offline, flash tier, text PDFs (harness: ``mineru_health/demo/fleet.py``). A steady
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
from harness.samplers import FaultRun, run_fault
from mineru_health.demo import sandbox
from mineru_health.demo.fleet import (
    FLEET4_ENV,
    LINE4,
    Client,
    Outcome,
    Router,
    fleet,
    text_document,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        sandbox.mineru4_python() is None,
        reason=f"set {sandbox.MINERU4_PYTHON_ENV} to a MinerU 4.0 Python",
    ),
]


@pytest.fixture
def router(tmp_path: Path) -> Iterator[Router]:
    python = sandbox.mineru4_python()
    assert python is not None
    with fleet(LINE4, tmp_path, python, env=FLEET4_ENV) as router:
        yield router


def _metrics_states(router: Router) -> dict[str, str]:
    return {
        s.labels["worker"]: s.labels["state"]
        for s in router.metric_samples("mineru_router_worker_state")
        if s.value == 1.0
    }


def _check(router: Router, inject: Callable[[], None], cause: str) -> FaultRun:
    run = run_fault(router, inject)
    records = router.audit_records(since=run.fault_at)
    assert cause in {r.get("cause") for r in records}, records
    assert any(r["action"] == "admitted" and r.get("from") == "restarting" for r in records), (
        records
    )
    assert run.back_at is not None, router.proc.log_tail()
    assert _metrics_states(router) == {"local-0-1": "healthy", "local-1-2": "healthy"}
    lost = [(o.number, o.detail.get("files") or o.detail) for o in run.lost]
    assert lost == [], (lost, router.proc.log_tail(6000))
    assert len(run.outcomes) > len(run.before)
    _assert_downloadable(router, run.before)
    return run


def _assert_downloadable(router: Router, jobs: list[Outcome]) -> None:
    with httpx.Client(base_url=router.base, timeout=30) as client:
        for job in jobs:
            output = job.detail["files"][0]["output_files"]["markdown"]
            content = client.get(f"/v1/files/{output['file_id']}/content")
            assert content.status_code == 200, (job.number, content.text[:300])
            assert f"Document {job.number}," in content.text
            assert client.get(f"/v1/tasks/{job.task_id}/result").status_code == 200


def test_kill_9_of_a_worker_loses_no_job(router: Router) -> None:
    _check(router, lambda: os.kill(router.worker_pids()[0], signal.SIGKILL), "process_exit")


def test_engine_death_loses_no_job(router: Router) -> None:
    _check(router, lambda: router.write_plan("engine_dead"), "engine_dead")


def test_hung_event_loop_loses_no_job(router: Router) -> None:
    """The native endpoint says loop_hung (definitive) while the main port answers nothing."""
    _check(router, lambda: router.write_plan("hang"), "loop_hung")


def test_stalled_engine_loses_no_job(router: Router) -> None:
    """The engine call never returns; the worker's stall watchdog condemns it."""
    _check(router, lambda: router.write_plan("engine_stall"), "engine_dead")


def test_poison_document_is_quarantined_after_two_deaths_and_loses_nothing(
    router: Router,
) -> None:
    """Issue 24: a document that kills every engine that parses it, amid a steady stream.

    Two deaths (one per worker), never more; the router keeps a worker in
    rotation while it can (no submission refused); every other job
    completes, and every result finished before the fault is still
    downloadable through both restarts.
    """
    poison = text_document(9999)[1]
    poisoned: list[Outcome] = []
    client = Client(router.base, router.line)

    def inject() -> None:
        router.write_plan("poison poison.pdf")  # every worker reads it; none consumes it
        poisoned.append(client.run("poison.pdf", poison))

    run = run_fault(router, inject, client=client, recovery_timeout_s=240.0)
    assert poisoned and poisoned[0].status == "failed", poisoned
    assert "Not sent again" in str(poisoned[0].detail)
    deaths = [r for r in router.audit_records(since=run.fault_at) if r["action"] == "ejected"]
    assert len(deaths) == 2, router.audit_records(since=run.fault_at)
    assert router.metric("mineru_router_poison_documents_total") == 1
    lost = [(o.number, o.status, o.detail.get("files") or o.detail) for o in run.lost]
    assert lost == [], (lost, router.proc.log_tail(6000))
    _assert_downloadable(router, run.before)
    task_id, refusal = client.submit("renamed.pdf", poison)
    assert not task_id and refusal["code"] == 422, refusal
    assert "Not sent again" in refusal["body"], refusal
    # A second restart in a row of a worker that already restarted: still nothing lost.
    os.kill(router.worker_pids()[0], signal.SIGKILL)
    assert sandbox.wait_until(lambda: router.line.rotation(router.base)[0] == 1, 30.0, 0.1)
    assert sandbox.wait_until(lambda: router.line.rotation(router.base)[0] == 2, 120.0, 0.2), (
        router.proc.log_tail()
    )
    _assert_downloadable(router, run.before)

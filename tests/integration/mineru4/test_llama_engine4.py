"""A real llama.cpp engine in a patched MinerU 4.0 worker: it parses, it dies, it is verified.

Standard-tier ``mineru-api`` 4.0.12 workers run MinerU's own VLM path in-process on
``mineru_llama_cpp.Engine`` (4.0's default engine on CPU) with the tiny random-weight
MinerU 2.5 model of ``mineru_health.demo.engine`` (generated once a run). No
fault plugin: failures are the engine's own.

* A document parses through the real engine; a document whose page is too large for the
  model's context meets llama.cpp's real ``ContextExceededError`` and fails alone: the
  worker stays healthy (no hook of ours is loaded in that worker at all).
* The engine released under a running job (``Engine.close()``, called by ``engine_switch``
  after one generation): the next page fails inside the engine's own ``generate``; no rule
  decides that failure, verification asks the real object (``verify_llama_cpp``: closed),
  the job fails ``engine_dead``, native and main ``/health`` answer 503.
* The same death in a fleet: the patched router restarts the worker and resubmits its jobs;
  none is lost.

Runtimes (shared 2-core machine): ~10 s, ~6 s and ~40 s, plus ~1 s once a run for the models.
"""

# ruff: noqa: F811 - the fixtures are imported from llama4_support and named as parameters
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness.samplers import run_fault
from llama4_support import (  # noqa: F401 - fixtures
    LINE4_STANDARD,
    big_page_pdf,
    python4_llama,
    site4_llama,
    tiny_vlm_home,
    worker_env,
)
from mineru_health.demo.fleet import (
    FLEET4_ENV,
    Router,
    Worker,
    start_router,
    start_worker,
    text_pdf,
)
from mineru_health.demo.sandbox import Processes

pytestmark = [pytest.mark.integration]


@pytest.fixture
def processes() -> Iterator[Processes]:
    with Processes() as procs:
        yield procs


def _worker(
    processes: Processes,
    tmp_path: Path,
    python: str,
    site: Path,
    home: Path,
    arm: Path | None = None,
) -> Worker:
    return start_worker(
        processes,
        LINE4_STANDARD,
        site,
        python,
        tmp_path / "worker",
        env=worker_env(home, arm),
        native=True,
        timeout_s=180.0,
        name="mineru-api-4-llama",
    )


def _run(worker: Worker, pdf: bytes, name: str) -> dict[str, Any]:
    response = worker.submit(pdf, name=name)
    assert response.status_code == 202, response.text
    return worker.wait_terminal(str(response.json()["task_id"]), 240.0)


def _native(worker: Worker) -> tuple[int, dict[str, Any]]:
    response = worker.native()
    return response.status_code, response.json()


def test_parse_and_context_overflow_on_the_real_engine(
    processes: Processes, tmp_path: Path, python4_llama: str, site4_llama: Path, tiny_vlm_home: Path
) -> None:
    """~10 s: a job parses through llama.cpp; an oversized page fails alone, worker healthy."""
    worker = _worker(processes, tmp_path, python4_llama, site4_llama, tiny_vlm_home)

    done = _run(worker, text_pdf(2, seed=1), "doc1.pdf")
    assert done["status"] == "completed", (done, worker.proc.log_tail())
    assert done["files"][0]["output_files"]["markdown"]["bytes"] > 0

    overflow = _run(worker, big_page_pdf(), "big.pdf")
    assert overflow["status"] == "failed", overflow
    error = str(overflow["files"][0]["error"])
    assert "exceeds the available context size" in error, overflow
    assert "engine_dead" not in error, overflow

    code, body = _native(worker)
    assert code == 200 and body["engine_dead"] is False, body
    assert body["task_local_failures"] >= 1, body
    assert worker.get("/v1/health").status_code == 200
    again = _run(worker, text_pdf(2, seed=2), "doc2.pdf")
    assert again["status"] == "completed", (again, worker.proc.log_tail())


def test_released_engine_is_verified_dead(
    processes: Processes, tmp_path: Path, python4_llama: str, site4_llama: Path, tiny_vlm_home: Path
) -> None:
    """~8 s: the engine closed after one page; the job's next page finds it released."""
    arm = tmp_path / "close-engine"
    arm.touch()
    worker = _worker(processes, tmp_path, python4_llama, site4_llama, tiny_vlm_home, arm)

    failed = _run(worker, text_pdf(3, seed=3), "doc3.pdf")
    assert not arm.exists(), "the engine was never closed"
    assert failed["status"] == "failed", (failed, worker.proc.log_tail())

    code, body = _native(worker)
    assert code == 503, body
    assert body["engine_dead"] is True, body
    assert body["rule"] == "verify.llama_cpp", body
    assert body["category"] == "engine_check_failed", body
    assert body["exception_type"].endswith("AttributeError"), body
    main = worker.get("/v1/health")
    assert main.status_code == 503, main.text
    refused = worker.submit(text_pdf(1, seed=4), name="doc4.pdf")
    assert refused.status_code == 503, refused.text


def test_fleet_heals_a_released_engine_with_no_job_lost(
    tmp_path: Path, python4_llama: str, site4_llama: Path, tiny_vlm_home: Path
) -> None:
    """~40 s: two standard workers behind the patched router; one engine released mid-job."""
    arm = tmp_path / "close-engine"
    env = {**FLEET4_ENV, **worker_env(tiny_vlm_home, arm)}
    with Processes() as procs:
        router: Router = start_router(
            procs, LINE4_STANDARD, site4_llama, python4_llama, tmp_path / "fleet", env=env
        )
        router.wait_in_rotation(240.0)
        run = run_fault(
            router, arm.touch, warm=2, every_s=1.5, after_s=3.0, recovery_timeout_s=150.0
        )
        records = router.audit_records(since=run.fault_at)
        resubmitted = router.metric("mineru_router_task_resubmissions_total", reason="engine_dead")
        tail = router.proc.log_tail(6000)
    assert not arm.exists(), "no engine was closed"
    lost = [
        (o.number, o.status, [f.get("error") for f in o.detail.get("files") or []] or o.detail)
        for o in run.lost
    ]
    assert lost == [], (lost, tail)
    assert "engine_dead" in {r.get("cause") for r in records}, records
    assert any(r["action"] == "admitted" and r["from"] == "restarting" for r in records), records
    assert run.back_at is not None, tail
    # The job the engine failed under (verified dead, so failed engine_dead) went elsewhere.
    assert resubmitted >= 1, tail

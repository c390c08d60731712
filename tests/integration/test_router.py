"""The patched ``mineru-router`` with two real local ``mineru-api`` workers.

One worker's engine is killed with the fault plan (``engine_dead``: the
first worker to read the plan consumes it, so exactly one worker dies). The
test checks, through the router's own endpoints and audit file only, that the
worker leaves rotation, is restarted on a new URL and comes back healthy,
that the task that met the dead engine is resubmitted and completes, that
tasks submitted meanwhile complete on the other worker, that every task
reaches a terminal state, and the audit actions and their order. A worker
that hangs (plan `hang`, aimed at one worker with `{port}`) is taken out by
probe timeouts alone and restarted. Through start, ejection, restart and
recovery, every worker's state in ``/metrics`` agrees with ``/health``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import (
    ROUTER_START_TIMEOUT_S,
    ManagedProcess,
    http_get,
    router_servers,
    wait_both_in_rotation,
    wait_restarted,
    wait_until,
    worker_pids,
)
from mineru_health.settings import HealthSettings
from mineru_health.testing.faults import write_plan
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.integration

TASK_TIMEOUT_S = 120.0
RESTART_TIMEOUT_S = 180.0
MAX_PROBE_TASKS = 8  # tasks submitted at most until one hits the dead engine
FAST = HealthSettings.preset("fast")










def _metric_samples(base: str, name: str) -> list[Any]:
    response = http_get(f"{base}/metrics", 5.0)
    assert response is not None and response.status_code == 200
    return [
        sample
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
        if sample.name == name
    ]


def _metric_view(base: str) -> dict[str, tuple[str, int]]:
    """(state, consecutive failures) of every worker, as /metrics shows them."""
    states = {
        s.labels["worker"]: s.labels["state"]
        for s in _metric_samples(base, "mineru_router_worker_state")
        if s.value == 1
    }
    failures = {
        s.labels["worker"]: int(s.value)
        for s in _metric_samples(base, "mineru_router_worker_consecutive_failures")
    }
    return {worker: (state, failures.get(worker, -1)) for worker, state in states.items()}


def _agreed_states(base: str) -> dict[str, str]:
    """Every worker's state once /health, /metrics and /health again are read at one settled moment.

    A transition between the reads shows as two different /health answers:
    then it looks again (bounded). With /health unchanged around it, /metrics
    must say the same, and MinerU's ``healthy`` must be the policy's rotation.
    """
    seen: list[Any] = []

    def settled() -> dict[str, str] | None:
        before = router_servers(base)
        metric_view = _metric_view(base)
        after = router_servers(base)

        def view(servers: dict[str, dict[str, Any]]) -> dict[str, Any]:
            return {
                sid: (s["state"], s["consecutive_failures"], s["healthy"], s["in_rotation"])
                for sid, s in servers.items()
            }

        seen[:] = [view(before), metric_view, view(after)]
        if not before or view(before) != view(after):
            return None
        assert metric_view == {sid: v[:2] for sid, v in view(before).items()}, seen
        for sid, (state, _failures, healthy, in_rotation) in view(before).items():
            assert healthy == in_rotation == (state == "healthy"), (sid, seen)
        return {sid: v[0] for sid, v in view(before).items()}

    states = wait_until(settled, 30.0, 0.1)
    assert states, f"/health never settled around a /metrics scrape: {seen}"
    result: dict[str, str] = states
    return result


class RouterClient:
    def __init__(self, base: str, pdf: bytes, vlm_url: str) -> None:
        self.base = base
        self.pdf = pdf
        self.vlm_url = vlm_url

    def submit(self) -> str:
        response = httpx.post(
            f"{self.base}/tasks",
            files={"files": ("tiny.pdf", self.pdf, "application/pdf")},
            data={"backend": "vlm-http-client", "server_url": self.vlm_url},
            timeout=60.0,
        )
        assert response.status_code == 202, response.text
        task_id: str = response.json()["task_id"]
        return task_id

    def wait(self, task_id: str) -> dict[str, Any]:
        """Polls the router until the task is terminal; fails the test if it never is."""
        deadline = time.monotonic() + TASK_TIMEOUT_S
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            response = http_get(f"{self.base}/tasks/{task_id}", 10.0)
            if response is not None and response.status_code == 200:
                status = response.json()
                if status["status"] in ("completed", "failed"):
                    return status
            time.sleep(0.25)
        pytest.fail(f"task {task_id} hung: last status {status}")

    def run(self) -> dict[str, Any]:
        return self.wait(self.submit())


def _run_until_one_meets_the_dead_engine(client: RouterClient) -> dict[str, Any]:
    """Sequential tasks until one was resubmitted away from the dead engine; all complete."""
    for _ in range(MAX_PROBE_TASKS):
        status = client.run()
        assert status["status"] == "completed", status  # never lost to the dead engine
        if status["attempts"] > 1:
            return status
    pytest.fail("no task reached the dead engine")




@pytest.mark.parametrize("bad", ["timeout", "rules"])
def test_router_refuses_bad_config(
    bad: str,
    launch_router: Callable[..., ManagedProcess],
    tmp_path: Path,
) -> None:
    if bad == "timeout":
        env = {"MINERU_ROUTER_HEALTH_TIMEOUT_S": "five"}
        expected = "MINERU_ROUTER_HEALTH_TIMEOUT_S"
    else:
        rules = tmp_path / "rules.txt"
        rules.write_text("site.broken fatal engine_dead (unclosed\n", encoding="utf-8")
        env = {"MINERU_HEALTH_RULES": str(rules)}
        expected = f"{rules}:1"
    proc = launch_router(env)
    code = proc.wait(ROUTER_START_TIMEOUT_S)
    assert code is not None and code != 0, proc.log_tail()
    log = proc.log()
    assert expected in log
    assert "Start MinerU FastAPI Service" not in log  # no worker was spawned


def test_engine_death_is_ejected_restarted_and_tasks_complete(
    launch_router: Callable[..., ManagedProcess],
    fake_vlm_url: str,
    tiny_pdf: bytes,
    tmp_path: Path,
) -> None:
    audit_path = tmp_path / "audit.jsonl"
    plan = tmp_path / "fault-plan"
    proc = launch_router(
        {
            "MINERU_ROUTER_HEALTH_PRESET": "fast",
            "MINERU_ROUTER_HEALTH_AUDIT_PATH": str(audit_path),
            # Both workers inherit it; whichever reads the plan first consumes it.
            "MINERU_HEALTH_FAULT_PLAN": str(plan),
        },
    )
    base = proc.base_url

    wait_both_in_rotation(proc)
    first_urls = {sid: s["base_url"] for sid, s in router_servers(base).items()}
    for entry in router_servers(base).values():
        assert entry["state"] == "healthy" and entry["restartable"]
        assert entry["consecutive_failures"] == 0 and entry["restart_attempt"] == 0

    client = RouterClient(base, tiny_pdf, fake_vlm_url)
    assert client.run()["status"] == "completed"

    write_plan(plan, "engine_dead")
    assert wait_until(lambda: not plan.exists(), 60.0, 0.1), "no worker consumed the fault plan"

    # Sequential tasks until one lands on the dead engine (the router picks
    # the least loaded worker, ties at random). It does not fail: the router
    # resubmits it to the other worker under the same task id (issue 9).
    # Meanwhile the dead worker leaves rotation (at once, from the failed
    # task's status; the probes confirm it with the 503): looked for while the
    # tasks run, since on a loaded machine its restart can come first. How
    # fast it leaves is bench/recovery's to measure.
    def dead_worker() -> str | None:
        out = [sid for sid, s in router_servers(base).items() if not s["in_rotation"]]
        return out[0] if len(out) == 1 else None

    with ThreadPoolExecutor(max_workers=1) as pool:
        meeting = pool.submit(_run_until_one_meets_the_dead_engine, client)
        dead = wait_until(dead_worker, RESTART_TIMEOUT_S, 0.05)
        assert dead, router_servers(base)
        (other,) = [sid for sid in first_urls if sid != dead]
        assert router_servers(base)[other]["in_rotation"]
        met = meeting.result(timeout=RESTART_TIMEOUT_S)
    assert met["workers_tried"][1] != met["workers_tried"][0]

    # Tasks submitted while it is out or restarting all complete.
    with ThreadPoolExecutor(max_workers=4) as pool:
        statuses = list(pool.map(lambda _: client.run(), range(6)))
    assert [s["status"] for s in statuses] == ["completed"] * 6, statuses

    wait_restarted(proc, dead, first_urls[dead])
    entry = router_servers(base)[dead]
    assert entry["state"] == "healthy" and entry["restart_attempt"] == 0
    assert entry["next_restart_at"] is None and entry["last_error"] is None
    assert router_servers(base)[other]["base_url"] == first_urls[other]

    # Both serve again.
    with ThreadPoolExecutor(max_workers=4) as pool:
        statuses = list(pool.map(lambda _: client.run(), range(4)))
    assert all(s["status"] == "completed" for s in statuses), statuses

    records = [json.loads(line) for line in audit_path.read_text().splitlines()]
    # Both were admitted at start; then only the dead one changed.
    assert {r["worker_id"] for r in records if r["action"] != "admitted"} == {dead}, records
    story = [r for r in records if r["worker_id"] == dead][1:]  # after its own admission
    # A loaded machine can take longer than the stability window (fast preset:
    # 30 s) to finish the tasks above: then the restart was confirmed as well.
    if story and story[-1]["action"] == "auto_restart_success":
        story = story[:-1]
    assert [r["action"] for r in story] == [
        "ejected",
        "health_failed",
        "auto_restart_scheduled",
        "auto_restart_requested",
        "admitted",  # back in rotation; "auto_restart_success" after the stability window
    ]
    # The failed task's status or the engine_dead probe, whichever came first;
    # the reason names the rule, never the task's text.
    assert story[0]["cause"] in ("engine_dead", "passive_failure"), story[0]
    assert "EngineCore" not in story[0]["reason"] and "rule" in story[0]["reason"]
    assert [(r["from"], r["to"]) for r in story] == [
        ("healthy", "unhealthy"),
        ("unhealthy", "failed"),
        ("failed", "restart_scheduled"),
        ("restart_scheduled", "restarting"),
        ("restarting", "healthy"),
    ]
    metrics = http_get(f"{base}/metrics", 5.0)
    assert metrics is not None and metrics.status_code == 200
    assert "mineru_router_audit_events_total" in metrics.text


LOOP_HANG_S = 3.0


def _victim_story(audit_path: Path, victim: str) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in audit_path.read_text().splitlines()]
    return [r for r in records if r["worker_id"] == victim][1:]  # after its admission


def test_hung_loop_is_ejected_by_its_native_endpoint_and_restarted(
    launch_router: Callable[..., ManagedProcess],
    fake_vlm_url: str,
    tiny_pdf: bytes,
    tmp_path: Path,
) -> None:
    # The event loop stops for good: the main port answers nothing, the native
    # endpoint says loop_hung once the loop has been blocked past the limit.
    audit_path = tmp_path / "audit.jsonl"
    plans = tmp_path / "plans"
    plans.mkdir()
    proc = launch_router(
        {
            "MINERU_ROUTER_HEALTH_PRESET": "fast",
            "MINERU_ROUTER_HEALTH_AUDIT_PATH": str(audit_path),
            "MINERU_HEALTH_FAULT_PLAN": str(plans / "plan-{port}"),
            "MINERU_HEALTH_LOOP_HANG_S": str(LOOP_HANG_S),
        },
    )
    base = proc.base_url

    wait_both_in_rotation(proc)
    servers = router_servers(base)
    victim = min(servers)
    (other,) = [sid for sid in servers if sid != victim]
    victim_url = servers[victim]["base_url"]
    write_plan(plans / f"plan-{victim_url.rsplit(':', 1)[1]}", "hang")

    # Out of rotation within the hang limit plus one probe (interval + timeout).
    # (Generous slack: a loaded machine delays the probes; bench/recovery times it.)
    bound = LOOP_HANG_S + FAST.interval_s * 1.5 + FAST.probe_timeout_s + 30.0
    assert wait_until(lambda: not router_servers(base)[victim]["in_rotation"], bound, 0.1), (
        router_servers(base)
    )
    assert router_servers(base)[other]["in_rotation"]

    client = RouterClient(base, tiny_pdf, fake_vlm_url)
    statuses = [client.run()["status"] for _ in range(3)]
    assert statuses == ["completed"] * 3

    wait_restarted(proc, victim, victim_url)
    story = _victim_story(audit_path, victim)
    assert story[0]["action"] == "ejected" and story[0]["cause"] == "loop_hung", story
    assert "admitted" in [r["action"] for r in story]


def test_stopped_process_is_ejected_by_probe_timeouts_and_restarted(
    launch_router: Callable[..., ManagedProcess],
    fake_vlm_url: str,
    tiny_pdf: bytes,
    tmp_path: Path,
) -> None:
    # SIGSTOP: nothing in the process answers, its native endpoint included;
    # only probe timeouts can take it out.
    audit_path = tmp_path / "audit.jsonl"
    proc = launch_router(
        {
            "MINERU_ROUTER_HEALTH_PRESET": "fast",
            "MINERU_ROUTER_HEALTH_AUDIT_PATH": str(audit_path),
        },
    )
    base = proc.base_url

    wait_both_in_rotation(proc)
    servers = router_servers(base)
    victim = min(servers)
    (other,) = [sid for sid in servers if sid != victim]
    victim_url = servers[victim]["base_url"]
    (pid,) = worker_pids({victim_url.rsplit(":", 1)[1]})
    os.kill(pid, signal.SIGSTOP)
    try:
        bound = FAST.failure_threshold * (FAST.interval_s * 1.5 + FAST.probe_timeout_s) + 30.0
        assert wait_until(lambda: not router_servers(base)[victim]["in_rotation"], bound, 0.1), (
            router_servers(base)
        )
        assert router_servers(base)[other]["in_rotation"]
        client = RouterClient(base, tiny_pdf, fake_vlm_url)
        assert [client.run()["status"] for _ in range(2)] == ["completed"] * 2
        wait_restarted(proc, victim, victim_url)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    story = _victim_story(audit_path, victim)
    assert story[0]["action"] == "ejected" and story[0]["cause"] == "timeout", story


def test_metrics_agree_with_health_through_a_restart(
    launch_router: Callable[..., ManagedProcess],
    fake_vlm_url: str,
    tiny_pdf: bytes,
    tmp_path: Path,
) -> None:
    plan = tmp_path / "fault-plan"
    proc = launch_router(
        {
            "MINERU_ROUTER_HEALTH_PRESET": "fast",
            "MINERU_ROUTER_HEALTH_AUDIT_PATH": str(tmp_path / "audit.jsonl"),
            "MINERU_HEALTH_FAULT_PLAN": str(plan),
        },
    )
    base = proc.base_url

    # Start: in rotation is "healthy" in /metrics too.
    wait_both_in_rotation(proc)
    first_urls = {sid: s["base_url"] for sid, s in router_servers(base).items()}
    assert set(_agreed_states(base).values()) == {"healthy"}

    # Ejection: a task meets the dead engine (and is resubmitted). The worker is
    # looked for while the tasks run: on a loaded machine the resubmitted task
    # can take longer than the dead worker's restart.
    client = RouterClient(base, tiny_pdf, fake_vlm_url)
    write_plan(plan, "engine_dead")
    assert wait_until(lambda: not plan.exists(), 60.0, 0.1), "no worker consumed the fault plan"

    def dead_worker() -> str | None:
        out = [sid for sid, s in router_servers(base).items() if not s["in_rotation"]]
        return out[0] if len(out) == 1 else None

    with ThreadPoolExecutor(max_workers=1) as pool:
        met = pool.submit(_run_until_one_meets_the_dead_engine, client)
        dead = wait_until(dead_worker, RESTART_TIMEOUT_S, 0.05)
        assert dead, router_servers(base)
        (other,) = [sid for sid in first_urls if sid != dead]
        states = _agreed_states(base)
        assert states[other] == "healthy" and states[dead] != "healthy", states
        met.result(timeout=RESTART_TIMEOUT_S)

    # Restart: the new process boots for seconds, long enough to be seen.
    assert wait_until(
        lambda: router_servers(base)[dead]["state"] == "restarting", RESTART_TIMEOUT_S, 0.1
    ), router_servers(base)
    states = _agreed_states(base)
    assert states[dead] in ("restarting", "healthy"), states

    # Recovery.
    wait_restarted(proc, dead, first_urls[dead])
    assert _agreed_states(base) == {dead: "healthy", other: "healthy"}

    def counted(name: str, label: str) -> dict[str, float]:
        return {
            s.labels[label]: s.value
            for s in _metric_samples(base, name)
            if s.labels["worker"] == dead and s.value
        }

    # Started; "succeeded" comes once it stayed healthy for the stability window.
    assert counted("mineru_router_restarts_total", "outcome") == {"started": 1}
    ejections = counted("mineru_router_ejections_total", "reason")
    # The failed task's status or the engine_dead probe, whichever came first.
    assert sum(ejections.values()) == 1, ejections
    assert set(ejections) <= {"passive_failure", "engine_dead"}, ejections

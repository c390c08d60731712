"""``mineru-health demo``: the end-to-end run, as a user starts it; its summary, marks and outcomes."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from mineru_health import demo
from mineru_health.demo.context import DemoContext
from mineru_health.demo.scenarios import GaveUp, NoRestart, Recovered, Verdict
from mineru_health.demo.timeline import Timeline
from mineru_health.demo.watchers import on_audit_line

MINERU_PYTHON = os.environ.get("MINERU_HEALTH_MINERU_PYTHON") or sys.executable


def _mineru_importable() -> bool:
    try:
        done = subprocess.run(
            [MINERU_PYTHON, "-c", "import mineru.cli.router, mineru.cli.fast_api"],
            capture_output=True,
            timeout=180,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@pytest.mark.integration
def test_engine_death_demo_recovers() -> None:
    if not _mineru_importable():
        pytest.skip(f"MinerU is not importable by {MINERU_PYTHON}")
    done = subprocess.run(
        [sys.executable, "-m", "mineru_health", "demo", "--scenario", "engine-death", "--json"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    summary = json.loads(done.stdout)
    assert summary["outcome"] == "pass"
    assert summary["scenario"] == "engine-death"
    times = summary["times_s"]
    # The order the health loop promises: fault, out of rotation, restart, back.
    assert times["fault_injected"] is not None
    assert times["out_of_rotation"] is not None
    assert times["restart_scheduled"] is not None
    assert times["back_in_rotation"] is not None
    assert (
        times["fault_injected"]
        <= times["out_of_rotation"]
        <= times["restart_scheduled"]
        <= times["back_in_rotation"]
    )
    assert summary["detection_s"] is not None and summary["recovery_s"] is not None
    assert summary["restart_attempts"] >= 1
    tasks = summary["tasks"]
    assert tasks["completed"] >= 3
    assert tasks["failed"] == 0  # the task that met the dead engine was resubmitted
    actions = {
        e["text"].split(": ", 1)[1].split(" ", 1)[0]
        for e in summary["timeline"]
        if e["source"] == "audit" and ": " in e["text"]
    }
    assert {"auto_restart_scheduled", "auto_restart_requested", "admitted"} <= actions
    assert any(
        name.startswith("mineru_router_restarts_total") for name in summary["router_metrics"]
    )


def _summary(**overrides: object) -> dict[str, object]:
    summary: dict[str, object] = {
        "scenario": "engine-death",
        "expected": "recovered",
        "outcome": "pass",
        "reason": "restarted and back in rotation",
        "victim": "local-gpu-1",
        "detection_s": 0.84,
        "recovery_s": 9.5,
        "restart_attempts": 1,
        "failed_restarts": 0,
        "tasks": {
            "submitted": 40,
            "completed": 36,
            "failed": 2,
            "hung": 0,
            "rejected": 0,
            "completed_while_victim_out": 12,
        },
        "router_metrics": {'mineru_router_restarts_total{outcome="succeeded"}': 1.0},
    }
    summary.update(overrides)
    return summary


def test_summary_table_lists_the_measurements() -> None:
    table = demo.render_summary(_summary())
    assert "detection (fault -> out of rotation)" in table and "0.84s" in table
    assert "time to recovery" in table and "9.50s" in table
    assert "36 (12 while the victim was out)" in table
    assert "PASS: restarted and back in rotation" in table
    assert 'mineru_router_restarts_total{outcome="succeeded"}' in table


def test_summary_table_shows_missing_times_and_failure() -> None:
    table = demo.render_summary(
        _summary(outcome="fail", reason="no restart", detection_s=None, recovery_s=None)
    )
    assert "FAIL: no restart" in table
    assert "  -" in table


def test_every_scenario_has_a_known_expectation() -> None:
    assert set(demo.SCENARIOS) == {"engine-death", "hung-worker", "crash-loop", "task-local"}
    for scenario in demo.SCENARIOS.values():
        assert scenario.expect in {"recovered", "gave_up", "no_restart"}
        assert scenario.observe_s > 0


def test_bad_rate_is_refused_without_starting_anything() -> None:
    assert demo.main(["--rate", "0"]) == demo.EXIT_SETUP_FAILED


# --- the parts, without processes ------------------------------------------------------


def _context(scenario: str, tmp_path: Path) -> DemoContext:
    ctx = DemoContext(
        demo.SCENARIOS[scenario], rate=2.0, timeout_s=60.0, timeline=Timeline(None, io.StringIO())
    )
    ctx.tmp = tmp_path
    ctx.victim, ctx.other = "local-gpu-1", "local-gpu-0"
    return ctx


def _audit_line(ctx: DemoContext, t: float, action: str, worker: str = "local-gpu-1") -> str:
    when = datetime.fromtimestamp(ctx.timeline.wall0 + t, tz=timezone.utc).isoformat()
    record = {"time": when, "worker_id": worker, "action": action, "attempt": 0,
              "reason": "r", "from": "healthy", "to": "unhealthy"}
    return json.dumps(record)


def test_audit_lines_mark_the_victim_s_story(tmp_path: Path) -> None:
    ctx = _context("engine-death", tmp_path)
    on_audit_line(ctx, _audit_line(ctx, 0.5, "ejected"))  # before the fault: shown, not marked
    ctx.marks.fault_at = 1.0
    for t, action in ((2.0, "ejected"), (2.0, "health_failed"), (2.1, "auto_restart_scheduled"),
                      (9.0, "admitted")):
        on_audit_line(ctx, _audit_line(ctx, t, action))
    on_audit_line(ctx, _audit_line(ctx, 3.0, "ejected", worker="local-gpu-0"))
    on_audit_line(ctx, "not json")
    m = ctx.marks
    assert (m.out_of_rotation_at, m.restart_scheduled_at, m.back_in_rotation_at) == pytest.approx(
        (2.0, 2.1, 9.0), abs=1e-3
    )
    assert m.restart_attempts == 1 and m.victim_actions[0] == "ejected"
    texts = [e.text for e in ctx.timeline.events]
    assert "not json" in texts
    assert any(t.startswith("local-gpu-0: ejected") for t in texts)


def test_each_scenario_has_its_own_outcome_object() -> None:
    kinds = {name: type(s.outcome) for name, s in demo.SCENARIOS.items()}
    assert kinds == {"engine-death": Recovered, "hung-worker": Recovered, "crash-loop": GaveUp,
                     "task-local": NoRestart}


def test_outcomes_judge_from_what_the_watchers_saw(tmp_path: Path) -> None:
    async def judge() -> None:
        ctx = _context("engine-death", tmp_path)
        ctx.marks.back_in_rotation_at = 9.0
        ctx.servers[ctx.victim] = {"completed_tasks": 2, "healthy": True}
        assert await Recovered().judge(ctx) == Verdict(True, "restarted and back in rotation")

        ctx = _context("crash-loop", tmp_path)
        ctx.marks.out_of_rotation_at, ctx.marks.gave_up_at = 2.0, 30.0
        ctx.marks.failed_restarts = 3
        assert await GaveUp().judge(ctx) == Verdict(True, "gave up after 3 failed restart(s)")
        assert "broken.rule" in (tmp_path / "rules.txt").read_text()

        ctx = _context("task-local", tmp_path)
        ctx.marks.first_failed_task_at = 3.0
        ctx.servers[ctx.victim] = {"healthy": True}
        verdict = await NoRestart(settle_s=0.0).judge(ctx)
        assert verdict.ok, verdict
        ctx.marks.victim_actions.append("ejected")
        verdict = await NoRestart(settle_s=0.0).judge(ctx)
        assert not verdict.ok and "acted on a task-local failure" in verdict.reason

        ctx = _context("engine-death", tmp_path)
        ctx.scenario = dataclasses.replace(ctx.scenario, observe_s=0.3)
        verdict = await Recovered().judge(ctx)
        assert verdict == Verdict(False, "local-gpu-1 did not come back within 0s")

    asyncio.run(judge())

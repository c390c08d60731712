"""``mineru-health demo``: the end-to-end run, as a user starts it, and its summary table."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from mineru_health import demo

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
    assert tasks["failed"] >= 1  # the task that met the dead engine
    actions = {
        e["text"].split(": ", 1)[1].split(" ", 1)[0]
        for e in summary["timeline"]
        if e["source"] == "audit" and ": " in e["text"]
    }
    assert {"auto_restart_scheduled", "auto_restart_success"} <= actions
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

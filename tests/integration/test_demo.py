"""``mineru-health demo``: the end-to-end run, as a user starts it; its summary, marks and outcomes."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from mineru_health import demo
from mineru_health.demo import engine as demo_engine
from mineru_health.demo.fleet import LINE3, LINE4, Line


@pytest.mark.integration
def test_engine_death_demo_recovers(mineru_python: str) -> None:  # skips without MinerU
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


def test_summary_table_says_how_the_engine_died() -> None:
    injected = demo.render_summary(_summary(engine="injected"))
    assert re.search(r"^fault +injected by the fault plugin$", injected, re.MULTILINE), injected
    real = demo.render_summary(_summary(engine=demo.LLAMA))
    assert "a real llama.cpp engine, closed under running jobs" in real


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
        assert "3" in scenario.plans  # every scenario runs on 3.x; crash-loop only there
    assert {n for n, s in demo.SCENARIOS.items() if "4.0" in s.plans} == {
        "engine-death", "hung-worker", "task-local"}


def test_bad_rate_is_refused_without_starting_anything() -> None:
    assert demo.main(["--rate", "0"]) == demo.EXIT_SETUP_FAILED


# --- the parts, without processes ------------------------------------------------------


def _demo(scenario: str, tmp_path: Path) -> demo.Demo:
    run = demo.Demo(demo.SCENARIOS[scenario], LINE3, scratch=tmp_path, rate=2.0, timeout_s=60.0,
                    out=io.StringIO(), err=io.StringIO())
    run.victim = "local-gpu-1"
    return run


def _audit_line(run: demo.Demo, t: float, action: str, worker: str = "local-gpu-1") -> str:
    when = datetime.fromtimestamp(run.wall0 + t, tz=timezone.utc).isoformat()
    record = {"time": when, "worker_id": worker, "action": action, "attempt": 0,
              "reason": "r", "from": "healthy", "to": "unhealthy"}
    return json.dumps(record)


def test_audit_lines_mark_the_victim_s_story(tmp_path: Path) -> None:
    run = _demo("engine-death", tmp_path)
    run.on_audit_line(_audit_line(run, 0.5, "ejected"))  # before the fault: shown, not marked
    run.marks["fault_injected"] = 1.0
    for t, action in ((2.0, "ejected"), (2.0, "health_failed"), (2.1, "auto_restart_scheduled"),
                      (9.0, "admitted")):
        run.on_audit_line(_audit_line(run, t, action))
    run.on_audit_line(_audit_line(run, 3.0, "ejected", worker="local-gpu-0"))
    run.on_audit_line("not json")
    m = run.marks
    assert (m["out_of_rotation"], m["restart_scheduled"], m["back_in_rotation"]) == pytest.approx(
        (2.0, 2.1, 9.0), abs=1e-3
    )
    assert run.restart_attempts == 1 and run.actions_after_fault[0] == ("local-gpu-1", "ejected")
    texts = [e["text"] for e in run.events]
    assert "not json" in texts
    assert any(t.startswith("local-gpu-0: ejected") for t in texts)


def test_a_shared_fault_plan_makes_the_first_ejected_worker_the_victim(tmp_path: Path) -> None:
    run = _demo("engine-death", tmp_path)
    run.victim = ""  # 4.0: the workers share one plan
    run.marks["fault_injected"] = 1.0
    run.on_audit_line(_audit_line(run, 2.0, "ejected", worker="local-gpu-0"))
    assert run.victim == "local-gpu-0" and run.marks["out_of_rotation"] == pytest.approx(2.0)


def test_each_scenario_expects_its_own_outcome() -> None:
    kinds = {name: s.expect for name, s in demo.SCENARIOS.items()}
    assert kinds == {"engine-death": "recovered", "hung-worker": "recovered",
                     "crash-loop": "gave_up", "task-local": "no_restart"}


def test_outcomes_judge_from_what_the_watcher_saw(tmp_path: Path) -> None:
    run = _demo("engine-death", tmp_path)
    run.marks["back_in_rotation"] = 9.0
    run.servers[run.victim] = {"completed_tasks": 2, "healthy": True}
    assert run.judge() == (True, "restarted and back in rotation")

    run = _demo("crash-loop", tmp_path)
    run.marks["out_of_rotation"], run.marks["gave_up"] = 2.0, 30.0
    run.failed_restarts = 3
    assert run.judge() == (True, "gave up after 3 failed restart(s)")
    assert "broken.rule" in (tmp_path / "rules.txt").read_text()

    run = _demo("task-local", tmp_path)
    run.settle_s = 0.0
    run.marks["first_failed_task"] = 3.0
    ok, reason = run.judge()
    assert ok, reason
    run.actions_after_fault.append(("local-gpu-1", "ejected"))
    ok, reason = run.judge()
    assert not ok and "acted on a task-local failure" in reason

    run = _demo("engine-death", tmp_path)
    run.scenario = demo.Scenario("engine-death", {"3": "engine_dead"}, "", "recovered", 0.3)
    assert run.judge() == (False, "local-gpu-1 did not come back within 0s")


# --- how the engine dies: a real llama.cpp engine where MinerU's Python can, else injected ---


@pytest.mark.parametrize(
    ("choice", "line", "scenario", "lacking", "engine"),
    [
        ("auto", LINE4, "engine-death", [], demo.LLAMA),
        ("llama", LINE4, "engine-death", [], demo.LLAMA),
        ("injected", LINE4, "engine-death", [], demo.INJECTED),
        ("auto", LINE4, "engine-death", ["gguf", "onnx"], demo.INJECTED),
        ("auto", LINE4, "hung-worker", [], demo.INJECTED),
        ("auto", LINE3, "engine-death", [], demo.INJECTED),
    ],
)
def test_the_engine_dies_for_real_where_it_can(
    choice: str, line: Line, scenario: str, lacking: list[str], engine: str
) -> None:
    chosen, note = demo.choose_engine(choice, line, demo.SCENARIOS[scenario], lambda: lacking)
    assert chosen == engine
    if lacking:  # the fallback says so, and what to install
        assert "lacks gguf, onnx" in note and "pip install gguf onnx" in note
        assert "injecting llama.cpp's EngineError" in note
    else:
        assert note == ""


@pytest.mark.parametrize(
    ("line", "scenario", "lacking", "said"),
    [
        (LINE4, "engine-death", ["mineru_llama_cpp"], "lacks mineru_llama_cpp"),
        (LINE4, "task-local", [], "engine-death scenario on MinerU 4.0 only"),
        (LINE3, "engine-death", [], "engine-death scenario on MinerU 4.0 only"),
    ],
)
def test_a_real_engine_asked_for_and_not_had_is_a_setup_error(
    line: Line, scenario: str, lacking: list[str], said: str
) -> None:
    with pytest.raises(demo.SetupError, match=said):
        demo.choose_engine("llama", line, demo.SCENARIOS[scenario], lambda: lacking)


class _Router:
    fault_plan = "plan"

    def __init__(self) -> None:
        self.plans: list[tuple[str, str]] = []

    def write_plan(self, word: str, worker_url: str = "") -> None:
        self.plans.append((word, worker_url))


def test_the_injected_engine_death_writes_llama_s_fault_plan(tmp_path: Path) -> None:
    """The fallback's fault (the end-to-end demo on 4.0 runs the real engine)."""
    run = demo.Demo(demo.SCENARIOS["engine-death"], LINE4, scratch=tmp_path, rate=1.0,
                    timeout_s=60.0, out=io.StringIO(), err=io.StringIO(),
                    note="no real engine: ...")
    run.router = _Router()
    run._inject()
    assert run.router.plans == [("llama_engine_dead", "")]
    assert run.marks["fault_injected"] is not None
    assert run.summary(demo.EXIT_OK, "ok")["engine"] == demo.INJECTED


def test_the_real_engine_death_arms_the_switch(tmp_path: Path) -> None:
    run = demo.Demo(demo.SCENARIOS["engine-death"], LINE4, scratch=tmp_path, rate=1.0,
                    timeout_s=60.0, out=io.StringIO(), err=io.StringIO(), engine=demo.LLAMA)
    run.real = demo_engine.RealEngine(tmp_path / "home", tmp_path / "close-engine", {})
    run.router = _Router()
    run._inject()
    assert run.router.plans == [] and (tmp_path / "close-engine").exists()
    assert run.real.env[demo_engine.ARM_ENV] == str(tmp_path / "close-engine")
    assert "Engine.close()" in run.events[-1]["text"]


def test_the_switch_loader_joins_the_fault_plugin_s_once(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("# the fault plugin's loader\n", encoding="utf-8")
    for _ in range(2):
        demo_engine.install_into_site(tmp_path)
    text = (tmp_path / "sitecustomize.py").read_text(encoding="utf-8")
    assert text.startswith("# the fault plugin's loader\n")
    assert text.count("mineru_health.demo.engine.engine_switch.load()") == 1
    compile(text, "sitecustomize.py", "exec")

"""``mineru-health demo``: the end-to-end run as a user starts it; summary, marks, outcomes."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from mineru_health import demo
from mineru_health.demo import accounting
from mineru_health.demo import engine as demo_engine
from mineru_health.demo.fleet import LINE3, LINE4, Line, Outcome, Stream, Unfinished
from mineru_health.demo.sandbox import wait_until


@pytest.mark.integration
def test_engine_death_demo_recovers(mineru_python: str) -> None:  # skips without MinerU
    done = subprocess.run(
        [sys.executable, "-m", "mineru_health", "demo", "--scenario", "engine-death", "--json"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    summary = _verdict_first(done)
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
    _assert_every_document_ended(summary)
    actions = {
        e["text"].split(": ", 1)[1].split(" ", 1)[0]
        for e in summary["timeline"]
        if e["source"] == "audit" and ": " in e["text"]
    }
    assert {"auto_restart_scheduled", "auto_restart_requested", "admitted"} <= actions
    assert any(
        name.startswith("mineru_router_restarts_total") for name in summary["router_metrics"]
    )


def _verdict_first(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The demo's JSON summary, once it passed; if not, its verdict and tally say why first
    (the JSON's tail is only the timeline's end)."""
    try:
        summary: dict[str, Any] = json.loads(done.stdout)
    except ValueError:
        summary = {}
    told = {k: summary.get(k) for k in ("outcome", "reason", "exit_code", "tasks")}
    assert done.returncode == 0, f"{told}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return summary


def _assert_every_document_ended(summary: dict[str, Any]) -> None:
    """A PASS accounts for every document sent, and none was left queued, running or hung; the
    stream never had more in flight than its limit."""
    tasks = summary["tasks"]
    assert summary["outcome"] == "pass" and summary["exit_code"] == 0
    assert tasks["submitted"] == tasks["completed"] + tasks["failed"] + tasks["rejected"], tasks
    assert tasks["queued"] == tasks["running"] == tasks["hung"] == 0, tasks
    assert tasks["unfinished"] == [] and tasks["failed_without_reason"] == 0, tasks
    assert 1 <= tasks["most_in_flight"] <= tasks["in_flight_limit"], tasks


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
            "completed": 38,
            "failed": 2,
            "rejected": 0,
            "queued": 0,
            "running": 0,
            "hung": 0,
            "result_bound_s": 60.0,
            "failures": [{"number": 7, "status": "failed", "reason": "corrupt PDF"}],
            "completed_while_victim_out": 12,
            "in_flight_limit": 8,
            "most_in_flight": 8,
            "elapsed_s": 41.0,
        },
        "router_metrics": {'mineru_router_restarts_total{outcome="succeeded"}': 1.0},
    }
    summary.update(overrides)
    return summary


def test_summary_table_lists_the_measurements() -> None:
    table = demo.render_summary(_summary())
    assert "detection (fault -> out of rotation)" in table and "0.84s" in table
    assert "time to recovery" in table and "9.50s" in table
    assert "38 (12 while the victim was out)" in table
    assert re.search(r"^tasks failed +2 \(#7 failed: corrupt PDF\)$", table, re.MULTILINE), table
    assert re.search(
        r"^documents in flight +at most 8 \(the most at once: 8\)$", table, re.MULTILINE
    ), table
    for row in (
        "tasks queued at the end (waiting for a slot)",
        "tasks running at the end",
        "tasks hung (started, no result in 60s)",
    ):
        assert re.search(rf"^{re.escape(row)}.* 0$", table, re.MULTILINE), (row, table)
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
        "engine-death",
        "hung-worker",
        "task-local",
    }


def test_summary_table_says_inconclusive() -> None:
    table = demo.render_summary(_summary(outcome="inconclusive", reason="too slow"))
    assert re.search(r"^result +INCONCLUSIVE: too slow$", table, re.MULTILINE), table


def test_bad_rate_or_in_flight_is_refused_without_starting_anything() -> None:
    assert demo.main(["--rate", "0"]) == demo.EXIT_SETUP_FAILED
    assert demo.main(["--in-flight", "0"]) == demo.EXIT_SETUP_FAILED


# --- the parts, without processes ------------------------------------------------------


def _demo(scenario: str, tmp_path: Path) -> demo.Demo:
    run = demo.Demo(
        demo.SCENARIOS[scenario],
        LINE3,
        scratch=tmp_path,
        rate=2.0,
        timeout_s=60.0,
        out=io.StringIO(),
        err=io.StringIO(),
    )
    run.victim = "local-gpu-1"
    return run


def _audit_line(run: demo.Demo, t: float, action: str, worker: str = "local-gpu-1") -> str:
    when = datetime.fromtimestamp(run.wall0 + t, tz=timezone.utc).isoformat()
    record = {
        "time": when,
        "worker_id": worker,
        "action": action,
        "attempt": 0,
        "reason": "r",
        "from": "healthy",
        "to": "unhealthy",
    }
    return json.dumps(record)


def test_audit_lines_mark_the_victim_s_story(tmp_path: Path) -> None:
    run = _demo("engine-death", tmp_path)
    run.on_audit_line(_audit_line(run, 0.5, "ejected"))  # before the fault: shown, not marked
    run.marks["fault_injected"] = 1.0
    for t, action in (
        (2.0, "ejected"),
        (2.0, "health_failed"),
        (2.1, "auto_restart_scheduled"),
        (9.0, "admitted"),
    ):
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
    assert kinds == {
        "engine-death": "recovered",
        "hung-worker": "recovered",
        "crash-loop": "gave_up",
        "task-local": "no_restart",
    }


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


@pytest.mark.parametrize(
    ("choice", "line", "scenario", "vllm_lacking", "engine"),
    [
        ("auto", LINE3, "engine-death", [], demo.VLLM),  # vLLM first, wherever it is found
        ("auto", LINE4, "engine-death", [], demo.VLLM),
        ("vllm", LINE3, "engine-death", [], demo.VLLM),
        ("auto", LINE4, "engine-death", ["vllm"], demo.LLAMA),
        ("auto", LINE3, "engine-death", ["vllm", "torch"], demo.INJECTED),
        ("auto", LINE3, "task-local", [], demo.INJECTED),
        ("injected", LINE3, "engine-death", [], demo.INJECTED),
    ],
)
def test_a_real_vllm_engine_dies_where_mineru_has_vllm(
    choice: str, line: Line, scenario: str, vllm_lacking: list[str], engine: str
) -> None:
    chosen, note = demo.choose_engine(
        choice, line, demo.SCENARIOS[scenario], list, lambda: vllm_lacking
    )
    assert (chosen, note) == (engine, "")


@pytest.mark.parametrize(
    ("scenario", "vllm_lacking", "said"),
    [
        ("engine-death", ["vllm"], "lacks vllm .pip install vllm"),
        ("task-local", [], "dies in the engine-death scenario"),
    ],
)
def test_a_vllm_engine_asked_for_and_not_had_is_a_setup_error(
    scenario: str, vllm_lacking: list[str], said: str
) -> None:
    with pytest.raises(demo.SetupError, match=said):
        demo.choose_engine("vllm", LINE3, demo.SCENARIOS[scenario], list, lambda: vllm_lacking)


class _Router:
    fault_plan = "plan"

    def __init__(self) -> None:
        self.plans: list[tuple[str, str]] = []

    def write_plan(self, word: str, worker_url: str = "") -> None:
        self.plans.append((word, worker_url))


def test_the_injected_engine_death_writes_llama_s_fault_plan(tmp_path: Path) -> None:
    """The fallback's fault (the end-to-end demo on 4.0 runs the real engine)."""
    run = demo.Demo(
        demo.SCENARIOS["engine-death"],
        LINE4,
        scratch=tmp_path,
        rate=1.0,
        timeout_s=60.0,
        out=io.StringIO(),
        err=io.StringIO(),
        note="no real engine: ...",
    )
    run.router = _Router()
    run._inject()
    assert run.router.plans == [("llama_engine_dead", "")]
    assert run.marks["fault_injected"] is not None
    assert run.summary(demo.EXIT_OK, "ok")["engine"] == demo.INJECTED


def test_the_real_engine_death_arms_the_switch(tmp_path: Path) -> None:
    run = demo.Demo(
        demo.SCENARIOS["engine-death"],
        LINE4,
        scratch=tmp_path,
        rate=1.0,
        timeout_s=60.0,
        out=io.StringIO(),
        err=io.StringIO(),
        engine=demo.LLAMA,
    )
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


# --- every document accounted for: the paced stream, the tally, the verdict ----------------


class _Slots:
    """A job API whose tasks stay where the test puts them (a Stream's client, no processes)."""

    line = LINE3

    def __init__(self) -> None:
        self.states: dict[str, str] = {}

    def submit(self, name: str, pdf: bytes) -> tuple[str, dict[str, Any]]:
        self.states.setdefault(name, "pending")
        return name, {}

    def status(self, task_id: str) -> dict[str, Any]:
        return {"status": self.states[task_id], "error": "corrupt PDF"}


def test_a_paced_stream_sends_the_next_document_only_when_one_ends() -> None:
    jobs = _Slots()
    client: Any = jobs
    with Stream(
        client,
        lambda n: (f"d{n}", b"%PDF-"),
        every_s=0.001,
        task_timeout_s=None,
        poll_s=0.01,
        in_flight=2,
    ) as stream:
        jobs.states["d0"] = "processing"
        seen = ["processing", "pending"]
        assert wait_until(lambda: [d.status for d in stream.unfinished()] == seen, 10, 0.01)
        assert stream.submitted == 2  # the feeder ran many times meanwhile: it waits
        jobs.states["d0"] = "completed"
        assert wait_until(lambda: stream.submitted == 3, 10, 0.01)
        jobs.states["d1"] = "failed"
        assert wait_until(lambda: stream.submitted == 4, 10, 0.01)
        stream.stop()
        ended, left = stream.ended(), stream.unfinished()
    assert stream.most_in_flight == 2
    assert [(o.number, o.status) for o in ended] == [(0, "completed"), (1, "failed")]
    assert all(o.elapsed_s is not None for o in ended)
    assert [(d.number, d.running_s) for d in left] == [(2, None), (3, None)]  # never started
    tally = accounting.account(ended, left)
    assert (tally.submitted, tally.completed, tally.failed, tally.queued) == (4, 1, 1, 2)
    assert tally.failures == [{"number": 1, "status": "failed", "reason": "corrupt PDF"}]


def _outcome(number: int, status: str, elapsed_s: float = 2.0, **detail: Any) -> Outcome:
    return Outcome(f"d{number}", status, f"t{number}", detail, number, elapsed_s)


def _left(number: int, running_s: float | None) -> Unfinished:
    return Unfinished(
        number,
        f"d{number}",
        "pending" if running_s is None else "processing",
        waited_s=(running_s or 0) + 5,
        running_s=running_s,
    )


def test_each_document_is_in_exactly_one_place() -> None:
    ended = [
        _outcome(0, "completed", 30.0),
        _outcome(1, "failed", error="corrupt PDF"),
        _outcome(2, "rejected", body="no healthy worker"),
        _outcome(
            3,
            "partial",
            files=[
                {
                    "error": {
                        "type": "engine_error",
                        "code": "parse_failed",
                        "message": "page 2: engine dead",
                    }
                }
            ],
        ),
    ]
    tally = accounting.account(ended, [_left(4, None), _left(5, 10.0), _left(6, 200.0)])
    assert tally.bound_s == 90.0  # three times the slowest completed document (above 60 s)
    assert (tally.completed, tally.failed, tally.rejected) == (1, 2, 1)
    assert (tally.queued, tally.running, tally.hung, tally.unexplained) == (1, 1, 1, 0)
    assert tally.submitted == tally.ended + tally.unfinished == 7
    assert [f["reason"] for f in tally.failures] == [
        "corrupt PDF",
        "no healthy worker",
        "parse_failed: page 2: engine dead",
    ]
    assert [d["where"] for d in tally.stuck] == ["queued", "running", "hung"]
    assert accounting.result_bound([_outcome(0, "completed", 1.0)]) == accounting.RESULT_BOUND_S


STORY = (True, "restarted and back in rotation")


@pytest.mark.parametrize(
    ("story", "ended", "left", "outcome", "said"),
    [
        (
            STORY,
            [_outcome(0, "completed"), _outcome(1, "failed", error="bad")],
            [],
            accounting.PASS,
            "restarted and back in rotation",
        ),
        # Unfinished documents never pass: a slow machine is inconclusive ...
        (
            STORY,
            [_outcome(0, "completed")],
            [_left(1, None), _left(2, 5.0)],
            accounting.INCONCLUSIVE,
            (
                "this machine completed 1 documents in 50s, too slow for "
                "the scenario (1 still queued, 1 still running); nothing "
                "failed"
            ),
        ),
        (
            STORY,
            [_outcome(0, "completed"), _outcome(1, "failed", error="bad")],
            [_left(2, None)],
            accounting.INCONCLUSIVE,
            "1 failed or refused, each for a stated reason",
        ),
        (
            (None, "only 1 document(s) completed in 120s: no fault"),
            [_outcome(0, "completed")],
            [_left(1, None)],
            accounting.INCONCLUSIVE,
            "too slow for the scenario",
        ),
        # ... a document started and never finished, or one failed for no stated reason, fails.
        (
            STORY,
            [_outcome(0, "completed")],
            [_left(1, 61.0), _left(2, None)],
            accounting.FAIL,
            "1 document(s) hung: started, no result within 60s",
        ),
        (
            STORY,
            [_outcome(0, "completed"), _outcome(1, "failed")],
            [],
            accounting.FAIL,
            "1 document(s) failed without a stated reason",
        ),
        (
            (False, "local-gpu-1 did not come back within 120s"),
            [_outcome(0, "completed")],
            [],
            accounting.FAIL,
            "did not come back",
        ),
    ],
)
def test_no_pass_unless_every_document_ended(
    story: tuple[bool | None, str],
    ended: list[Outcome],
    left: list[Unfinished],
    outcome: str,
    said: str,
) -> None:
    got, reason = accounting.run_outcome(story, accounting.account(ended, left), 50.0)
    assert got == outcome and said in reason, (got, reason)


def test_a_stalled_fleet_is_not_a_slow_one() -> None:
    """Documents waiting while nothing ran or ended for a bound: FAIL, not INCONCLUSIVE."""
    ended, left = [_outcome(0, "completed")], [_left(1, None), _left(2, None)]
    stalled = accounting.account(ended, left, idle_s=61.0)
    got, reason = accounting.run_outcome(STORY, stalled, 50.0)
    assert got == accounting.FAIL and "the fleet stalled: 2 document(s) queued" in reason
    moving = accounting.account(ended, [*left, _left(3, 5.0)], idle_s=61.0)  # one runs
    assert accounting.run_outcome(STORY, moving, 50.0)[0] == accounting.INCONCLUSIVE

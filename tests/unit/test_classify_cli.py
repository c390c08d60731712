"""``mineru-health classify`` and ``mineru-health rules``."""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path

from conftest import run_cli
from mineru_health.testing.faults import ENGINE_DEAD_MESSAGE, make_engine_dead_error

FATAL_TEXT = f"vllm.v1.engine.exceptions.EngineDeadError: {ENGINE_DEAD_MESSAGE}\n"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MINERU_HEALTH_RULES"}
    env.update(extra)
    return env


def test_fatal_from_stdin_exits_1() -> None:
    result = run_cli("classify", input_text=FATAL_TEXT, env=_env())
    assert result.returncode == 1, result.stderr
    assert result.stdout.startswith("fatal")
    assert "rule:" in result.stdout


def test_task_local_exits_0_json() -> None:
    result = run_cli("classify", "--json", input_text="ValueError: not a pdf\n", env=_env())
    assert result.returncode == 0
    body = json.loads(result.stdout)
    assert body["fatal"] is False and body["kind"] == "task_local"


def test_full_traceback_file(tmp_path: Path) -> None:
    try:
        try:
            raise make_engine_dead_error()
        except Exception as inner:
            raise RuntimeError("parse failed") from inner
    except RuntimeError as exc:
        text = "".join(traceback.format_exception(exc))
    trace = tmp_path / "trace.txt"
    trace.write_text(text, encoding="utf-8")
    result = run_cli("classify", str(trace), "--json", env=_env())
    assert result.returncode == 1
    body = json.loads(result.stdout)
    assert body["frame"]["type_name"] == "EngineDeadError"
    assert body["frame"]["module"] == "vllm.v1.engine.exceptions"
    assert body["frame_index"] == 1


def test_rules_file_changes_the_verdict(tmp_path: Path) -> None:
    rules = tmp_path / "r.rules"
    rules.write_text("site.gpu fatal gpu widget\\s+fell\\s+off\n", encoding="utf-8")
    assert run_cli("classify", input_text="widget fell off the shelf", env=_env()).returncode == 0
    via_flag = run_cli("classify", "--rules", str(rules), input_text="widget fell off the shelf",
                       env=_env())
    assert via_flag.returncode == 1
    via_env = run_cli("classify", input_text="widget fell off the shelf",
                      env=_env(MINERU_HEALTH_RULES=str(rules)))
    assert via_env.returncode == 1


def test_bad_rules_file_is_an_error(tmp_path: Path) -> None:
    rules = tmp_path / "bad.rules"
    rules.write_text("broken fatal c (\n", encoding="utf-8")
    result = run_cli("classify", input_text="x", env=_env(MINERU_HEALTH_RULES=str(rules)))
    assert result.returncode == 2
    assert str(rules) in result.stderr and "broken" in result.stderr


def test_rules_listing_and_check(tmp_path: Path) -> None:
    listing = run_cli("rules", "--json", env=_env())
    assert listing.returncode == 0
    body = json.loads(listing.stdout)
    assert body["sources"] == ["<builtin>"]
    assert {r["kind"] for r in body["rules"]} == {
        "fatal", "heuristic", "task_local", "generic", "ambiguous"}
    plain = run_cli("rules", env=_env())
    assert plain.returncode == 0 and plain.stdout.startswith("#")

    good = tmp_path / "good.rules"
    good.write_text("# mine\nmine.one task_local mine hello\n", encoding="utf-8")
    checked = run_cli("rules", "--check", str(good), "--json", env=_env())
    assert checked.returncode == 0
    assert json.loads(checked.stdout)["rules"] == 1

    bad = tmp_path / "bad.rules"
    bad.write_text("only-two-fields fatal\n", encoding="utf-8")
    refused = run_cli("rules", "--check", str(bad), env=_env())
    assert refused.returncode == 2
    assert f"{bad}:1" in refused.stderr

"""``mineru-health classify`` and ``mineru-health rules``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
from conftest import run_cli
from mineru_health.demo.faults import ENGINE_DEAD_MESSAGE, make_engine_dead_error

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
    via_flag = run_cli(
        "classify", "--rules", str(rules), input_text="widget fell off the shelf", env=_env()
    )
    assert via_flag.returncode == 1
    via_env = run_cli(
        "classify", input_text="widget fell off the shelf", env=_env(MINERU_HEALTH_RULES=str(rules))
    )
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
        "fatal",
        "heuristic",
        "task_local",
        "generic",
        "ambiguous",
    }
    plain = run_cli("rules", env=_env())
    assert plain.returncode == 0 and plain.stdout.startswith("#")

    good = tmp_path / "good.rules"
    good.write_text("# mine\nmine.one task_local mine hello\n", encoding="utf-8")
    checked = run_cli("rules", "--check", str(good), "--json", env=_env())
    assert checked.returncode == 0
    assert json.loads(checked.stdout)["rules"] == 1
    assert json.loads(checked.stdout)["warnings"] == []  # origin=engine by default

    reach = tmp_path / "reach.rules"
    reach.write_text(
        "mine.any fatal mine target=message origin=any hello\n"
        "mine.type fatal mine target=type origin=any ^acme\\.Gone\\b\n",
        encoding="utf-8",
    )
    warned = run_cli("rules", "--check", str(reach), env=_env())
    assert warned.returncode == 0
    assert "rule 'mine.any': origin=any on message text" in warned.stderr
    assert "mine.type" not in warned.stderr  # a class name is not document text

    bad = tmp_path / "bad.rules"
    bad.write_text("only-two-fields fatal\n", encoding="utf-8")
    refused = run_cli("rules", "--check", str(bad), env=_env())
    assert refused.returncode == 2
    assert f"{bad}:1" in refused.stderr


def _run_bytes(*args: str, data: bytes, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "mineru_health", *args],
        input=data,
        capture_output=True,
        timeout=120,
        check=False,
        env=env,
    )


@pytest.mark.parametrize("encoding", ["utf-8", "ascii", ""])
def test_invalid_utf8_input_is_classified_not_a_traceback(encoding: str) -> None:
    env = _env(PYTHONIOENCODING=encoding) if encoding else _env()
    data = b"\xff\xfe\xc0 garbage \xed\xa0\x80 EngineCore encountered an issue. \xe4\xb8\n"
    plain = _run_bytes("classify", data=data, env=env)
    assert plain.returncode == 1, plain.stderr
    assert b"Traceback" not in plain.stderr
    as_json = _run_bytes("classify", "--json", data=b"\xff\xfe not a pdf\n", env=env)
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["kind"] == "task_local"


@pytest.mark.parametrize(
    ("args", "stdin"),
    [
        (["classify", "--json", "/nonexistent/trace.txt"], ""),
        (["classify", "--json", "--rules", "/dev/zero"], "x"),
        (["classify", "--json", "--no-such-flag"], ""),
        (["rules", "--json", "--check", "/dev/zero"], ""),
        (["rules", "--json", "--check", "/nonexistent.rules"], ""),
    ],
)
def test_json_errors_are_json_with_exit_2(args: list[str], stdin: str) -> None:
    result = run_cli(*args, input_text=stdin, env=_env())
    assert result.returncode == 2, result.stdout + result.stderr
    body = json.loads(result.stdout)
    assert body["exit_code"] == 2 and body["error"]
    assert "Traceback" not in result.stderr


def test_plain_errors_exit_2_without_traceback(tmp_path: Path) -> None:
    result = run_cli("classify", str(tmp_path), env=_env())  # a directory
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "error" in result.stderr


def test_ambiguous_and_remote_engine_in_json() -> None:
    oom = run_cli(
        "classify", "--json", input_text="torch.OutOfMemoryError: CUDA out of memory.\n", env=_env()
    )
    assert oom.returncode == 0
    body = json.loads(oom.stdout)
    assert body["ambiguous"] is True and body["kind"] == "ambiguous" and body["fatal"] is False
    assert body["strength"] == "ambiguous"
    remote = run_cli("classify", "--json", "--remote-engine", input_text=FATAL_TEXT, env=_env())
    assert remote.returncode == 1  # a vLLM EngineDeadError class: this process's own engine
    remote_text = run_cli(
        "classify",
        "--json",
        "--remote-engine",
        input_text="EngineCore encountered an issue.\n",
        env=_env(),
    )
    assert remote_text.returncode == 0
    assert json.loads(remote_text.stdout)["remote_engine"] is True


def test_rules_listing_shows_targets_and_origins() -> None:
    listing = run_cli("rules", "--json", env=_env())
    rules = json.loads(listing.stdout)["rules"]
    engine_dead = next(r for r in rules if r["id"] == "vllm.engine_dead")
    assert (engine_dead["target"], engine_dead["strength"]) == ("type", "definitive")
    assert {r["origin"] for r in rules} == {"engine", "any"}

"""`mineru-health config`: every variable from the native table, and the start-up checks.

``config --check`` must refuse exactly what the router and the worker refuse
at start-up, naming the variable; the cases marked "issue 10" passed it before.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import run_cli
from mineru_health.runtime.settings import markdown_tables, variables


def _env(**changes: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MINERU_ROUTER_HEALTH_", "MINERU_HEALTH_"))
    }
    env.update(changes)
    return env


def test_lists_every_variable_as_json() -> None:
    result = run_cli("config", "--json", env=_env())
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [row["name"] for row in rows] == [v.name for v in variables()]
    by_name = {row["name"]: row for row in rows}
    assert {
        "MINERU_ROUTER_HEALTH_INTERVAL_S",
        "MINERU_ROUTER_HEALTH_TIMEOUT_S",
        "MINERU_ROUTER_HEALTH_PRESET",
        "MINERU_ROUTER_HEALTH_AUDIT_PATH",
        "MINERU_HEALTH_EXIT_GRACE_S",
        "MINERU_HEALTH_PORT",
    } <= set(by_name)
    grace = by_name["MINERU_HEALTH_EXIT_GRACE_S"]
    assert (grace["component"], grace["type"], grace["default"]) == ("worker", "seconds", "5")
    assert (grace["min"], grace["max"]) == (0, 3600)
    interval = by_name["MINERU_ROUTER_HEALTH_INTERVAL_S"]
    assert interval["presets"] == {"fast": "1", "production": "2", "outage-tolerant": "5"}


def test_markdown_is_the_generated_table() -> None:
    result = run_cli("config", "--markdown", env=_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout == markdown_tables()
    rows = [line for line in result.stdout.splitlines() if line.startswith("| `")]
    assert len(rows) == len(variables())


def test_plain_listing_names_every_variable() -> None:
    result = run_cli("config", env=_env())
    assert result.returncode == 0, result.stderr
    for v in variables():
        assert v.name in result.stdout


def test_check_accepts_a_preset_and_reports_both_sides() -> None:
    result = run_cli(
        "config",
        "--check",
        "--json",
        env=_env(
            MINERU_ROUTER_HEALTH_PRESET="fast",
            MINERU_HEALTH_RETRY_AFTER_S="10",
            MINERU_HEALTH_MINERU_PYTHON="/usr/bin/python3",
        ),
    )
    assert result.returncode == 0, result.stderr
    checked = json.loads(result.stdout)
    assert checked["router"]["interval_s"] == 1.0
    assert checked["worker"]["retry_after_s"] == 10
    assert checked["rules"] > 0


@pytest.mark.parametrize(
    ("role", "present", "absent"), [("router", "router", "worker"), ("worker", "worker", "router")]
)
def test_check_one_role(role: str, present: str, absent: str) -> None:
    result = run_cli("config", "--check", "--json", "--role", role, env=_env())
    assert result.returncode == 0, result.stderr
    checked = json.loads(result.stdout)
    assert present in checked and absent not in checked


def test_check_names_the_bad_variable() -> None:
    result = run_cli(
        "config",
        "--check",
        env=_env(MINERU_ROUTER_HEALTH_TIMEOUT_S="5", MINERU_ROUTER_HEALTH_INTERVAL_S="2"),
    )
    assert result.returncode == 2
    assert "MINERU_ROUTER_HEALTH_TIMEOUT_S" in result.stderr


def test_check_refuses_a_non_number() -> None:
    result = run_cli("config", "--check", env=_env(MINERU_ROUTER_HEALTH_INTERVAL_S="soon"))
    assert result.returncode == 2
    assert "MINERU_ROUTER_HEALTH_INTERVAL_S" in result.stderr


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        # issue 10: each of these passed `config --check` before.
        ("MINERU_ROUTER_HEALTH_BOOT_TIMEOUT_S", "1e-300"),
        ("MINERU_ROUTER_HEALTH_CONNECT_TIMEOUT_S", "1e-300"),
        ("MINERU_ROUTER_HEALTH_CA_FILE", "/etc"),
        ("MINERU_ROUTER_HEALTH_AUDIT_PATH", "/nonexistent/x"),
        ("MINERU_HEALTH_EXIT_GRACE_S", "inf"),
        ("MINERU_HEALTH_EXIT_GRACE_S", "1e300"),
        ("MINERU_HEALTH_EXIT_GRACE_S", "nan"),
        ("MINERU_HEALTH_RETRY_AFTER_S", "inf"),
        ("MINERU_HEALTH_RETRY_AFTER_S", "nan"),
        ("MINERU_HEALTH_RETRY_AFTER_S", "9" * 31),
        ("MINERU_HEALTH_EXIT_ON_FATAL", "maybe"),
        ("MINERU_HEALTH_RULES", "/dev/zero"),
        ("MINERU_HEALTH_RETRY_AFTER", "30"),  # a typo must not pass
    ],
)
def test_check_refuses_what_start_up_refuses(variable: str, value: str) -> None:
    result = run_cli("config", "--check", env=_env(**{variable: value}))
    assert result.returncode == 2, result.stdout
    assert variable in result.stderr
    assert "Traceback" not in result.stderr

    as_json = run_cli("config", "--check", "--json", env=_env(**{variable: value}))
    assert as_json.returncode == 2
    body = json.loads(as_json.stdout)
    assert variable in body["error"] and body["type"] == "ConfigError"


def test_check_runs_the_rules_file_check(tmp_path: Path) -> None:
    rules = tmp_path / "rules.txt"
    rules.write_text("this is not a rule\n", encoding="utf-8")
    result = run_cli(
        "config", "--check", "--role", "worker", env=_env(MINERU_HEALTH_RULES=str(rules))
    )
    assert result.returncode == 2
    assert str(rules) in result.stderr

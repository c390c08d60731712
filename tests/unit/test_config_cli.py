"""`mineru-health config`: the router's variables, and the start-up check of the current ones."""

from __future__ import annotations

import json
import os

from conftest import run_cli


def _env(**changes: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINERU_ROUTER_HEALTH_")}
    env.update(changes)
    return env


def test_lists_every_variable_as_json() -> None:
    result = run_cli("config", "--json", env=_env())
    assert result.returncode == 0, result.stderr
    names = {row["name"] for row in json.loads(result.stdout)}
    assert {"MINERU_ROUTER_HEALTH_INTERVAL_S", "MINERU_ROUTER_HEALTH_TIMEOUT_S",
            "MINERU_ROUTER_HEALTH_PRESET", "MINERU_ROUTER_HEALTH_AUDIT_PATH"} <= names


def test_markdown_table_has_a_row_per_variable() -> None:
    listed = json.loads(run_cli("config", "--json", env=_env()).stdout)
    table = run_cli("config", "--markdown", env=_env()).stdout.splitlines()
    assert len(table) == 2 + len(listed)


def test_check_accepts_a_preset() -> None:
    result = run_cli("config", "--check", "--json",
                     env=_env(MINERU_ROUTER_HEALTH_PRESET="fast"))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["interval_s"] == 1.0


def test_check_names_the_bad_variable() -> None:
    result = run_cli("config", "--check",
                     env=_env(MINERU_ROUTER_HEALTH_TIMEOUT_S="5", MINERU_ROUTER_HEALTH_INTERVAL_S="2"))
    assert result.returncode == 2
    assert "MINERU_ROUTER_HEALTH_TIMEOUT_S" in result.stderr


def test_check_refuses_a_non_number() -> None:
    result = run_cli("config", "--check", env=_env(MINERU_ROUTER_HEALTH_INTERVAL_S="soon"))
    assert result.returncode == 2
    assert "MINERU_ROUTER_HEALTH_INTERVAL_S" in result.stderr

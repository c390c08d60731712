"""HealthSettings and WorkerSettings: views over the native configuration table.

Every variable is defined once, in C++; these tests check that Python derives
its fields, names and the README's tables from that table, and that the
values the hardening issue found (passing ``config --check`` but breaking
things) are refused at start-up naming the variable.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from conftest import generated_docs
from mineru_health import _native
from mineru_health._names import enum_name, enum_names
from mineru_health.errors import ConfigError
from mineru_health.runtime.settings import (
    ROUTER_ENV_PREFIX,
    WORKER_ENV_PREFIX,
    HealthSettings,
    WorkerSettings,
    markdown_tables,
    variables,
)

README = Path(__file__).resolve().parents[2] / "README.md"


def test_defaults_are_the_production_preset() -> None:
    assert HealthSettings() == HealthSettings.preset("production")
    assert HealthSettings.from_env({}) == HealthSettings.preset("production")


def test_presets_listed_and_loadable() -> None:
    names = HealthSettings.preset_names()
    assert names == ["fast", "production", "outage-tolerant"]
    fast = HealthSettings.preset("fast")
    tolerant = HealthSettings.preset("outage-tolerant")
    assert fast.interval_s < HealthSettings().interval_s < tolerant.interval_s
    assert tolerant.failure_threshold > fast.failure_threshold


def test_preset_from_env_then_variables_over_it(tmp_path: Path) -> None:
    s = HealthSettings.from_env(
        {
            "MINERU_ROUTER_HEALTH_PRESET": "fast",
            "MINERU_ROUTER_HEALTH_FAILURE_THRESHOLD": "7",
            "MINERU_ROUTER_HEALTH_AUDIT_PATH": str(tmp_path / "audit.jsonl"),
            "UNRELATED": "ignored",
        }
    )
    assert s.interval_s == HealthSettings.preset("fast").interval_s
    assert s.failure_threshold == 7
    assert s.audit_path == str(tmp_path / "audit.jsonl")


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"MINERU_ROUTER_HEALTH_INTERVAL_S": "soon"}, "MINERU_ROUTER_HEALTH_INTERVAL_S"),
        ({"MINERU_ROUTER_HEALTH_INTERVAL_S": "-1"}, "MINERU_ROUTER_HEALTH_INTERVAL_S"),
        (
            {"MINERU_ROUTER_HEALTH_INTERVAL_S": "1", "MINERU_ROUTER_HEALTH_TIMEOUT_S": "2"},
            "MINERU_ROUTER_HEALTH_TIMEOUT_S",
        ),
        ({"MINERU_ROUTER_HEALTH_FAILURE_THRESHOLD": "0"}, "MINERU_ROUTER_HEALTH_FAILURE_THRESHOLD"),
        ({"MINERU_ROUTER_HEALTH_JITTER": "0.9"}, "MINERU_ROUTER_HEALTH_JITTER"),
        ({"MINERU_ROUTER_HEALTH_PRESET": "turbo"}, "MINERU_ROUTER_HEALTH_PRESET"),
        ({"MINERU_ROUTER_HEALTH_INTERVALS": "1"}, "MINERU_ROUTER_HEALTH_INTERVALS"),
        ({"MINERU_ROUTER_HEALTH_MAX_BODY_BYTES": "1"}, "MINERU_ROUTER_HEALTH_MAX_BODY_BYTES"),
    ],
)
def test_bad_config_names_the_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError) as info:
        HealthSettings.from_env(env)
    assert info.value.variable == variable
    assert variable in str(info.value)


def test_from_env_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINERU_ROUTER_HEALTH_MAX_ATTEMPTS", "not-a-number")
    with pytest.raises(ConfigError) as info:
        HealthSettings.from_env()
    assert info.value.variable == "MINERU_ROUTER_HEALTH_MAX_ATTEMPTS"


def test_replace_validates_and_copies() -> None:
    base = HealthSettings()
    changed = base.replace(failure_threshold=9)
    assert changed.failure_threshold == 9 and base.failure_threshold != 9
    with pytest.raises(ConfigError) as info:
        base.replace(probe_timeout_s=base.interval_s * 2)
    assert info.value.variable == "MINERU_ROUTER_HEALTH_TIMEOUT_S"
    with pytest.raises(TypeError):
        base.replace(no_such_field=1)
    assert "failure_threshold=3" in repr(base)


def test_documented_variables_cover_every_field() -> None:
    names = [v.name for v in HealthSettings.variables()]
    assert "MINERU_ROUTER_HEALTH_PRESET" in names
    assert "MINERU_ROUTER_HEALTH_AUDIT_PATH" in names
    assert "MINERU_ROUTER_HEALTH_CA_FILE" in names
    for added in (
        "TASK_RETRIES",
        "RETRY_BUDGET_PERCENT",
        "RETRY_BUDGET_MIN",
        "MAIN_PORT_TIMEOUT_S",
        "STABLE_WINDOW_S",
        "MAX_EJECTION_PERCENT",
        "NATIVE_PROBES",
        "MAX_KEPT_TASKS",
        "MAX_KEPT_MB",
        "WORKER_CGROUPS",
        "STOP_GRACE_S",
        "MAX_STATUS_MB",
        "MAX_RESULT_MB",
        "MAX_RESULT_S",
        "UPSTREAM_DNS",
        "DNS_INTERVAL_S",
        "DNS_TIMEOUT_S",
        "DNS_MAX_ADDRESSES",
        "DNS_SERVERS",
        "STORE_URL",
        "ROUTER_ID",
        "LEASE_S",
    ):
        assert ROUTER_ENV_PREFIX + added in names
    assert len(names) == len(set(names)) == 38
    for name in names:
        assert name.startswith(ROUTER_ENV_PREFIX)


# --- fields derived from the native table ----------------------------------------------


def _struct_fields(native_type: type) -> set[str]:
    return {name for name in dir(native_type()) if not name.startswith("_")}


@pytest.mark.parametrize(
    ("settings_type", "native_type", "component"),
    [
        (HealthSettings, _native.HealthConfig, "router"),
        (WorkerSettings, _native.WorkerConfig, "worker"),
    ],
)
def test_every_struct_field_has_exactly_one_variable(
    settings_type: type[HealthSettings | WorkerSettings], native_type: type, component: str
) -> None:
    table_fields = [v.field for v in variables(component) if v.field]
    assert len(table_fields) == len(set(table_fields))
    # A struct field without a table entry (or the reverse) fails here.
    assert set(table_fields) == _struct_fields(native_type)
    assert set(settings_type().as_dict()) == set(table_fields)
    for field in table_fields:
        name = settings_type.variable_name(field)
        assert name.startswith(ROUTER_ENV_PREFIX if component == "router" else WORKER_ENV_PREFIX)
    with pytest.raises(KeyError):
        settings_type.variable_name("no_such_field")


def test_every_variable_has_finite_bounds_and_help() -> None:
    for v in variables():
        assert v.meaning and v.allowed, v.name
        if enum_name(v.type) in ("seconds", "number", "integer", "port"):
            assert v.min_value is not None and v.max_value is not None, v.name
            assert math.isfinite(v.min_value) and math.isfinite(v.max_value), v.name
        if enum_name(v.type) == "seconds":
            assert v.min_value == 0 or v.min_value >= 0.001, v.name
            assert v.max_value <= 86400, v.name
    components = {enum_name(v.component) for v in variables()}
    assert components == set(enum_names(_native.ConfigComponent))


# --- the worker -----------------------------------------------------------------------------


def test_worker_defaults() -> None:
    settings = WorkerSettings.from_env({})
    assert settings == WorkerSettings()
    assert settings.port is None
    assert settings.bind == "127.0.0.1"
    assert (settings.loop_hang_s, settings.stall_s) == (60.0, 300.0)
    assert settings.exit_on_fatal is False and settings.expose_errors is False
    assert settings.exit_grace_s == 5.0
    assert settings.retry_after_s == 30 and isinstance(settings.retry_after_s, int)
    assert (settings.error_budget, settings.error_budget_window_s) == (3, 60.0)
    assert settings.rules_path == ""
    assert "retry_after_s=30" in repr(settings)


def test_worker_reads_its_variables(tmp_path: Path) -> None:
    rules = tmp_path / "rules.txt"
    rules.write_text("", encoding="utf-8")
    settings = WorkerSettings.from_env(
        {
            "MINERU_HEALTH_PORT": "0",
            "MINERU_HEALTH_BIND": "::1",
            "MINERU_HEALTH_STALL_S": "0",
            "MINERU_HEALTH_EXIT_ON_FATAL": "yes",
            "MINERU_HEALTH_EXIT_GRACE_S": "2.5",
            "MINERU_HEALTH_RETRY_AFTER_S": "7",
            "MINERU_HEALTH_EXPOSE_ERRORS": "1",
            "MINERU_HEALTH_RULES": str(rules),
            # Read by the test harness, its fault plugin and the patch command, ignored here.
            "MINERU_HEALTH_MINERU_PYTHON": "/usr/bin/python3",
            "MINERU_HEALTH_PATCHES_DIR": str(tmp_path),
            "MINERU_HEALTH_FAULT_PLAN": str(tmp_path / "plan-{port}"),
            "MINERU_HEALTH_FAULT_HANG_S": "not checked by the worker",
            "MINERU_ROUTER_HEALTH_INTERVAL_S": "not the worker's",
            "UNRELATED": "x",
        }
    )
    assert settings.port == 0 and settings.bind == "::1" and settings.stall_s == 0
    assert settings.exit_on_fatal is True and settings.expose_errors is True
    assert settings.exit_grace_s == 2.5 and settings.retry_after_s == 7
    assert settings.rules_path == str(rules)
    assert not any("fault" in name for name in settings.as_dict())  # no worker field of tests
    tooling = {v.name for v in variables("tooling")}
    assert {"MINERU_HEALTH_FAULT_PLAN", "MINERU_HEALTH_FAULT_HANG_S"} <= tooling


def test_worker_from_env_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINERU_HEALTH_RETRY_AFTER_S", "12")
    assert WorkerSettings.from_env().retry_after_s == 12


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        # Issue 10: accepted before, then an OverflowError killed the exit
        # thread (inf, 1e300), the grace was skipped (nan), or start-up
        # crashed with a traceback; Retry-After went out as a 31-digit number.
        ("MINERU_HEALTH_EXIT_GRACE_S", "inf"),
        ("MINERU_HEALTH_EXIT_GRACE_S", "1e300"),
        ("MINERU_HEALTH_EXIT_GRACE_S", "nan"),
        ("MINERU_HEALTH_RETRY_AFTER_S", "inf"),
        ("MINERU_HEALTH_RETRY_AFTER_S", "nan"),
        ("MINERU_HEALTH_RETRY_AFTER_S", "9" * 31),
        ("MINERU_HEALTH_RETRY_AFTER_S", "1e30"),
        ("MINERU_HEALTH_RETRY_AFTER_S", "2.5"),
        ("MINERU_HEALTH_EXIT_ON_FATAL", "maybe"),
        ("MINERU_HEALTH_PORT", "65536"),
        ("MINERU_HEALTH_BIND", "localhost"),
        ("MINERU_HEALTH_STALL_S", "1e-300"),
        ("MINERU_HEALTH_RULES", "/dev/zero"),
        ("MINERU_HEALTH_RULES", "/etc"),
        ("MINERU_HEALTH_RETRY_AFTER", "30"),
    ],
)
def test_bad_worker_config_names_the_variable(variable: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        WorkerSettings.from_env({variable: value})
    assert info.value.variable == variable
    assert variable in str(info.value)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        # Issue 10: each passed `config --check` and then broke the router.
        ("MINERU_ROUTER_HEALTH_BOOT_TIMEOUT_S", "1e-300"),
        ("MINERU_ROUTER_HEALTH_CONNECT_TIMEOUT_S", "1e-300"),
        ("MINERU_ROUTER_HEALTH_CA_FILE", "/etc"),
        ("MINERU_ROUTER_HEALTH_AUDIT_PATH", "/nonexistent/x"),
        ("MINERU_ROUTER_HEALTH_INTERVAL_S", "1e9"),
        ("MINERU_ROUTER_HEALTH_TASK_RETRIES", "11"),
        ("MINERU_ROUTER_HEALTH_RETRY_BUDGET_PERCENT", "nan"),
        ("MINERU_ROUTER_HEALTH_MAX_EJECTION_PERCENT", "101"),
    ],
)
def test_router_values_that_broke_things_are_refused(variable: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        HealthSettings.from_env({variable: value})
    assert info.value.variable == variable
    assert variable in str(info.value)


def test_worker_replace_validates() -> None:
    base = WorkerSettings()
    changed = base.replace(retry_after_s=5, port=8080)
    assert (changed.retry_after_s, changed.port) == (5, 8080)
    assert base.port is None
    with pytest.raises(ConfigError) as info:
        base.replace(exit_grace_s=float("inf"))
    assert info.value.variable == "MINERU_HEALTH_EXIT_GRACE_S"
    with pytest.raises(TypeError):
        base.replace(no_such_field=1)
    assert changed != base and changed == base.replace(retry_after_s=5, port=8080)
    assert changed.native.port == 8080


# --- enum names, defined once in C++ -------------------------------------------------------


@pytest.mark.parametrize(
    "enum_type",
    [
        _native.WorkerPhase,
        _native.AuditAction,
        _native.ProbeStatus,
        _native.PollerEventKind,
        _native.RuleKind,
        _native.ConfigComponent,
        _native.ConfigType,
    ],
)
def test_enum_names_come_from_the_native_to_string(enum_type: type) -> None:
    names = enum_names(enum_type)
    assert len(names) == len(list(enum_type)) == len(set(names))
    for member, name in zip(enum_type, names):
        assert name == enum_name(member)
        assert re.fullmatch(r"[a-z_]+", name), name


def test_enum_names_spelling() -> None:
    assert enum_names(_native.PollerEventKind) == ("probe", "audit", "restart_requested", "error")
    assert "gave_up" in enum_names(_native.WorkerPhase)
    assert enum_names(_native.RuleKind) == (
        "fatal",
        "task_local",
        "heuristic",
        "ambiguous",
        "generic",
    )


# --- the README's tables are generated ----------------------------------------------------


def test_readme_configuration_tables_are_the_generated_ones() -> None:
    text = README.read_text(encoding="utf-8")
    assert generated_docs().BEGIN in text, "README.md has lost its generated configuration section"
    assert generated_docs().config_tables(text) == text, (
        "README.md's configuration tables differ from the native table: regenerate them with "
        "scripts/generated_docs.py"
    )


def test_markdown_tables_list_every_variable_once() -> None:
    tables = markdown_tables()
    for v in variables():
        assert tables.count(f"| `{v.name}` |") == 1, v.name


# --- the shipped deployment examples pass the start-up checks ----------------------------


def _deploy_env() -> list[dict[str, str]]:
    yaml = pytest.importorskip("yaml")
    root = README.parent / "deploy"
    envs = []
    for doc in yaml.safe_load_all((root / "k8s" / "00-config.yaml").read_text(encoding="utf-8")):
        if (
            doc
            and doc.get("kind") == "ConfigMap"
            and doc["metadata"]["name"] == "mineru-health-env"
        ):
            envs.append({str(k): str(v) for k, v in doc["data"].items()})
    compose = yaml.safe_load((root / "compose" / "compose.yaml").read_text(encoding="utf-8"))
    for service in compose["services"].values():
        environment = service.get("environment") or {}
        if isinstance(environment, list):
            environment = dict(item.split("=", 1) for item in environment)
        envs.append({str(k): str(v) for k, v in environment.items()})
    return envs


def test_deploy_examples_pass_the_start_up_checks(tmp_path: Path) -> None:
    rules = tmp_path / "rules.txt"
    rules.write_text("", encoding="utf-8")
    envs = _deploy_env()
    assert len(envs) >= 2
    for env in envs:
        # The paths name files inside the containers; the values are what is checked here.
        env = {k: (str(rules) if k.endswith("_RULES") else v) for k, v in env.items()}
        HealthSettings.from_env(env)
        WorkerSettings.from_env(env)

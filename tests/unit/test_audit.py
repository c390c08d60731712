"""AuditLog and audit_record: one JSON line per policy transition; the path checked up front."""

from __future__ import annotations

import errno
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_fleet import Fleet, one_audit_event, run_async
from mineru_health import _native
from mineru_health._names import enum_names
from mineru_health._native import AuditAction
from mineru_health.errors import ConfigError
from mineru_health.runtime.router import audit
from mineru_health.runtime.router.audit import AuditLog, audit_record

AUDIT_PATH = "MINERU_ROUTER_HEALTH_AUDIT_PATH"


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    with Fleet() as running:
        yield running


@run_async
async def test_audit_log_writes_one_json_line_per_event(fleet: Fleet, tmp_path: Any) -> None:
    events = await one_audit_event(fleet)
    path = tmp_path / "audit.jsonl"
    log = AuditLog(str(path))
    for event in events:
        log.write(event)
    log.close()
    lines = path.read_text().splitlines()
    assert len(lines) == len(events)
    first = json.loads(lines[0])
    assert set(first) == {"time", "worker_id", "action", "attempt", "reason", "cause", "from", "to"}
    assert first["cause"] == "passive_failure"
    assert first["worker_id"] == "w" and first["action"] == "ejected"
    assert first["from"] == "healthy" and first["to"] == "unhealthy"
    assert first["reason"] == "fatal task error"
    assert first["time"].endswith("+00:00") and "T" in first["time"]
    assert events[0].audit.action == AuditAction.EJECTED
    assert audit_record(events[0]) == first


@run_async
async def test_audit_log_defaults_to_stderr(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    events = await one_audit_event(fleet)
    log = AuditLog("")
    log.write(events[0])
    log.close()
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert json.loads(line)["action"] == "ejected"
    assert json.loads(line)["from"] in enum_names(_native.WorkerPhase)


@pytest.mark.parametrize(
    "make_path",
    [
        lambda tmp: "/nonexistent/x",  # issue 10: a raw FileNotFoundError killed the router
        lambda tmp: str(tmp),  # a directory
        lambda tmp: str(tmp / "missing-dir" / "audit.jsonl"),
    ],
)
def test_unusable_path_is_a_config_error_naming_the_variable(
    tmp_path: Path, make_path: Any
) -> None:
    with pytest.raises(ConfigError) as info:
        AuditLog(make_path(tmp_path))
    assert info.value.variable == AUDIT_PATH
    assert AUDIT_PATH in str(info.value)


def test_open_failing_after_the_check_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(errno.EACCES, "Permission denied", args[0])

    monkeypatch.setattr(audit, "open", refuse, raising=False)
    with pytest.raises(ConfigError) as info:
        AuditLog(str(tmp_path / "audit.jsonl"))
    assert info.value.variable == AUDIT_PATH
    assert "Permission denied" in str(info.value)


def test_a_good_path_is_created_on_open(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(str(path))
    try:
        assert path.is_file()
    finally:
        log.close()
    assert repr(log) == f"AuditLog(path={str(path)!r})"

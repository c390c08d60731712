"""Poller events and statuses onto MinerU 3.x's WorkerState (``mineru3.router.pool.Server``),
the policy's fields in ``/health`` and the fleet's reasons and log lines; no processes.

Probe results are real (``classify_health_response``); events and statuses
are plain objects with the native fields, since the poller alone makes real
ones. The WorkerState is MinerU's own dataclass.
"""

from __future__ import annotations

import json
from datetime import datetime
from types import SimpleNamespace
from typing import Any

import pytest
from mineru_health import _native
from mineru_health.mineru3.router.pool import Server, add_policy_fields
from mineru_health.runtime.router import fleet, policy

router_mod = pytest.importorskip("mineru.cli.router", reason="mineru 3.4.4 is not importable")

K = _native.PollerEventKind
A = _native.AuditAction
P = _native.WorkerPhase
HEALTHY_BODY = {
    "status": "healthy",
    "protocol_version": 2,
    "queued_tasks": 1,
    "processing_tasks": 2,
    "completed_tasks": 3,
    "failed_tasks": 4,
    "max_concurrent_requests": 3,
    "processing_window_size": 0,
}
DEAD_BODY = {"status": "unhealthy", "engine_dead": True, "error": "EngineDeadError: boom"}


def probe_result(code: int, body: dict[str, Any]) -> Any:
    expect = _native.ProbeExpectations()
    expect.expected_status = "healthy"
    expect.max_body_bytes = 65536
    expect.require_load_fields = True
    return _native.classify_health_response(code, json.dumps(body), False, expect)


def probe_event(worker: str, result: Any, *, in_rotation: bool) -> SimpleNamespace:
    return SimpleNamespace(
        kind=K.PROBE,
        worker_id=worker,
        unix_time=1_700_000_000.0,
        probe=result,
        audit=None,
        in_rotation=in_rotation,
    )


def audit_event(worker: str, action: Any, reason: str, *, in_rotation: bool) -> SimpleNamespace:
    audit = SimpleNamespace(
        action=action, reason=reason, attempt=0, from_phase=P.HEALTHY, to_phase=P.UNHEALTHY
    )
    return SimpleNamespace(
        kind=K.AUDIT,
        worker_id=worker,
        unix_time=1_700_000_001.0,
        probe=None,
        audit=audit,
        in_rotation=in_rotation,
    )


def restart_event(worker: str) -> SimpleNamespace:
    return SimpleNamespace(
        kind=K.RESTART_REQUESTED,
        worker_id=worker,
        unix_time=0.0,
        probe=None,
        audit=None,
        in_rotation=False,
    )


def worker_state(**fields: Any) -> Any:
    return router_mod.WorkerState(
        server_id="local-gpu-0", source="local", base_url="http://127.0.0.1:1", gpu="0", **fields
    )


def show(server: Any, event: Any) -> None:
    Server(server, pool=None).show(event)  # type: ignore[arg-type]


def test_healthy_probe_brings_rotation_load_and_time() -> None:
    server = worker_state(last_error="old")
    show(server, probe_event("w", probe_result(200, HEALTHY_BODY), in_rotation=True))
    assert server.healthy
    assert (server.queued_tasks, server.processing_tasks) == (1, 2)
    assert (server.completed_tasks, server.failed_tasks) == (3, 4)
    assert server.max_concurrent_requests == 3
    assert server.processing_window_size == 1  # at least 1, as MinerU's scoring needs
    assert server.last_error is None
    assert datetime.fromisoformat(server.last_checked_at).timestamp() == 1_700_000_000.0


def test_rotation_is_the_policy_s_not_the_probe_s() -> None:
    # A booting worker answers healthy before the healthy threshold is met:
    # the policy keeps it out, and so does the projection.
    server = worker_state(healthy=True)
    show(server, probe_event("w", probe_result(200, HEALTHY_BODY), in_rotation=False))
    assert not server.healthy


def test_failed_probe_brings_its_classification_as_last_error() -> None:
    server = worker_state(healthy=True, queued_tasks=7)
    show(server, probe_event("w", probe_result(503, DEAD_BODY), in_rotation=False))
    assert not server.healthy
    assert server.last_error.startswith("engine_dead: HTTP 503")
    assert server.queued_tasks == 7  # load stays what the last healthy answer said


def test_audit_out_of_rotation_brings_its_reason() -> None:
    server = worker_state(healthy=True)
    reason = "worker process 12 exited with code -9\n  (second line)"
    show(server, audit_event("w", A.EJECTED, reason, in_rotation=False))
    assert not server.healthy
    assert server.last_error == "worker process 12 exited with code -9 (second line)"
    show(server, audit_event("w", A.RESTART_SUCCEEDED, "", in_rotation=True))
    assert server.healthy


def test_restart_request_only_takes_it_out() -> None:
    server = worker_state(healthy=True, last_error="kept")
    show(server, restart_event("w"))
    assert not server.healthy and server.last_error == "kept"


def test_a_report_writes_rotation_and_its_reason() -> None:
    server = worker_state(healthy=True)
    Server(server, pool=None).show_rotation(True)  # type: ignore[arg-type]
    assert server.healthy and server.last_error is None
    Server(server, pool=None).show_rotation(False, "exited")  # type: ignore[arg-type]
    assert not server.healthy and server.last_error == "exited"


def status(**fields: Any) -> SimpleNamespace:
    base: dict[str, Any] = {
        "phase": P.RESTART_SCHEDULED,
        "in_rotation": False,
        "restartable": True,
        "consecutive_failures": 2,
        "attempt": 1,
        "next_restart_in_s": 4.0,
        "last_error": "timed out",
        "stable_in_s": None,
        "endpoint": _native.ProbeEndpoint.NATIVE,
        "probe_url": "http://127.0.0.1:9001/health",
        "last_cause": "timeout",
        "last_exit_code": None,
        "ejection_suppressed": False,
        "last_probe": SimpleNamespace(loop_lag_s=2.5, engine_calls_in_flight=1),
    }
    base.update(fields)
    return SimpleNamespace(**base)


def test_health_entry_gets_the_policy_fields() -> None:
    entry: dict[str, Any] = {"server_id": "w", "last_error": None}
    add_policy_fields(entry, status(), restarting=False, now=1_700_000_000.0)
    assert entry["state"] == "restart_scheduled" and not entry["in_rotation"]
    assert entry["restartable"] and not entry["restarting"]
    assert (entry["consecutive_failures"], entry["restart_attempt"]) == (2, 1)
    assert datetime.fromisoformat(entry["next_restart_at"]).timestamp() == 1_700_000_004.0
    assert entry["last_error"] == "timed out"
    assert entry["probe_endpoint"] == "native" and entry["last_cause"] == "timeout"
    assert entry["loop_lag_s"] == 2.5 and entry["engine_calls_in_flight"] == 1
    assert entry["restart_confirmed_at"] is None and entry["last_exit_code"] is None


def test_health_entry_in_rotation_says_its_last_probes_word() -> None:
    # Read from the policy's state at the answer, not from MinerU's attributes (an event
    # on its way writes those): a healthy last probe clears a stale error, a failed one
    # (below the failure threshold, still in rotation) names itself.
    entry: dict[str, Any] = {"server_id": "w", "last_error": "connect_error: from its boot"}
    healthy = SimpleNamespace(healthy=True, loop_lag_s=0.0, engine_calls_in_flight=0)
    in_rotation = {"phase": P.HEALTHY, "in_rotation": True, "next_restart_in_s": None}
    add_policy_fields(
        entry,
        status(**in_rotation, last_error="stale", last_probe=healthy),
        restarting=False,
        now=0.0,
    )
    assert entry["state"] == "healthy" and entry["next_restart_at"] is None
    assert entry["healthy"] and entry["last_error"] is None
    failed = SimpleNamespace(
        healthy=False,
        status=_native.ProbeStatus.TIMEOUT,
        detail="no answer in 2 s",
        loop_lag_s=None,
        engine_calls_in_flight=None,
    )
    add_policy_fields(entry, status(**in_rotation, last_probe=failed), restarting=False, now=0.0)
    assert entry["healthy"] and entry["last_error"] == "timeout: no answer in 2 s"


def test_reasons_are_one_line_and_bounded() -> None:
    long = fleet.short_reason("x\n" * 400)
    assert "\n" not in long and len(long) == fleet.REASON_CHARS and long.endswith("...")


def test_passive_reasons_never_carry_task_text() -> None:
    # Issue 10 item 8: the audit log and /health name the rule, not the document.
    dead = {
        "status": "failed",
        "engine_dead": True,
        "error": "quotes the document",
        "verdict": {"rule": "vllm.engine_dead"},
    }
    assert policy.passive_reason(policy.Answer.of_status(dead)) == (
        "a task failed with a fatal error (rule vllm.engine_dead)"
    )
    assert policy.passive_reason(policy.Answer.of_status({**dead, "engine_dead": False})) is None


def test_router_log_lines_escape_worker_text(caplog: pytest.LogCaptureFixture) -> None:
    # A worker's /health text with a newline and an ANSI escape must not forge
    # a log line or repaint a terminal (issue 10 item 7); JSON records keep it.
    hostile = "timeout\n2026-01-01 INFO forged line \x1b[32mgreen"
    with caplog.at_level("INFO", logger="mineru_health.router"):
        fleet.log_audit(
            {"worker_id": "w", "action": "ejected", "reason": hostile}, in_rotation=False
        )
    (record,) = caplog.records
    message = record.getMessage()
    assert "\n" not in message and "\x1b" not in message
    assert "forged line" in message and record.levelname == "WARNING"

"""classify_health_response through the binding: what one /health answer means."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mineru_health import _native
from mineru_health._native import ProbeStatus

S = ProbeStatus

HEALTHY: dict[str, Any] = {
    "status": "healthy",
    "version": "3.4.4",
    "protocol_version": 2,
    "queued_tasks": 4,
    "processing_tasks": 1,
    "completed_tasks": 10,
    "failed_tasks": 2,
    "max_concurrent_requests": 3,
    "processing_window_size": 64,
}


def expect(**changes: Any) -> Any:
    e = _native.ProbeExpectations()
    e.protocol_version = 2
    for key, value in changes.items():
        setattr(e, key, value)
    return e


def body(**changes: Any) -> bytes:
    doc = {**HEALTHY, **changes}
    return json.dumps({k: v for k, v in doc.items() if v is not ...}).encode()


CASES = [
    ("healthy", 200, body(), S.HEALTHY),
    ("healthy 204-ish 2xx", 201, body(), S.HEALTHY),
    ("503 plain", 503, b'{"status": "unhealthy", "error": "dispatcher"}', S.HTTP_STATUS),
    (
        "503 engine dead",
        503,
        b'{"status": "unhealthy", "error": "EngineDeadError", "engine_dead": true}',
        S.ENGINE_DEAD,
    ),
    ("503 engine_dead false", 503, b'{"status": "unhealthy", "engine_dead": false}', S.HTTP_STATUS),
    ("500 html", 500, b"<html>oops</html>", S.HTTP_STATUS),
    ("404", 404, b'{"detail": "Not Found"}', S.HTTP_STATUS),
    ("not json", 200, b"OK", S.NOT_JSON_OBJECT),
    ("json array", 200, b"[1, 2]", S.NOT_JSON_OBJECT),
    ("not utf-8", 200, b'{"status": "\xff\xfe"}', S.NOT_JSON_OBJECT),
    ("empty body", 200, b"", S.NOT_JSON_OBJECT),
    ("wrong status", 200, body(status="starting"), S.UNEXPECTED_STATUS),
    ("status missing", 200, body(status=...), S.UNEXPECTED_STATUS),
    ("old protocol", 200, body(protocol_version=1), S.BAD_PROTOCOL),
    ("protocol missing", 200, body(protocol_version=...), S.BAD_PROTOCOL),
    ("zero capacity", 200, body(max_concurrent_requests=0), S.BAD_FIELDS),
    ("string count", 200, body(queued_tasks="many"), S.BAD_FIELDS),
    ("negative count", 200, body(processing_tasks=-1), S.BAD_FIELDS),
]


@pytest.mark.parametrize(("name", "code", "raw", "status"), CASES, ids=[c[0] for c in CASES])
def test_classification_table(name: str, code: int, raw: bytes, status: Any) -> None:
    result = _native.classify_health_response(code, raw, False, expect())
    assert result.status == status, result.detail
    assert result.healthy == (status == S.HEALTHY)
    assert result.definitive == (status == S.ENGINE_DEAD)
    if status != S.HEALTHY:
        assert result.detail


def test_load_fields_are_read() -> None:
    result = _native.classify_health_response(200, body(), False, expect())
    load = result.load
    assert (load.queued_tasks, load.processing_tasks) == (4, 1)
    assert (load.completed_tasks, load.failed_tasks) == (10, 2)
    assert (load.max_concurrent_requests, load.processing_window_size) == (3, 64)


def test_truncated_body_is_too_large() -> None:
    result = _native.classify_health_response(200, body()[:20], True, expect())
    assert result.status == S.BODY_TOO_LARGE


def test_str_body_accepted() -> None:
    result = _native.classify_health_response(200, body().decode(), False, expect())
    assert result.healthy


def test_other_engines_answering_ok() -> None:
    e = expect(expected_status="ok", protocol_version=None, require_load_fields=False)
    assert _native.classify_health_response(200, b'{"status": "ok"}', False, e).healthy
    strict = expect(expected_status="ok")
    assert not _native.classify_health_response(200, b'{"status": "ok"}', False, strict).healthy


def test_no_protocol_required_accepts_any_version() -> None:
    e = expect(protocol_version=None)
    assert _native.classify_health_response(200, body(protocol_version=7), False, e).healthy


def test_status_names() -> None:
    names = {_native.to_string(s) for s in ProbeStatus}
    assert {"healthy", "engine_dead", "timeout", "connect_error", "transport_error"} <= names
    assert len(names) == len(ProbeStatus)

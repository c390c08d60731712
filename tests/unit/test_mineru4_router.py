"""The MinerU 4.0 router adapter's pure parts: health bodies, job payloads, retired outputs."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from mineru_health import _native
from mineru_health._native import ProbeStatus
from mineru_health.mineru4.router.endpoints import install_endpoints, submit_with_failover
from mineru_health.mineru4.router.jobs import JobLine, policy_payload
from mineru_health.mineru4.router.pool import MAIN_PORT_STATUS
from mineru_health.mineru4.router.retired import RetiredOutputs
from mineru_health.runtime.router.fleet import expectations
from mineru_health.runtime.router.policy import (
    Action,
    Answer,
    AnswerKind,
    WorkerView,
    next_step,
)
from mineru_health.runtime.router.supervisor import Supervisor
from mineru_health.runtime.settings import HealthSettings

ENGINE_DEAD_503 = {
    "error": {
        "type": "engine_error",
        "code": "engine_dead",
        "message": "EngineDeadError: EngineCore died",
        "param": None,
    }
}


def ok_expectations() -> Any:
    expect = _native.ProbeExpectations()
    expect.expected_status = "ok"
    expect.require_load_fields = False
    return expect


def test_mineru4_engine_dead_503_is_definitive() -> None:
    result = _native.classify_health_response(
        503, json.dumps(ENGINE_DEAD_503), False, ok_expectations()
    )
    assert result.status == ProbeStatus.ENGINE_DEAD
    assert result.definitive
    assert "EngineCore died" in result.detail


def test_mineru4_other_503_counts_against_the_threshold() -> None:
    body = {"error": {"code": "model_preload_failed", "message": "no weights"}}
    result = _native.classify_health_response(503, json.dumps(body), False, ok_expectations())
    assert result.status == ProbeStatus.HTTP_STATUS
    assert not result.definitive


def test_mineru4_healthy_body_without_load_fields() -> None:
    body = {"status": "ok", "version": "4.0.12", "features": {"sources": ["file_id"]}}
    result = _native.classify_health_response(200, json.dumps(body), False, ok_expectations())
    assert result.healthy


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/v1/health":
            body, code = json.dumps({"status": "ok", "version": "4.0.12"}).encode(), 200
        else:
            body, code = b'{"status": "not_found"}', 404
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def mineru4_main_port() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_poller_judges_a_mineru4_main_port_by_its_own_word(mineru4_main_port: str) -> None:
    """The main port says "ok" (main_port_status); the worker is probed at <base>/v1/health."""
    settings = HealthSettings.preset("fast").replace(
        interval_s=0.2, probe_timeout_s=0.1, connect_timeout_s=0.1
    )
    poller = _native.Poller(
        settings.native,
        expectations(settings, require_load_fields=False, main_port_status=MAIN_PORT_STATUS),
        0,
    )
    poller.add_worker(_native.Target("w", f"{mineru4_main_port}/v1", False, ""))
    poller.start()
    try:
        events: list[Any] = []
        for _ in range(200):
            events += poller.drain_events()
            if any(e.probe is not None and e.probe.healthy for e in events):
                break
            threading.Event().wait(0.02)
        probes = [e.probe for e in events if e.probe is not None]
        assert probes and probes[-1].healthy, [p.detail for p in probes]
        assert probes[-1].url == f"{mineru4_main_port}/v1/health"
    finally:
        poller.stop()


def _job(status: str, code: str | None = None, **extra: Any) -> dict[str, Any]:
    error = {"type": "engine_error", "code": code, "message": f"{code} happened"} if code else None
    return {
        "job_id": "job_1",
        "status": status,
        **extra,
        "files": [{"name": "a.pdf", "status": status, "error": error}],
    }


def test_policy_payload_reads_4_0_engine_deaths() -> None:
    dead = policy_payload(_job("failed", "engine_dead"))
    assert dead == {"status": "failed", "engine_dead": True, "error": "engine_dead happened"}
    view = WorkerView(in_rotation=False, declared_failed=True, same_instance=True)
    assert next_step(Answer(AnswerKind.STATUS, payload=dead), view).action is Action.RESUBMIT


def test_policy_payload_leaves_document_errors_alone() -> None:
    failed = policy_payload(_job("failed", "parse_failed"))
    assert failed["engine_dead"] is False
    view = WorkerView(in_rotation=True, declared_failed=False, same_instance=True)
    assert next_step(Answer(AnswerKind.STATUS, payload=failed), view).action is Action.APPLY


def test_policy_payload_keeps_a_patched_worker_verdict() -> None:
    verdict = {"role": "trigger", "rule": "vllm.engine_dead"}
    view = policy_payload(_job("failed", "engine_dead", verdict=verdict))
    assert view["verdict"] == verdict


@pytest.mark.parametrize("status", ["completed", "partial", "failed", "canceled"])
def test_every_4_0_end_state_is_terminal(status: str) -> None:
    view = WorkerView(in_rotation=True, declared_failed=True, same_instance=True, replaced=True)
    step = next_step(Answer(AnswerKind.STATUS, payload=policy_payload(_job(status))), view)
    assert step.action is Action.APPLY  # never resubmitted once it ended


class _Dir:
    def __init__(self, path: Path) -> None:
        self.name = str(path)
        self.cleaned = False

    def cleanup(self) -> None:
        self.cleaned = True


def _retired(tmp_path: Path) -> tuple[RetiredOutputs, _Dir, str]:
    sha = "ab" * 32
    blob = tmp_path / "uploads" / "blobs" / sha[:2] / sha[2:]
    blob.parent.mkdir(parents=True)
    blob.write_text("# Document 7\n", encoding="utf-8")
    retired, temp_dir = RetiredOutputs(), _Dir(tmp_path)
    meta = {
        "id": "file-public",
        "object": "file",
        "bytes": 13,
        "filename": "doc7.md",
        "purpose": "parse_output",
        "sha256sum": sha,
        "created_at": 1,
    }
    served = retired.retire(temp_dir, [("file-0123abcd", meta), ("file-nosha", {"id": "x"})])
    assert served == 1
    return retired, temp_dir, sha


def test_retired_outputs_answer_for_a_replaced_worker(tmp_path: Path) -> None:
    retired, temp_dir, _ = _retired(tmp_path)
    calls: list[str] = []

    def worker(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        return httpx.Response(404, json={"error": {"code": "file_not_found"}})

    async def run() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        transport = retired.transport(httpx.MockTransport(worker))
        async with httpx.AsyncClient(transport=transport) as client:
            meta = await client.get("http://127.0.0.1:1/v1/files/file-0123abcd")
            content = await client.get("http://127.0.0.1:1/v1/files/file-0123abcd/content")
            other = await client.get("http://127.0.0.1:1/v1/files/file-other/content")
            return meta, content, other

    meta, content, other = asyncio.run(run())
    assert meta.status_code == 200 and meta.json()["id"] == "file-0123abcd"
    assert content.status_code == 200 and content.text == "# Document 7\n"
    assert content.headers["content-type"] == "application/octet-stream"  # as the worker says
    assert other.status_code == 404 and calls == ["/v1/files/file-other/content"]
    retired.close()
    assert temp_dir.cleaned and "file-0123abcd" not in retired


def test_retired_outputs_delete_and_missing_blob(tmp_path: Path) -> None:
    retired, _, sha = _retired(tmp_path)
    (tmp_path / "uploads" / "blobs" / sha[:2] / sha[2:]).unlink()
    missing = retired.answer("GET", "/v1/files/file-0123abcd/content")
    assert missing is not None and missing[0] == 404
    deleted = retired.answer("DELETE", "/v1/files/file-0123abcd")
    assert deleted is not None and deleted[0] == 200
    assert retired.answer("GET", "/v1/files/file-0123abcd") is None
    assert retired.retire(None, []) == 0


def test_retired_outputs_of_an_earlier_instance_survive_a_second_restart(
    tmp_path: Path,
) -> None:
    """Issue 24: the router still lists the first instance's files on the worker."""
    retired, _, _ = _retired(tmp_path)
    second = tmp_path / "second"
    (second / "uploads" / "blobs").mkdir(parents=True)
    meta = {"id": "file-public", "sha256sum": "cd" * 32}
    served = retired.retire(
        _Dir(second), [("file-0123abcd", {"sha256sum": "ab" * 32}), ("file-4567cdef", meta)]
    )
    assert served == 1  # only the second instance's own file
    answer = retired.answer("GET", "/v1/files/file-0123abcd/content")
    assert answer is not None and answer[0] == 200 and answer[2] == b"# Document 7\n"


class _ProxyError(Exception):
    def __init__(self, status_code: int) -> None:
        super().__init__(f"HTTP {status_code}")
        self.status_code = status_code


class _Response:
    def __init__(self, status_code: int, body: bytes = b"{}") -> None:
        self.status_code = status_code
        self.body = body


class _Pool:
    def __init__(self) -> None:
        settings = HealthSettings.preset("fast").replace(
            interval_s=0.01, probe_timeout_s=0.005, connect_timeout_s=0.005
        )
        self.workers = [SimpleNamespace(worker_id="w0"), SimpleNamespace(worker_id="w1")]
        self.checked: list[str] = []
        self.fleet = SimpleNamespace(
            settings=settings,
            local=SimpleNamespace(check_process=self.checked.append),
            listen=lambda callback: None,
            state_dirs=SimpleNamespace(router_dir=lambda: None),
        )
        self.supervisor: Any = None  # built beside the pool's job line (_supervisor)


def _supervisor(pool: _Pool) -> Any:
    """4.0's job line (whose failover this is), as the pool and ``install_app`` build it."""
    line = JobLine(pool)
    pool.supervisor = Supervisor.over(pool.fleet, line)  # type: ignore[arg-type]
    namespace = {
        "RouterProxyError": _ProxyError,
        "rewrite_job_payload": lambda payload, *rest: payload,
        "_mark_missing_job": lambda route, pool: {},
    }
    line.install(None, None, namespace)
    install_endpoints(line, namespace)
    return line


def test_a_submission_lost_on_its_worker_is_made_again() -> None:
    pool = _Pool()
    answers: list[Any] = [
        _ProxyError(502),
        _Response(503, b'{"error":{"code":"engine_dead"}}'),
        _Response(200),
    ]

    async def submit_job(body: Any, request: Any, uploads: Any) -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    response = asyncio.run(submit_with_failover(_supervisor(pool), submit_job, {}, None, None))
    assert response.status_code == 200 and answers == []
    assert pool.checked == ["w0", "w1", "w0", "w1"]  # every process checked before each try


@pytest.mark.parametrize("answer", [_ProxyError(400), _Response(503, b'{"error":{"code":"x"}}')])
def test_other_submission_answers_go_to_the_client(answer: Any) -> None:
    async def submit_job(body: Any, request: Any, uploads: Any) -> Any:
        if isinstance(answer, Exception):
            raise answer
        return answer

    supervisor = _supervisor(_Pool())
    if isinstance(answer, Exception):
        with pytest.raises(_ProxyError):
            asyncio.run(submit_with_failover(supervisor, submit_job, {}, None, None))
    else:
        assert asyncio.run(submit_with_failover(supervisor, submit_job, {}, None, None)) is answer


def test_failover_gives_up_after_one_try_per_worker_and_one_more() -> None:
    calls = 0

    async def submit_job(body: Any, request: Any, uploads: Any) -> Any:
        nonlocal calls
        calls += 1
        raise _ProxyError(504)

    with pytest.raises(_ProxyError):
        asyncio.run(submit_with_failover(_supervisor(_Pool()), submit_job, {}, None, None))
    assert calls == 3


def test_policy_payload_resubmits_a_hung_job_without_ejecting() -> None:
    from mineru_health.mineru4 import TASK_HUNG_CODE
    from mineru_health.mineru4.router.jobs import policy_payload
    from mineru_health.runtime.router.policy import (
        Answer,
        engine_dead_failure,
        hung_failure,
        trigger_rule,
    )

    view = Answer.of_status(
        policy_payload(
            {
                "status": "failed",
                "files": [
                    {
                        "status": "failed",
                        "error": {"code": TASK_HUNG_CODE, "message": "no progress"},
                    }
                ],
            }
        )
    )
    assert hung_failure(view) and not engine_dead_failure(view)
    assert trigger_rule(view) == "watchdog.task_hung"

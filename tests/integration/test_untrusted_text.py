"""Text a user controls never restarts a real, patched ``mineru-api`` worker.

(a) A ~700-byte .docx whose XML opens a tag named ``EngineDeadError`` (and
quotes vLLM's engine-death message) fails in MinerU's document conversion
with lxml's "Opening and ending tag mismatch: EngineDeadError ..."; the
marker check of PR #5188 calls that fatal. The worker must stay healthy and
keep serving other tasks.

(b) A task with backend ``vlm-http-client`` and a user-chosen ``server_url``
pointing at a loopback server that answers HTTP 500 with vLLM's engine-death
text fails with mineru_vl_utils' ServerError quoting that body. The remote
engine's death is not this worker's: it stays healthy.
"""

from __future__ import annotations

import io
import json
import threading
import zipfile
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ManagedProcess, free_port, http_get, submit_task, wait_task, wait_until

pytestmark = pytest.mark.integration

ENGINE_DEATH = "EngineCore encountered an issue. See stack trace (above) for the root cause."
DOCX_TYPE = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"


def engine_dead_docx() -> bytes:
    """A minimal OOXML package MinerU detects as .docx, with broken document XML."""
    content_types = (
        '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
        '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.'
        'relationships+xml"/><Override PartName="/word/document.xml" ContentType="application/'
        'vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>'
    )
    rels = (
        '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
        '<Relationship Id="r1" Type="http://schemas.openxmlformats.org/officeDocument/2006/'
        'relationships/officeDocument" Target="word/document.xml"/></Relationships>'
    )
    document = (
        '<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main">'
        f"<w:body><EngineDeadError>{ENGINE_DEATH}</w:body></w:document>"
    )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as package:
        package.writestr("[Content_Types].xml", content_types)
        package.writestr("_rels/.rels", rels)
        package.writestr("word/document.xml", document)
    return buffer.getvalue()


class _DeadEngineHandler(BaseHTTPRequestHandler):
    """An OpenAI-compatible front end whose engine died: lists its model, fails every call."""

    def _send(self, status: int, body: dict[str, Any]) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/v1/models"):
            self._send(
                200,
                {
                    "object": "list",
                    "data": [
                        {"id": "dead-engine", "object": "model", "created": 0, "owned_by": "test"}
                    ],
                },
            )
        else:
            self._send(404, {"detail": "not found"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.server.calls += 1  # type: ignore[attr-defined]
        self._send(
            500,
            {
                "object": "error",
                "message": f"vllm.v1.engine.exceptions.EngineDeadError: {ENGINE_DEATH}",
                "type": "InternalServerError",
                "param": None,
                "code": 500,
            },
        )

    def log_message(self, format: str, *args: Any) -> None:
        return


@pytest.fixture
def dead_engine_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _DeadEngineHandler)
    server.calls = 0  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
        assert server.calls > 0, "the worker never called the dead engine"  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()


def _submit(base_url: str, name: str, content: bytes, mime: str, server_url: str) -> str:
    response = submit_task(base_url, content, server_url, name=name, mime=mime)
    assert response.status_code == 202, response.text
    task_id: str = response.json()["task_id"]
    return task_id


def _assert_healthy(proc: ManagedProcess) -> None:
    response = http_get(f"{proc.base_url}/health", 5.0)
    assert response is not None, proc.log_tail()
    assert response.status_code == 200, (response.text, proc.log_tail())
    assert response.json()["status"] == "healthy"


def test_docx_with_engine_dead_tag_keeps_worker_healthy(
    patched_mineru_site: Path,
    mineru_api_factory: Callable[..., ManagedProcess],
    fake_vlm_url: str,
    tiny_pdf: bytes,
) -> None:
    docx = engine_dead_docx()
    assert 600 <= len(docx) <= 900, len(docx)
    proc = mineru_api_factory(patched_mineru_site)
    _assert_healthy(proc)

    # Another task in flight on a slow engine while the document fails.
    slow = _submit(
        proc.base_url, "slow.pdf", tiny_pdf, "application/pdf", f"{fake_vlm_url}/delay/1500/"
    )
    evil = _submit(proc.base_url, "evil.docx", docx, DOCX_TYPE, fake_vlm_url)

    failed = wait_task(proc, evil)
    assert failed["status"] == "failed", (failed, proc.log_tail())
    assert "EngineDeadError" in (failed["error"] or ""), failed  # the text reached the worker
    _assert_healthy(proc)

    assert wait_task(proc, slow)["status"] == "completed", proc.log_tail()
    after = _submit(proc.base_url, "after.pdf", tiny_pdf, "application/pdf", fake_vlm_url)
    assert wait_task(proc, after)["status"] == "completed", proc.log_tail()
    _assert_healthy(proc)
    assert proc.poll() is None


def test_remote_engine_death_keeps_worker_healthy(
    patched_mineru_site: Path,
    mineru_api_factory: Callable[..., ManagedProcess],
    fake_vlm_url: str,
    dead_engine_url: str,
    tiny_pdf: bytes,
) -> None:
    proc = mineru_api_factory(patched_mineru_site)
    _assert_healthy(proc)

    remote = _submit(proc.base_url, "remote.pdf", tiny_pdf, "application/pdf", dead_engine_url)
    failed = wait_task(proc, remote)
    assert failed["status"] == "failed", (failed, proc.log_tail())
    assert "500" in (failed["error"] or "") or "EngineCore" in (failed["error"] or ""), failed
    _assert_healthy(proc)

    after = _submit(proc.base_url, "after.pdf", tiny_pdf, "application/pdf", fake_vlm_url)
    assert wait_task(proc, after)["status"] == "completed", proc.log_tail()
    _assert_healthy(proc)
    assert proc.poll() is None


def test_control_an_operator_rule_trusting_documents_would_restart(
    patched_mineru_site: Path,
    mineru_api_factory: Callable[..., ManagedProcess],
    fake_vlm_url: str,
    tmp_path: Path,
) -> None:
    """The same .docx does reach the classifier: a rule that trusts any text turns it fatal."""
    rules = tmp_path / "rules.txt"
    rules.write_text(
        "site.trust_any fatal engine_dead target=frame origin=any EngineDeadError\n",
        encoding="utf-8",
    )
    proc = mineru_api_factory(patched_mineru_site, env={"MINERU_HEALTH_RULES": str(rules)})
    _assert_healthy(proc)
    evil = _submit(proc.base_url, "evil.docx", engine_dead_docx(), DOCX_TYPE, fake_vlm_url)
    assert wait_task(proc, evil)["status"] == "failed"

    def unhealthy() -> bool:
        response = http_get(f"{proc.base_url}/health", 5.0)
        return response is not None and response.status_code == 503

    assert wait_until(unhealthy, 30.0, 0.1), proc.log_tail()
    body = httpx.get(f"{proc.base_url}/health", timeout=5).json()
    assert body["rule"] == "site.trust_any", body

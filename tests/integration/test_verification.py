"""Verify, don't guess (issue 18), against a real patched ``mineru-api`` (MinerU 3.x).

The fault plan raises an error no rule knows in MinerU's real parse path and
plants an engine handle (lmdeploy's shape) in MinerU's real
``ModelSingleton._models``. Only checking that handle can tell the worker
whether the engine survived: broken, the worker turns 503 with rule
``verify.lmdeploy`` (category ``engine_check_failed``); healthy, it stays 200
and the failure stays the task's own. The liveness thread reads only an
``errored`` flag, which lmdeploy's engine has not, so nothing but the
verification can decide here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ManagedProcess, http_get, wait_until
from mineru_health.testing.faults import UNKNOWN_ERROR_MESSAGE, write_plan

pytestmark = pytest.mark.integration

TASK_TIMEOUT_S = 120.0
BACKEND = "vlm-http-client"


def _submit(base_url: str, pdf: bytes, server_url: str) -> httpx.Response:
    return httpx.post(f"{base_url}/tasks", files={"files": ("doc.pdf", pdf, "application/pdf")},
                      data={"backend": BACKEND, "server_url": server_url}, timeout=60.0)


def _wait_terminal(proc: ManagedProcess, task_id: str) -> dict[str, Any]:
    def terminal() -> dict[str, Any] | None:
        response = httpx.get(f"{proc.base_url}/tasks/{task_id}", timeout=10)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body if body["status"] in ("completed", "failed") else None

    body = wait_until(terminal, TASK_TIMEOUT_S, 0.1)
    assert body, f"task {task_id} did not finish:\n{proc.log_tail()}"
    result: dict[str, Any] = body
    return result


def _health(proc: ManagedProcess) -> httpx.Response:
    response = http_get(f"{proc.base_url}/health", 5.0)
    assert response is not None, proc.log_tail()
    return response


def _fail_one_task(proc: ManagedProcess, plan: Path, word: str, pdf: bytes,
                   server_url: str) -> dict[str, Any]:
    write_plan(plan, word)
    submitted = _submit(proc.base_url, pdf, server_url)
    assert submitted.status_code == 202, submitted.text
    failed = _wait_terminal(proc, submitted.json()["task_id"])
    assert failed["status"] == "failed", proc.log_tail()
    assert UNKNOWN_ERROR_MESSAGE in failed["error"]
    return failed


def test_unknown_error_with_a_broken_engine_turns_the_worker_503(
    patched_mineru_site: Path,
    mineru_api_factory: Callable[..., ManagedProcess],
    fake_vlm_url: str,
    tiny_pdf: bytes,
    tmp_path: Path,
) -> None:
    plan = tmp_path / "fault-plan"
    proc = mineru_api_factory(patched_mineru_site, env={"MINERU_HEALTH_FAULT_PLAN": str(plan)})
    failed = _fail_one_task(proc, plan, "unknown_error_dead", tiny_pdf, fake_vlm_url)
    verdict = failed["verdict"]
    assert (verdict["rule"], verdict["category"], verdict["role"]) == (
        "verify.lmdeploy", "engine_check_failed", "trigger")
    assert failed["engine_dead"] is True
    checked = verdict["verification"]
    assert checked["outcome"] == "dead" and "main loop" in checked["detail"]

    health = _health(proc)
    assert health.status_code == 503, health.text
    body = health.json()
    assert (body["rule"], body["category"]) == ("verify.lmdeploy", "engine_check_failed")
    refused = _submit(proc.base_url, tiny_pdf, fake_vlm_url)
    assert refused.status_code == 503 and int(refused.headers["retry-after"]) > 0


def test_unknown_error_with_a_healthy_engine_stays_200(
    patched_mineru_site: Path,
    mineru_api_factory: Callable[..., ManagedProcess],
    fake_vlm_url: str,
    tiny_pdf: bytes,
    tmp_path: Path,
) -> None:
    plan = tmp_path / "fault-plan"
    proc = mineru_api_factory(patched_mineru_site, env={"MINERU_HEALTH_FAULT_PLAN": str(plan)})
    failed = _fail_one_task(proc, plan, "unknown_error_alive", tiny_pdf, fake_vlm_url)
    verdict = failed["verdict"]
    assert verdict["fatal"] is False and failed["engine_dead"] is False
    assert verdict["verification"]["outcome"] == "alive", verdict
    assert any(check["verifier"] == "lmdeploy" and check["state"] == "alive"
               for check in verdict["verification"]["checks"])
    assert _health(proc).status_code == 200

    later = _wait_terminal(proc, _submit(proc.base_url, tiny_pdf, fake_vlm_url).json()["task_id"])
    assert later["status"] == "completed", proc.log_tail()
    assert _health(proc).status_code == 200

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

import pytest
from conftest import ManagedProcess, submit_task, wait_task, worker_health
from mineru_health.demo.faults import UNKNOWN_ERROR_MESSAGE, write_plan

pytestmark = pytest.mark.integration


def _fail_one_task(
    proc: ManagedProcess, plan: Path, word: str, pdf: bytes, server_url: str
) -> dict[str, Any]:
    write_plan(plan, word)
    submitted = submit_task(proc.base_url, pdf, server_url)
    assert submitted.status_code == 202, submitted.text
    failed = wait_task(proc, submitted.json()["task_id"])
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
        "verify.lmdeploy",
        "engine_check_failed",
        "trigger",
    )
    assert failed["engine_dead"] is True
    checked = verdict["verification"]
    assert checked["outcome"] == "dead" and "main loop" in checked["detail"]

    health = worker_health(proc)
    assert health.status_code == 503, health.text
    body = health.json()
    assert (body["rule"], body["category"]) == ("verify.lmdeploy", "engine_check_failed")
    refused = submit_task(proc.base_url, tiny_pdf, fake_vlm_url)
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
    assert any(
        check["verifier"] == "lmdeploy" and check["state"] == "alive"
        for check in verdict["verification"]["checks"]
    )
    assert worker_health(proc).status_code == 200

    later = wait_task(proc, submit_task(proc.base_url, tiny_pdf, fake_vlm_url).json()["task_id"])
    assert later["status"] == "completed", proc.log_tail()
    assert worker_health(proc).status_code == 200


MINERU4_PYTHON_ENV = "MINERU_HEALTH_MINERU4_PYTHON"
_MINERU4_SCRIPT = r"""
import json, sys, threading, types
import mineru_llama_cpp
from mineru.model.vlm import async_runtime, runtime
from mineru_health.runtime.worker import verification

llama = mineru_llama_cpp.Engine.__new__(mineru_llama_cpp.Engine)  # no model: never loaded
llama._closed, llama._close_lock = True, threading.Lock()

def factory():
    client = types.SimpleNamespace()
    client._mineru_runtime_handles = {
        "backend": "llama-cpp-engine", "model": None, "processor": None, "vllm_llm": None,
        "vllm_async_llm": None, "lmdeploy_engine": None, "llama_cpp_engine": llama}
    return client

local = async_runtime.AsyncVlmPredictor(factory, lambda client: None,
                                        backend="vllm-async-engine", max_concurrency=1)
local.wait_ready()
remote = async_runtime.AsyncVlmPredictor(factory, lambda client: None,
                                         backend="http-client", max_concurrency=1)
remote.wait_ready()
runtime.ModelSingleton._models[("vllm-async-engine", "/m", None, "fp")] = local
runtime.ModelSingleton._models[("http-client", None, "http://127.0.0.1:9", "fp")] = remote
out = {"handles": [[h.verifier, h.where] for h in verification.engine_handles()]}
out["running"] = verification.verify_mineru_runtime(local)
out["llama"] = verification.verify_llama_cpp(llama)
out["engine_error"] = (verification._llama_error_class(llama, "EngineError")
                       is mineru_llama_cpp.exceptions.EngineError)
out["params"] = mineru_llama_cpp.SamplingParams(n_predict=1).to_json_fields()
local._loop.call_soon_threadsafe(local._loop.stop)  # the runtime thread ends, unasked
local._thread.join(10)
out["stopped"] = verification.verify_mineru_runtime(local)
print(json.dumps(out))
"""


def test_mineru4_runtime_and_llama_cpp_shapes(tmp_path: Path) -> None:
    """MinerU 4.0.12's real AsyncVlmPredictor and ModelSingleton, mineru_llama_cpp's classes."""
    import json
    import os
    import subprocess

    from mineru_health.demo.sandbox import mineru_health_path

    python = os.environ.get(MINERU4_PYTHON_ENV, "")
    if not python:
        pytest.skip(f"{MINERU4_PYTHON_ENV} not set (a MinerU 4.0 venv with mineru_llama_cpp)")
    # Only our package on the path: the dev venv's site-packages also hold MinerU 3.x.
    site = tmp_path / "site"
    site.mkdir()
    (site / "mineru_health").symlink_to(Path(mineru_health_path()) / "mineru_health")
    done = subprocess.run(
        [python, "-c", _MINERU4_SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "PYTHONPATH": str(site),
            "HOME": str(tmp_path),
            "MINERU_HOME": str(tmp_path),
        },
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    verifiers = [verifier for verifier, _ in out["handles"]]
    assert verifiers == ["mineru_runtime", "llama_cpp"], out["handles"]  # the remote one skipped
    assert out["running"] == ["alive", "runtime thread running"]
    assert out["llama"] == ["dead", "engine closed"]
    assert out["engine_error"] is True and out["params"] == {"n_predict": 1}
    assert out["stopped"][0] == "dead", out["stopped"]

"""Detection on MinerU 4.0.12, upstream against ours: which engine deaths turn a worker unhealthy.

For each fault, in the same run, a fresh real ``mineru-api`` 4.0.12 (flash
tier, offline) on each side gets the fault plan, then one job; then the
worker's answers are read: ``/v1/health`` (and, ours, the native endpoint),
and whether a second job is refused. The fault plan plugin raises the
engine's own error at 4.0's parse call, on both sides alike:

- ``llama_engine_dead``:    llama.cpp's ``EngineError("no result (stopped)")``;
- ``cuda_illegal_address``: PyTorch's sticky CUDA ``RuntimeError``;
- ``engine_dead``:          vLLM's ``EngineDeadError``;
- ``task_local``:           a document's own error (the worker must stay healthy).

Sides: (a) upstream: an unpatched copy of 4.0.12 (its own
``is_fatal_engine_error``); (b) ours: the copy patched by ``mineru-health
patch apply``.

    MINERU_HEALTH_MINERU4_PYTHON=.venv-mineru4/bin/python \\
        python bench/recovery/detect4.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from mineru_health.testing.faults import write_plan
from mineru_health.testing.sandbox import (
    HOST,
    Processes,
    add_fault_plugin,
    copy_mineru,
    free_port,
    make_pdf,
    mineru4_api_command,
    mineru4_env,
    mineru4_python,
    patched_site4,
    wait_until,
)

FAULTS = ("llama_engine_dead", "cuda_illegal_address", "engine_dead", "task_local")
START_TIMEOUT_S = 180.0
JOB_TIMEOUT_S = 120.0


def _status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=10.0).status_code
    except httpx.HTTPError:
        return None


def _job(base: str, pdf: bytes) -> tuple[int, dict[str, Any] | None]:
    submitted = httpx.post(f"{base}/v1/tasks", params={"tier": "flash"},
                           files={"files": ("doc.pdf", pdf, "application/pdf")}, timeout=60)
    if submitted.status_code != 202:
        return submitted.status_code, None
    task_id = submitted.json()["task_id"]
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while time.monotonic() < deadline:
        body: dict[str, Any] = httpx.get(f"{base}/v1/tasks/{task_id}", timeout=60).json()
        if body["status"] not in ("queued", "running"):
            return 202, body
        time.sleep(0.2)
    return 202, None


def one(site: Path, root: Path, python: str, fault: str, pdf: bytes, *,
        native: bool) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(dir=root))
    port, health_port = free_port(), free_port()
    plan = scratch / "plan"
    extra = {"MINERU_HEALTH_FAULT_PLAN": str(plan)}
    if native:
        extra["MINERU_HEALTH_PORT"] = str(health_port)
    base = f"http://{HOST}:{port}"
    with Processes() as procs:
        worker = procs.start("mineru-api", mineru4_api_command(python, port, scratch / "up"),
                             env=mineru4_env(site, scratch, extra=extra),
                             log_path=scratch / "api.log")
        if not wait_until(lambda: _status(f"{base}/v1/health") == 200, START_TIMEOUT_S, 0.5):
            raise RuntimeError(f"the worker did not start:\n{worker.log_tail()}")
        write_plan(plan, fault)
        started = time.monotonic()
        _, job = _job(base, pdf)
        first_job_s = round(time.monotonic() - started, 2)
        error = ((job or {}).get("files") or [{}])[0].get("error") or {}
        result: dict[str, Any] = {
            "job": (job or {}).get("status", "timed out"),
            "job_error_code": error.get("code"),
            "v1_health": _status(f"{base}/v1/health"),
            "next_submit": _job(base, pdf)[0],
            "first_job_s": first_job_s,  # fault plan to the job's final status
        }
        if native:
            result["native_health"] = _status(f"http://{HOST}:{health_port}/health")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    python = mineru4_python()
    if python is None:
        print("set MINERU_HEALTH_MINERU4_PYTHON to a MinerU 4.0 venv's python", file=sys.stderr)
        return 2
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="mineru-health-detect4-") as tmp:
        root = Path(tmp)
        pdf = make_pdf(2, lines_per_page=40)
        sites = {"upstream": add_fault_plugin(copy_mineru(root / "site-upstream", python)),
                 "ours": patched_site4(root / "site-ours", python)}
        for fault in FAULTS:
            for side, site in sites.items():
                outcome = one(site, root, python, fault, pdf, native=side == "ours")
                results.setdefault(fault, {})[side] = outcome
                print(f"{fault:22} {side:8} {json.dumps(outcome)}", flush=True)
    dead = [f for f in FAULTS if f != "task_local"]
    summary = {side: sum(results[f][side]["v1_health"] == 503 for f in dead)
               for side in ("upstream", "ours")}
    print(f"engine deaths detected (/v1/health 503) of {len(dead)}: {summary}")
    if args.json:
        args.json.write_text(json.dumps({"results": results, "detected": summary}, indent=2)
                             + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

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

from mineru_health.demo.faults import write_plan
from mineru_health.demo.fleet import LINE4, Worker, start_worker, text_pdf
from mineru_health.demo.sandbox import Processes, mineru4_python

FAULTS = ("llama_engine_dead", "cuda_illegal_address", "engine_dead", "task_local")
START_TIMEOUT_S = 180.0
JOB_TIMEOUT_S = 120.0


def _status(get: Any) -> int | None:
    try:
        return int(get().status_code)
    except Exception:  # noqa: BLE001 - no answer
        return None


def _job(worker: Worker, pdf: bytes) -> tuple[int, dict[str, Any] | None]:
    submitted = worker.client.post("doc.pdf", pdf)
    if submitted.status_code != 202:
        return submitted.status_code, None
    outcome = worker.client.wait(submitted.json()["task_id"], timeout_s=JOB_TIMEOUT_S)
    return 202, None if outcome.status == "hung" else outcome.detail


def one(
    site: Path, root: Path, python: str, fault: str, pdf: bytes, *, native: bool
) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(dir=root))
    with Processes() as procs:
        worker = start_worker(
            procs,
            LINE4,
            site,
            python,
            scratch,
            native=native,
            faults=True,
            timeout_s=START_TIMEOUT_S,
        )
        write_plan(worker.plan, fault)
        started = time.monotonic()
        _, job = _job(worker, pdf)
        first_job_s = round(time.monotonic() - started, 2)
        error = ((job or {}).get("files") or [{}])[0].get("error") or {}
        result: dict[str, Any] = {
            "job": (job or {}).get("status", "timed out"),
            "job_error_code": error.get("code"),
            "v1_health": _status(lambda: worker.get("/v1/health")),
            "next_submit": _job(worker, pdf)[0],
            "first_job_s": first_job_s,  # fault plan to the job's final status
        }
        if native:
            result["native_health"] = _status(worker.native)
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
        pdf = text_pdf(2)
        sites = {
            "upstream": LINE4.site(root / "site-upstream", python, patched=False),
            "ours": LINE4.site(root / "site-ours", python),
        }
        for fault in FAULTS:
            for side, site in sites.items():
                outcome = one(site, root, python, fault, pdf, native=side == "ours")
                results.setdefault(fault, {})[side] = outcome
                print(f"{fault:22} {side:8} {json.dumps(outcome)}", flush=True)
    dead = [f for f in FAULTS if f != "task_local"]
    summary = {
        side: sum(results[f][side]["v1_health"] == 503 for f in dead)
        for side in ("upstream", "ours")
    }
    print(f"engine deaths detected (/v1/health 503) of {len(dead)}: {summary}")
    if args.json:
        args.json.write_text(
            json.dumps({"results": results, "detected": summary}, indent=2) + "\n", encoding="utf-8"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

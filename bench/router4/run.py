"""MinerU 4.0 router under faults: MinerU's own 4.0 router against ours, in the same run.

For each scenario and each side a fresh ``mineru-router --local-gpus 0,1
--worker-tier flash`` (offline, text PDFs) gets the same steady stream of
jobs (one every 0.8 s through ``/v1/tasks``) and, after three jobs
completed, the same fault on one worker:

- ``kill9``:       ``kill -9`` of a worker process;
- ``engine_dead``: vLLM's ``EngineDeadError`` from 4.0's parse call, from then on
                   (4.0.12 recognises it itself: job failed, ``/v1/health`` 503);
- ``hang``:        the worker's event loop blocks (its ``/v1/health`` answers nothing).

Sides: ``upstream`` (MinerU 4.0's own router; the fault plugin only) and
``ours`` (the copy patched with ``patches/mineru-4.0``), both with the
router's environment of the tests (fast preset, 3 s main-port timeout:
read only by ours). Measured: jobs submitted, jobs lost (refused, failed or
not finished within the wait), seconds from the fault to fewer than two
workers taking jobs and to both again (``/v1/usage``, every 0.2 s). Earlier
results still downloadable is checked too. Timings depend on the machine;
read them side by side.

    MINERU_HEALTH_MINERU4_PYTHON=/path/to/python python bench/router4/run.py \\
        [--scenarios kill9,engine_dead,hang] [--sides upstream,ours] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from mineru_health.testing import router4, sandbox
from mineru_health.testing.router4 import Fleet, Job

SCENARIOS: dict[str, Callable[[Fleet], None]] = {
    "kill9": lambda fleet: os.kill(fleet.worker_pids()[0], signal.SIGKILL),
    "engine_dead": lambda fleet: router4.write_plan(fleet.plan, "engine_dead"),
    "hang": lambda fleet: router4.write_plan(fleet.plan, "hang"),
}


def downloadable(fleet: Fleet, jobs: list[Job]) -> int:
    count = 0
    with httpx.Client(base_url=fleet.base, timeout=30) as client:
        for job in jobs:
            try:
                output = job.payload["files"][0]["output_files"]["markdown"]
                content = client.get(f"/v1/files/{output['file_id']}/content")
            except (httpx.HTTPError, KeyError, TypeError, IndexError):
                continue
            count += content.status_code == 200 and f"Document {job.seed}," in content.text
    return count


def _reason(job: Job) -> str:
    if job.error is not None:
        return f"submission refused: {job.error}"[:160]
    files = job.payload.get("files") or [{}]
    return f"{job.status}: {files[0].get('error')}"[:160]


def one(python: str, scenario: str, side: str) -> dict[str, Any]:
    with (tempfile.TemporaryDirectory(prefix=f"router4-{scenario}-{side}-") as scratch,
          router4.start_fleet(Path(scratch), python, patched=side == "ours") as fleet):
        run = router4.run_fault(fleet, lambda: SCENARIOS[scenario](fleet),
                                recovery_timeout_s=90.0, job_timeout_s=120.0)
        kept = downloadable(fleet, run.before)
    return {
        "scenario": scenario,
        "side": side,
        "jobs": len(run.jobs),
        "lost": len(run.lost),
        "out_after_s": None if run.out_at is None else round(run.out_at - run.fault_at, 2),
        "back_after_s": None if run.back_at is None else round(run.back_at - run.fault_at, 2),
        "earlier_results": f"{kept}/{len(run.before)}",
        "lost_reasons": sorted({_reason(j) for j in run.lost}),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--sides", default="upstream,ours")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    python = sandbox.mineru4_python()
    if python is None:
        print(f"set {sandbox.MINERU4_PYTHON_ENV} to a MinerU 4.0 Python", file=sys.stderr)
        return 2
    rows = []
    for scenario in args.scenarios.split(","):
        for side in args.sides.split(","):
            row = one(python, scenario, side)
            rows.append(row)
            print(f"{scenario:12} {side:9} jobs {row['jobs']:3}  lost {row['lost']:3}  "
                  f"out after {row['out_after_s']} s  back after {row['back_after_s']} s  "
                  f"earlier results {row['earlier_results']}", flush=True)
            for reason in row["lost_reasons"]:
                print(f"{'':23}lost: {reason}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``mineru-health demo`` on MinerU 4.0: the same story on 4.0's ``mineru-router`` and workers.

The fleet is :mod:`mineru_health.testing.router`'s (the harness of the 4.0
router tests and ``bench/recovery --line 4``): the real, patched ``mineru-router``
4.0 with two local workers on the flash tier, offline, a job (a text PDF)
every 0.8 s. One worker's engine fails as the scenario says; the timeline
comes from the router's audit file and ``/v1/usage``, the verdict from the
jobs: none lost, the worker back in rotation (``task-local``: one job failed,
nothing restarted).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..safe_text import printable

__all__ = ["SCENARIOS4", "run_demo4"]


@dataclass(frozen=True)
class Scenario4:
    word: str  # the fault plan word (testing/faults.py)
    story: str
    restarts: bool  # the worker is expected to leave rotation and come back


SCENARIOS4 = {
    "engine-death": Scenario4(
        "llama_engine_dead",
        "llama.cpp, 4.0's default engine, dies in one worker (upstream 4.0.12 never notices)",
        True),
    "hung-worker": Scenario4(
        "hang", "one worker's event loop blocks for good (its HTTP server stops answering)", True),
    "task-local": Scenario4(
        "task_local", "one document fails to parse: one job fails, nothing is restarted", False),
}


def _line(out: IO[str], start: float, when: float, text: str) -> None:
    print(f"  {when - start:7.1f} s  {printable(text)}", file=out, flush=True)


def run_demo4(python: str, scenario: str, *, json_mode: bool, keep_temp: bool,
              out: IO[str] = sys.stdout) -> int:
    """Runs one 4.0 scenario; returns the demo's exit status (0 outcome met, 1 missed, 2 set-up)."""
    from ..testing.router import FLEET4_ENV, LINE4, fleet, run_fault
    from ..testing.sandbox import SandboxError

    chosen = SCENARIOS4[scenario]
    scratch = Path(tempfile.mkdtemp(prefix="mineru-health-demo4-"))
    try:
        if not json_mode:
            print(f"mineru-health demo (MinerU 4.0): {chosen.story}", file=out, flush=True)
        try:
            with fleet(LINE4, scratch, python, env=FLEET4_ENV) as router:
                start = time.time()
                if not json_mode:
                    _line(out, start, start, "router and two workers in rotation; jobs start")
                run = run_fault(router, lambda: router.write_plan(chosen.word))
                audit = router.audit_records(since=run.fault_at)
        except SandboxError as error:
            print(f"mineru-health demo: {error}", file=sys.stderr)
            return 2
        lost = [j for j in run.lost if not (chosen.word == "task_local" and j.status == "failed")]
        failed_docs = len(run.lost) - len(lost)
        ok = not lost and ((run.back_at is not None) if chosen.restarts
                           else (run.out_at is None and failed_docs <= 1))
        summary: dict[str, Any] = {
            "line": "4.0", "scenario": scenario, "ok": ok,
            "jobs": len(run.outcomes),
            "completed": sum(j.status == "completed" for j in run.outcomes),
            "lost": len(lost), "failed_documents": failed_docs,
            "out_of_rotation_after_s": None if run.out_at is None else run.out_at - run.fault_at,
            "back_after_s": None if run.back_at is None else run.back_at - run.fault_at,
            "audit": [{"action": r.get("action"), "worker": r.get("worker_id"),
                       "cause": r.get("cause")} for r in audit],
        }
        if json_mode:
            json.dump(summary, out, indent=2)
            print(file=out)
            return 0 if ok else 1
        events = [(run.fault_at, f"fault injected: {chosen.word}")]
        events += [(_record_time(r, run.fault_at),
                    f"router: {r.get('worker_id')} {r.get('action')} ({r.get('cause') or ''})")
                   for r in audit]
        if run.out_at is not None:
            events.append((run.out_at, "one worker out of rotation (/v1/usage)"))
        if run.back_at is not None:
            events.append((run.back_at, "both workers in rotation again"))
        for when, text in sorted(events, key=lambda event: event[0]):
            _line(out, run.fault_at, when, text)
        print(f"jobs: {summary['jobs']} submitted, {summary['completed']} completed, "
              f"{summary['lost']} lost, {failed_docs} failed by their own document", file=out)
        print(f"outcome: {'as expected' if ok else 'NOT as expected'}", file=out)
        if keep_temp:
            print(f"logs kept in {scratch}", file=out)
        return 0 if ok else 1
    finally:
        if not keep_temp:
            shutil.rmtree(scratch, ignore_errors=True)


def _record_time(record: dict[str, Any], default: float) -> float:
    from datetime import datetime

    try:
        return datetime.fromisoformat(str(record["time"])).timestamp()
    except (KeyError, ValueError):
        return default

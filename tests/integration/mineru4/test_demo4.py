"""``mineru-health demo`` on MinerU 4.0: told from the files of the MinerU it runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from mineru_health.testing.sandbox import MINERU4_PYTHON_ENV, MINERU_PYTHON_ENV

pytestmark = pytest.mark.integration


def test_engine_death_demo_on_4_0_loses_no_job() -> None:
    python4 = os.environ.get(MINERU4_PYTHON_ENV)
    if not python4:
        pytest.skip(f"{MINERU4_PYTHON_ENV} is not set (a MinerU 4.0 venv's python)")
    env = {**os.environ, MINERU_PYTHON_ENV: python4}
    done = subprocess.run(
        [sys.executable, "-m", "mineru_health", "demo", "--scenario", "engine-death", "--json"],
        capture_output=True, text=True, timeout=900, check=False, env=env,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    summary = json.loads(done.stdout)
    assert summary["line"] == "4.0" and summary["outcome"] == "pass"
    tasks = summary["tasks"]
    assert tasks["failed"] == tasks["hung"] == tasks["rejected"] == 0  # no job lost
    assert tasks["completed"] >= 3
    assert summary["recovery_s"] is not None
    actions = {e["text"].split(": ", 1)[1].split(" ", 1)[0]
               for e in summary["timeline"] if e["source"] == "audit" and ": " in e["text"]}
    assert "ejected" in actions and "admitted" in actions, actions

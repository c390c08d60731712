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
    assert summary["line"] == "4.0" and summary["ok"] is True
    assert summary["lost"] == 0 and summary["completed"] >= 3
    assert summary["back_after_s"] is not None
    actions = [r["action"] for r in summary["audit"]]
    assert "ejected" in actions and "admitted" in actions, actions

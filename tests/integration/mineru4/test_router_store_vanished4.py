"""A router store that vanishes under a live 4.0 router loses nothing acknowledged (issue 31).

The same run as ``integration/test_router_store_vanished.py`` on MinerU
4.0.12's patched ``mineru-router`` (one local worker, flash tier, text PDFs,
``/v1/tasks``): the store deleted, then truncated to 0 bytes, mid-stream;
both audited; after ``kill -9`` and a new router every accepted job answers
and completes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mineru_health.demo import sandbox
from mineru_health.demo.fleet import FLEET4_ENV, LINE4, Client, Router, start_router, text_pdf
from mineru_health.demo.sandbox import Processes
from vanished_store import nothing_lost, vanish_and_restart

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        sandbox.mineru4_python() is None,
        reason=f"set {sandbox.MINERU4_PYTHON_ENV} to a MinerU 4.0 Python",
    ),
]


def test_a_store_deleted_then_truncated_under_a_live_4_router_loses_no_job(
    tmp_path: Path,
) -> None:
    python = sandbox.mineru4_python()
    assert python is not None
    site = LINE4.site(tmp_path / "mineru-site", python)
    state = tmp_path / "router-state"
    env = {**FLEET4_ENV, "MINERU_HEALTH_STATE_DIR": str(state)}
    with Processes() as procs:
        count = 0

        def start() -> Router:
            nonlocal count
            count += 1
            router = start_router(
                procs,
                LINE4,
                site,
                python,
                tmp_path / f"router-{count}",
                env=env,
                fault_plan=None,
                local_gpus="0",
            )
            router.wait_in_rotation()
            return router

        run = vanish_and_restart(
            start(),
            start,
            lambda r: Client(r.base, r.line),
            lambda n: (f"doc{n}.pdf", text_pdf(1, seed=n)),
            state,
        )
        nothing_lost(run, state)

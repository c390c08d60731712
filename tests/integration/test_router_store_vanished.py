"""A router store that vanishes under a live router loses nothing acknowledged (issue 31, item 4).

The patched ``mineru-router`` (MinerU 3.x) with one real local worker and
``MINERU_HEALTH_STATE_DIR`` set; a steady stream of tasks. Its store is
deleted, later truncated to 0 bytes, while the stream runs: each is audited
(``state_file_vanished``) and a fresh file written at its path. The router
is then killed with ``kill -9`` and a new one started on the same state
directory: every task the first one accepted answers through the new one (no
404) and completes (``vanished_store.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Router, make_pdf
from mineru_health.demo.fleet import Client
from vanished_store import nothing_lost, vanish_and_restart

pytestmark = pytest.mark.integration

ENV = {"MINERU_ROUTER_HEALTH_PRESET": "fast", "MINERU_ROUTER_HEALTH_RETRY_BUDGET_MIN": "12"}


def test_a_store_deleted_then_truncated_under_a_live_router_loses_no_task(
    launch_router: Callable[..., Router],
    fake_vlm_url: str,
    tmp_path: Path,
) -> None:
    pytest.importorskip("reportlab")
    pdf = make_pdf(text="mineru-health vanished store page")
    state = tmp_path / "router-state"
    env = {**ENV, "MINERU_HEALTH_STATE_DIR": str(state)}

    def start() -> Router:
        router = launch_router(env, local_gpus="0")
        router.wait_in_rotation()
        return router

    run = vanish_and_restart(
        start(),
        start,
        lambda r: Client(r.base, r.line, engine_url=fake_vlm_url),
        lambda n: (f"vanish-{n:03d}.pdf", pdf),
        state,
    )
    nothing_lost(run, state)

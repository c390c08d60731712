"""A router store that vanishes under a live router loses nothing acknowledged (issue 31, item 4).

The patched ``mineru-router`` (MinerU 3.x) with one real local worker and
``MINERU_HEALTH_STATE_DIR`` set; a steady stream of tasks. Its store is
deleted, later truncated to 0 bytes, while the stream runs: each is audited
(``state_file_vanished``) and a fresh file written at its path. The router
is then killed with ``kill -9`` and a new one started on the same state
directory: every task the first one accepted answers through the new one (no
404) and completes.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Router, make_pdf, wait_until
from mineru_health.demo.fleet import Client
from mineru_health.runtime.router.store import DB_NAME
from router_restart import _Feed, _status

pytestmark = pytest.mark.integration

ENV = {"MINERU_ROUTER_HEALTH_PRESET": "fast", "MINERU_ROUTER_HEALTH_RETRY_BUDGET_MIN": "12"}


def test_a_store_deleted_then_truncated_under_a_live_router_loses_no_task(
    launch_router: Callable[..., Router], fake_vlm_url: str, tmp_path: Path,
) -> None:
    pytest.importorskip("reportlab")
    pdf = make_pdf(text="mineru-health vanished store page")
    state = tmp_path / "router-state"
    env = {**ENV, "MINERU_HEALTH_STATE_DIR": str(state)}
    first = launch_router(env, local_gpus="0")
    first.wait_in_rotation()
    client = Client(first.base, first.line, engine_url=f"{fake_vlm_url}/delay/300/")
    feed = _Feed(client, lambda n: (f"vanish-{n:03d}.pdf", pdf), 0.2)

    def vanished() -> list[dict[str, Any]]:
        return [r for r in first.audit_records() if r["action"] == "state_file_vanished"]

    def accepted(count: int) -> None:
        assert wait_until(lambda: feed.count() >= count, 60.0, 0.05), first.proc.log_tail()

    try:
        accepted(3)
        (state / DB_NAME).unlink()
        deleted_at = feed.count()
        accepted(deleted_at + 3)
        assert wait_until(lambda: len(vanished()) == 1, 30.0, 0.1), first.proc.log_tail()
        os.truncate(state / DB_NAME, 0)
        accepted(feed.count() + 3)
        assert wait_until(lambda: len(vanished()) == 2, 30.0, 0.1), first.proc.log_tail()
    finally:
        feed.stop()
    deleted, truncated = vanished()
    assert "was deleted" in deleted["reason"] and deleted["set_aside"] is None, deleted
    assert "was truncated" in truncated["reason"] and truncated["unreadable"] == 0, truncated
    assert Path(truncated["set_aside"]).parent == state, truncated
    assert truncated["rows"] >= deleted_at + 3, (truncated, deleted_at)

    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait(30.0)
    second = launch_router(env, local_gpus="0")
    second.wait_in_rotation()
    new = Client(second.base, second.line)
    ids = [task_id for _, task_id in feed.ids()]
    not_found = [t for t in ids if _status(new, t)[0] == 404]
    assert not_found == [], (not_found, len(ids), second.proc.log_tail(6000))
    outcomes = {t: new.wait(t, timeout_s=120.0) for t in ids}
    lost = {t: o.status for t, o in outcomes.items() if o.status != "completed"}
    assert lost == {}, (lost, second.proc.log_tail(6000))
    assert not [r for r in second.audit_records() if r["action"] == "state_file_vanished"]

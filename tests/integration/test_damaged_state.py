"""Damaged or foreign state never stops anything (issue 17, with real processes).

A task store overwritten with garbage used to make the worker exit 1 and the
router exit 3, for good, since the state directory outlives restarts. Two
routers on one state directory were neither refused nor warned, and a
restarted worker of one served the other's tasks.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import ManagedProcess, Router, http_get, wait_until
from mineru_health.runtime.worker.store import DB_NAME

pytestmark = pytest.mark.integration


def test_a_worker_on_a_damaged_store_starts_and_keeps_it(
    mineru_api_factory: Callable[..., ManagedProcess],
    patched_mineru_site: Path,
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / DB_NAME).write_bytes(b"overwritten with garbage\n" * 64)
    proc = mineru_api_factory(patched_mineru_site, env={"MINERU_HEALTH_STATE_DIR": str(state)})
    response = http_get(f"{proc.base_url}/health", 10.0)
    assert response is not None and response.status_code == 200, proc.log_tail()
    kept = [p for p in state.iterdir() if p.name.startswith(f"{DB_NAME}.damaged-")]
    assert len(kept) == 1 and kept[0].read_bytes().startswith(b"overwritten with garbage")
    assert (state / DB_NAME).read_bytes().startswith(b"SQLite format 3")
    assert "moved aside" in proc.log_tail()


def test_a_store_its_worker_set_aside_is_in_the_routers_audit_log(
    launch_router: Callable[..., Router], tmp_path: Path
) -> None:
    worker_dir = tmp_path / "state" / "local-gpu-0"
    worker_dir.mkdir(parents=True)
    (worker_dir / DB_NAME).write_bytes(b"overwritten with garbage\n" * 64)
    router = launch_router({"MINERU_HEALTH_STATE_DIR": str(tmp_path / "state")}, local_gpus="0")
    router.wait_in_rotation()

    def audited() -> list[dict[str, Any]]:
        return [r for r in router.audit_records() if r["action"] == "state_file_set_aside"]

    assert wait_until(lambda: bool(audited()), 60.0, 0.2), router.proc.log_tail()
    (record,) = audited()
    assert record["worker_id"] == "local-gpu-0", record
    assert Path(record["path"]).parent == worker_dir and Path(record["path"]).is_file(), record


def test_a_second_router_on_a_claimed_state_directory_is_refused(
    launch_router: Callable[..., Router], tmp_path: Path
) -> None:
    shared = {"MINERU_HEALTH_STATE_DIR": str(tmp_path / "shared-state")}
    first = launch_router(shared, local_gpus="0").proc
    assert wait_until(
        lambda: (tmp_path / "shared-state" / ".mineru-health.lock").is_file(), 120.0, 0.2
    ), first.log_tail()
    second = launch_router(shared, local_gpus="0").proc
    assert wait_until(lambda: second.poll() is not None, 120.0, 0.2), second.log_tail()
    assert second.returncode != 0
    log = second.log_tail()
    assert "MINERU_HEALTH_STATE_DIR" in log and "in use by another live process" in log, log
    assert "Traceback" not in log, log  # a refusal, not a crash
    assert first.poll() is None

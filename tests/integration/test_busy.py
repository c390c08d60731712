"""Busy is not broken: a loaded fleet behind the real router is never ejected or restarted.

The patched ``mineru-router`` with two real local ``mineru-api`` workers, the
``production`` preset (the defaults), no fault injected: large multi-page PDFs
with images, several tasks in flight on each worker. MinerU blocks each
worker's event loop for seconds at a time while it copies and hashes page
bitmaps; the router probes the workers' native endpoints, which answer from a
thread of their own, so nothing is ejected. The same holds when a worker's
loop is blocked on purpose (fault plan ``hang <s>``) for less than the hang
limit. All waits are bounded.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from conftest import (
    ManagedProcess,
    http_get,
    router_servers,
    wait_both_in_rotation,
    wait_until,
)
from mineru_health.testing.faults import write_plan
from mineru_health.testing.sandbox import make_pdf

if TYPE_CHECKING:
    from typing_extensions import Self

pytestmark = pytest.mark.integration

LOAD_TIMEOUT_S = 900.0
# More than one 64-page processing window: MinerU blocks its loop after each.
PAGES = 70
TASKS = 6  # three per worker: MinerU runs three at once by default
DISRUPTIONS = ("ejected", "health_failed", "auto_restart_scheduled", "auto_restart_success",
               "auto_restart_failed", "auto_restart_gave_up")








class RotationWatch:
    """Polls the router's /health every 0.5 s and remembers every worker seen out of rotation."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.out_of_rotation: list[tuple[float, str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            for sid, entry in router_servers(self.base).items():
                if not entry.get("in_rotation", True):
                    self.out_of_rotation.append((time.time(), sid, str(entry.get("last_error"))))
            self._stop.wait(0.5)


def _submit_all(base: str, pdf: bytes, vlm: str, count: int) -> list[str]:
    def submit(index: int) -> str:
        response = httpx.post(
            f"{base}/tasks",
            files={"files": (f"big-{index}.pdf", pdf, "application/pdf")},
            data={"backend": "vlm-http-client", "server_url": vlm},
            timeout=300.0,
        )
        assert response.status_code == 202, response.text
        task_id: str = response.json()["task_id"]
        return task_id

    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(submit, range(count)))


def _wait_all(base: str, ids: list[str], timeout_s: float) -> dict[str, dict[str, Any]]:
    finals: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    while len(finals) < len(ids) and time.monotonic() < deadline:
        for task_id in ids:
            if task_id in finals:
                continue
            response = http_get(f"{base}/tasks/{task_id}", 60.0)
            if response is not None and response.status_code == 200:
                status = response.json()
                if status["status"] in ("completed", "failed"):
                    finals[task_id] = status
        time.sleep(1.0)
    return finals


def _disruptions(audit_path: Path) -> list[dict[str, Any]]:
    if not audit_path.exists():
        return []
    records = [json.loads(line) for line in audit_path.read_text().splitlines() if line]
    return [r for r in records if r["action"] in DISRUPTIONS]


def test_loaded_fleet_is_never_ejected_or_restarted(
    launch_router: Callable[..., ManagedProcess],
    fake_vlm_url: str,
    tmp_path: Path,
) -> None:
    audit_path = tmp_path / "audit.jsonl"
    proc = launch_router({"MINERU_ROUTER_HEALTH_AUDIT_PATH": str(audit_path)})  # production preset
    first = wait_both_in_rotation(proc)
    pdf = make_pdf(pages=PAGES, images_per_page=1, image_px=128, seed=3)

    with RotationWatch(proc.base_url) as watch:
        ids = _submit_all(proc.base_url, pdf, fake_vlm_url, TASKS)
        finals = _wait_all(proc.base_url, ids, LOAD_TIMEOUT_S)

    assert len(finals) == TASKS, (f"hung tasks: {set(ids) - set(finals)}", proc.log_tail())
    assert [f["status"] for f in finals.values()] == ["completed"] * TASKS, finals
    assert watch.out_of_rotation == [], watch.out_of_rotation
    assert _disruptions(audit_path) == []
    # The same processes throughout: nothing was restarted.
    assert {sid: s["base_url"] for sid, s in router_servers(proc.base_url).items()} == {
        sid: s["base_url"] for sid, s in first.items()
    }


def test_a_loop_blocked_below_the_hang_limit_is_busy_not_broken(
    launch_router: Callable[..., ManagedProcess],
    fake_vlm_url: str,
    tiny_pdf: bytes,
    tmp_path: Path,
) -> None:
    audit_path = tmp_path / "audit.jsonl"
    plans = tmp_path / "plans"
    plans.mkdir()
    proc = launch_router(
        {
            "MINERU_ROUTER_HEALTH_AUDIT_PATH": str(audit_path),
            "MINERU_HEALTH_FAULT_PLAN": str(plans / "plan-{port}"),
        },
    )
    servers = wait_both_in_rotation(proc)
    victim = min(servers)
    plan = plans / f"plan-{servers[victim]['base_url'].rsplit(':', 1)[1]}"

    with RotationWatch(proc.base_url) as watch:
        # Three blocks of 8 s, each five times the production probe timeout:
        # the main port answers nothing meanwhile.
        for _ in range(3):
            write_plan(plan, "hang 8")
            assert wait_until(lambda: not plan.exists(), 30.0, 0.1)
            assert wait_until(
                lambda: (r := http_get(f"{servers[victim]['base_url']}/health", 2.0)) is not None
                and r.status_code == 200, 60.0, 0.2)
        ids = _submit_all(proc.base_url, tiny_pdf, fake_vlm_url, 4)
        finals = _wait_all(proc.base_url, ids, 120.0)

    assert [f["status"] for f in finals.values()] == ["completed"] * 4, finals
    assert watch.out_of_rotation == [], watch.out_of_rotation
    assert _disruptions(audit_path) == []

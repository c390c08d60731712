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

from collections.abc import Callable
from typing import Any

import pytest
from conftest import Router, http_get, wait_until
from harness.samplers import RotationLog
from mineru_health.demo.fleet import Client, Outcome, Stream
from mineru_health.demo.sandbox import make_pdf

pytestmark = pytest.mark.integration

LOAD_TIMEOUT_S = 900.0
# More than one 64-page processing window: MinerU blocks its loop after each.
PAGES = 70
TASKS = 6  # three per worker: MinerU runs three at once by default
DISRUPTIONS = (
    "ejected",
    "health_failed",
    "auto_restart_scheduled",
    "auto_restart_success",
    "auto_restart_failed",
    "auto_restart_gave_up",
)


def _run_all(router: Router, pdf: bytes, vlm: str, count: int, timeout_s: float) -> list[Outcome]:
    """``count`` tasks submitted at once, each waited for (bounded)."""
    client = Client(router.base, router.line, engine_url=vlm, submit_timeout_s=300.0)
    with Stream(client, lambda n: (f"big-{n}.pdf", pdf), task_timeout_s=timeout_s) as stream:
        for _ in range(count):
            stream.add()
        return stream.outcomes()


def _disruptions(router: Router) -> list[dict[str, Any]]:
    return [r for r in router.audit_records() if r["action"] in DISRUPTIONS]


def test_loaded_fleet_is_never_ejected_or_restarted(
    launch_router: Callable[..., Router],
    fake_vlm_url: str,
) -> None:
    router = launch_router({})  # production preset
    first = router.wait_in_rotation()
    pdf = make_pdf(pages=PAGES, images_per_page=1, image_px=128, seed=3)

    with RotationLog(router) as watch:
        finals = _run_all(router, pdf, fake_vlm_url, TASKS, LOAD_TIMEOUT_S)

    hung = [o.name for o in finals if o.status == "hung"]
    assert not hung, (f"hung tasks: {hung}", router.proc.log_tail())
    assert [f.status for f in finals] == ["completed"] * TASKS, finals
    assert watch.out_of_rotation() == [], watch.out_of_rotation()
    assert _disruptions(router) == []
    # The same processes throughout: nothing was restarted.
    assert {sid: s["base_url"] for sid, s in router.servers().items()} == {
        sid: s["base_url"] for sid, s in first.items()
    }


def test_a_loop_blocked_below_the_hang_limit_is_busy_not_broken(
    launch_router: Callable[..., Router],
    fake_vlm_url: str,
    tiny_pdf: bytes,
) -> None:
    router = launch_router({}, fault_plan="plan-{port}")
    servers = router.wait_in_rotation()
    victim = min(servers)
    plan = router.plan(servers[victim]["base_url"])

    with RotationLog(router) as watch:
        # Three blocks of 8 s, each five times the production probe timeout:
        # the main port answers nothing meanwhile.
        for _ in range(3):
            router.write_plan("hang 8", servers[victim]["base_url"])
            assert wait_until(lambda: not plan.exists(), 30.0, 0.1)
            assert wait_until(
                lambda: (
                    (r := http_get(f"{servers[victim]['base_url']}/health", 2.0)) is not None
                    and r.status_code == 200
                ),
                60.0,
                0.2,
            )
        finals = _run_all(router, tiny_pdf, fake_vlm_url, 4, 120.0)

    assert [f.status for f in finals] == ["completed"] * 4, finals
    assert watch.out_of_rotation() == [], watch.out_of_rotation()
    assert _disruptions(router) == []

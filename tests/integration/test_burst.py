"""Bursts of submissions to a real 3.x router: the kept-task and kept-byte caps hold
(issues 24 and 31).

The router keeps every accepted task's upload until the task ends, so that it
can send it again; ``MINERU_ROUTER_HEALTH_MAX_KEPT_TASKS`` bounds them. The
cap used to be checked before staging and counted after, so a burst passed it
(2,000 of 2,000 accepted with a cap of 1,000). Here every task waits on a
server that answers only after a minute, so none ends during the burst: at
most the cap is accepted, the rest are refused with 503 and ``Retry-After``,
and nothing else happens to the router (it answers, nothing is ejected).
Loopback only; bounded in count and time.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from admission_runs import burst, padded
from conftest import Router, make_pdf
from mineru_health.demo.fleet import Client

pytestmark = pytest.mark.integration

BURST = 2_000
CAP = 200
SENDERS = 64  # connections at once


def test_a_burst_of_submissions_is_capped(
    launch_router: Callable[..., Router],
    fake_vlm_url: str,
) -> None:
    router = launch_router(
        {"MINERU_ROUTER_HEALTH_PRESET": "fast", "MINERU_ROUTER_HEALTH_MAX_KEPT_TASKS": str(CAP)}
    )
    router.wait_in_rotation()
    pytest.importorskip("reportlab")
    pdf = make_pdf(text="one of a burst")
    client = Client(
        router.base, router.line, engine_url=f"{fake_vlm_url}/delay/60000/", submit_timeout_s=120.0
    )

    def submit(number: int) -> tuple[int, str]:
        response = client.post(f"burst-{number:04d}.pdf", pdf, timeout_s=120.0)
        return response.status_code, response.headers.get("retry-after", "")

    with ThreadPoolExecutor(max_workers=SENDERS) as pool:
        answers = list(pool.map(submit, range(BURST)))
    accepted = sum(1 for code, _ in answers if code == 202)
    refused = [(code, retry) for code, retry in answers if code != 202]
    assert 0 < accepted <= CAP, (accepted, refused[:5])
    assert all(code == 503 and retry for code, retry in refused), sorted(set(refused))[:5]
    assert len(refused) == BURST - accepted
    assert router.metric("mineru_router_ejections_total") == 0


MIB = 1024 * 1024


def test_a_burst_of_large_uploads_is_capped_in_bytes_then_in_count(
    launch_router: Callable[..., Router],
    fake_vlm_url: str,
    tmp_path: Path,
) -> None:
    """Issue 31: 20 x 19 MiB at once with MAX_KEPT_MB=100 kept 375 MiB. Each upload's size is
    now reserved at its admission: at most 100 MiB kept, the rest 503 with Retry-After;
    then a burst of small ones fills the count cap (MAX_KEPT_TASKS=8) and no more."""
    state = tmp_path / "router-state"
    router = launch_router(
        {
            "MINERU_ROUTER_HEALTH_PRESET": "fast",
            "MINERU_ROUTER_HEALTH_MAX_KEPT_MB": "100",
            "MINERU_ROUTER_HEALTH_MAX_KEPT_TASKS": "8",
            "MINERU_HEALTH_STATE_DIR": str(state),
        },
        local_gpus="0",
    )
    router.wait_in_rotation()
    pytest.importorskip("reportlab")
    pdf = make_pdf(text="one of a burst")
    client = Client(
        router.base, router.line, engine_url=f"{fake_vlm_url}/delay/60000/", submit_timeout_s=120.0
    )
    large = burst(
        client,
        [(f"large-{n:02d}.pdf", padded(make_pdf(text=f"large {n}"), 19 * MIB)) for n in range(20)],
        20,
    )
    kept = sum(p.stat().st_size for p in (state / "kept").rglob("*") if p.is_file())
    accepted = sum(1 for code, _, _ in large if code == 202)
    assert 1 <= accepted <= 5 and kept <= 100 * MIB, (accepted, kept, large)
    assert all(code == 503 and retry for code, retry, _ in large if code != 202), large
    small = burst(client, [(f"small-{n:02d}.pdf", pdf) for n in range(20)], 20)
    more = sum(1 for code, _, _ in small if code == 202)
    assert 1 <= more <= 8 - accepted, (accepted, small)
    assert all(code == 503 and retry for code, retry, _ in small if code != 202), small
    refused = 40 - accepted - more
    assert router.metric("mineru_router_kept_cap_refusals_total") == refused
    assert router.metric("mineru_router_storage_full_refusals_total") == 0

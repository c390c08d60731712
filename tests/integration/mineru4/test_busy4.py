# ruff: noqa: F811 - the fixtures are imported from mineru4_support and named as parameters
"""Busy is not broken on 4.0: one large job, the native endpoint answers while ``/v1/health`` waits.

One 200-page PDF with a 256 px image and 40 text lines a page (about 50 MB;
the flash tier inlines the images into a ~400 MB markdown), parsed by a real
patched ``mineru-api`` 4.0.12. 4.0 sanitises and hashes that output on its
event loop, so ``/v1/health`` waits seconds for its answer; the native
endpoint answers from its own thread. Only coarse bounds are asserted (the
figures go to ``bench/busy/run.py --line 4``); the hang limit is raised so that a
slow machine's long block is not reported as a hung loop.
"""

from __future__ import annotations

from typing import Any

import pytest
from mineru4_support import (
    Prober,
    Worker,
    python4,  # noqa: F401 - fixture
    site4,  # noqa: F401 - fixture
    start_worker4,  # noqa: F401 - fixture
)
from mineru_health.demo.sandbox import make_pdf

pytestmark = pytest.mark.integration

PAGES = 200
JOB_TIMEOUT_S = 900.0


@pytest.fixture(scope="module")
def large_pdf() -> bytes:
    return make_pdf(PAGES, images_per_page=1, image_px=256, lines_per_page=40, seed=4)


def test_native_endpoint_answers_while_v1_health_waits(
    start_worker4: Any, large_pdf: bytes
) -> None:
    worker: Worker = start_worker4({"MINERU_HEALTH_LOOP_HANG_S": "600"})
    with (
        Prober(f"{worker.native_url}/health", timeout_s=300.0) as native,
        Prober(f"{worker.base_url}/v1/health", timeout_s=300.0) as main,
    ):
        submitted = worker.submit(large_pdf, formats=("markdown", "middle_json"), timeout_s=300)
        assert submitted.status_code == 202, submitted.text
        job = worker.wait_terminal(submitted.json()["task_id"], JOB_TIMEOUT_S)
    assert job["status"] == "completed", job
    assert native.answers and main.answers
    assert all(status == 200 for _, status in native.answers), native.answers
    assert all(status == 200 for _, status in main.answers), main.answers
    # Coarse: measured 0.26 s against 50 s on a loaded 2-core machine.
    assert native.worst_s < 2.0, native.worst_s
    assert main.worst_s > 4 * native.worst_s, (main.worst_s, native.worst_s)

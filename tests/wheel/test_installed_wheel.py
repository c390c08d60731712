"""The installed wheel, end to end: run by scripts/test_wheels.sh in clean roots.

Skipped unless ``TEST_INSTALLED_WHEEL=1``: the default suite tests the
source build, and this module checks what only an installed wheel has (its
bundled libraries) before starting one real, patched ``mineru-api`` whose
engine dies under a task (fault plan ``engine_dead``, the fake VLM server as
its engine): the task fails as the trigger, and MinerU's ``/health`` and the
native one both say 503.
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from conftest import ManagedProcess, free_port, http_get, wait_until
from mineru_health.demo.faults import write_plan

pytestmark = pytest.mark.skipif(
    os.environ.get("TEST_INSTALLED_WHEEL") != "1",
    reason="scripts/test_wheels.sh runs this against an installed wheel",
)

UNHEALTHY_TIMEOUT_S = 60.0
TASK_TIMEOUT_S = 120.0


def test_extension_comes_from_the_wheel() -> None:
    from mineru_health import _native

    native = Path(_native.__file__).resolve()
    site = Path(sysconfig.get_paths()["platlib"]).resolve()
    assert native.is_relative_to(site), native
    bundled = site / "mineru_health.libs"
    names = sorted(p.name.split("-")[0] for p in bundled.iterdir())
    for library in ("libre2", "libfmt", "libcurl", "libmicrohttpd"):
        assert library in names, names
    assert native.with_name("_native.pyi").is_file()  # the generated type stub


@pytest.mark.integration
def test_fatal_error_makes_native_health_503(
    patched_mineru_site: Path,
    mineru_api_factory: Callable[..., ManagedProcess],
    fake_vlm_url: str,
    tiny_pdf: bytes,
    tmp_path: Path,
) -> None:
    plan = tmp_path / "fault-plan"
    native_port = free_port()
    proc = mineru_api_factory(
        patched_mineru_site,
        env={"MINERU_HEALTH_FAULT_PLAN": str(plan), "MINERU_HEALTH_PORT": str(native_port)},
    )
    native_url = f"http://127.0.0.1:{native_port}/health"
    healthy = http_get(native_url, 5.0)
    assert healthy is not None and healthy.status_code == 200, proc.log_tail()

    write_plan(plan, "engine_dead")
    submitted = httpx.post(
        f"{proc.base_url}/tasks",
        files={"files": ("doc.pdf", tiny_pdf, "application/pdf")},
        data={"backend": "vlm-http-client", "server_url": fake_vlm_url},
        timeout=60,
    )
    assert submitted.status_code == 202, submitted.text
    task_url = f"{proc.base_url}/tasks/{submitted.json()['task_id']}"

    def finished() -> dict[str, object] | None:
        body: dict[str, object] = httpx.get(task_url, timeout=10).json()
        return body if body["status"] in ("completed", "failed") else None

    final = wait_until(finished, TASK_TIMEOUT_S, 0.2)
    assert final and final["status"] == "failed", (final, proc.log_tail())

    def native_status() -> int | None:
        response = http_get(native_url, 2.0)
        return response.status_code if response is not None else None

    assert wait_until(lambda: native_status() == 503, UNHEALTHY_TIMEOUT_S, 0.2), proc.log_tail()
    native = http_get(native_url, 5.0)
    worker = http_get(f"{proc.base_url}/health", 5.0)
    assert native is not None and worker is not None
    assert worker.status_code == 503
    assert native.json()["engine_dead"] is True
    assert native.json()["rule"] == worker.json()["rule"]
    assert proc.poll() is None

# ruff: noqa: F811 - the fixtures are imported from mineru4_support and named as parameters
"""A hostile answer at a worker's address leaves a real, patched 4.0 ``mineru-router`` whole.

As ``integration/test_hostile_worker.py`` for 3.x: two ``--upstream-url``
fakes (``harness.hostile_worker``, 4.0's job API), one honest, one whose
job statuses and output files break every bound. While the hostile one's
jobs are asked about and their outputs fetched, the honest one's jobs keep
answering, the router's peak memory stays within a stated bound, a job
status that breaks a bound is a 502 ``upstream_bound_broken`` naming the
worker and the bound, and every bound broken is counted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import free_port
from harness.hostile_worker import HostileWorkers, hostile_workers
from mineru4_support import (
    python4,  # noqa: F401 - fixture
    site4,  # noqa: F401 - fixture
)
from mineru_health.demo.fleet import HOST, LINE4, Router
from mineru_health.demo.sandbox import Processes

pytestmark = pytest.mark.integration

MIB = 1024 * 1024
GROWTH_BOUND_MB = 200  # as for 3.x: the hostile answers would take gigabytes
HONEST_STATUS_BOUND_S = 3.0  # milliseconds normally; a trickling status is held 60 s
ENV = {
    "MINERU_ROUTER_HEALTH_PRESET": "fast",
    "MINERU_ROUTER_HEALTH_MAX_RESULT_MB": "64",
    "MINERU_ROUTER_HEALTH_MAX_RESULT_S": "4",
}
HOSTILE = ("huge-status", "endless-status", "trickle-status", "endless-result", "trickle-result")


def memory_mb(pid: int) -> dict[str, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


@pytest.fixture
def fakes() -> Iterator[HostileWorkers]:
    with hostile_workers(hostile=1, honest=1, line="4") as workers:
        yield workers


@pytest.fixture
def router(fakes: HostileWorkers, python4: str, site4: Path, tmp_path: Path) -> Iterator[Router]:
    with Processes() as processes:
        port = free_port()
        argv = [*LINE4.router_argv(python4, port, "none")]
        for url in fakes.urls:
            argv += ["--upstream-url", url]
        proc = processes.start(
            "mineru-router",
            argv,
            env=LINE4.env(site4, tmp_path, python4, ENV),
            log_path=tmp_path / "router.log",
            cwd=tmp_path,
        )
        proc.base_url = f"http://{HOST}:{port}"
        router = Router(LINE4, proc, tmp_path, 2)
        router.wait_in_rotation(120.0)
        try:
            yield router
        finally:
            fakes.stop()  # ends the requests still under way: the router stops at once


def submit(client: httpx.Client, name: str) -> str:
    answer = client.post(
        "/v1/parse/jobs",
        json={
            "tier": "flash",
            "output_formats": ["markdown"],
            "files": [{"source": {"type": "url", "url": f"http://127.0.0.1:9/{name}"}}],
        },
    )
    assert answer.status_code in (200, 201, 202), answer.text
    job_id: str = answer.json()["job_id"]
    return job_id


def place(router: Router, fakes: HostileWorkers) -> tuple[dict[str, str], list[str]]:
    """Submits until each hostile name sits on the hostile worker and 3 jobs on the honest one."""
    placed: dict[str, str] = {}
    honest: list[str] = []
    with httpx.Client(base_url=router.base, timeout=30) as client:
        for _ in range(40):
            missing = [name for name in HOSTILE if name not in placed]
            if not missing and len(honest) >= 3:
                break
            name = missing[0] if missing else "honest"
            job_id = submit(client, name)
            if fakes.received[-1] != ("hostile", name):
                honest.append(job_id)
            elif name != "honest":
                placed[name] = job_id
            # else: an honest name that landed on the hostile worker: neither
    assert len(placed) == len(HOSTILE) and len(honest) >= 3, (placed, honest)
    return placed, honest


def keep_asking(router: Router, honest: list[str], stop: threading.Event) -> list[float]:
    took: list[float] = []
    with httpx.Client(base_url=router.base, timeout=30) as client:
        while not stop.is_set() and len(took) < 10_000:
            for job_id in honest:
                started = time.monotonic()
                answer = client.get(f"/v1/parse/jobs/{job_id}")
                took.append(time.monotonic() - started)
                assert answer.status_code == 200 and answer.json()["status"] == "running"
            stop.wait(0.05)
    return took


def during(router: Router, honest: list[str], hostile: Callable[[], Any]) -> tuple[Any, float]:
    stop = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        asking = pool.submit(keep_asking, router, honest, stop)
        try:
            value = hostile()
        finally:
            stop.set()
        took = asking.result(60)
    assert took
    return value, max(took)


def output_file(client: httpx.Client, job_id: str) -> str:
    """The job's markdown output file (the job completed on the fake)."""
    for _ in range(100):
        body = client.get(f"/v1/parse/jobs/{job_id}").json()
        if body["status"] == "completed":
            file_id: str = body["files"][0]["output_files"]["markdown"]["file_id"]
            return file_id
        time.sleep(0.1)
    raise AssertionError(f"{job_id} never completed")


def test_hostile_answers_leave_the_4_0_router_whole(router: Router, fakes: HostileWorkers) -> None:
    placed, honest = place(router, fakes)
    pid = router.proc.pid
    before = memory_mb(pid)
    report: dict[str, Any] = {"before_mb": before}

    def statuses() -> list[httpx.Response | str]:
        # Each hostile status asked about twice at once. A trickling one holds the router's
        # request for 4.0's own 60 s timeout (in all, now): its clients give up after 5 s
        # and ask again, as impatient clients do; the router's requests stay under way.
        names = [n for n in HOSTILE if n.endswith("-status")] * 2

        def ask(name: str) -> httpx.Response | str:
            try:
                return client.get(
                    f"/v1/parse/jobs/{placed[name]}", timeout=5 if name == "trickle-status" else 60
                )
            except httpx.TimeoutException:
                return name

        with ThreadPoolExecutor(len(names)) as pool, httpx.Client(base_url=router.base) as client:
            return list(pool.map(ask, names))

    answers, slowest = during(router, honest, statuses)
    report["statuses"] = {"after_mb": memory_mb(pid), "slowest_honest_s": slowest}
    assert answers.count("trickle-status") == 2, answers
    for answer in answers:
        if isinstance(answer, str):
            continue
        assert answer.status_code == 502, answer.text
        error = answer.json()["error"]
        assert error["code"] == "upstream_bound_broken", error
        assert "Upstream remote-1" in error["message"], error
        assert "MAX_STATUS_MB" in error["message"] or "declared" in error["message"], error
    assert slowest < HONEST_STATUS_BOUND_S, report

    def results() -> dict[str, Any]:
        got: dict[str, Any] = {}
        headers = {"Accept-Encoding": "identity"}
        with httpx.Client(base_url=router.base, timeout=60, headers=headers) as client:
            for name in ("endless-result", "trickle-result"):
                file_id = output_file(client, placed[name])
                received = 0
                try:
                    with client.stream("GET", f"/v1/files/{file_id}/content") as answer:
                        assert answer.status_code == 200
                        for chunk in answer.iter_raw():
                            received += len(chunk)
                except httpx.HTTPError as exc:  # the router cut the stream
                    got[f"{name}_cut"] = type(exc).__name__
                got[name] = received
        return got

    got, slowest = during(router, honest, results)
    report["results"] = {"after_mb": memory_mb(pid), "slowest_honest_s": slowest, **got}
    print("hostile worker, 4.0:", report)  # the figures the closing note gives
    assert slowest < HONEST_STATUS_BOUND_S, report
    assert got["endless-result"] <= 64 * MIB + MIB, report  # cut at MAX_RESULT_MB
    assert got["trickle-result"] < 64 * MIB, report  # cut at MAX_RESULT_S
    peak = memory_mb(pid)["VmHWM"]
    assert peak - before["VmRSS"] < GROWTH_BOUND_MB, report
    broken = {
        bound: router.metric("mineru_router_upstream_bounds_broken_total", bound=bound)
        for bound in ("size", "time")
    }
    # Sizes: the two endless and the two huge statuses, the endless output; time: the trickling
    # output (the trickling statuses' 60 s are still running).
    assert broken["size"] >= 5 and broken["time"] >= 1, (broken, report)

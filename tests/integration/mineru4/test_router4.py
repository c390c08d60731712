"""The patched MinerU 4.0 ``mineru-router`` with two real local ``mineru-api`` workers.

Offline, flash tier, text PDFs (``testing/mineru4.py``). A steady stream of
jobs goes through the router's ``/v1/tasks`` while one worker is killed with
``kill -9``, its engine dies (vLLM's ``EngineDeadError`` raised in 4.0's
real parse call), or its event loop hangs. Every job submitted must complete
(0 failed, 0 hung, no refused submission); the faulty worker is taken out,
restarted and back in rotation (audit file), and the results of jobs that
finished before the fault are still downloadable. Runs when
``MINERU_HEALTH_MINERU4_PYTHON`` names a MinerU 4.0 environment's Python.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import httpx
import pytest
from mineru_health.testing import mineru4
from mineru_health.testing.processes import ManagedProcess, Processes
from mineru_health.testing.sandbox import free_port, wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(mineru4.mineru4_python() is None,
                       reason=f"set {mineru4.MINERU4_PYTHON_ENV} to a MinerU 4.0 Python"),
]

START_TIMEOUT_S = 240.0
JOB_TIMEOUT_S = 240.0
RECOVERY_TIMEOUT_S = 120.0
TERMINAL = {"completed", "partial", "failed", "canceled"}
_ROUTER = "import sys; from mineru.kit.router.cli import main; sys.argv[0] = 'mineru-router'; main()"


@dataclass
class Fleet:
    base: str
    router: ManagedProcess
    audit: Path
    plan: Path
    seeds: Iterator[int] = field(default_factory=lambda: iter(range(1, 10_000)))

    def audit_records(self) -> list[dict[str, Any]]:
        if not self.audit.is_file():
            return []
        lines = self.audit.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def worker_pids(self) -> dict[int, str]:
        """pid -> command line of the router's api-server children."""
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == self.router.pid and "api-server" in cmdline:
                found[int(entry.name)] = cmdline
        return found

    def in_rotation(self) -> set[str]:
        try:
            text = httpx.get(f"{self.base}/metrics", timeout=5).text
        except httpx.HTTPError:
            return set()
        workers = set()
        for line in text.splitlines():
            if line.startswith("mineru_router_worker_state{") and 'state="healthy"' in line \
                    and line.endswith(" 1.0"):
                workers.add(line.split('worker="', 1)[1].split('"', 1)[0])
        return workers


@dataclass
class Job:
    seed: int
    task_id: str | None = None
    error: str | None = None
    status: str = "submitted"
    payload: dict[str, Any] = field(default_factory=dict)


class Stream:
    """Submits a job every ``every_s`` from a thread; ``wait`` until all are terminal."""

    def __init__(self, fleet: Fleet, every_s: float = 0.8) -> None:
        self.fleet = fleet
        self.every_s = every_s
        self.jobs: list[Job] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=120)

    def _run(self) -> None:
        with httpx.Client(base_url=self.fleet.base, timeout=120) as client:
            while not self._stop.is_set():
                job = Job(next(self.fleet.seeds))
                self.jobs.append(job)
                pdf = mineru4.text_pdf(2, seed=job.seed)
                try:
                    response = client.post("/v1/tasks", params={"tier": "flash"},
                                           files={"files": (f"doc{job.seed}.pdf", pdf,
                                                            "application/pdf")})
                    if response.status_code == 202:
                        job.task_id = response.json()["task_id"]
                    else:
                        job.error = f"{response.status_code} {response.text[:300]}"
                except httpx.HTTPError as exc:
                    job.error = f"{type(exc).__name__}: {exc}"
                self._stop.wait(self.every_s)

    def refresh(self) -> None:
        with httpx.Client(base_url=self.fleet.base, timeout=30) as client:
            for job in list(self.jobs):
                if job.task_id is None or job.status in TERMINAL:
                    continue
                try:
                    response = client.get(f"/v1/tasks/{job.task_id}")
                except httpx.HTTPError:
                    continue
                if response.status_code == 200:
                    job.payload = response.json()
                    job.status = str(job.payload.get("status"))

    def completed(self) -> list[Job]:
        self.refresh()
        return [j for j in self.jobs if j.status == "completed"]

    def wait(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.refresh()
            if all(j.status in TERMINAL or j.task_id is None for j in self.jobs):
                return
            time.sleep(1.0)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    python = mineru4.mineru4_python()
    assert python is not None
    site = mineru4.patched_site4(tmp_path / "mineru-site", python)
    audit, plan = tmp_path / "audit.jsonl", tmp_path / "plan"
    env = mineru4.router_env(site, tmp_path, {
        "MINERU_ROUTER_HEALTH_PRESET": "fast",
        # A hung loop is found by main-port timeouts (these workers have no native port).
        "MINERU_ROUTER_HEALTH_MAIN_PORT_TIMEOUT_S": "3",
        "MINERU_ROUTER_HEALTH_AUDIT_PATH": str(audit),
        "MINERU_HEALTH_FAULT_PLAN": str(plan),
    })
    port = free_port()
    with Processes() as procs:
        router = procs.start(
            "mineru-router",
            [python, "-c", _ROUTER, "--host", "127.0.0.1", "--port", str(port),
             "--local-gpus", "0,1", "--worker-tier", "flash"],
            env=env, log_path=tmp_path / "router.log", cwd=tmp_path)
        fleet = Fleet(f"http://127.0.0.1:{port}", router, audit, plan)
        up = wait_until(lambda: len(fleet.in_rotation()) == 2 or router.poll() is not None,
                        START_TIMEOUT_S, 1.0)
        assert up and router.poll() is None, router.log_tail()
        yield fleet
        procs.record_descendants(router)


def _after(records: list[dict[str, Any]], since: float) -> list[dict[str, Any]]:
    from datetime import datetime

    return [r for r in records if datetime.fromisoformat(r["time"]).timestamp() >= since]


def _run_fault(fleet: Fleet, inject: Any, cause: str) -> tuple[Stream, list[Job], float]:
    """Streams jobs, injects the fault after a few completed, waits for recovery and the end."""
    with Stream(fleet) as stream:
        assert wait_until(lambda: len(stream.completed()) >= 3, JOB_TIMEOUT_S, 1.0), \
            fleet.router.log_tail()
        before = stream.completed()
        fault_at = time.time()
        inject()
        recovered = wait_until(
            lambda: any(r["action"] == "admitted" and r["from"] == "restarting"
                        for r in _after(fleet.audit_records(), fault_at))
            and len(fleet.in_rotation()) == 2,
            RECOVERY_TIMEOUT_S, 0.5)
        assert recovered, fleet.router.log_tail()
        time.sleep(5.0)  # a few more jobs on the restarted fleet
    stream.wait(JOB_TIMEOUT_S)
    records = _after(fleet.audit_records(), fault_at)
    causes = {r["cause"] for r in records}
    assert cause in causes, records
    ejected = min(r["time"] for r in records if r["action"] in ("ejected", "health_failed"))
    admitted = max(r["time"] for r in records if r["action"] == "admitted")
    print(f"\n{cause}: fault at {fault_at:.2f}, out of rotation {ejected}, back {admitted}; "
          f"{len(stream.jobs)} jobs")
    failed = [(j.seed, j.error or j.payload.get("files")) for j in stream.jobs
              if j.error is not None or j.status != "completed"]
    assert failed == [], (failed, fleet.router.log_tail(6000))
    return stream, before, fault_at


def _assert_downloadable(fleet: Fleet, jobs: list[Job]) -> None:
    with httpx.Client(base_url=fleet.base, timeout=30) as client:
        for job in jobs:
            output = job.payload["files"][0]["output_files"]["markdown"]
            content = client.get(f"/v1/files/{output['file_id']}/content")
            assert content.status_code == 200, (job.seed, content.text[:300])
            assert f"Document {job.seed}," in content.text
            assert client.get(f"/v1/tasks/{job.task_id}/result").status_code == 200


def test_kill_9_of_a_worker_loses_no_job(fleet: Fleet) -> None:
    def kill() -> None:
        pid = min(fleet.worker_pids())
        os.kill(pid, signal.SIGKILL)

    _, before, _ = _run_fault(fleet, kill, "process_exit")
    _assert_downloadable(fleet, before)


def test_engine_death_loses_no_job(fleet: Fleet) -> None:
    _, before, _ = _run_fault(fleet, lambda: mineru4.write_plan(fleet.plan, "engine_dead"),
                              "engine_dead")
    _assert_downloadable(fleet, before)


def test_hung_worker_loses_no_job(fleet: Fleet) -> None:
    _, before, _ = _run_fault(fleet, lambda: mineru4.write_plan(fleet.plan, "hang"), "timeout")
    _assert_downloadable(fleet, before)

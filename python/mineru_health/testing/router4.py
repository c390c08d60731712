"""The MinerU 4.0 router harness: a patched (or MinerU's own) ``mineru-router`` and a job stream.

    python = sandbox.mineru4_python()              # $MINERU_HEALTH_MINERU4_PYTHON, or None
    with start_fleet(tmp, python) as fleet:        # the router and its two local workers
        run = run_fault(fleet, lambda: write_plan(fleet.plan, "engine_dead"))
        run.lost                                   # jobs failed, hung or refused

The router runs ``--local-gpus 0,1 --worker-tier flash`` offline from a
sandbox copy (``sandbox.patched_site4``: worker and router patched, fault
plugin loaded; ``patched=False``: MinerU's own code with the fault plugin
only, for comparison). Jobs are text PDFs with a real text layer
(``sandbox.make_pdf(lines_per_page=40)``: the flash tier parses them with no
model weights). One harness for the 4.0 router tests and ``bench/router4``.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .faults import FAULT_PLAN_ENV, write_plan
from .processes import ManagedProcess, Processes
from .sandbox import SandboxError, free_port, make_pdf, mineru4_env, patched_site4, wait_until

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "FaultRun",
    "Fleet",
    "Job",
    "JobStream",
    "run_fault",
    "start_fleet",
    "text_pdf",
    "write_plan",
]

# --- a router, its workers and a stream of jobs --------------------------------------------

def text_pdf(pages: int = 2, *, seed: int = 0) -> bytes:
    """A PDF with 40 lines of real text a page; the text names ``seed`` ("Document 7, ...")."""
    return make_pdf(pages, seed=seed, lines_per_page=40,
                    text=f"Document {seed}, the quick brown fox jumps over the lazy dog")


TERMINAL = frozenset({"completed", "partial", "failed", "canceled"})
_ROUTER = ("import sys; from mineru.kit.router.cli import main; "
           "sys.argv[0] = 'mineru-router'; main()")


@dataclass
class Fleet:
    """A running ``mineru-router`` with two local workers, on loopback."""

    base: str
    router: ManagedProcess
    audit: Path
    plan: Path
    seeds: Iterator[int] = field(default_factory=lambda: iter(range(1, 1_000_000)))

    def audit_records(self, since: float = 0.0) -> list[dict[str, Any]]:
        if not self.audit.is_file():
            return []
        records = [json.loads(line) for line in
                   self.audit.read_text(encoding="utf-8").splitlines() if line.strip()]
        return [r for r in records if datetime.fromisoformat(r["time"]).timestamp() >= since]

    def worker_pids(self) -> list[int]:
        """The router's ``api-server`` children."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == self.router.pid and b"api-server" in cmdline:
                found.append(int(entry.name))
        return sorted(found)

    def routable(self) -> int:
        """Workers the router routes jobs to now (4.0's ``/v1/usage``: healthy x concurrency 1)."""
        import httpx

        try:
            usage = httpx.get(f"{self.base}/v1/usage", timeout=10).json()
            return int(usage["limits"]["max_concurrent_jobs"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return -1


@dataclass
class Job:
    seed: int
    task_id: str | None = None
    error: str | None = None  # the submission's, when it was refused
    status: str = "submitted"
    payload: dict[str, Any] = field(default_factory=dict)


class JobStream:
    """Submits a job (a text PDF of its own) every ``every_s`` from a thread of its own."""

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
        self._thread.join(timeout=180)

    def _run(self) -> None:
        import httpx

        with httpx.Client(base_url=self.fleet.base, timeout=120) as client:
            while not self._stop.is_set():
                job = Job(next(self.fleet.seeds))
                self.jobs.append(job)
                files = {"files": (f"doc{job.seed}.pdf", text_pdf(2, seed=job.seed),
                                   "application/pdf")}
                try:
                    response = client.post("/v1/tasks", params={"tier": "flash"}, files=files)
                    if response.status_code == 202:
                        job.task_id = response.json()["task_id"]
                    else:
                        job.error = f"{response.status_code} {response.text[:300]}"
                except httpx.HTTPError as exc:
                    job.error = f"{type(exc).__name__}: {exc}"
                self._stop.wait(self.every_s)

    def refresh(self) -> None:
        import httpx

        with httpx.Client(base_url=self.fleet.base, timeout=30) as client:
            for job in list(self.jobs):
                if job.task_id is None or job.status in TERMINAL:
                    continue
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    response = client.get(f"/v1/tasks/{job.task_id}")
                    if response.status_code == 200:
                        job.payload = response.json()
                        job.status = str(job.payload.get("status"))

    def completed(self) -> list[Job]:
        self.refresh()
        return [j for j in self.jobs if j.status == "completed"]

    def wait(self, timeout_s: float) -> None:
        """Until every submitted job is terminal, or ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.refresh()
            if all(j.status in TERMINAL or j.task_id is None for j in self.jobs):
                return
            time.sleep(1.0)

    @property
    def lost(self) -> list[Job]:
        """Jobs refused, failed or not finished."""
        return [j for j in self.jobs if j.error is not None or j.status != "completed"]


@contextlib.contextmanager
def start_fleet(scratch: Path, python: str, *, patched: bool = True,
                extra_env: dict[str, str] | None = None,
                timeout_s: float = 240.0) -> Iterator[Fleet]:
    """``mineru-router --local-gpus 0,1 --worker-tier flash`` on a free port, both workers up.

    ``patched``: the copy carries our router patches (else MinerU's own
    router runs, faults included). The fast preset, with a 3 s main-port
    timeout (workers without a native endpoint show a hung loop that way),
    and in the workers a 5 s loop-hang limit and a 10 s stall watchdog.
    """
    site = patched_site4(scratch / "mineru-site", python, patched=patched)
    audit, plan = scratch / "audit.jsonl", scratch / "plan"
    env = mineru4_env(site, scratch, extra={
        "MINERU_ROUTER_HEALTH_PRESET": "fast",
        "MINERU_ROUTER_HEALTH_MAIN_PORT_TIMEOUT_S": "3",
        "MINERU_ROUTER_HEALTH_AUDIT_PATH": str(audit),
        # Workers: a loop blocked 5 s is hung, a stalled engine call is condemned after
        # 10 s (a parse here takes ~2 s and blocks the loop for milliseconds).
        "MINERU_HEALTH_LOOP_HANG_S": "5",
        "MINERU_HEALTH_STALL_S": "10",
        FAULT_PLAN_ENV: str(plan),
        **(extra_env or {}),
    })
    port = free_port()
    with Processes() as procs:
        router = procs.start(
            "mineru-router",
            [python, "-c", _ROUTER, "--host", "127.0.0.1", "--port", str(port),
             "--local-gpus", "0,1", "--worker-tier", "flash"],
            env=env, log_path=scratch / "router.log", cwd=scratch)
        fleet = Fleet(f"http://127.0.0.1:{port}", router, audit, plan)
        up = wait_until(lambda: fleet.routable() == 2 or router.poll() is not None, timeout_s, 1.0)
        if not up or router.poll() is not None:
            raise SandboxError(f"the router did not come up: {router.log_tail()}")
        try:
            yield fleet
        finally:
            procs.record_descendants(router)


@dataclass
class FaultRun:
    jobs: list[Job]
    before: list[Job]  # completed before the fault
    fault_at: float  # unix time
    out_at: float | None  # first time fewer than two workers were routable
    back_at: float | None  # both routable again after that
    lost: list[Job]


def run_fault(fleet: Fleet, inject: Callable[[], None], *, warm_jobs: int = 3,
              recovery_timeout_s: float = 120.0, job_timeout_s: float = 240.0,
              after_s: float = 5.0) -> FaultRun:
    """Streams jobs, injects the fault after ``warm_jobs`` completed, waits for the end.

    Recovery is read from the router's own ``/v1/usage`` (works on MinerU's
    own router too): out when fewer than two workers take jobs, back when
    both do again.
    """
    out_at: float | None = None
    back_at: float | None = None
    with JobStream(fleet) as stream:
        if not wait_until(lambda: len(stream.completed()) >= warm_jobs, job_timeout_s, 1.0):
            raise SandboxError(f"no job completed: {fleet.router.log_tail()}")
        before = stream.completed()
        fault_at = time.time()
        inject()
        deadline = time.monotonic() + recovery_timeout_s
        while time.monotonic() < deadline:
            routable = fleet.routable()
            if out_at is None and 0 <= routable < 2:
                out_at = time.time()
            elif out_at is not None and routable == 2:
                back_at = time.time()
                break
            time.sleep(0.2)
        time.sleep(after_s)  # a few more jobs on the healed (or not) fleet
    stream.wait(job_timeout_s)
    return FaultRun(stream.jobs, before, fault_at, out_at, back_at, stream.lost)

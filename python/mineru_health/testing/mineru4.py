"""A throwaway, patched MinerU 4.0 router on loopback, and faults for its workers (tests only).

    python = mineru4_python()                      # $MINERU_HEALTH_MINERU4_PYTHON, or None
    site = patched_site4(tmp / "mineru-site", python)   # copy of MinerU 4.0, router patched
    env = router_env(site, tmp)                    # offline: MINERU_HOME/HOME in tmp
    pdf = text_pdf(pages=2, seed=3)                # a real text layer: flash tier, no models
    with start_fleet(tmp, python) as fleet:        # the router and its two local workers
        run = run_fault(fleet, lambda: write_plan(fleet.plan, "engine_dead"))
        run.lost                                   # jobs failed, hung or refused

``start_fleet``/``run_fault`` are the one router harness of the 4.0 tests and
``bench/router4`` (``patched=False``: MinerU's own router, for comparison).

Faults reach the workers the router launches through a ``sitecustomize``
in ``router_env``'s path: in an ``api-server`` process it wraps 4.0's
``parse_async`` (the call ``_run_job`` makes for every file) so that,
when ``MINERU_HEALTH_FAULT_PLAN`` (``{port}`` becomes the worker's port)
holds a word, the worker behaves as follows (the file is consumed):

``engine_dead``
    this and every later parse raises vLLM's ``EngineDeadError`` (same
    module path and class name, so 4.0.12's own ``is_fatal_engine_error``
    fails the job and turns ``/v1/health`` to 503 ``engine_dead``).
``hang``
    the parse blocks the worker's event loop (``time.sleep`` on it, for
    ``MINERU_HEALTH_FAULT_HANG_S``, default 3600 s): ``/v1/health`` answers
    nothing, the process stays alive.

Written for the router tests until the worker-side 4.0 plugin lands
(branch w4); the ``engine_dead`` error class is ``testing.faults``'s.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Self

from .faults import FAULT_PLAN_ENV, HANG_S_ENV, make_engine_dead_error, write_plan
from .processes import ManagedProcess, Processes
from .sandbox import SandboxError, copy_mineru, free_port, wait_until

__all__ = [
    "MINERU4_PYTHON_ENV",
    "FaultRun",
    "Fleet",
    "Job",
    "JobStream",
    "install_faults",
    "mineru4_python",
    "patched_site4",
    "router_env",
    "run_fault",
    "start_fleet",
    "text_pdf",
    "write_plan",
]

MINERU4_PYTHON_ENV = "MINERU_HEALTH_MINERU4_PYTHON"
_SITECUSTOMIZE = """\
import sys
if "api-server" in sys.argv:
    from mineru_health.testing import mineru4
    mineru4.install_faults()
"""


def mineru4_python() -> str | None:
    """The interpreter of a MinerU 4.0 environment, or None (tests skip)."""
    return os.environ.get(MINERU4_PYTHON_ENV) or None


def patches_dir() -> Path:
    """The 4.0 patch set (installed with the package, or this checkout's)."""
    from mineru_health.patching import patches_root

    return patches_root() / "mineru-4.0"


def patched_site4(dest_dir: Path, python: str) -> Path:
    """Copies ``python``'s MinerU into ``dest_dir`` and applies the 4.0 router patches."""
    import json

    site = copy_mineru(dest_dir, python)
    package = site / "mineru"
    manifest = json.loads((patches_dir() / "manifest.json").read_text(encoding="utf-8"))
    for entry in manifest["files"]:
        if not entry["target"].startswith("kit/router/"):
            continue  # the worker side is its own patch (and adapter)
        done = subprocess.run(
            ["patch", "-p1", "--forward", "--quiet", "-i", str(patches_dir() / entry["patch"])],
            cwd=package, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SandboxError(f"patch {entry['patch']}: {done.stdout}{done.stderr}")
    return site


def router_env(site: Path, scratch: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a patched router (and so of the workers it launches), offline."""
    import mineru_health

    home = scratch / "home"
    home.mkdir(parents=True, exist_ok=True)
    # Only this package, not the environment it is installed in, joins MinerU's path.
    shim = scratch / "health-path"
    shim.mkdir(exist_ok=True)
    link = shim / "mineru_health"
    if not link.exists():
        link.symlink_to(Path(mineru_health.__file__).resolve().parent)
    (shim / "sitecustomize.py").write_text(_SITECUSTOMIZE, encoding="utf-8")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MINERU_ROUTER_HEALTH_", "MINERU_HEALTH_", "PYTHON"))}
    env.update({
        "PYTHONPATH": os.pathsep.join([str(site), str(shim)]),
        "PYTHONUNBUFFERED": "1",
        "MINERU_HOME": str(home),
        "HOME": str(home),
        "MINERU_MODEL_SOURCE": "local",
        "HF_HUB_OFFLINE": "1",
    })
    env.update(extra or {})
    return env


def text_pdf(pages: int = 2, *, seed: int = 0, lines: int = 40) -> bytes:
    """A PDF whose pages carry ``lines`` lines of real text (the flash tier parses it)."""
    from reportlab.lib.pagesizes import A4  # type: ignore[import-untyped]
    from reportlab.pdfgen import canvas  # type: ignore[import-untyped]

    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=A4, invariant=True)
    _, height = A4
    for page in range(1, pages + 1):
        y = height - 60
        for line in range(1, lines + 1):
            pdf.drawString(50, y, f"Document {seed}, page {page}, line {line}: the quick brown "
                                  f"fox jumps over the lazy dog {seed * 1000 + line}.")
            y -= 18
        pdf.showPage()
    pdf.save()
    return buffer.getvalue()


# --- a router, its workers and a stream of jobs --------------------------------------------

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
    timeout (workers without a native endpoint show a hung loop that way).
    """
    site_dir = scratch / "mineru-site"
    site = patched_site4(site_dir, python) if patched else copy_mineru(site_dir, python)
    audit, plan = scratch / "audit.jsonl", scratch / "plan"
    env = router_env(site, scratch, {
        "MINERU_ROUTER_HEALTH_PRESET": "fast",
        "MINERU_ROUTER_HEALTH_MAIN_PORT_TIMEOUT_S": "3",
        "MINERU_ROUTER_HEALTH_AUDIT_PATH": str(audit),
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


# --- in the worker process -------------------------------------------------------------------


def install_faults() -> None:
    """Wraps ``mineru.parser.api_server.parse_async`` once that module is imported."""
    plan = os.environ.get(FAULT_PLAN_ENV)
    if not plan:
        return
    port = _port(sys.argv)
    state: dict[str, Any] = {"dead": False, "path": plan.replace("{port}", str(port))}
    hang_s = float(os.environ.get(HANG_S_ENV) or 3600)

    def wrap(module: Any) -> None:
        original = module.parse_async

        async def parse_async(*args: Any, **kwargs: Any) -> Any:
            word = _consume(state["path"])
            if word == "engine_dead":
                state["dead"] = True
            elif word == "hang":
                import time

                time.sleep(hang_s)  # noqa: ASYNC251 -- blocks the event loop, on purpose
            if state["dead"]:
                raise make_engine_dead_error()
            return await original(*args, **kwargs)

        module.parse_async = parse_async

    _after_import("mineru.parser.api_server", wrap)


def _consume(path: str) -> str:
    try:
        word = Path(path).read_text(encoding="utf-8").strip()
    except OSError:
        return ""
    Path(path).unlink(missing_ok=True)
    return word


def _port(argv: list[str]) -> int:
    for index, arg in enumerate(argv):
        if arg == "--port" and index + 1 < len(argv):
            return int(argv[index + 1])
    return 0


def _after_import(name: str, callback: Any) -> None:
    """Calls ``callback(module)`` right after ``name`` is first imported."""
    import importlib.abc
    import importlib.machinery

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is None or spec.loader is None:
                return spec
            loader = spec.loader
            exec_module = loader.exec_module

            def exec_and_wrap(module: Any) -> None:
                exec_module(module)
                callback(module)

            loader.exec_module = exec_and_wrap  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, Finder())


def cleanup(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)

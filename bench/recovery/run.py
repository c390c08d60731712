"""Recovery benchmark: a real mineru-router with two real local mineru-api workers.

For each side, in the same run, with the same steady stream of tasks through
the router and the same injected engine death (``MINERU_HEALTH_FAULT_PLAN``
``engine_dead``, consumed by exactly one worker), it measures:

1. seconds from the death showing (the first task the dead engine failed)
   to the worker leaving rotation (the router's ``/health`` shows it
   unhealthy),
2. seconds from that moment to the worker being healthy again on a new URL
   (restarted),
3. tasks failed and tasks hung (no terminal state within --task-timeout) out
   of those submitted.

Sides:

(a) baseline: MinerU 3.4.4's own router (unpatched) and workers patched only
    with ``baseline_fast_api.patch`` -- PR #5188's behaviour emulated by
    ``pr5188_baseline.py`` (a fatal marker sets ``last_worker_error``, so
    ``/health`` answers 503) plus the same fault injection;
(b) mineru-health: router and workers patched by ``mineru-health patch apply``.

Both sides probe every 2 s by default (MinerU's refresh interval is 2 s; the
``production`` preset's interval is 2 s too). Timings are machine-dependent;
read the ratios. The injected death stays latent until the next engine call,
so the clock starts at the first failed task, on both sides alike. Runtime:
about ``2 * (startup + warm-up + --duration)``, four to five minutes.

    python bench/recovery/run.py [--duration 50] [--period 2.0] [--json out.json]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
STARTUP_TIMEOUT_S = 240.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def mineru_package_dir(python: str) -> Path:
    out = subprocess.run(
        [
            python,
            "-c",
            "import importlib.util as u; "
            + "print(list(u.find_spec('mineru').submodule_search_locations)[0])",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return Path(out.stdout.strip())


def mineru_health_dir() -> str:
    import mineru_health

    return str(Path(mineru_health.__file__).resolve().parent.parent)


def copy_site(dest: Path, python: str) -> Path:
    shutil.copytree(
        mineru_package_dir(python),
        dest / "mineru",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    return dest


def baseline_site(dest: Path, python: str) -> Path:
    import patch_ng

    site = copy_site(dest, python)
    patch_set = patch_ng.fromfile(str(HERE / "baseline_fast_api.patch"))
    if not patch_set or not patch_set.apply(strip=1, root=str(site / "mineru")):
        raise SystemExit("baseline_fast_api.patch does not apply to this MinerU")
    return site


def ours_site(dest: Path, python: str) -> Path:
    site = copy_site(dest, python)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "mineru_health",
            "patch",
            "apply",
            "--mineru-path",
            str(site / "mineru"),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return site


def tiny_pdf() -> bytes:
    from reportlab.pdfgen import canvas

    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer)
    pdf.drawString(72, 720, "mineru-health recovery bench")
    pdf.showPage()
    pdf.save()
    return buffer.getvalue()


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` (the router's workers), read from /proc."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...; comm may hold spaces, so split after ')'.
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            out.append(int(entry.name))
    return out


@dataclass
class TaskOutcome:
    submitted_at: float
    status: str  # completed | failed | rejected | hung
    error: str = ""
    finished_at: float = 0.0


@dataclass
class SideResult:
    name: str
    leave_rotation_s: float | None = None
    healthy_again_s: float | None = None
    dead_worker: str = ""
    first_failure_after_injection_s: float | None = None
    tasks: list[TaskOutcome] = field(default_factory=list)
    log: str = ""

    def count(self, *statuses: str) -> int:
        return sum(1 for t in self.tasks if t.status in statuses)


class Side:
    def __init__(self, name: str, site: Path, env_extra: dict[str, str], work: Path, args: Any):
        self.name = name
        self.site = site
        self.work = work / name
        self.work.mkdir(parents=True)
        self.args = args
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.plan = self.work / "fault-plan"
        paths = [str(site), mineru_health_dir(), str(HERE)]
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("MINERU_")}
        self.env.update(
            {
                "PYTHONPATH": os.pathsep.join(paths),
                "MINERU_MODEL_SOURCE": "local",
                "MINERU_API_DISABLE_ACCESS_LOG": "1",
                "MINERU_HEALTH_FAULT_PLAN": str(self.plan),
                "PYTHONUNBUFFERED": "1",
                **env_extra,
            }
        )
        self.log_path = self.work / "router.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.samples: list[tuple[float, dict[str, tuple[bool, str]]]] = []
        self._stop = threading.Event()

    # -- process --------------------------------------------------------------
    def start(self) -> None:
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                self.args.python,
                "-m",
                "mineru.cli.router",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--local-gpus",
                "0,1",
            ],
            env=self.env,
            cwd=self.work,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name}: router exited; see {self.log_path}")
            servers = self.servers()
            if len(servers) == 2 and all(h for h, _ in servers.values()):
                return
            time.sleep(0.5)
        raise SystemExit(f"{self.name}: router not healthy in time; see {self.log_path}")

    def stop(self) -> None:
        if self.proc is None:
            return
        workers = children_of(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        for pid in workers:  # the router stops its workers; make sure
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass

    # -- observation ---------------------------------------------------------------
    def servers(self) -> dict[str, tuple[bool, str]]:
        try:
            payload = httpx.get(f"{self.base}/health", timeout=5.0).json()
        except (httpx.HTTPError, ValueError):
            return {}
        return {
            s["server_id"]: (bool(s["healthy"]), s["base_url"]) for s in payload.get("servers", [])
        }

    def watch(self) -> None:
        while not self._stop.is_set():
            servers = self.servers()
            if servers:
                self.samples.append((time.monotonic(), servers))
            self._stop.wait(0.1)

    def submit_and_wait(self, client: httpx.Client, pdf: bytes) -> TaskOutcome:
        t = time.monotonic()
        try:
            response = client.post(
                f"{self.base}/tasks",
                files={"files": ("tiny.pdf", pdf, "application/pdf")},
                data={"backend": "vlm-http-client", "server_url": self.args.vlm_url},
                timeout=60.0,
            )
        except httpx.HTTPError as exc:
            return TaskOutcome(t, "rejected", str(exc))
        if response.status_code != 202:
            return TaskOutcome(t, "rejected", f"{response.status_code} {response.text[:200]}")
        task_id = response.json()["task_id"]
        deadline = t + self.args.task_timeout
        while time.monotonic() < deadline:
            try:
                status = client.get(f"{self.base}/tasks/{task_id}", timeout=10.0).json()
            except (httpx.HTTPError, ValueError):
                status = {}
            if status.get("status") in ("completed", "failed"):
                error = str(status.get("error") or "")
                return TaskOutcome(t, status["status"], error, time.monotonic())
            time.sleep(0.5)
        return TaskOutcome(t, "hung")

    # -- one run -------------------------------------------------------------------
    def run(self, pdf: bytes) -> SideResult:
        result = SideResult(self.name)
        print(f"[{self.name}] starting router and two workers ...", flush=True)
        self.start()
        initial = self.servers()
        watcher = threading.Thread(target=self.watch, daemon=True)
        watcher.start()
        futures: list[Future[TaskOutcome]] = []
        t_inject: float | None = None
        try:
            with httpx.Client() as client, ThreadPoolExecutor(max_workers=64) as pool:
                # Warm both workers (first parses import and load a lot) so the
                # death is not hidden behind a cold start.
                warm = [pool.submit(self.submit_and_wait, client, pdf) for _ in range(4)]
                for outcome in (f.result() for f in warm):
                    if outcome.status != "completed":
                        raise SystemExit(
                            f"{self.name}: warm-up task {outcome}; see {self.log_path}"
                        )
                t_start = time.monotonic()
                n = 0
                while time.monotonic() - t_start < self.args.duration:
                    if t_inject is None and time.monotonic() - t_start >= self.args.inject_after:
                        tmp = self.plan.with_suffix(".tmp")
                        tmp.write_text("engine_dead\n")
                        os.replace(tmp, self.plan)
                        t_inject = time.monotonic()
                        print(f"[{self.name}] engine death injected", flush=True)
                    futures.append(pool.submit(self.submit_and_wait, client, pdf))
                    n += 1
                    next_at = t_start + n * self.args.period
                    time.sleep(max(0.0, next_at - time.monotonic()))
                print(f"[{self.name}] stream done; waiting for tasks and recovery ...", flush=True)
                result.tasks = [f.result() for f in futures]
                assert t_inject is not None
                # The clock starts when the death shows: the first task that
                # failed (the injected death is latent until an engine call).
                failures = [t.finished_at for t in result.tasks if t.status == "failed"]
                t0 = min(failures) if failures else t_inject
                result.first_failure_after_injection_s = t0 - t_inject if failures else None
                cap = t0 + self.args.recovery_cap
                while time.monotonic() < cap and not self._recovered(result, initial, t0):
                    time.sleep(0.2)
                self._recovered(result, initial, t0)
        finally:
            self._stop.set()
            watcher.join(timeout=10)
            self.stop()
        return result

    def _recovered(
        self, result: SideResult, initial: dict[str, tuple[bool, str]], t0: float
    ) -> bool:
        result.dead_worker = ""
        # Samples from one poll interval before t0 on: the router may eject in
        # the very status request through which the bench sees the failure.
        for t, servers in list(self.samples):
            if t < t0 - 0.5:
                continue
            if not result.dead_worker:
                for sid, (healthy, _url) in servers.items():
                    if not healthy:
                        result.dead_worker = sid
                        result.leave_rotation_s = max(0.0, t - t0)
                        break
                continue
            healthy, url = servers.get(result.dead_worker, (False, ""))
            if healthy and url != initial[result.dead_worker][1]:
                result.healthy_again_s = t - t0
                return True
        return False


def fmt(value: float | None, cap: float) -> str:
    return f"{value:.2f}" if value is not None else f"> {cap:.0f} (never)"


def ratio(base: float | None, ours: float | None) -> str:
    if base is None or ours is None or ours <= 0:
        return "n/a"
    return f"{base / ours:.1f}x"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--python", default=os.environ.get("MINERU_HEALTH_MINERU_PYTHON", sys.executable)
    )
    parser.add_argument(
        "--duration", type=float, default=50.0, help="seconds of task stream per side"
    )
    parser.add_argument("--period", type=float, default=2.0, help="seconds between submissions")
    parser.add_argument("--inject-after", type=float, default=6.0, help="seconds into the stream")
    parser.add_argument(
        "--task-timeout", type=float, default=90.0, help="a task not terminal by then is hung"
    )
    parser.add_argument(
        "--recovery-cap", type=float, default=120.0, help="stop waiting for recovery after"
    )
    parser.add_argument(
        "--preset", default="production", help="MINERU_ROUTER_HEALTH_PRESET for side (b)"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="mineru-health-recovery-"))
    vlm_port = free_port()
    args.vlm_url = f"http://127.0.0.1:{vlm_port}"
    vlm = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mineru_health.testing.fake_vlm_server",
            "--host",
            "127.0.0.1",
            "--port",
            str(vlm_port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    results: list[SideResult] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{args.vlm_url}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        pdf = tiny_pdf()
        sides = [
            Side("baseline", baseline_site(work / "site-a", args.python), {}, work, args),
            Side(
                "mineru-health",
                ours_site(work / "site-b", args.python),
                {
                    "MINERU_ROUTER_HEALTH_PRESET": args.preset,
                    "MINERU_ROUTER_HEALTH_AUDIT_PATH": str(work / "audit.jsonl"),
                },
                work,
                args,
            ),
        ]
        for side in sides:
            results.append(side.run(pdf))
    finally:
        vlm.terminate()
        vlm.wait(timeout=30)

    base, ours = results
    cap = args.recovery_cap
    rows = [
        (
            "injection -> first failed task (s)",
            fmt(base.first_failure_after_injection_s, cap),
            fmt(ours.first_failure_after_injection_s, cap),
            "",
        ),
        (
            "first failure -> out of rotation (s)",
            fmt(base.leave_rotation_s, cap),
            fmt(ours.leave_rotation_s, cap),
            ratio(base.leave_rotation_s, ours.leave_rotation_s),
        ),
        (
            "first failure -> healthy again (s)",
            fmt(base.healthy_again_s, cap),
            fmt(ours.healthy_again_s, cap),
            ratio(base.healthy_again_s, ours.healthy_again_s),
        ),
        ("tasks submitted", str(len(base.tasks)), str(len(ours.tasks)), ""),
        (
            "tasks failed (incl. rejected)",
            str(base.count("failed", "rejected")),
            str(ours.count("failed", "rejected")),
            ratio(
                float(base.count("failed", "rejected")),
                float(ours.count("failed", "rejected")) or None,
            ),
        ),
        ("tasks hung", str(base.count("hung")), str(ours.count("hung")), ""),
    ]
    widths = [
        max(
            len(r[i])
            for r in [("metric", "(a) 3.4.4 + PR#5188-like", "(b) mineru-health", "a/b"), *rows]
        )
        for i in range(4)
    ]
    header = ("metric", "(a) 3.4.4 + PR#5188-like", "(b) mineru-health", "a/b")
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
    print(
        f"\ndead worker: (a) {base.dead_worker or '-'}  (b) {ours.dead_worker or '-'}; logs under {work}"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    r.name: {
                        "leave_rotation_s": r.leave_rotation_s,
                        "healthy_again_s": r.healthy_again_s,
                        "submitted": len(r.tasks),
                        "failed": r.count("failed", "rejected"),
                        "hung": r.count("hung"),
                        "dead_worker": r.dead_worker,
                    }
                    for r in results
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Recovery benchmark: a real mineru-router with two real local mineru-api workers, four faults.

For each scenario and each side, in the same run, a fresh router and two
workers get the same warm-up and the same steady stream of tasks (a tiny
PDF, one every --period seconds for --duration seconds, each with a name of
its own), and the same fault a few seconds in, right after a burst of
--burst tasks (so that it finds tasks queued and running), aimed at one
worker (``local-gpu-0``) unless the scenario says otherwise:

- ``engine_death``: the engine dies (fault plan ``engine_dead``);
- ``stall``:        the engine stops making progress (``engine_stall``);
- ``kill9``:        the worker's process is killed with SIGKILL;
- ``poison``:       a document that kills the engine of any worker parsing
                    it (``poison <name>``) is submitted once, mid-stream.

Measured per side: tasks completed / failed (rejected submissions included)
/ hung (not terminal within --task-timeout) / duplicated (parsed to the end
more than once: the same upload name's Markdown found in two task output
directories), resubmissions (ours), seconds from the fault to the first
worker leaving rotation (detection) and to every worker being in rotation
again (recovery), read from the router's ``/health`` every 0.1 s.

Sides:

(a) baseline: MinerU 3.4.4's own router and workers, with only fault
    injection added (``baseline_fast_api.patch`` + ``pr5188_baseline.py``);
    ``--baseline pr5188`` adds PR #5188's marker check on the workers
    (``/health`` 503 after an engine death) for the older comparison;
(b) mineru-health: router and workers patched by ``mineru-health patch
    apply``, the ``production`` preset unless --preset says otherwise.

Timings are machine-dependent; read the ratios. Runtime: about 8 x (start-up
+ warm-up + --duration + the slowest task), six to eight minutes on 2 cores
with the defaults; ``--scenarios`` runs a subset.

    python bench/recovery/run.py [--scenarios engine_death,kill9] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from mineru_health.testing.faults import write_plan

HERE = Path(__file__).resolve().parent
STARTUP_TIMEOUT_S = 240.0
SCENARIOS = ("engine_death", "stall", "kill9", "poison")
VICTIM = "local-gpu-0"
POISON_NAME = "poison.pdf"


def free_port() -> int:
    from mineru_health.testing.sandbox import free_port as pick

    return pick()


def baseline_site(dest: Path, python: str) -> Path:
    import patch_ng
    from mineru_health.testing.sandbox import add_fault_plugin, copy_mineru

    site = copy_mineru(dest, python)
    patch_set = patch_ng.fromfile(str(HERE / "baseline_fast_api.patch"))
    if not patch_set or not patch_set.apply(strip=1, root=str(site / "mineru")):
        raise SystemExit("baseline_fast_api.patch does not apply to this MinerU")
    return add_fault_plugin(site)


def ours_site(dest: Path, python: str) -> Path:
    from mineru_health.testing.sandbox import patched_site

    return patched_site(dest, python)


def pdf_bytes(text: str) -> bytes:
    from mineru_health.testing.sandbox import make_pdf

    return make_pdf(text=text)


def child_pid(parent: int, port: str) -> int | None:
    """The child of ``parent`` started with ``--port <port>`` (a router's worker)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and b"--port" in argv and port.encode() in argv:
            return int(entry.name)
    return None


@dataclass
class Outcome:
    name: str
    status: str  # completed | failed | rejected | hung
    attempts: int = 1
    error: str = ""


@dataclass
class Result:
    side: str
    scenario: str
    tasks: list[Outcome] = field(default_factory=list)
    detection_s: float | None = None
    recovery_s: float | None = None
    duplicated: int = 0
    resubmissions: int = 0
    poison_status: str = ""

    def count(self, *statuses: str) -> int:
        return sum(1 for t in self.tasks if t.status in statuses)


class Side:
    """One router with two workers for one scenario; stopped, with what it started, after."""

    def __init__(self, name: str, site: Path, env_extra: dict[str, str], work: Path,
                 args: Any) -> None:
        self.name, self.args = name, args
        self.work = work
        self.work.mkdir(parents=True)
        (self.work / "tmp").mkdir()
        self.plans = self.work / "plans"
        self.plans.mkdir()
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        from mineru_health.testing.sandbox import mineru_health_path

        paths = [str(site), mineru_health_path(), str(HERE)]
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("MINERU_", "BENCH_"))}
        self.env.update({
            "PYTHONPATH": os.pathsep.join(paths),
            "MINERU_MODEL_SOURCE": "local",
            "MINERU_API_DISABLE_ACCESS_LOG": "1",
            "MINERU_HEALTH_FAULT_PLAN": str(self.plans / "plan-{port}"),
            "PYTHONUNBUFFERED": "1",
            # Workers' output directories land here, where the bench can count them.
            "TMPDIR": str(self.work / "tmp"),
            **env_extra,
        })
        self.log_path = self.work / "router.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.samples: list[tuple[float, dict[str, tuple[bool, str]]]] = []
        self._stop = threading.Event()

    def start(self) -> None:
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [self.args.python, "-m", "mineru.cli.router", "--host", "127.0.0.1", "--port",
                 str(self.port), "--local-gpus", "0,1"],
                env=self.env, cwd=self.work, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
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
        from mineru_health.testing.processes import Processes

        with Processes() as reaper:  # the router's workers are in sessions of their own
            reaper.record_descendants(_Adopted(self.proc))
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(timeout=30)

    def servers(self) -> dict[str, tuple[bool, str]]:
        try:
            payload = httpx.get(f"{self.base}/health", timeout=5.0).json()
        except (httpx.HTTPError, ValueError):
            return {}
        return {s["server_id"]: (bool(s["healthy"]), s["base_url"])
                for s in payload.get("servers", [])}

    def watch(self) -> None:
        while not self._stop.is_set():
            servers = self.servers()
            if servers:
                self.samples.append((time.monotonic(), servers))
            self._stop.wait(0.1)

    def run_task(self, client: httpx.Client, name: str, pdf: bytes) -> Outcome:
        t = time.monotonic()
        try:
            response = client.post(f"{self.base}/tasks",
                                   files={"files": (name, pdf, "application/pdf")},
                                   data={"backend": "vlm-http-client",
                                         "server_url": self.args.vlm_url},
                                   timeout=60.0)
        except httpx.HTTPError as exc:
            return Outcome(name, "rejected", error=f"{type(exc).__name__}: {exc}")
        if response.status_code != 202:
            return Outcome(name, "rejected", error=f"{response.status_code} {response.text[:300]}")
        task_id = response.json()["task_id"]
        while time.monotonic() < t + self.args.task_timeout:
            try:
                status = client.get(f"{self.base}/tasks/{task_id}", timeout=10.0).json()
            except (httpx.HTTPError, ValueError):
                status = {}
            if status.get("status") in ("completed", "failed"):
                return Outcome(name, status["status"], int(status.get("attempts", 1)),
                               str(status.get("error") or "")[:300])
            time.sleep(0.3)
        return Outcome(name, "hung")

    def inject(self, scenario: str, client: httpx.Client, pool: ThreadPoolExecutor,
               poisoned: list[Future[Outcome]]) -> None:
        victim_url = self.servers()[VICTIM][1]
        victim_port = victim_url.rsplit(":", 1)[1]
        if scenario in ("engine_death", "stall"):
            word = "engine_dead" if scenario == "engine_death" else "engine_stall"
            write_plan(self.plans / f"plan-{victim_port}", word)
        elif scenario == "kill9":
            assert self.proc is not None
            pid = child_pid(self.proc.pid, victim_port)
            if pid is None:
                raise SystemExit(f"{self.name}: no worker process on port {victim_port}")
            os.kill(pid, signal.SIGKILL)
        elif scenario == "poison":
            for server_url in (url for _, url in self.servers().values()):
                write_plan(self.plans / f"plan-{server_url.rsplit(':', 1)[1]}",
                           f"poison {POISON_NAME}")
            time.sleep(0.3)  # workers read their plan every 0.1 s
            poison = pdf_bytes("a document that kills inference engines")
            poisoned.append(pool.submit(self.run_task, client, POISON_NAME, poison))

    def run(self, scenario: str, pdf: bytes) -> Result:
        result = Result(self.name, scenario)
        print(f"[{scenario}/{self.name}] starting router and two workers ...", flush=True)
        self.start()
        watcher = threading.Thread(target=self.watch, daemon=True)
        watcher.start()
        futures: list[Future[Outcome]] = []
        poisoned: list[Future[Outcome]] = []
        try:
            with httpx.Client() as client, ThreadPoolExecutor(max_workers=64) as pool:
                warm = [pool.submit(self.run_task, client, f"warm-{i}.pdf", pdf) for i in range(4)]
                if any(f.result().status != "completed" for f in warm):
                    raise SystemExit(f"{self.name}: warm-up failed; see {self.log_path}")
                t_start = time.monotonic()
                t_inject: float | None = None
                n = 0
                while time.monotonic() - t_start < self.args.duration:
                    if t_inject is None and time.monotonic() - t_start >= self.args.inject_after:
                        # A burst first, so that the fault finds tasks queued and running.
                        futures += [pool.submit(self.run_task, client, f"s-burst-{i}.pdf", pdf)
                                    for i in range(self.args.burst)]
                        time.sleep(0.5)
                        self.inject(scenario, client, pool, poisoned)
                        t_inject = time.monotonic()
                    futures.append(pool.submit(self.run_task, client, f"s{n:03d}.pdf", pdf))
                    n += 1
                    time.sleep(max(0.0, t_start + n * self.args.period - time.monotonic()))
                result.tasks = [f.result() for f in futures]
                result.poison_status = poisoned[0].result().status if poisoned else ""
                assert t_inject is not None
                self._times(result, t_inject)
                result.duplicated = self._duplicates()
                result.resubmissions = self._resubmissions()
        finally:
            self._stop.set()
            watcher.join(timeout=10)
            self.stop()
        return result

    def _times(self, result: Result, t0: float) -> None:
        """Detection: first worker out of rotation; recovery: all back (bounded wait).

        Called once every task is terminal or hung: a worker never taken out
        by then (upstream's dead engine answers /health 200) never will be.
        """
        out = [t for t, s in self.samples if t >= t0 and not all(h for h, _ in s.values())]
        if not out:
            return
        result.detection_s = out[0] - t0
        cap = t0 + self.args.recovery_cap
        while True:
            back = [t for t, s in self.samples
                    if t > out[0] and s and all(h for h, _ in s.values())]
            if back:
                result.recovery_s = back[0] - t0
                return
            if time.monotonic() >= cap:
                return
            time.sleep(0.2)

    def _duplicates(self) -> int:
        """Upload names whose Markdown exists in more than one task output directory."""
        seen = Counter(path.stem for path in (self.work / "tmp").rglob("*.md"))
        return sum(1 for stem, count in seen.items() if count > 1 and stem.startswith("s"))

    def _resubmissions(self) -> int:
        try:
            text = httpx.get(f"{self.base}/metrics", timeout=5.0).text
        except httpx.HTTPError:
            return 0
        total = 0.0
        for line in text.splitlines():
            if line.startswith("mineru_router_task_resubmissions_total{"):
                total += float(line.rsplit(" ", 1)[1])
        return int(total)


class _Adopted:
    """What Processes.record_descendants needs of a process it did not start."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.pid, self._popen = popen.pid, popen

    def poll(self) -> int | None:
        return self._popen.poll()


def fmt(value: float | None, cap: float) -> str:
    return f"{value:.1f}" if value is not None else f">{cap:.0f} (never)"


def ratio(base: float | None, ours: float | None) -> str:
    if base is None or ours is None or ours <= 0:
        return "n/a"
    return f"{base / ours:.1f}x"


def report(pairs: list[tuple[Result, Result]], cap: float) -> None:
    header = ("scenario", "metric", "(a) baseline", "(b) mineru-health", "a/b")
    rows: list[tuple[str, ...]] = []
    for base, ours in pairs:
        lost_a, lost_b = base.count("failed", "rejected"), ours.count("failed", "rejected")
        rows += [
            (base.scenario, "tasks submitted", str(len(base.tasks)), str(len(ours.tasks)), ""),
            ("", "tasks completed", str(base.count("completed")), str(ours.count("completed")),
             ""),
            ("", "tasks failed (incl. rejected)", str(lost_a), str(lost_b),
             ratio(float(lost_a), float(lost_b)) if lost_b else ("-" if not lost_a else "inf")),
            ("", "tasks hung", str(base.count("hung")), str(ours.count("hung")), ""),
            ("", "tasks duplicated", str(base.duplicated), str(ours.duplicated), ""),
            ("", "resubmissions", str(base.resubmissions), str(ours.resubmissions), ""),
            ("", "fault -> worker out (s)", fmt(base.detection_s, cap), fmt(ours.detection_s, cap),
             ratio(base.detection_s, ours.detection_s)),
            ("", "fault -> all back (s)", fmt(base.recovery_s, cap), fmt(ours.recovery_s, cap),
             ratio(base.recovery_s, ours.recovery_s)),
        ]
        if base.poison_status or ours.poison_status:
            rows.append(("", "poison document", base.poison_status, ours.poison_status, ""))
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(5)]
    for row in (header, tuple("-" * w for w in widths), *rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python",
                        default=os.environ.get("MINERU_HEALTH_MINERU_PYTHON", sys.executable))
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--duration", type=float, default=14.0, help="seconds of stream")
    parser.add_argument("--period", type=float, default=1.0, help="seconds between submissions")
    parser.add_argument("--inject-after", type=float, default=4.0, help="seconds into the stream")
    parser.add_argument("--burst", type=int, default=4, help="tasks submitted at once just "
                        "before the fault")
    parser.add_argument("--task-timeout", type=float, default=60.0,
                        help="a task not terminal by then is hung")
    parser.add_argument("--recovery-cap", type=float, default=60.0,
                        help="stop waiting for recovery after this many seconds")
    parser.add_argument("--preset", default="production", help="MINERU_ROUTER_HEALTH_PRESET (b)")
    parser.add_argument("--stall-s", default="5", help="MINERU_HEALTH_STALL_S of (b)'s workers")
    parser.add_argument("--baseline", choices=("upstream", "pr5188"), default="upstream")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; known: {', '.join(SCENARIOS)}")

    from mineru_health.testing.processes import Processes
    from mineru_health.testing.sandbox import fake_vlm_command

    work = Path(tempfile.mkdtemp(prefix="mineru-health-recovery-"))
    vlm_port = free_port()
    args.vlm_url = f"http://127.0.0.1:{vlm_port}"
    pairs: list[tuple[Result, Result]] = []
    with Processes() as procs:
        procs.start("fake-vlm", fake_vlm_command(sys.executable, vlm_port), env=dict(os.environ),
                    log_path=work / "fake-vlm.log")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{args.vlm_url}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        pdf = pdf_bytes("mineru-health recovery bench")
        sites = {"baseline": baseline_site(work / "site-a", args.python),
                 "mineru-health": ours_site(work / "site-b", args.python)}
        base_env = {"BENCH_PR5188_MARKERS": "1"} if args.baseline == "pr5188" else {}
        ours_env = {"MINERU_ROUTER_HEALTH_PRESET": args.preset,
                    "MINERU_HEALTH_STALL_S": args.stall_s}
        for scenario in scenarios:
            audit = {"MINERU_ROUTER_HEALTH_AUDIT_PATH": str(work / f"{scenario}-audit.jsonl")}
            baseline = Side("baseline", sites["baseline"], base_env, work / f"{scenario}-a", args)
            ours = Side("mineru-health", sites["mineru-health"], {**ours_env, **audit},
                        work / f"{scenario}-b", args)
            pairs.append((baseline.run(scenario, pdf), ours.run(scenario, pdf)))
    label = "upstream 3.4" if args.baseline == "upstream" else "upstream 3.4 + PR#5188-like"
    print(f"\n(a) = {label}, (b) = mineru-health ({args.preset}); logs under {work}")
    report(pairs, args.recovery_cap)
    if args.json:
        args.json.write_text(json.dumps(
            [{"scenario": a.scenario, "baseline": _summary(a), "mineru_health": _summary(b)}
             for a, b in pairs], indent=2))
    return 0


def _summary(result: Result) -> dict[str, Any]:
    data = asdict(result)
    data["lost"] = [asdict(t) for t in result.tasks if t.status != "completed"]
    data.pop("tasks")
    data.update(submitted=len(result.tasks), completed=result.count("completed"),
                failed=result.count("failed", "rejected"), hung=result.count("hung"))
    return data


if __name__ == "__main__":
    sys.exit(main())

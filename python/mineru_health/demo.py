"""``mineru-health demo``: watch a patched MinerU router heal a worker, on one machine, no GPU.

    mineru-health demo [--scenario engine-death|hung-worker|crash-loop|task-local]
                       [--json] [--keep-temp] [--rate N] [--timeout S]

What it does, all on 127.0.0.1:

1. copies the installed ``mineru`` package into a temporary directory and
   patches the copy (``mineru-health patch apply --mineru-path``); the
   installed MinerU is never touched;
2. starts the fake OpenAI-compatible VLM server
   (:mod:`mineru_health.testing.fake_vlm_server`), so that MinerU's real
   ``vlm-http-client`` parse path completes without a model;
3. starts the real, patched ``mineru-router`` with two router-managed
   ``mineru-api`` workers (``--local-gpus 0,1``), the ``fast`` health preset,
   an audit file and a fault plan path per worker port;
4. sends a steady stream of one-page PDF tasks through the router;
5. injects the scenario's fault into one worker by writing its plan file;
6. prints a live timeline from the router's ``/health``, the audit file, the
   victim worker's own ``/health`` and the task results, then a summary.

Exit status: 0 when the scenario's expected outcome happened (engine-death and
hung-worker: the worker was restarted and is back in rotation; crash-loop:
the router gave up; task-local: one task failed and nothing was restarted),
1 when it did not, 2 when the demo could not be set up, 130 when interrupted.
SIGINT and SIGTERM stop every child process and remove the temporary files.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

__all__ = ["SCENARIOS", "Scenario", "main"]

EXIT_OK = 0
EXIT_OUTCOME_MISSED = 1
EXIT_SETUP_FAILED = 2
EXIT_INTERRUPTED = 130

PYTHON_ENV = "MINERU_HEALTH_MINERU_PYTHON"
HOST = "127.0.0.1"
VICTIM_INDEX = -1  # the last worker the router lists (local-gpu-1)


@dataclass(frozen=True)
class Scenario:
    """One fault and the outcome that proves the health loop handled it."""

    name: str
    plan: str  # the fault plan word written for the victim
    expect: str  # "recovered", "gave_up" or "no_restart"
    summary: str
    observe_s: float  # how long after the fault the outcome may take
    break_restarts: bool = False


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "engine-death",
            "engine_dead",
            "recovered",
            "the worker's inference engine dies (vLLM EngineDeadError) on its next task",
            observe_s=120,
        ),
        Scenario(
            "hung-worker",
            "hang",
            "recovered",
            "the worker's event loop stops: /health and everything else stop answering",
            observe_s=120,
        ),
        Scenario(
            "crash-loop",
            "engine_dead",
            "gave_up",
            "the engine dies and every restart fails at start-up (a broken rules file)",
            observe_s=240,
            break_restarts=True,
        ),
        Scenario(
            "task-local",
            "task_local",
            "no_restart",
            "one document is corrupt: its task fails, the worker stays in rotation",
            observe_s=60,
        ),
    )
}

# Written by MinerU's own Python, which has pypdfium2 (a MinerU dependency).
_PDF_SCRIPT = (
    "import sys, pypdfium2 as pdfium\n"
    "doc = pdfium.PdfDocument.new()\n"
    "doc.new_page(300, 200)\n"
    "doc.save(sys.argv[1])\n"
)
_FIND_MINERU = "import mineru, os; print(os.path.dirname(mineru.__file__))"
_CHECK_HEALTH_IMPORT = "import mineru_health.integration.worker"
_RULES_COMMENT = "# mineru-health demo: extra classifier rules (none)\n"
# A rule line without a pattern: the worker refuses to start (RulesError).
_BROKEN_RULES = "# mineru-health demo (crash-loop): a broken rule\nbroken.rule fatal\n"
_OUT_OF_ROTATION = ("ejected", "health_failed")
_RESTART_ACTIONS = ("auto_restart_scheduled", "auto_restart_success", "auto_restart_failed")


class SetupError(Exception):
    """The demo could not get its processes running."""


# --- timeline ---------------------------------------------------------------------------------


@dataclass
class Event:
    t: float  # seconds since the demo started
    source: str  # demo, task, worker, router, audit
    text: str


class Timeline:
    """Events in arrival order, printed live in text mode. Used on the event loop only."""

    def __init__(self, live: TextIO | None, progress: TextIO) -> None:
        self.wall0 = time.time()
        self.events: list[Event] = []
        self.live = live
        self.progress = progress
        self.last_print = time.monotonic()
        self.waiting_for = ""
        self.wait_started = time.monotonic()
        self.wait_limit = 0.0

    def now(self) -> float:
        return time.time() - self.wall0

    def at(self, unix_time: float) -> float:
        return unix_time - self.wall0

    def add(self, source: str, text: str, t: float | None = None) -> float:
        when = self.now() if t is None else t
        self.events.append(Event(round(when, 2), source, text))
        if self.live is not None:
            print(f"t+{when:7.2f}s  {source:<6}  {text}", file=self.live, flush=True)
        self.last_print = time.monotonic()
        return when

    def wait(self, what: str, limit_s: float) -> None:
        self.waiting_for = what
        self.wait_started = time.monotonic()
        self.wait_limit = limit_s

    def maybe_progress(self) -> None:
        """A progress line when nothing was printed for 5 s during a wait."""
        now = time.monotonic()
        if not self.waiting_for or now - self.last_print < 5:
            return
        elapsed = now - self.wait_started
        print(
            f"... waiting for {self.waiting_for} ({elapsed:.0f}s of at most {self.wait_limit:.0f}s)",
            file=self.progress,
            flush=True,
        )
        self.last_print = now


# --- child processes ---------------------------------------------------------------------------


def _proc_start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (field 22 of /proc/<pid>/stat), to detect pid reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces; fields after it are plain.
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


def _children_of(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                found.extend(int(x) for x in (task / "children").read_text().split())
    return found


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class Children:
    """The processes the demo started, each in its own session (process group)."""

    def __init__(self) -> None:
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.logs: list[Any] = []
        # Workers the router spawned (their own sessions too): pid -> start time.
        self.grandchildren: dict[int, str] = {}

    def spawn(
        self,
        name: str,
        argv: Sequence[str],
        env: dict[str, str],
        log_path: Path,
        cwd: Path,
        *,
        stdin_pipe: bool = False,
    ) -> subprocess.Popen[bytes]:
        log = open(log_path, "ab")  # noqa: SIM115 - closed in stop_all
        self.logs.append(log)
        proc = subprocess.Popen(
            list(argv),
            env=env,
            cwd=cwd,
            stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append((name, proc))
        return proc

    def record_descendants(self, proc: subprocess.Popen[bytes]) -> None:
        for pid in _children_of(proc.pid):
            start = _proc_start_time(pid)
            if start is not None:
                self.grandchildren.setdefault(pid, start)

    def stop_all(self, grace_s: float = 15.0) -> None:
        """SIGTERM every group, wait (bounded), close stdin pipes, then SIGKILL what is left."""
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for _, proc in reversed(self.procs):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for _, proc in self.procs:
            if proc.stdin is not None:
                # Router-spawned workers share this pipe as stdin and exit on EOF
                # (MINERU_API_SHUTDOWN_ON_STDIN_EOF), even if the router died.
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        for _, proc in self.procs:
            if proc.poll() is None:
                _signal_group(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
        leftovers = [
            pid for pid, start in self.grandchildren.items() if _proc_start_time(pid) == start
        ]
        for pid in leftovers:
            _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while leftovers and time.monotonic() < deadline:
            leftovers = [p for p in leftovers if _proc_start_time(p) == self.grandchildren[p]]
            time.sleep(0.1)
        for pid in leftovers:
            _signal_group(pid, signal.SIGKILL)
        for log in self.logs:
            with contextlib.suppress(OSError):
                log.close()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _read_from(path: Path, offset: int) -> tuple[str, int]:
    """What was appended to ``path`` since ``offset``, and the new offset."""
    try:
        with open(path, encoding="utf-8") as handle:
            handle.seek(offset)
            return handle.read(), handle.tell()
    except FileNotFoundError:
        return "", offset


def _port_of(url: str) -> int | None:
    try:
        return int(url.rstrip("/").rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return None


# --- results ----------------------------------------------------------------------------------


@dataclass
class TaskStats:
    submitted: int = 0
    completed: int = 0
    failed: int = 0
    hung: int = 0
    rejected: int = 0  # the router answered 503 (no healthy worker) or the submit timed out
    in_flight: int = 0
    completed_during_outage: int = 0
    failures: list[str] = field(default_factory=list)


@dataclass
class Marks:
    """When things happened, in timeline seconds (None: did not happen)."""

    fault_at: float | None = None
    first_failed_task_at: float | None = None
    worker_unhealthy_at: float | None = None
    out_of_rotation_at: float | None = None
    restart_scheduled_at: float | None = None
    back_in_rotation_at: float | None = None
    gave_up_at: float | None = None
    restart_attempts: int = 0
    failed_restarts: int = 0
    victim_actions: list[str] = field(default_factory=list)


def _since(mark: float | None, origin: float | None) -> float | None:
    if mark is None or origin is None:
        return None
    return round(mark - origin, 2)


# --- the demo -----------------------------------------------------------------------------------


class Demo:
    def __init__(
        self,
        scenario: Scenario,
        *,
        json_mode: bool,
        keep_temp: bool,
        rate: float,
        timeout_s: float,
        out: TextIO,
        err: TextIO,
    ) -> None:
        self.scenario = scenario
        self.json_mode = json_mode
        self.keep_temp = keep_temp
        self.rate = rate
        self.timeout_s = timeout_s
        self.out = out
        self.err = err
        self.timeline = Timeline(None if json_mode else out, err)
        self.children = Children()
        self.tmp: Path | None = None
        self.stats = TaskStats()
        self.marks = Marks()
        self.router_url = ""
        self.router: subprocess.Popen[bytes] | None = None
        self.fake_url = ""
        self.pdf = b""
        self.victim = ""
        self.victim_url = ""
        self.other = ""
        self.servers: dict[str, dict[str, Any]] = {}
        self.victim_health = ""
        self.background: list[asyncio.Task[Any]] = []
        self.task_coros: set[asyncio.Task[Any]] = set()
        self.loading = False
        self.interrupted: int | None = None
        self.outcome_ok = False
        self.outcome_reason = ""
        self.router_metrics: dict[str, float] = {}
        self.deadline = time.monotonic() + timeout_s
        self.client: Any = None  # httpx.AsyncClient while the demo runs
        self.python = sys.executable  # MinerU's Python
        self.base_env: dict[str, str] = {}
        self.shown_after_recovery = 0

    # -- entry ------------------------------------------------------------------------------------
    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        main_task = asyncio.current_task()
        assert main_task is not None

        def on_signal(sig: int) -> None:
            if self.interrupted is None:
                self.interrupted = sig
                main_task.cancel()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)
        code = EXIT_SETUP_FAILED
        try:
            code = await self._run()
        except asyncio.CancelledError:
            if self.interrupted is None:
                raise
            self.timeline.add("demo", f"interrupted by {signal.Signals(self.interrupted).name}")
            code = EXIT_INTERRUPTED
        except SetupError as exc:
            self.timeline.add("demo", f"setup failed: {exc}")
            self._print_logs()
            code = EXIT_SETUP_FAILED
        finally:
            # The handlers stay during the (bounded) teardown, so that a second
            # Ctrl-C cannot cut the clean-up short.
            await self._teardown()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        if code in (EXIT_OK, EXIT_OUTCOME_MISSED):
            self._report(code)
        elif self.json_mode:
            json.dump(self._summary(code), self.out, indent=2)
            print(file=self.out)
        return code

    async def _run(self) -> int:
        import httpx

        s = self.scenario
        self.timeline.add("demo", f"scenario {s.name}: {s.summary}")
        await self._setup()
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=16)
        async with httpx.AsyncClient(timeout=10.0, limits=limits) as client:
            self.client = client
            await self._start_router()
            self.background = [
                asyncio.create_task(self._watch_router(), name="demo-router-health"),
                asyncio.create_task(self._watch_audit(), name="demo-audit"),
                asyncio.create_task(self._watch_victim(), name="demo-victim-health"),
                asyncio.create_task(self._load(), name="demo-load"),
                asyncio.create_task(self._progress(), name="demo-progress"),
            ]
            warmed = await self._wait_for(
                "3 tasks to complete before the fault", 120, lambda: self.stats.completed >= 3
            )
            if not warmed:
                raise SetupError(
                    f"only {self.stats.completed} task(s) completed before the fault "
                    f"({self.stats.failed} failed, {self.stats.rejected} refused)"
                )
            await self._inject()
            await self._observe()
            await self._finish_load()
            await self._scrape_metrics()
        return EXIT_OK if self.outcome_ok else EXIT_OUTCOME_MISSED

    # -- set-up -----------------------------------------------------------------------------------
    async def _setup(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="mineru-health-demo-"))
        (self.tmp / "logs").mkdir()
        python = os.environ.get(PYTHON_ENV) or sys.executable
        self.python = python
        found = await self._run_child([python, "-c", _FIND_MINERU], "find MinerU", 120)
        mineru_dir = Path(found.strip().splitlines()[-1])
        # Not a valid module name, so nothing can import the folder itself.
        site = self.tmp / "mineru-site"
        await asyncio.to_thread(
            shutil.copytree,
            mineru_dir,
            site / "mineru",
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
        self.timeline.add("demo", f"copied {mineru_dir} to {site / 'mineru'}")
        from mineru_health import patching
        from mineru_health.errors import MineruHealthError

        try:
            report = await asyncio.to_thread(patching.apply, site / "mineru")
        except MineruHealthError as exc:
            raise SetupError(f"mineru-health patch apply: {exc}") from None
        targets = {f.target for f in report.files}
        if not {"cli/fast_api.py", "cli/router.py"} <= targets:
            raise SetupError(
                f"the patch set covers only {sorted(targets)}; the demo needs both "
                "cli/fast_api.py and cli/router.py"
            )
        patched = ", ".join(f"{f.target} ({f.state.value})" for f in report.files)
        self.timeline.add("demo", f"patched the copy for MinerU {report.mineru_version}: {patched}")

        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("MINERU_ROUTER_HEALTH_", "MINERU_HEALTH_"))
        }
        paths = [str(site)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(paths)
        probe = await asyncio.to_thread(
            subprocess.run,
            [python, "-c", _CHECK_HEALTH_IMPORT],
            env=env,
            capture_output=True,
            timeout=120,
            check=False,
        )
        if probe.returncode != 0:
            # MinerU's Python is another environment: lend it this package.
            import mineru_health

            parent = str(Path(mineru_health.__file__).resolve().parent.parent)
            env["PYTHONPATH"] = os.pathsep.join([str(site), parent, *paths[1:]])
        self.base_env = env

        pdf_path = self.tmp / "demo.pdf"
        await self._run_child([python, "-c", _PDF_SCRIPT, str(pdf_path)], "make a test PDF", 60)
        self.pdf = pdf_path.read_bytes()
        (self.tmp / "rules.txt").write_text(_RULES_COMMENT)

        port = _free_port()
        self.fake_url = f"http://{HOST}:{port}"
        self.children.spawn(
            "fake-vlm",
            [
                python,
                "-m",
                "mineru_health.testing.fake_vlm_server",
                "--host",
                HOST,
                "--port",
                str(port),
            ],
            env,
            self.tmp / "logs" / "fake-vlm.log",
            self.tmp,
        )

    async def _run_child(self, argv: list[str], what: str, limit_s: float) -> str:
        try:
            done = await asyncio.to_thread(
                subprocess.run,
                argv,
                capture_output=True,
                text=True,
                timeout=limit_s,
                check=False,
                cwd=self.tmp,
            )
        except subprocess.TimeoutExpired:
            raise SetupError(f"{what}: no result within {limit_s:.0f}s") from None
        except OSError as exc:
            raise SetupError(f"{what}: {exc}") from None
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip().splitlines()[-5:]
            raise SetupError(f"{what} failed (exit {done.returncode}): " + " | ".join(detail))
        return done.stdout

    async def _start_router(self) -> None:
        assert self.tmp is not None
        await self._wait_http(f"{self.fake_url}/health", "the fake VLM server", 60)
        self.timeline.add("demo", f"fake VLM server up at {self.fake_url}")
        port = _free_port()
        self.router_url = f"http://{HOST}:{port}"
        env = dict(self.base_env)
        env.update(
            {
                "MINERU_ROUTER_HEALTH_PRESET": "fast",
                "MINERU_ROUTER_HEALTH_AUDIT_PATH": str(self.tmp / "audit.jsonl"),
                "MINERU_HEALTH_FAULT_PLAN": str(self.tmp / "plan-{port}"),
                "MINERU_HEALTH_FAULT_HANG_S": "600",
                "MINERU_HEALTH_RULES": str(self.tmp / "rules.txt"),
                # Workers inherit the router's stdin (our pipe): they exit when
                # it closes, even if the router itself was killed.
                "MINERU_API_SHUTDOWN_ON_STDIN_EOF": "1",
                "MINERU_API_DISABLE_ACCESS_LOG": "1",
            }
        )
        if self.scenario.break_restarts:
            env["MINERU_ROUTER_HEALTH_MAX_ATTEMPTS"] = "3"
        argv = [self.python, "-m", "mineru.cli.router", "--host", HOST, "--port", str(port)]
        argv += ["--local-gpus", "0,1"]
        self.router = self.children.spawn(
            "router", argv, env, self.tmp / "logs" / "router.log", self.tmp, stdin_pipe=True
        )
        self.timeline.add("demo", f"started mineru-router on {self.router_url} (2 local workers)")
        limit = 300.0
        self.timeline.wait("the router and both workers to be healthy", limit)
        deadline = time.monotonic() + limit
        while True:
            self._check_deadline()
            if self.router.poll() is not None:
                raise SetupError(f"mineru-router exited with code {self.router.returncode}")
            payload = await self._get_json(f"{self.router_url}/health", timeout=2.0)
            servers = payload.get("servers") if isinstance(payload, dict) else None
            if isinstance(servers, list) and len(servers) >= 2:
                self.children.record_descendants(self.router)
                if all(s.get("healthy") for s in servers):
                    ids = [str(s.get("server_id")) for s in servers]
                    self.victim, self.other = ids[VICTIM_INDEX], ids[0]
                    for entry in servers:
                        self.servers[str(entry.get("server_id"))] = dict(entry)
                    self.victim_url = str(self.servers[self.victim].get("base_url", ""))
                    break
            if time.monotonic() > deadline:
                raise SetupError(f"router or workers not healthy within {limit:.0f}s")
            self.timeline.maybe_progress()
            await asyncio.sleep(0.5)
        self.timeline.add(
            "router",
            "both workers in rotation: "
            + ", ".join(f"{sid} {s.get('base_url')}" for sid, s in self.servers.items()),
        )
        self.timeline.add("demo", f"victim: {self.victim}; sending tasks at {self.rate:g}/s")

    async def _wait_http(self, url: str, what: str, limit_s: float) -> None:
        import httpx

        self.timeline.wait(what, limit_s)
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            self._check_deadline()
            try:
                response = await self.client.get(url, timeout=2.0)
                if response.status_code == 200:
                    return
            except httpx.HTTPError:
                pass  # not up yet: retry
            self.timeline.maybe_progress()
            await asyncio.sleep(0.3)
        raise SetupError(f"{what} did not answer at {url} within {limit_s:.0f}s")

    def _check_deadline(self) -> None:
        if time.monotonic() > self.deadline:
            raise SetupError(f"the demo ran past --timeout {self.timeout_s:.0f}s")

    async def _get_json(self, url: str, timeout: float) -> Any:
        try:
            response = await self.client.get(url, timeout=timeout)
            return response.json()
        except Exception:  # noqa: BLE001 - absent, slow or not JSON: the caller retries
            return None

    # -- load -----------------------------------------------------------------------------------
    async def _load(self) -> None:
        self.loading = True
        interval = 1.0 / self.rate
        max_in_flight = 6
        number = 0
        while self.loading:
            if self.stats.in_flight < max_in_flight:
                number += 1
                task = asyncio.create_task(self._one_task(number), name=f"demo-task-{number}")
                self.task_coros.add(task)
                task.add_done_callback(self.task_coros.discard)
            await asyncio.sleep(interval)

    async def _one_task(self, number: int) -> None:
        import httpx

        stats = self.stats
        stats.submitted += 1
        stats.in_flight += 1
        try:
            try:
                response = await self.client.post(
                    f"{self.router_url}/tasks",
                    files={"files": (f"doc-{number}.pdf", self.pdf, "application/pdf")},
                    data={"backend": "vlm-http-client", "server_url": self.fake_url},
                    timeout=15.0,
                )
            except httpx.HTTPError as exc:
                stats.rejected += 1
                self.timeline.add("task", f"#{number} not submitted: {type(exc).__name__}")
                return
            if response.status_code != 202:
                stats.rejected += 1
                detail = response.text[:120].replace("\n", " ")
                self.timeline.add(
                    "task", f"#{number} refused by router: {response.status_code} {detail}"
                )
                return
            task_id = response.json().get("task_id")
            started = time.monotonic()
            while time.monotonic() - started < 60:
                await asyncio.sleep(0.3)
                payload = await self._get_json(f"{self.router_url}/tasks/{task_id}", timeout=5.0)
                status = payload.get("status") if isinstance(payload, dict) else None
                if status == "completed":
                    stats.completed += 1
                    took = f"#{number} completed in {time.monotonic() - started:.1f}s"
                    if self._outage():
                        stats.completed_during_outage += 1
                        # The first few tell the story; the rest are counted.
                        if stats.completed_during_outage <= 3:
                            self.timeline.add("task", f"{took} (the victim is out of rotation)")
                        elif stats.completed_during_outage == 4:
                            self.timeline.add("task", "... more tasks completing (counted)")
                    elif stats.completed <= 3 or self._recently_recovered():
                        self.timeline.add("task", took)
                    return
                if status == "failed":
                    stats.failed += 1
                    error = str(payload.get("error") or "")
                    stats.failures.append(error[:200])
                    t = self.timeline.add("task", f"#{number} FAILED: {error[:140]}")
                    if self.marks.fault_at is not None and self.marks.first_failed_task_at is None:
                        self.marks.first_failed_task_at = t
                    return
            stats.hung += 1
            self.timeline.add("task", f"#{number} no result after 60s (counted as hung)")
        finally:
            stats.in_flight -= 1

    def _outage(self) -> bool:
        m = self.marks
        return m.out_of_rotation_at is not None and m.back_in_rotation_at is None

    def _recently_recovered(self) -> bool:
        """True for the first three completions after the victim came back."""
        if self.marks.back_in_rotation_at is None or self.shown_after_recovery >= 3:
            return False
        self.shown_after_recovery += 1
        return True

    async def _finish_load(self) -> None:
        self.loading = False
        limit = 20.0
        self.timeline.wait("tasks in flight to finish", limit)
        deadline = time.monotonic() + limit
        while self.task_coros and time.monotonic() < deadline:
            self.timeline.maybe_progress()
            await asyncio.sleep(0.2)
        if self.task_coros:
            # Still without a result after the limit: counted as hung.
            self.stats.hung += len(self.task_coros)
            self.timeline.add("task", f"{len(self.task_coros)} task(s) still without a result")
        for task in list(self.task_coros):
            task.cancel()
        self.timeline.waiting_for = ""

    # -- watchers ----------------------------------------------------------------------------------
    async def _watch_router(self) -> None:
        """Router /health every 0.5 s: restarts on a new URL, per-worker completed tasks."""
        assert self.router is not None
        while True:
            payload = await self._get_json(f"{self.router_url}/health", timeout=2.0)
            servers = payload.get("servers") if isinstance(payload, dict) else None
            for entry in servers if isinstance(servers, list) else []:
                sid = str(entry.get("server_id"))
                old = self.servers.get(sid, {})
                url = str(entry.get("base_url") or "")
                if url and old.get("base_url") and url != old.get("base_url"):
                    self.timeline.add("router", f"{sid} now runs on {url} (new process)")
                    if sid == self.victim:
                        self.victim_url = url
                if old.get("healthy") and not entry.get("healthy"):
                    self.timeline.add(
                        "router", f"{sid} out of rotation ({entry.get('state', '?')})"
                    )
                elif not old.get("healthy") and entry.get("healthy"):
                    self.timeline.add("router", f"{sid} back in rotation")
                self.servers[sid] = dict(entry)
            self.children.record_descendants(self.router)
            await asyncio.sleep(0.5)

    async def _watch_audit(self) -> None:
        """Tails the router's audit JSON lines."""
        assert self.tmp is not None
        path = self.tmp / "audit.jsonl"
        offset = 0
        pending = ""
        while True:
            chunk, offset = await asyncio.to_thread(_read_from, path, offset)
            pending += chunk
            *lines, pending = pending.split("\n")
            for line in lines:
                if line.strip():
                    self._on_audit(line)
            await asyncio.sleep(0.2)

    def _on_audit(self, line: str) -> None:
        try:
            record = json.loads(line)
            when = datetime.fromisoformat(str(record["time"])).timestamp()
        except (ValueError, KeyError, TypeError):
            self.timeline.add("audit", line[:160])
            return
        t = self.timeline.at(when)
        worker = str(record.get("worker_id", "?"))
        action = str(record.get("action", "?"))
        reason = " ".join(str(record.get("reason", "")).split())
        attempt = record.get("attempt", 0)
        self.timeline.add(
            "audit",
            f"{worker}: {action} [{record.get('from')} -> {record.get('to')}, attempt {attempt}]"
            + (f" {reason[:110]}" if reason else ""),
            t=t,
        )
        m = self.marks
        if worker != self.victim or m.fault_at is None or t < m.fault_at - 0.5:
            return
        m.victim_actions.append(action)
        if action in _OUT_OF_ROTATION and m.out_of_rotation_at is None:
            m.out_of_rotation_at = t
        elif action == "auto_restart_scheduled":
            m.restart_attempts += 1
            if m.restart_scheduled_at is None:
                m.restart_scheduled_at = t
        elif action == "auto_restart_failed":
            m.failed_restarts += 1
        elif action in ("auto_restart_success", "recovered") and m.back_in_rotation_at is None:
            if m.out_of_rotation_at is not None:
                m.back_in_rotation_at = t
                self.timeline.add(
                    "task",
                    f"{self.stats.completed_during_outage} task(s) completed on the other "
                    "worker(s) while the victim was out",
                )
        elif action == "auto_restart_gave_up" and m.gave_up_at is None:
            m.gave_up_at = t

    async def _watch_victim(self) -> None:
        """The victim's own /health, every 0.25 s (its URL changes when it is restarted)."""
        import httpx

        while True:
            url = self.victim_url
            if url:
                try:
                    response = await self.client.get(f"{url}/health", timeout=1.0)
                    if response.status_code == 200:
                        state = "200 healthy"
                    else:
                        body = response.json() if response.content else {}
                        if isinstance(body, dict) and body.get("engine_dead"):
                            state = (
                                f"{response.status_code} engine dead "
                                f"(rule {body.get('rule')}, {str(body.get('error'))[:60]})"
                            )
                        else:
                            state = f"{response.status_code} unhealthy"
                except httpx.TimeoutException:
                    state = "no answer within 1s"
                except httpx.HTTPError as exc:
                    state = f"unreachable ({type(exc).__name__})"
                except ValueError:
                    state = "answer is not JSON"
                if state != self.victim_health:
                    self.victim_health = state
                    t = self.timeline.add("worker", f"{self.victim} {url}/health: {state}")
                    m = self.marks
                    if (
                        not state.startswith("200")
                        and m.fault_at is not None
                        and m.worker_unhealthy_at is None
                    ):
                        m.worker_unhealthy_at = t
            await asyncio.sleep(0.25)

    async def _progress(self) -> None:
        while True:
            self.timeline.maybe_progress()
            await asyncio.sleep(1.0)

    async def _wait_for(self, what: str, limit_s: float, done: Any) -> bool:
        self.timeline.wait(what, limit_s)
        deadline = time.monotonic() + limit_s
        while not done():
            self._check_deadline()
            if time.monotonic() > deadline:
                self.timeline.waiting_for = ""
                return False
            if self.router is not None and self.router.poll() is not None:
                raise SetupError(f"mineru-router exited with code {self.router.returncode}")
            await asyncio.sleep(0.2)
        self.timeline.waiting_for = ""
        return True

    # -- fault and outcome ----------------------------------------------------------------------
    async def _inject(self) -> None:
        assert self.tmp is not None
        from mineru_health.testing.faults import write_plan

        port = _port_of(self.victim_url)
        if port is None:
            raise SetupError(f"cannot tell the port of {self.victim_url!r}")
        write_plan(self.tmp / f"plan-{port}", self.scenario.plan)
        self.marks.fault_at = self.timeline.add(
            "demo", f"FAULT: wrote plan {self.scenario.plan!r} for {self.victim} (port {port})"
        )

    async def _observe(self) -> None:
        s = self.scenario
        m = self.marks
        if s.expect == "recovered":
            ok = await self._wait_for(
                f"{self.victim} to be restarted and back in rotation",
                s.observe_s,
                lambda: m.back_in_rotation_at is not None,
            )
            if ok:
                # Let the restarted worker show that it serves again.
                await self._wait_for(
                    f"{self.victim} to complete tasks again",
                    20,
                    lambda: int(self.servers.get(self.victim, {}).get("completed_tasks") or 0) > 0,
                )
            served = int(self.servers.get(self.victim, {}).get("completed_tasks") or 0)
            if ok:
                self.timeline.add(
                    "router", f"{self.victim} completed {served} task(s) since restart"
                )
            self.outcome_ok = ok
            self.outcome_reason = (
                "restarted and back in rotation"
                if ok
                else f"{self.victim} did not come back within {s.observe_s:.0f}s"
            )
        elif s.expect == "gave_up":
            broke = await self._wait_for(
                f"the router to take {self.victim} out of rotation",
                60,
                lambda: m.out_of_rotation_at is not None,
            )
            if broke:
                assert self.tmp is not None
                (self.tmp / "rules.txt").write_text(_BROKEN_RULES)
                self.timeline.add(
                    "demo", "broke the rules file: every new worker now refuses to start"
                )
            ok = broke and await self._wait_for(
                f"the router to give up on {self.victim}",
                s.observe_s,
                lambda: m.gave_up_at is not None,
            )
            if ok:
                self.timeline.add(
                    "demo",
                    f"{self.victim} stays out of rotation until a person fixes the cause; "
                    f"{self.other} keeps serving",
                )
            self.outcome_ok = ok
            self.outcome_reason = (
                f"gave up after {m.failed_restarts} failed restart(s)"
                if ok
                else f"no auto_restart_gave_up for {self.victim} within {s.observe_s:.0f}s"
            )
        else:
            failed = await self._wait_for(
                "a task to fail task-locally",
                s.observe_s,
                lambda: m.first_failed_task_at is not None,
            )
            if failed:
                # A few probe intervals: a wrong decision would show by now.
                settle = time.monotonic() + 8
                await self._wait_for(
                    "the router to leave the worker alone (8s)",
                    9,
                    lambda: time.monotonic() > settle,
                )
            restarted = [a for a in m.victim_actions if a in _OUT_OF_ROTATION + _RESTART_ACTIONS]
            in_rotation = bool(self.servers.get(self.victim, {}).get("healthy"))
            self.outcome_ok = failed and not restarted and in_rotation
            if not failed:
                self.outcome_reason = f"no task failed within {s.observe_s:.0f}s"
            elif restarted:
                self.outcome_reason = f"the router acted on a task-local failure: {restarted}"
            elif not in_rotation:
                self.outcome_reason = f"{self.victim} is not in rotation"
            else:
                self.outcome_reason = "one task failed; the worker stayed in rotation, no restart"
                self.timeline.add(
                    "router", f"{self.victim} still in rotation; no audit event for it"
                )

    async def _scrape_metrics(self) -> None:
        from prometheus_client.parser import text_string_to_metric_families

        try:
            response = await self.client.get(f"{self.router_url}/metrics", timeout=3.0)
        except Exception:  # noqa: BLE001 - the summary just lacks metrics then
            return
        if response.status_code != 200:
            return
        wanted = (
            "mineru_router_restarts_total",
            "mineru_router_gave_up_total",
            "mineru_router_ejections_total",
        )
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                if sample.name in wanted and sample.labels.get("worker") == self.victim:
                    labels = ",".join(
                        f'{k}="{v}"' for k, v in sorted(sample.labels.items()) if k != "worker"
                    )
                    key = f"{sample.name}{{{labels}}}" if labels else sample.name
                    self.router_metrics[key] = sample.value

    # -- teardown and report ------------------------------------------------------------------------
    async def _teardown(self) -> None:
        self.loading = False
        tasks = [*self.background, *self.task_coros]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        await asyncio.to_thread(self.children.stop_all)
        if self.tmp is not None:
            if self.keep_temp:
                print(f"kept temporary files in {self.tmp}", file=self.err)
            else:
                shutil.rmtree(self.tmp, ignore_errors=True)

    def _print_logs(self) -> None:
        if self.tmp is None:
            return
        for name in ("router.log", "fake-vlm.log"):
            tail = _tail(self.tmp / "logs" / name)
            if tail:
                print(f"--- last lines of {name} ---\n{tail}", file=self.err)

    def _summary(self, code: int) -> dict[str, Any]:
        m = self.marks
        s = self.stats
        return {
            "scenario": self.scenario.name,
            "expected": self.scenario.expect,
            "outcome": "pass" if code == EXIT_OK else "fail",
            "reason": self.outcome_reason,
            "exit_code": code,
            "victim": self.victim,
            "times_s": {
                name: None if value is None else round(value, 2)
                for name, value in (
                    ("fault_injected", m.fault_at),
                    ("first_failed_task", m.first_failed_task_at),
                    ("worker_unhealthy", m.worker_unhealthy_at),
                    ("out_of_rotation", m.out_of_rotation_at),
                    ("restart_scheduled", m.restart_scheduled_at),
                    ("back_in_rotation", m.back_in_rotation_at),
                    ("gave_up", m.gave_up_at),
                )
            },
            "detection_s": _since(m.out_of_rotation_at, m.fault_at),
            "recovery_s": _since(m.back_in_rotation_at, m.fault_at),
            "restart_attempts": m.restart_attempts,
            "failed_restarts": m.failed_restarts,
            "tasks": {
                "submitted": s.submitted,
                "completed": s.completed,
                "failed": s.failed,
                "hung": s.hung,
                "rejected": s.rejected,
                "completed_while_victim_out": s.completed_during_outage,
            },
            "router_metrics": self.router_metrics,
            "timeline": [e.__dict__ for e in sorted(self.timeline.events, key=lambda e: e.t)],
        }

    def _report(self, code: int) -> None:
        summary = self._summary(code)
        if self.json_mode:
            json.dump(summary, self.out, indent=2)
            print(file=self.out)
            return
        print(render_summary(summary), file=self.out)


def _fmt_s(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}s"


def render_summary(summary: dict[str, Any]) -> str:
    """The end-of-demo table, from the same dict --json prints."""
    t = summary["tasks"]
    rows = [
        ("scenario", summary["scenario"]),
        ("victim worker", summary["victim"] or "-"),
        ("expected outcome", summary["expected"].replace("_", " ")),
        ("detection (fault -> out of rotation)", _fmt_s(summary["detection_s"])),
        ("time to recovery (fault -> back in rotation)", _fmt_s(summary["recovery_s"])),
        (
            "restarts scheduled / failed",
            f"{summary['restart_attempts']} / {summary['failed_restarts']}",
        ),
        ("tasks submitted", str(t["submitted"])),
        (
            "tasks completed",
            f"{t['completed']} ({t['completed_while_victim_out']} while the victim was out)",
        ),
        ("tasks failed", str(t["failed"])),
        ("tasks hung (no result in 60s)", str(t["hung"])),
        ("tasks refused by the router", str(t["rejected"])),
    ]
    rows += [
        (f"router metric {name}", f"{value:g}") for name, value in summary["router_metrics"].items()
    ]
    verdict = "PASS" if summary["outcome"] == "pass" else "FAIL"
    rows.append(("result", f"{verdict}: {summary['reason']}"))
    width = max(len(name) for name, _ in rows)
    rule = "-" * (width + 2 + max(len(value) for _, value in rows))
    lines = ["", "Summary", rule]
    lines += [f"{name:<{width}}  {value}" for name, value in rows]
    lines.append(rule)
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mineru-health demo",
        description=(
            "Start a patched mineru-router with two workers on this machine (no GPU: a fake "
            "VLM server answers), send tasks, inject a fault into one worker and show how the "
            "router detects it and heals."
        ),
    )
    parser.add_argument(
        "--scenario",
        choices=sorted(SCENARIOS),
        default="engine-death",
        help="the fault to inject (default: engine-death)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON summary, no live timeline"
    )
    parser.add_argument(
        "--keep-temp", action="store_true", help="keep the temporary directory (logs)"
    )
    parser.add_argument(
        "--rate", type=float, default=2.0, help="tasks submitted per second (default: 2)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="hard limit for the whole demo in seconds (default: 600)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the demo; returns the exit status."""
    args = build_parser().parse_args(argv)
    if not 0.1 <= args.rate <= 20:
        print("mineru-health demo: --rate must be between 0.1 and 20", file=sys.stderr)
        return EXIT_SETUP_FAILED
    try:
        import httpx  # noqa: F401 - the demo's HTTP client
    except ImportError:
        print("mineru-health demo needs httpx (pip install httpx)", file=sys.stderr)
        return EXIT_SETUP_FAILED
    demo = Demo(
        SCENARIOS[args.scenario],
        json_mode=args.json,
        keep_temp=args.keep_temp,
        rate=args.rate,
        timeout_s=args.timeout,
        out=sys.stdout,
        err=sys.stderr,
    )
    try:
        return asyncio.run(demo.run())
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())

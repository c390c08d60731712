"""One demo run: set up the sandbox, start the router, load, fault, outcome, report, clean up.

``Demo.run`` owns the signal handling: SIGINT/SIGTERM cancel the run, the
teardown (bounded) stops every child process and removes the temporary
directory with the handlers still installed, so a second Ctrl-C cannot cut it
short. Used on one asyncio loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from importlib import import_module
from pathlib import Path
from typing import Any, TextIO

from mineru_health.testing import sandbox
from mineru_health.testing.router import LINE3, start_router

from .context import DemoContext, SetupError
from .load import Load
from .scenarios import RULES_COMMENT, SCENARIOS, Scenario, Verdict, inject
from .summary import build_summary, render_summary, scrape_router_metrics
from .timeline import Timeline
from .watchers import progress, watch_audit, watch_router, watch_victim

__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_OUTCOME_MISSED",
    "EXIT_SETUP_FAILED",
    "Demo",
    "build_parser",
    "main",
]

EXIT_OK = 0
EXIT_OUTCOME_MISSED = 1
EXIT_SETUP_FAILED = 2
EXIT_INTERRUPTED = 130

HOST = sandbox.HOST
VICTIM_INDEX = -1  # the last worker the router lists (local-gpu-1)
ROUTER_START_S = 300.0


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
        self.json_mode = json_mode
        self.keep_temp = keep_temp
        self.out = out
        self.err = err
        self.timeline = Timeline(None if json_mode else out, err)
        self.ctx = DemoContext(scenario, rate=rate, timeout_s=timeout_s, timeline=self.timeline)
        self.load = Load(self.ctx)
        self.background: list[asyncio.Task[Any]] = []
        self.interrupted: int | None = None
        self.verdict = Verdict(False, "")
        self.router_metrics: dict[str, float] = {}

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
        if code in (EXIT_OK, EXIT_OUTCOME_MISSED) or self.json_mode:
            self._report(code)
        return code

    async def _run(self) -> int:
        import httpx

        ctx = self.ctx
        s = ctx.scenario
        self.timeline.add("demo", f"scenario {s.name}: {s.summary}")
        await self._setup()
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=16)
        async with httpx.AsyncClient(timeout=10.0, limits=limits) as client:
            ctx.client = client
            await self._start_router()
            self.background = [
                asyncio.create_task(watch_router(ctx), name="demo-router-health"),
                asyncio.create_task(watch_audit(ctx), name="demo-audit"),
                asyncio.create_task(watch_victim(ctx), name="demo-victim-health"),
                asyncio.create_task(self.load.run(), name="demo-load"),
                asyncio.create_task(progress(ctx), name="demo-progress"),
            ]
            warmed = await ctx.wait_for(
                "3 tasks to complete before the fault", 120, lambda: ctx.stats.completed >= 3
            )
            if not warmed:
                raise SetupError(
                    f"only {ctx.stats.completed} task(s) completed before the fault "
                    f"({ctx.stats.failed} failed, {ctx.stats.rejected} refused)"
                )
            await inject(ctx)
            self.verdict = await s.outcome.judge(ctx)
            await self.load.finish()
            self.router_metrics = await scrape_router_metrics(ctx)
        return EXIT_OK if self.verdict.ok else EXIT_OUTCOME_MISSED

    # -- set-up -----------------------------------------------------------------------------------
    async def _setup(self) -> None:
        ctx = self.ctx
        ctx.tmp = tmp = Path(tempfile.mkdtemp(prefix="mineru-health-demo-"))
        ctx.python = python = sandbox.mineru_python()
        try:
            mineru_dir = await asyncio.to_thread(sandbox.mineru_package_dir, python)
            # Not a valid module name, so nothing can import the folder itself.
            site = await asyncio.to_thread(
                sandbox.copy_mineru, tmp / "mineru-site", source=mineru_dir
            )
            self.timeline.add("demo", f"copied {mineru_dir} to {site / 'mineru'}")
            report = await asyncio.to_thread(sandbox.patch_site, site)
        except sandbox.SandboxError as exc:
            raise SetupError(str(exc)) from None
        sandbox.add_fault_plugin(site)  # the plan the scenarios write reaches MinerU through it
        patched = ", ".join(f"{f.target} ({f.state.value})" for f in report.files)
        self.timeline.add("demo", f"patched the copy for MinerU {report.mineru_version}: {patched}")

        ctx.site = site
        env = await asyncio.to_thread(LINE3.env, site, tmp, python, {})
        ctx.pdf = await asyncio.to_thread(sandbox.make_pdf)
        (tmp / "rules.txt").write_text(RULES_COMMENT)

        port = sandbox.free_port()
        ctx.fake_url = f"http://{HOST}:{port}"
        ctx.processes.start(
            "fake-vlm",
            sandbox.fake_vlm_command(python, port),
            env=env,
            log_path=tmp / "fake-vlm.log",
            cwd=tmp,
        )

    async def _start_router(self) -> None:
        ctx = self.ctx
        assert ctx.tmp is not None and ctx.site is not None
        await self._wait_http(f"{ctx.fake_url}/health", "the fake VLM server", 60)
        self.timeline.add("demo", f"fake VLM server up at {ctx.fake_url}")
        env = {
            "MINERU_ROUTER_HEALTH_PRESET": "fast",
            "MINERU_HEALTH_FAULT_HANG_S": "600",
            # A loop blocked this long is hung (60 s in production): short
            # enough for the hung-worker scenario to play out in a minute.
            "MINERU_HEALTH_LOOP_HANG_S": "5",
            "MINERU_HEALTH_RULES": str(ctx.tmp / "rules.txt"),
            # Workers inherit the router's stdin (our pipe): they exit when
            # it closes, even if the router itself was killed.
            "MINERU_API_SHUTDOWN_ON_STDIN_EOF": "1",
        }
        if ctx.scenario.break_restarts:
            env["MINERU_ROUTER_HEALTH_MAX_ATTEMPTS"] = "3"
        # The audit file and the victim's plan (plan-<its port>) are in ctx.tmp.
        router = start_router(ctx.processes, LINE3, ctx.site, ctx.python, ctx.tmp, env=env,
                              fault_plan="plan-{port}", stdin_pipe=True)
        ctx.router, ctx.router_url = router.proc, router.base
        self.timeline.add("demo", f"started mineru-router on {ctx.router_url} (2 local workers)")
        self.timeline.wait("the router and both workers to be healthy", ROUTER_START_S)
        deadline = time.monotonic() + ROUTER_START_S
        while not await self._both_healthy():
            if time.monotonic() > deadline:
                raise SetupError(f"router or workers not healthy within {ROUTER_START_S:.0f}s")
            self.timeline.maybe_progress()
            await asyncio.sleep(0.5)
        self.timeline.add(
            "router",
            "both workers in rotation: "
            + ", ".join(f"{sid} {s.get('base_url')}" for sid, s in ctx.servers.items()),
        )
        self.timeline.add("demo", f"victim: {ctx.victim}; sending tasks at {ctx.rate:g}/s")

    async def _both_healthy(self) -> bool:
        """One look at the router's /health; on success picks the victim and the other worker."""
        ctx = self.ctx
        assert ctx.router is not None
        ctx.check_deadline()
        ctx.check_router()
        payload = await ctx.get_json(f"{ctx.router_url}/health", timeout=2.0)
        servers = payload.get("servers") if isinstance(payload, dict) else None
        if not isinstance(servers, list) or len(servers) < 2:
            return False
        ctx.processes.record_descendants(ctx.router)
        if not all(s.get("healthy") for s in servers):
            return False
        ids = [str(s.get("server_id")) for s in servers]
        ctx.victim, ctx.other = ids[VICTIM_INDEX], ids[0]
        for entry in servers:
            ctx.servers[str(entry.get("server_id"))] = dict(entry)
        ctx.victim_url = str(ctx.servers[ctx.victim].get("base_url", ""))
        return True

    async def _wait_http(self, url: str, what: str, limit_s: float) -> None:
        import httpx

        self.timeline.wait(what, limit_s)
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            self.ctx.check_deadline()
            try:
                response = await self.ctx.client.get(url, timeout=2.0)
                if response.status_code == 200:
                    return
            except httpx.HTTPError:
                pass  # not up yet: retry
            self.timeline.maybe_progress()
            await asyncio.sleep(0.3)
        raise SetupError(f"{what} did not answer at {url} within {limit_s:.0f}s")

    # -- teardown and report ------------------------------------------------------------------------
    async def _teardown(self) -> None:
        self.load.running = False
        tasks = [*self.background, *self.load.tasks]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        await asyncio.to_thread(self.ctx.processes.stop_all)
        tmp = self.ctx.tmp
        if tmp is not None:
            if self.keep_temp:
                print(f"kept temporary files in {tmp}", file=self.err)
            else:
                shutil.rmtree(tmp, ignore_errors=True)

    def _print_logs(self) -> None:
        if self.ctx.tmp is None:
            return
        for name in ("router.log", "fake-vlm.log"):
            try:
                text = (self.ctx.tmp / name).read_text(errors="replace")
            except OSError:
                continue
            tail = "\n".join(text.splitlines()[-40:])
            if tail:
                print(f"--- last lines of {name} ---\n{tail}", file=self.err)

    def _report(self, code: int) -> None:
        summary = build_summary(
            self.ctx, code=code, reason=self.verdict.reason, router_metrics=self.router_metrics
        )
        if self.json_mode:
            json.dump(summary, self.out, indent=2)
            print(file=self.out)
            return
        print(render_summary(summary), file=self.out)


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


def _mineru_line() -> str:
    """The MinerU line the demo's Python runs ("3" or "4.0"), told by its files; "3" if unknown."""
    from .. import patching
    from ..errors import MineruHealthError
    try:
        manifest, _targets = patching.detect(sandbox.mineru_package_dir(sandbox.mineru_python()))
    except (MineruHealthError, sandbox.SandboxError):
        return "3"
    return manifest.line


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the demo; returns the exit status."""
    args = build_parser().parse_args(argv)
    if not 0.1 <= args.rate <= 20:
        print("mineru-health demo: --rate must be between 0.1 and 20", file=sys.stderr)
        return EXIT_SETUP_FAILED
    missing = []
    # The demo's HTTP client, and what makes its test PDF (the demo extra).
    for name in ("httpx", "reportlab", "PIL"):
        try:
            import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        print(
            f"mineru-health demo needs {', '.join(missing)} (pip install 'mineru-health[demo]')",
            file=sys.stderr,
        )
        return EXIT_SETUP_FAILED
    line = _mineru_line()
    if line == "4.0":
        from .line4 import SCENARIOS4, run_demo4

        if args.scenario not in SCENARIOS4:
            print(f"mineru-health demo: on MinerU 4.0 the scenarios are "
                  f"{', '.join(sorted(SCENARIOS4))}", file=sys.stderr)
            return EXIT_SETUP_FAILED
        return run_demo4(sandbox.mineru_python(), args.scenario, json_mode=args.json,
                         keep_temp=args.keep_temp)
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

"""Recovery benchmark: a real mineru-router with two real local workers under faults, both lines.

``--line 3`` (the default): for each scenario and each side, in the same run,
a fresh router and two workers get the same warm-up and the same steady
stream of tasks (a tiny PDF, one every --period seconds for --duration
seconds, each with a name of its own), and the same fault a few seconds in,
right after a burst of --burst tasks (so that it finds tasks queued and
running), aimed at one worker (``local-gpu-0``) unless the scenario says
otherwise:

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

Sides: (a) baseline: MinerU 3.4's own router and workers, with only fault
injection added (``baseline_fast_api.patch`` + ``pr5188_baseline.py``);
``--baseline pr5188`` adds PR #5188's marker check on the workers
(``/health`` 503 after an engine death) for the older comparison; (b)
mineru-health: router and workers patched by ``mineru-health patch apply``,
the ``production`` preset unless --preset says otherwise.

``--line 4`` (``MINERU_HEALTH_MINERU4_PYTHON``): for each scenario and each
side a fresh ``mineru-router --local-gpus 0,1 --worker-tier flash``
(offline, text PDFs) gets the same steady stream of jobs (one every 0.8 s
through ``/v1/tasks``) and, after three jobs completed, the same fault on
one worker: ``kill9``, ``engine_dead`` (vLLM's ``EngineDeadError`` from
4.0's parse call, from then on; 4.0.12 recognises it itself: job failed,
``/v1/health`` 503) or ``hang`` (the worker's event loop blocks), all three
injected; and ``llama_real``, a real engine death beside them: workers on
the standard tier (MinerU's VLM path on llama.cpp, 4.0's default engine on
CPU, with the tiny generated model of ``mineru_health.demo.engine``), one
job every 2 s, and the engine of whichever worker generates next closed
under its running jobs (``Engine.close()``; no fault plugin); ``vllm_real`` (asked for by
name: it needs ``.venv-vllm4``, ``scripts/vllm_venvs.sh``), the same with a real vLLM
(``mineru_health.demo.engine.tiny_qwen2vl``), the first worker's ``VLLM::EngineCore``
killed (kill -9). Sides:
``upstream`` (MinerU 4.0's own router; the fault plugin only), ``ours``,
and ``ours-grace``: ours as it was before fast replacement (issue 32), a
worker condemned for a dead engine ended like a healthy one (SIGTERM,
STOP_GRACE_S, SIGKILL), by lines added to the ``sitecustomize`` of its
copy of MinerU that empty the router's ``CONDEMNED_CAUSES``; all with the router's
environment of the tests (fast preset, 3 s main-port timeout: read only by
ours). Measured: jobs submitted, jobs lost (refused,
failed or not finished within the wait), seconds from the fault to fewer
than two workers taking jobs and to both again (``/v1/usage``, every 0.2 s),
and whether earlier results are still downloadable.

Timings are machine-dependent; read the ratios, or the sides side by side.
Line 3 takes about 8 x (start-up + warm-up + --duration + the slowest task),
six to eight minutes on 2 cores with the defaults; line 4 about nine
(``llama_real`` two and a half of them); ``--scenarios`` runs a subset.
Results of one run: ``README.md``.

    python bench/recovery/run.py [--scenarios engine_death,kill9] [--json out.json]
    MINERU_HEALTH_MINERU4_PYTHON=/path/to/python python bench/recovery/run.py --line 4 \\
        [--scenarios kill9,engine_dead,hang,llama_real] [--sides upstream,ours] [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from mineru_health.demo import engine as demo_engine
from mineru_health.demo import sandbox
from mineru_health.demo.fleet import (
    FLEET4_ENV,
    LINE3,
    LINE4,
    LINE4_STANDARD,
    Client,
    Outcome,
    Router,
    Stream,
    fleet,
    start_fake_vlm,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # the tests' harness
from harness import vllm_real
from harness.samplers import RotationLog, run_fault
from mineru_health.demo.sandbox import Processes, SandboxError, make_pdf, wait_until

HERE = Path(__file__).resolve().parent
SCENARIOS = ("engine_death", "stall", "kill9", "poison")
VICTIM = "local-gpu-0"
POISON_NAME = "poison.pdf"


def baseline_site(dest: Path, python: str) -> Path:
    """MinerU's own code with fault injection (and PR #5188's check, when asked for) only."""
    import patch_ng

    site = sandbox.copy_mineru(dest, python)
    patch_set = patch_ng.fromfile(str(HERE / "baseline_fast_api.patch"))
    if not patch_set or not patch_set.apply(strip=1, root=str(site / "mineru")):
        raise SystemExit("baseline_fast_api.patch does not apply to this MinerU")
    shutil.copy(HERE / "pr5188_baseline.py", site)  # the patch imports it
    return sandbox.add_fault_plugin(site)


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


def _inject(router: Router, scenario: str, stream: Stream) -> None:
    victim_url = router.servers()[VICTIM]["base_url"]
    if scenario in ("engine_death", "stall"):
        router.write_plan(
            "engine_dead" if scenario == "engine_death" else "engine_stall", victim_url
        )
    elif scenario == "kill9":
        pid = router.worker_pid(victim_url)
        if pid is None:
            raise SystemExit(f"no worker process at {victim_url}")
        os.kill(pid, signal.SIGKILL)
    elif scenario == "poison":
        for server in router.servers().values():
            router.write_plan(f"poison {POISON_NAME}", server["base_url"])
        time.sleep(0.3)  # workers read their plan every 0.1 s
        stream.add((POISON_NAME, make_pdf(text="a document that kills inference engines")))


def run_side(
    side: str, site: Path, env: dict[str, str], work: Path, scenario: str, pdf: bytes, args: Any
) -> Result:
    """One router with two workers for one scenario; stopped, with what it started, after."""
    result = Result(side, scenario)
    print(f"[{scenario}/{side}] starting router and two workers ...", flush=True)
    # The router's workers put their output directories in TMPDIR: counted here.
    (work / "tmp").mkdir(parents=True)
    env = {**env, "TMPDIR": str(work / "tmp")}
    with (
        fleet(LINE3, work, args.python, site=site, env=env, fault_plan="plan-{port}") as router,
        RotationLog(router, every_s=0.1) as rotation,
    ):
        client = Client(router.base, LINE3, engine_url=args.vlm_url, timeout_s=args.task_timeout)
        with Stream(
            client, lambda n: (f"warm-{n}.pdf", pdf), task_timeout_s=args.task_timeout
        ) as warm:
            for _ in range(4):
                warm.add()
            if any(o.status != "completed" for o in warm.outcomes()):
                raise SystemExit(f"{side}: warm-up failed; see {router.proc.log_path}")
        with Stream(
            client, lambda n: (f"s{n:03d}.pdf", pdf), task_timeout_s=args.task_timeout
        ) as stream:
            t_start = time.monotonic()
            t_inject: float | None = None
            n = 0
            while time.monotonic() - t_start < args.duration:
                if t_inject is None and time.monotonic() - t_start >= args.inject_after:
                    # A burst first, so that the fault finds tasks queued and running.
                    for i in range(args.burst):
                        stream.add((f"s-burst-{i}.pdf", pdf))
                    time.sleep(0.5)
                    _inject(router, scenario, stream)
                    t_inject = time.time()
                stream.add((f"s{n:03d}.pdf", pdf))
                n += 1
                time.sleep(max(0.0, t_start + n * args.period - time.monotonic()))
            outcomes = stream.outcomes()
        result.tasks = [o for o in outcomes if o.name != POISON_NAME]
        result.poison_status = next((o.status for o in outcomes if o.name == POISON_NAME), "")
        assert t_inject is not None
        # Once every task is terminal or hung: a worker never taken out by then
        # (upstream's dead engine answers /health 200) never will be.
        out = rotation.out_at(t_inject)
        if out is not None:
            result.detection_s = out - t_inject
            back = wait_until(
                lambda: rotation.back_at(t_inject),
                max(0.0, t_inject + args.recovery_cap - time.time()),
                0.2,
            )
            result.recovery_s = back - t_inject if back else None
        # Upload names whose Markdown exists in more than one task output directory.
        seen = Counter(path.stem for path in (work / "tmp").rglob("*.md"))
        result.duplicated = sum(1 for stem, c in seen.items() if c > 1 and stem.startswith("s"))
        try:
            result.resubmissions = int(router.metric("mineru_router_task_resubmissions_total"))
        except (SandboxError, httpx.HTTPError):
            result.resubmissions = 0  # MinerU's own router has no /metrics
    return result


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
            ("", "tasks completed", str(base.count("completed")), str(ours.count("completed")), ""),
            (
                "",
                "tasks failed (incl. rejected)",
                str(lost_a),
                str(lost_b),
                ratio(float(lost_a), float(lost_b)) if lost_b else ("-" if not lost_a else "inf"),
            ),
            ("", "tasks hung", str(base.count("hung")), str(ours.count("hung")), ""),
            ("", "tasks duplicated", str(base.duplicated), str(ours.duplicated), ""),
            ("", "resubmissions", str(base.resubmissions), str(ours.resubmissions), ""),
            (
                "",
                "fault -> worker out (s)",
                fmt(base.detection_s, cap),
                fmt(ours.detection_s, cap),
                ratio(base.detection_s, ours.detection_s),
            ),
            (
                "",
                "fault -> all back (s)",
                fmt(base.recovery_s, cap),
                fmt(ours.recovery_s, cap),
                ratio(base.recovery_s, ours.recovery_s),
            ),
        ]
        if base.poison_status or ours.poison_status:
            rows.append(("", "poison document", base.poison_status, ours.poison_status, ""))
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(5)]
    for row in (header, tuple("-" * w for w in widths), *rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


def _task(outcome: Outcome) -> dict[str, Any]:
    """A task as this bench's JSON lists it: name, status, attempts, error."""
    detail, ended = outcome.detail, outcome.status in LINE3.terminal
    error = (
        f"{detail.get('code')} {str(detail.get('body', ''))[:300]}"
        if outcome.status == "rejected"
        else str(detail.get("error") or "")[:300]
    )
    return {
        "name": outcome.name,
        "status": outcome.status,
        "attempts": outcome.attempts if ended else 1,
        "error": error if ended or outcome.status == "rejected" else "",
    }


def _summary(result: Result) -> dict[str, Any]:
    data = asdict(result)
    data["lost"] = [_task(t) for t in result.tasks if t.status != "completed"]
    data.pop("tasks")
    data.update(
        submitted=len(result.tasks),
        completed=result.count("completed"),
        failed=result.count("failed", "rejected"),
        hung=result.count("hung"),
    )
    return data


def line3(args: argparse.Namespace, scenarios: list[str]) -> list[dict[str, Any]]:
    work = Path(tempfile.mkdtemp(prefix="mineru-health-recovery-"))
    pairs: list[tuple[Result, Result]] = []
    with Processes() as procs:
        args.vlm_url = start_fake_vlm(procs, work)
        pdf = make_pdf(text="mineru-health recovery bench")
        sites = {
            "baseline": baseline_site(work / "site-a", args.python),
            "mineru-health": LINE3.site(work / "site-b", args.python),
        }
        base_env = {"BENCH_PR5188_MARKERS": "1"} if args.baseline == "pr5188" else {}
        ours_env = {
            "MINERU_ROUTER_HEALTH_PRESET": args.preset,
            "MINERU_HEALTH_STALL_S": args.stall_s,
        }
        for scenario in scenarios:
            pairs.append(
                (
                    run_side(
                        "baseline",
                        sites["baseline"],
                        base_env,
                        work / f"{scenario}-a",
                        scenario,
                        pdf,
                        args,
                    ),
                    run_side(
                        "mineru-health",
                        sites["mineru-health"],
                        ours_env,
                        work / f"{scenario}-b",
                        scenario,
                        pdf,
                        args,
                    ),
                )
            )
    label = "upstream 3.4" if args.baseline == "upstream" else "upstream 3.4 + PR#5188-like"
    print(f"\n(a) = {label}, (b) = mineru-health ({args.preset}); logs under {work}")
    report(pairs, args.recovery_cap)
    return [
        {"scenario": a.scenario, "baseline": _summary(a), "mineru_health": _summary(b)}
        for a, b in pairs
    ]


# --- line 4 -------------------------------------------------------------------------------------

SCENARIOS4: dict[str, Callable[[Router], object]] = {
    "kill9": lambda router: os.kill(router.worker_pids()[0], signal.SIGKILL),
    "engine_dead": lambda router: router.write_plan("engine_dead"),
    "hang": lambda router: router.write_plan("hang"),
}
#: The real engine death (demo_engine): its own setup and pace, since it parses with a model.
LLAMA_REAL = "llama_real"
LLAMA_REAL_EVERY_S = 2.0
#: A real vLLM (``.venv-vllm4``, scripts/vllm_venvs.sh) on the standard tier, its EngineCore
#: killed (kill -9) under running jobs; not in the default list (it needs that venv). Its
#: engines start on their first jobs (~1.5 min, two at once on 2 cores): a longer job bound.
VLLM_REAL = "vllm_real"
VLLM_REAL_START_S = 420.0


def _vllm4_python() -> str:
    python, why = vllm_real.vllm4_python()
    if python is None:
        raise SystemExit(f"{VLLM_REAL}: {why}")
    return python


def _kill_engine_core(router: Router) -> None:
    """kill -9 of the first worker's ``VLLM::EngineCore``."""
    cores = vllm_real.vllm_processes(vllm_real.descendants(router.worker_pids()[0]))
    os.kill(cores["engine_core"][0], signal.SIGKILL)


def _downloadable(router: Router, jobs: list[Outcome]) -> int:
    """Jobs whose Markdown still downloads whole (on the flash tier: with the document's words;
    the tiny model of the standard tier writes nonsense)."""
    count = 0
    with httpx.Client(base_url=router.base, timeout=30) as client:
        for job in jobs:
            try:
                output = job.detail["files"][0]["output_files"]["markdown"]
                content = client.get(f"/v1/files/{output['file_id']}/content")
            except (httpx.HTTPError, KeyError, TypeError, IndexError):
                continue
            whole = content.status_code == 200 and len(content.content) == output.get("bytes")
            count += whole and (
                router.line is not LINE4 or f"Document {job.number}," in content.text
            )
    return count


def _reason(job: Outcome) -> str:
    if job.status == "rejected":
        return f"submission refused: {job.detail.get('code')} {job.detail.get('body')}"[:160]
    files = job.detail.get("files") or [{}]
    return f"{job.status}: {files[0].get('error')}"[:160]


#: ``ours-grace``: the router treats no failure as condemning (the behaviour before issue 32).
_GRACE_BASELINE = """
import importlib.abc, importlib.util, sys

class _Grace(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "mineru_health.runtime.router.local_workers":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.CONDEMNED_CAUSES = frozenset()

        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _Grace())
"""


def one4(python: str, scenario: str, side: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"router4-{scenario}-{side}-") as scratch_dir:
        scratch, patched = Path(scratch_dir), side in ("ours", "ours-grace")
        line, site, env, plan, every_s, real = LINE4, None, FLEET4_ENV, "plan", 0.8, None
        start_s, recovery_s = 120.0, 90.0
        if scenario == VLLM_REAL:
            python = _vllm4_python()
            line, plan, every_s = LINE4_STANDARD, None, LLAMA_REAL_EVERY_S
            site = line.site(scratch / "mineru-site", python, patched=patched, faults=False)
            vllm_real.write_home4(python, scratch / "tiny-home")
            env = {**FLEET4_ENV, **vllm_real.worker_env4(scratch / "tiny-home")}
            start_s = VLLM_REAL_START_S
        if scenario == LLAMA_REAL:
            line, plan, every_s = LINE4_STANDARD, None, LLAMA_REAL_EVERY_S
            site = line.site(scratch / "mineru-site", python, patched=patched, faults=False)
            real = demo_engine.prepare(site, scratch, python, line.env(site, scratch, python, {}))
            env = {**FLEET4_ENV, **real.env}
        if side == "ours-grace":
            site = site or line.site(scratch / "mineru-site", python, patched=True)
            hooks = site / "sitecustomize.py"  # the fault plan plugin's loader stays first
            first = hooks.read_text(encoding="utf-8") if hooks.exists() else ""
            hooks.write_text(first + _GRACE_BASELINE, encoding="utf-8")
        with fleet(
            line, scratch, python, site=site, patched=patched, env=env, fault_plan=plan
        ) as router:
            if real:
                inject: Callable[[], object] = real.close
            elif scenario == VLLM_REAL:
                inject = functools.partial(_kill_engine_core, router)
            else:
                inject = functools.partial(SCENARIOS4[scenario], router)
            run = run_fault(
                router,
                inject,
                every_s=every_s,
                recovery_timeout_s=recovery_s,
                task_timeout_s=start_s,
            )
            kept = _downloadable(router, run.before)
    return {
        "scenario": scenario,
        "side": side,
        "jobs": len(run.outcomes),
        "lost": len(run.lost),
        "out_after_s": None if run.out_at is None else round(run.out_at - run.fault_at, 2),
        "back_after_s": None if run.back_at is None else round(run.back_at - run.fault_at, 2),
        "earlier_results": f"{kept}/{len(run.before)}",
        "lost_reasons": sorted({_reason(j) for j in run.lost}),
    }


def line4(args: argparse.Namespace, scenarios: list[str]) -> list[dict[str, Any]]:
    rows = []
    for scenario in scenarios:
        for side in args.sides.split(","):
            row = one4(args.python, scenario, side)
            rows.append(row)
            print(
                f"{scenario:12} {side:10} jobs {row['jobs']:3}  lost {row['lost']:3}  "
                f"out after {row['out_after_s']} s  back after {row['back_after_s']} s  "
                f"earlier results {row['earlier_results']}",
                flush=True,
            )
            for reason in row["lost_reasons"]:
                print(f"{'':23}lost: {reason}", flush=True)
    real_vs_injected(rows)
    return rows


def real_vs_injected(rows: list[dict[str, Any]]) -> None:
    """The real engine death beside the injected one of the same run, side by side (ours)."""
    ours = {row["scenario"]: row for row in rows if row["side"] == "ours"}
    real, injected = ours.get(LLAMA_REAL), ours.get("engine_dead")
    if real is None or injected is None:
        return
    print(
        f"\nours, {LLAMA_REAL} / engine_dead (real / injected, same run): "
        f"out after {ratio(real['out_after_s'], injected['out_after_s'])}, "
        f"back after {ratio(real['back_after_s'], injected['back_after_s'])}; "
        f"lost {real['lost']} / {injected['lost']}",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--line", choices=("3", "4"), default="3")
    parser.add_argument(
        "--python",
        help="MinerU's interpreter (default: "
        "MINERU_HEALTH_MINERU_PYTHON or this one; line 4: "
        "MINERU_HEALTH_MINERU4_PYTHON)",
    )
    parser.add_argument(
        "--scenarios",
        help=f"line 3: {','.join(SCENARIOS)} (default); "
        f"line 4: {','.join(SCENARIOS4)},{LLAMA_REAL} (default), "
        f"{VLLM_REAL}",
    )
    parser.add_argument(
        "--sides", default="upstream,ours", help="line 4: upstream, ours, ours-grace"
    )
    parser.add_argument("--duration", type=float, default=14.0, help="seconds of stream")
    parser.add_argument("--period", type=float, default=1.0, help="seconds between submissions")
    parser.add_argument("--inject-after", type=float, default=4.0, help="seconds into the stream")
    parser.add_argument(
        "--burst", type=int, default=4, help="tasks submitted at once just before the fault"
    )
    parser.add_argument(
        "--task-timeout", type=float, default=60.0, help="a task not terminal by then is hung"
    )
    parser.add_argument(
        "--recovery-cap",
        type=float,
        default=60.0,
        help="stop waiting for recovery after this many seconds",
    )
    parser.add_argument("--preset", default="production", help="MINERU_ROUTER_HEALTH_PRESET (b)")
    parser.add_argument("--stall-s", default="5", help="MINERU_HEALTH_STALL_S of (b)'s workers")
    parser.add_argument("--baseline", choices=("upstream", "pr5188"), default="upstream")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    default = SCENARIOS if args.line == "3" else (*SCENARIOS4, LLAMA_REAL)
    known = default if args.line == "3" else (*default, VLLM_REAL)
    scenarios = [s for s in (args.scenarios or ",".join(default)).split(",") if s]
    unknown = set(scenarios) - set(known)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; known: {', '.join(known)}")
    if args.line == "3":
        args.python = args.python or sandbox.mineru_python()
        results = line3(args, scenarios)
    else:
        args.python = args.python or sandbox.mineru4_python()
        if args.python is None:
            print(f"set {sandbox.MINERU4_PYTHON_ENV} to a MinerU 4.0 Python", file=sys.stderr)
            return 2
        results = line4(args, scenarios)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

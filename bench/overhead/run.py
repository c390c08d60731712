"""What our hooks cost a loaded worker: jobs completed per minute, patched over unpatched.

For each MinerU line, two real ``mineru-api`` workers, never both at once: an
unpatched copy of MinerU (``upstream``) and a copy patched by ``mineru-health
patch apply --mineru-path <copy>`` (``ours``, its native health endpoint on
``MINERU_HEALTH_PORT``). Each gets the same closed-loop load: ``--in-flight``
clients, each submitting the next PDF of a fixed set as soon as its previous
job ends, polling the job's status every 250 ms. After ``--warmup`` seconds,
completed jobs are counted for ``--seconds``; throughput is completions per
minute over the span between the first and the last completion in that
window. Also measured in the window: the worker's CPU seconds (its whole
session, from /proc) per completed job, and, on ours only, the native
``/health`` latency asked every 100 ms (upstream is not probed: any probing
cost is charged to ours).

The sides alternate in counterbalanced rounds (upstream, ours; then ours,
upstream; ...), so a drift in the machine's load hits both alike. Reported per
round: each side's jobs/min and the ratio ours/upstream; overall the median
ratio and its spread (min-max over rounds), and the noise floor: the spread of
one side's own jobs/min between rounds.

- line 3: the dev venv's MinerU 3.x (``MINERU_HEALTH_MINERU_PYTHON`` or this
  interpreter), ``vlm-http-client`` backend against the fake VLM server, PDFs
  with an image a page;
- line 4: MinerU 4.0 (``MINERU_HEALTH_MINERU4_PYTHON``, else the repo's
  ``.venv-mineru4``), ``--tier flash``, offline, text PDFs.

    python bench/overhead/run.py [--line 3|4|all] [--rounds 3] [--seconds 20] [--json out.json]

Loopback only; every process is reaped after each run. Timings depend on the
machine: read the ratios, and the noise floor next to them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mineru_health.demo.fleet import (
    LINE3,
    LINE4,
    Client,
    Line,
    start_fake_vlm,
    start_worker,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # the tests' harness
from harness.samplers import Prober
from mineru_health.demo.sandbox import (
    Processes,
    copy_mineru,
    make_pdf,
    mineru4_python,
    mineru_python,
)

START_TIMEOUT_S = 240.0
REQUEST_TIMEOUT_S = 120.0
POLL_S = 0.25
_TICKS_PER_S = 100.0  # USER_HZ, fixed at 100 on Linux for /proc/<pid>/stat
_REPO = Path(__file__).resolve().parents[2]


@dataclass
class Bench:
    """One MinerU line as measured here: its worker's Python, a job's PDFs and request shape."""

    line: Line
    name: str
    python: str
    pdfs: list[tuple[str, bytes]]
    engine_url: str = ""  # 3.x: the fake VLM server
    formats: tuple[str, ...] = ()
    procs: Processes = field(default_factory=Processes)

    def client(self, base: str) -> Client:
        return Client(
            base,
            self.line,
            engine_url=self.engine_url,
            formats=self.formats,
            submit_timeout_s=REQUEST_TIMEOUT_S,
        )

    def close(self) -> None:
        self.procs.stop_all()


def line3(root: Path, pages: int) -> Bench:
    python = mineru_python()
    procs = Processes()
    try:
        vlm = start_fake_vlm(procs, root)
    except BaseException:
        procs.stop_all()
        raise
    pdfs = [
        (
            f"doc{i}.pdf",
            make_pdf(pages + i, images_per_page=1, image_px=128, lines_per_page=10, seed=30 + i),
        )
        for i in range(4)
    ]
    return Bench(LINE3, "3.x", python, pdfs, vlm, procs=procs)


def line4(root: Path, pages: int) -> Bench | None:
    python = mineru4_python()
    if python is None and (_REPO / ".venv-mineru4/bin/python").exists():
        python = str(_REPO / ".venv-mineru4/bin/python")
    if python is None:
        return None
    pdfs = [(f"doc{i}.pdf", make_pdf(pages + i, lines_per_page=40, seed=40 + i)) for i in range(4)]
    return Bench(LINE4, "4.0", python, pdfs, formats=("markdown", "middle_json"))


def make_sites(line: Bench, root: Path) -> dict[str, Path]:
    """An unpatched copy of MinerU and one patched by the CLI, as a user patches it."""
    upstream = copy_mineru(root / "site-upstream", line.python)
    ours = copy_mineru(root / "site-ours", line.python)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mineru_health",
            "patch",
            "apply",
            "--mineru-path",
            str(ours / "mineru"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"mineru-health patch apply failed ({done.returncode}):\n{done.stdout}{done.stderr}"
        )
    return {"upstream": upstream, "ours": ours}


# --- one measured run ----------------------------------------------------------------------


def _session_cpu_s(session: int) -> float:
    """CPU seconds (user + system, reaped children included) of the living members of a session."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        # After the command name: [3] session, [11] utime, [12] stime, [13] cutime, [14] cstime.
        if len(fields) > 14 and fields[3] == str(session):
            total += sum(int(fields[i]) for i in (11, 12, 13, 14))
    return total / _TICKS_PER_S


def _client_loop(
    line: Bench,
    client: Client,
    first: int,
    stop: threading.Event,
    done: list[tuple[float, str]],
    errors: list[str],
) -> None:
    """One client: submit, poll until the job ends, record when and how, next PDF."""
    index = first
    while not stop.is_set():
        name, pdf = line.pdfs[index % len(line.pdfs)]
        index += 1
        task_id, refusal = client.submit(name, pdf)
        if not task_id:
            if not stop.is_set():
                errors.append(f"refused: {refusal}"[:200])
                stop.wait(1.0)
            continue
        while not stop.is_set():
            status = client.status(task_id, REQUEST_TIMEOUT_S).get("status")
            if status in line.line.terminal:
                done.append((time.monotonic(), str(status)))
                break
            stop.wait(POLL_S)


def measure(
    line: Bench,
    side: str,
    site: Path,
    root: Path,
    *,
    in_flight: int,
    warmup_s: float,
    seconds: float,
) -> dict[str, Any]:
    scratch = root / f"run-{side}-{time.monotonic_ns()}"
    done: list[tuple[float, str]] = []
    errors: list[str] = []
    stop = threading.Event()
    started = time.monotonic()
    with Processes() as procs:
        worker = start_worker(
            procs,
            line.line,
            site,
            line.python,
            scratch,
            native=side == "ours",
            timeout_s=START_TIMEOUT_S,
            name=f"mineru-api-{side}",
        )
        up_s = time.monotonic() - started
        client = line.client(worker.base_url)
        clients = [
            threading.Thread(
                target=_client_loop, args=(line, client, i, stop, done, errors), daemon=True
            )
            for i in range(in_flight)
        ]
        for thread in clients:
            thread.start()
        time.sleep(warmup_s)
        window_start = time.monotonic()
        cpu_start = _session_cpu_s(worker.proc.pid)
        # Upstream is not probed: any probing cost is charged to ours.
        with (
            Prober(f"{worker.native_url}/health", timeout_s=30.0)
            if side == "ours"
            else contextlib.nullcontext()
        ) as prober:
            time.sleep(seconds)
            window_end = time.monotonic()
            cpu_s = _session_cpu_s(worker.proc.pid) - cpu_start
            stop.set()
        alive = worker.proc.poll() is None
    # The worker is gone: a client still waiting on it fails at once and sees ``stop``.
    for thread in clients:
        thread.join(REQUEST_TIMEOUT_S + 5)
    log_tail = "" if alive else worker.proc.log_tail(1500)
    shutil.rmtree(scratch, ignore_errors=True)
    in_window = [(t, s) for t, s in done if window_start <= t <= window_end]
    completed = sorted(t for t, s in in_window if s == "completed")
    if len(completed) >= 3:
        per_min = (len(completed) - 1) / (completed[-1] - completed[0]) * 60.0
    else:
        per_min = len(completed) / seconds * 60.0
    result: dict[str, Any] = {
        "jobs_per_min": round(per_min, 2),
        "completed": len(completed),
        "other_endings": len(in_window) - len(completed),
        "client_errors": len(errors),
        # Per job at the measured rate, not per whole job counted: no edge quantisation.
        "cpu_s_per_job": round(cpu_s / (per_min * seconds / 60.0), 3) if per_min else None,
        "cpu_cores_busy": round(cpu_s / seconds, 2),
        "start_s": round(up_s, 1),
        "wall_s": round(time.monotonic() - started, 1),
    }
    if prober is not None:
        result["native_health"] = prober.summary()
    if errors:
        result["first_error"] = errors[0]
    if not alive:
        result["worker_exited"] = log_tail
    return result


# --- rounds ----------------------------------------------------------------------------------


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
    }


def bench_line(
    line: Bench, root: Path, *, rounds: int, in_flight: int, warmup_s: float, seconds: float
) -> dict[str, Any]:
    sites = make_sites(line, root)
    per_round: list[dict[str, Any]] = []
    for index in range(rounds):
        order = ("upstream", "ours") if index % 2 == 0 else ("ours", "upstream")
        row: dict[str, Any] = {"order": list(order)}
        for side in order:
            row[side] = measure(
                line,
                side,
                sites[side],
                root,
                in_flight=in_flight,
                warmup_s=warmup_s,
                seconds=seconds,
            )
        up, ours = row["upstream"]["jobs_per_min"], row["ours"]["jobs_per_min"]
        row["ratio"] = round(ours / up, 4) if up else None
        cpu_up, cpu_ours = row["upstream"]["cpu_s_per_job"], row["ours"]["cpu_s_per_job"]
        row["cpu_ratio"] = round(cpu_ours / cpu_up, 4) if cpu_up and cpu_ours else None
        print(
            f"  {line.name} round {index + 1} ({' then '.join(order)}): jobs/min upstream {up}"
            f" ours {ours} ratio {row['ratio']} | cpu s/job upstream {cpu_up} ours {cpu_ours}"
            f" ratio {row['cpu_ratio']} | cores busy upstream "
            f"{row['upstream']['cpu_cores_busy']} ours {row['ours']['cpu_cores_busy']} | "
            f"native /health {row['ours'].get('native_health')}",
            flush=True,
        )
        per_round.append(row)
    summary: dict[str, Any] = {"rounds": per_round}
    ratios = [r["ratio"] for r in per_round if r["ratio"]]
    cpu_ratios = [r["cpu_ratio"] for r in per_round if r["cpu_ratio"]]
    if ratios:
        summary["ratio"] = _spread(ratios)
    if cpu_ratios:
        summary["cpu_per_job_ratio"] = _spread(cpu_ratios)
    for side in ("upstream", "ours"):
        for key in ("jobs_per_min", "cpu_s_per_job"):
            values = [r[side][key] for r in per_round if r[side][key]]
            if not values:
                continue
            summary.setdefault(side, {})[key] = _spread(values)
            if len(values) > 1:
                # The noise floor: how far one side's own figure moves between rounds.
                cv = statistics.stdev(values) / statistics.mean(values)
                summary[side][key]["cv"] = round(cv, 4)
    latencies = [r["ours"]["native_health"] for r in per_round]
    summary["native_health_p50_ms"] = _spread([h["p50_ms"] for h in latencies if "p50_ms" in h])
    summary["native_health_p99_ms"] = _spread([h["p99_ms"] for h in latencies if "p99_ms" in h])
    return summary


def _print_summary(name: str, s: dict[str, Any]) -> None:
    for side in ("upstream", "ours"):
        print(
            f"{name}: {side:<8} jobs/min {s[side].get('jobs_per_min')} ; "
            f"cpu s/job {s[side].get('cpu_s_per_job')}"
        )
    print(
        f"{name}: ratio ours/upstream {s.get('ratio')} ; cpu s/job ratio "
        f"{s.get('cpu_per_job_ratio')}"
    )
    print(
        f"{name}: ours native /health p50 ms {s['native_health_p50_ms']}, "
        f"p99 ms {s['native_health_p99_ms']}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--line", choices=("3", "4", "all"), default="all")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per line (default 3)")
    parser.add_argument(
        "--seconds", type=float, default=20.0, help="measured window per run, seconds (default 20)"
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=5.0,
        help="load before the window opens, seconds (default 5)",
    )
    parser.add_argument("--in-flight", type=int, default=4, help="jobs in flight (default 4)")
    parser.add_argument(
        "--pages",
        type=int,
        default=3,
        help="pages of the smallest PDF of the set of four (default 3)",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if not (
        1 <= args.rounds <= 50
        and 5 <= args.seconds <= 1800
        and 1 <= args.in_flight <= 32
        and 0 <= args.warmup <= 600
        and 1 <= args.pages <= 200
    ):
        parser.error("rounds 1-50, seconds 5-1800, warmup 0-600, in-flight 1-32, pages 1-200")
    results: dict[str, Any] = {"settings": {k: v for k, v in vars(args).items() if k != "json"}}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mineru-health-overhead-") as tmp:
        root = Path(tmp)
        for name, factory in (("3", line3), ("4", line4)):
            if args.line not in (name, "all"):
                continue
            scratch = root / f"line{name}"
            scratch.mkdir()
            line = factory(scratch, args.pages)
            if line is None:
                print(
                    f"line {name}: skipped, set MINERU_HEALTH_MINERU4_PYTHON to a MinerU 4.0 "
                    "venv's python",
                    file=sys.stderr,
                )
                if args.line == name:
                    return 2
                continue
            try:
                results[line.name] = bench_line(
                    line,
                    scratch,
                    rounds=args.rounds,
                    in_flight=args.in_flight,
                    warmup_s=args.warmup,
                    seconds=args.seconds,
                )
            finally:
                line.close()
            _print_summary(line.name, results[line.name])
    results["total_s"] = round(time.monotonic() - started, 1)
    print(f"total {results['total_s']} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

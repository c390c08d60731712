"""Memory per task under a steady stream: the patched fleet against upstream MinerU 3.x, same run.

A real ``mineru-router`` with two local ``mineru-api`` workers (``vlm-http-client``
backend, the fake VLM server) parses a steady stream of small text PDFs
(``--rate`` a second for ``--duration`` seconds), twice in one run: once on
an unpatched copy of MinerU (``upstream``), once patched (``ours``). MinerU's
task retention is short (``MINERU_API_TASK_RETENTION_SECONDS``, router and
workers alike), so that what a finished task leaves behind is dropped while
the stream runs. The resident memory (``VmRSS``) of the router and of each
worker is sampled every 2 s.

Reported per side and process: RSS at the end of the warm-up and at the end,
the growth per completed task after the warm-up (least-squares slope of RSS
against tasks completed), and ours against upstream. Growth that upstream
shows as well is MinerU's (its retention, Python's allocator); what only
ours shows is ours.

    python bench/soak/run.py [--duration 180] [--rate 2] [--retention 30] [--json out.json]

Timings and sizes depend on the machine; read the per-task slopes side by side.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from mineru_health.demo.fleet import LINE3, Client, Router, Stream, fleet, start_fake_vlm
from mineru_health.demo.sandbox import Processes, make_pdf, mineru_python

SIDES = {"upstream": False, "ours": True}


def rss_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of y against x (None with fewer than two distinct x)."""
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    num = sum((x - mean_x) * (y - mean_y) for x, y in points)
    den = sum((x - mean_x) ** 2 for x, _ in points)
    return num / den


def soak(router: Router, client: Client, pdf: bytes, args: argparse.Namespace) -> dict[str, Any]:
    samples: dict[str, list[tuple[float, float]]] = {}
    stop = threading.Event()
    every_s = 1.0 / args.rate
    count = int(args.duration * args.rate)
    warm = int(args.warmup * args.rate)

    with Stream(
        client, lambda n: (f"soak-{n:05d}.pdf", pdf), every_s=every_s, count=count
    ) as stream:

        def sample() -> None:
            while not stop.wait(2.0):
                done = len(stream.completed())
                if done < warm:
                    continue
                procs = {"router": router.proc.pid}
                procs.update(
                    {f"worker-{i}": pid for i, pid in enumerate(sorted(router.worker_pids()))}
                )
                for name, pid in procs.items():
                    kb = rss_kb(pid)
                    if kb is not None:
                        samples.setdefault(name, []).append((float(done), float(kb)))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        outcomes = stream.outcomes(args.task_timeout)
        stop.set()
        sampler.join(timeout=10.0)
    completed = sum(1 for o in outcomes if o.status == "completed")
    result: dict[str, Any] = {"tasks": len(outcomes), "completed": completed}
    for name, points in sorted(samples.items()):
        per_task = slope(points)
        result[name] = {
            "rss_after_warmup_mb": round(points[0][1] / 1024, 1),
            "rss_end_mb": round(points[-1][1] / 1024, 1),
            "kb_per_task": None if per_task is None else round(per_task, 2),
            "samples": len(points),
        }
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=180.0, help="seconds of stream a side")
    parser.add_argument("--rate", type=float, default=2.0, help="tasks a second")
    parser.add_argument(
        "--warmup",
        type=float,
        default=30.0,
        help="seconds of stream before sampling (first parses load a lot)",
    )
    parser.add_argument(
        "--retention",
        type=int,
        default=30,
        help="MinerU's task retention, seconds (router and workers)",
    )
    parser.add_argument("--task-timeout", type=float, default=600.0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    env = {
        "MINERU_API_TASK_RETENTION_SECONDS": str(args.retention),
        "MINERU_API_TASK_CLEANUP_INTERVAL_SECONDS": str(max(1, args.retention // 3)),
    }
    python = mineru_python()
    results: dict[str, Any] = {
        "duration_s": args.duration,
        "rate": args.rate,
        "retention_s": args.retention,
    }
    pdf = make_pdf(text="mineru-health soak page")
    with tempfile.TemporaryDirectory(prefix="mineru-health-soak-") as tmp, Processes() as procs:
        root = Path(tmp)
        vlm = start_fake_vlm(procs, root)
        for side, patched in SIDES.items():
            site = LINE3.site(root / f"site-{side}", python, patched=patched, faults=False)
            with fleet(
                LINE3, root / f"router-{side}", python, site=site, env=env, fault_plan=None
            ) as router:
                client = Client(router.base, LINE3, engine_url=vlm, submit_timeout_s=120.0)
                results[side] = soak(router, client, pdf, args)
            print(f"{side}: {json.dumps(results[side])}", flush=True)
    print(
        f"\nsoak: {args.duration:g} s at {args.rate:g} task/s a side, "
        f"retention {args.retention} s (RSS growth per completed task after warm-up)"
    )
    print(
        f"  {'process':<10} {'upstream KB/task':>17} {'ours KB/task':>13} "
        f"{'ours end MB':>12} {'upstream end MB':>16}"
    )
    for name in sorted(set(results["ours"]) - {"tasks", "completed"}):
        ours, up = results["ours"].get(name, {}), results["upstream"].get(name, {})
        print(
            f"  {name:<10} {up.get('kb_per_task')!s:>17} {ours.get('kb_per_task')!s:>13} "
            f"{ours.get('rss_end_mb')!s:>12} {up.get('rss_end_mb')!s:>16}"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

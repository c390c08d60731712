"""Busy is not broken: /health under real load, main port versus native endpoint, and the router.

``--line 3`` (the default), part 1, one patched ``mineru-api`` worker
(``vlm-http-client`` backend, the fake VLM server): large multi-page PDFs
with images, several tasks in flight. Two probers ask ``GET /health`` every
100 ms, one on MinerU's main port (served on the event loop that MinerU
blocks while it copies and hashes page bitmaps), one on the native endpoint
(``MINERU_HEALTH_PORT``, a native thread). Reported per endpoint, idle and
loaded: p50 / p99 / max latency, and the loaded main/native ratios measured
in the same run.

Part 2, the patched ``mineru-router`` with two local workers under the same
kind of load, ``production`` preset, no fault injected, twice in the same run:
(a) probing the workers' main ports with the 0.1 defaults
(``MINERU_ROUTER_HEALTH_NATIVE_PROBES=0``: the main port's /health is then the
health URL, probed with ``TIMEOUT_S``, 1.5 s, 3 failures) and
(b) the defaults (native endpoints). Reported: ejections, restarts and failed
tasks from the router's audit log and task statuses, and the wall time.

``--line 4`` (``MINERU_HEALTH_MINERU4_PYTHON``): one real ``mineru-api``
4.0.12 (flash tier, offline) parses one large PDF (``--pages`` pages, an
image and 40 text lines each; the flash tier inlines the images, so the
markdown is ~2 MB a page). 4.0 sanitises, hashes and stores that output on
its event loop. The same two probers: the main port's ``GET /v1/health``
and, on the patched worker, the native endpoint. Reported per endpoint: p50
/ p99 / max latency, and the ratios measured in the same run: upstream
4.0.12 (an unpatched copy) against ours, main port against native endpoint.

    python bench/busy/run.py [--pages 100] [--tasks 4] [--part 1|2|all] [--json out.json]
    MINERU_HEALTH_MINERU4_PYTHON=.venv-mineru4/bin/python \\
        python bench/busy/run.py --line 4 [--pages 200] [--no-upstream] [--json out.json]

Timings depend on the machine; read the ratios. A run takes a few minutes
(line 4: 200 pages take a few minutes a side).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mineru_health.demo.fleet import (
    LINE3,
    LINE4,
    Client,
    Stream,
    Worker,
    fleet,
    start_fake_vlm,
    start_worker,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # the tests' harness
from harness.samplers import Prober
from mineru_health.demo.sandbox import Processes, make_pdf, mineru4_python, mineru_python

START_TIMEOUT_S = 240.0
RATIO_KEYS = ("p50_ms", "p99_ms", "max_ms")


def _run_tasks(client: Client, pdf: bytes, count: int, timeout_s: float) -> list[str]:
    """Submits ``count`` tasks at once and waits for all; returns their final statuses."""
    with Stream(
        client, lambda n: (f"doc-{n}.pdf", pdf), task_timeout_s=timeout_s, poll_s=1.0
    ) as stream:
        for _ in range(count):
            stream.add()
        return [o.status for o in stream.outcomes()]


def _probed(
    worker: Worker, busy: Callable[[], Any], probe_timeout_s: float
) -> tuple[float, dict[str, Prober]]:
    """Probes the main port's health (and the native endpoint's) while ``busy()`` runs."""
    urls = {"main": f"{worker.base_url}{worker.line.health}"}
    if worker.native_url:
        urls["native"] = f"{worker.native_url}/health"
    with contextlib.ExitStack() as stack:
        probes = {
            name: stack.enter_context(Prober(url, timeout_s=probe_timeout_s))
            for name, url in urls.items()
        }
        started = time.monotonic()
        busy()
        wall = time.monotonic() - started
    return wall, probes


def _summary(probes: Prober) -> dict[str, Any]:
    summary = probes.summary()
    return {
        "probes": summary.pop("probes"),
        "failures": summary.pop("failures"),
        **summary,
        "max_loop_lag_s": round(probes.max_loop_lag_s, 2),
    }


def _ratio(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    return {
        key: round(a[key] / max(b[key], 0.01), 1) for key in RATIO_KEYS if key in a and key in b
    }


# --- line 3, part 1: one worker, two endpoints ----------------------------------------------


def part1(
    procs: Processes,
    site: Path,
    root: Path,
    vlm: str,
    pdf: bytes,
    tasks: int,
    task_timeout_s: float,
) -> dict[str, Any]:
    worker = start_worker(
        procs, LINE3, site, mineru_python(), root / "worker", native=True, timeout_s=START_TIMEOUT_S
    )
    _, idle = _probed(worker, lambda: time.sleep(10.0), 60.0)
    client = Client(worker.base_url, LINE3, engine_url=vlm, submit_timeout_s=600.0)
    statuses: list[str] = []
    wall, loaded = _probed(
        worker, lambda: statuses.extend(_run_tasks(client, pdf, tasks, task_timeout_s)), 60.0
    )
    worker_main, worker_native = _summary(loaded["main"]), _summary(loaded["native"])
    return {
        "tasks": {s: statuses.count(s) for s in sorted(set(statuses))},
        "load_wall_s": round(wall, 1),
        "idle": {name: _summary(probes) for name, probes in idle.items()},
        "loaded": {"main": worker_main, "native": worker_native},
        "loaded_ratio_main_over_native": _ratio(worker_main, worker_native),
    }


def _print_part1(result: dict[str, Any]) -> None:
    print(f"part 1: one worker, {result['tasks']} in {result['load_wall_s']} s")
    print(
        f"  {'endpoint':<8} {'phase':<7} {'probes':>7} {'fail':>5} {'p50 ms':>9} "
        f"{'p99 ms':>9} {'max ms':>9} {'max lag s':>10}"
    )
    for phase in ("idle", "loaded"):
        for name, row in result[phase].items():
            print(
                f"  {name:<8} {phase:<7} {row.get('probes', 0):>7} {row.get('failures', 0):>5} "
                f"{row.get('p50_ms', '-'):>9} {row.get('p99_ms', '-'):>9} "
                f"{row.get('max_ms', '-'):>9} {row.get('max_loop_lag_s', '-'):>10}"
            )
    ratios = result["loaded_ratio_main_over_native"]
    print("  loaded main/native: " + ", ".join(f"{k} {v}x" for k, v in ratios.items()))


# --- line 3, part 2: the router, with and without native endpoints -------------------------

#: Audit actions that hurt a healthy fleet.
DISRUPTIONS = ("ejected", "health_failed", "auto_restart_requested")
SIDES = {
    # mineru-health 0.1: every probe on the main port, 1.5 s timeout, 3 failures.
    "main_port": {"MINERU_ROUTER_HEALTH_NATIVE_PROBES": "0"},
    # The defaults: native endpoints.
    "native": {},
}


def part2(
    site: Path, root: Path, vlm: str, pdf: bytes, tasks: int, task_timeout_s: float
) -> dict[str, Any]:
    result = {}
    for side, extra in SIDES.items():
        with fleet(
            LINE3,
            root / f"router-{side}",
            mineru_python(),
            site=site,
            env=extra,
            fault_plan=None,
            timeout_s=START_TIMEOUT_S,
        ) as router:
            client = Client(router.base, LINE3, engine_url=vlm, submit_timeout_s=600.0)
            started = time.monotonic()
            statuses = _run_tasks(client, pdf, tasks, task_timeout_s)
            wall = time.monotonic() - started
            records = router.audit_records()
        counts = {
            action: sum(1 for r in records if r["action"] == action) for action in DISRUPTIONS
        }
        result[side] = {
            "tasks": {status: statuses.count(status) for status in sorted(set(statuses))},
            "wall_s": round(wall, 1),
            "ejections": counts["ejected"],
            "marked_failed": counts["health_failed"],
            "restarts": counts["auto_restart_requested"],
        }
    return result


def _print_part2(result: dict[str, Any]) -> None:
    print("part 2: router + two workers, production preset, no fault injected")
    print(
        f"  {'probes on':<10} {'tasks':<28} {'wall s':>7} {'ejections':>10} "
        f"{'failed':>7} {'restarts':>9}"
    )
    for side, row in result.items():
        print(
            f"  {side:<10} {json.dumps(row['tasks']):<28} {row['wall_s']:>7} "
            f"{row['ejections']:>10} {row['marked_failed']:>7} {row['restarts']:>9}"
        )


def line3(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    results: dict[str, Any] = {
        "pages": args.pages,
        "images_per_page": args.images,
        "tasks": args.tasks,
    }
    site = LINE3.site(root / "site", mineru_python(), faults=False)
    pdf = make_pdf(pages=args.pages, images_per_page=args.images, image_px=128, seed=7)
    with Processes() as procs:
        vlm = start_fake_vlm(procs, root)
        if args.part in ("1", "all"):
            with Processes() as worker_procs:
                results["part1"] = part1(
                    worker_procs, site, root, vlm, pdf, args.tasks, args.task_timeout
                )
            _print_part1(results["part1"])
        if args.part in ("2", "all"):
            results["part2"] = part2(site, root, vlm, pdf, args.tasks * 2, args.task_timeout)
            _print_part2(results["part2"])
    return results


# --- line 4: one large job, upstream against ours -------------------------------------------


def side4(
    name: str, site: Path, root: Path, python: str, pdf: bytes, *, native: bool, timeout_s: float
) -> dict[str, Any]:
    with Processes() as procs:
        worker = start_worker(
            procs,
            LINE4,
            site,
            python,
            root / name,
            native=native,
            env={"MINERU_HEALTH_LOOP_HANG_S": "600"},
            timeout_s=180.0,
            name=name,
        )
        client = Client(
            worker.base_url, LINE4, formats=("markdown", "middle_json"), submit_timeout_s=300.0
        )
        statuses: list[str] = []
        # 4.0 keeps /v1/health waiting for most of a minute here: a probe must outwait it.
        wall, probes = _probed(
            worker, lambda: statuses.extend(_run_tasks(client, pdf, 1, timeout_s)), 600.0
        )
    status = statuses[0] if statuses else "?"
    return {
        "status": "timed out" if status == "hung" else status,
        "wall_s": round(wall, 1),
        **{endpoint: _summary(p) for endpoint, p in probes.items()},
    }


def line4(args: argparse.Namespace, root: Path, python: str) -> dict[str, Any]:
    results: dict[str, Any] = {"pages": args.pages}
    started = time.monotonic()
    pdf = make_pdf(args.pages, images_per_page=1, image_px=256, lines_per_page=40, seed=4)
    results["pdf"] = {"bytes": len(pdf), "made_in_s": round(time.monotonic() - started, 1)}
    ours = LINE4.site(root / "site-ours", python, faults=False)
    results["ours"] = side4(
        "ours", ours, root, python, pdf, native=True, timeout_s=args.task_timeout
    )
    print("ours:", json.dumps(results["ours"]))
    if not args.no_upstream:
        upstream = LINE4.site(root / "site-upstream", python, patched=False, faults=False)
        results["upstream"] = side4(
            "upstream", upstream, root, python, pdf, native=False, timeout_s=args.task_timeout
        )
        print("upstream:", json.dumps(results["upstream"]))
        results["ratio_upstream_main_over_our_native"] = _ratio(
            results["upstream"]["main"], results["ours"]["native"]
        )
    results["ratio_our_main_over_our_native"] = _ratio(
        results["ours"]["main"], results["ours"]["native"]
    )
    print(json.dumps({k: v for k, v in results.items() if k.startswith("ratio")}, indent=2))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--line", choices=("3", "4"), default="3")
    parser.add_argument("--pages", type=int, help="pages per PDF (default: line 3 100, line 4 200)")
    parser.add_argument("--images", type=int, default=1, help="images per page (default 1)")
    parser.add_argument(
        "--tasks", type=int, default=4, help="line 3: tasks in flight per worker (default 4)"
    )
    parser.add_argument(
        "--task-timeout", type=float, help="per task, seconds (default: line 3 1200, line 4 1800)"
    )
    parser.add_argument("--part", choices=("1", "2", "all"), default="all", help="line 3")
    parser.add_argument(
        "--no-upstream", action="store_true", help="line 4: skip the unpatched 4.0.12 side"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    args.pages = args.pages or (100 if args.line == "3" else 200)
    args.task_timeout = args.task_timeout or (1200.0 if args.line == "3" else 1800.0)
    python4 = mineru4_python()
    if args.line == "4" and python4 is None:
        print("set MINERU_HEALTH_MINERU4_PYTHON to a MinerU 4.0 venv's python", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="mineru-health-busy-") as tmp:
        root = Path(tmp)
        results = line3(args, root) if args.line == "3" else line4(args, root, str(python4))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

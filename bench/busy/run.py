"""Busy is not broken: /health under real load, main port versus native endpoint, and the router.

Part 1, one patched ``mineru-api`` worker (``vlm-http-client`` backend, the fake
VLM server): large multi-page PDFs with images, several tasks in flight. Two
probers ask ``GET /health`` every 100 ms, one on MinerU's main port (served on
the event loop that MinerU blocks while it copies and hashes page bitmaps), one
on the native endpoint (``MINERU_HEALTH_PORT``, a native thread). Reported per
endpoint, idle and loaded: p50 / p99 / max latency, and the loaded main/native
ratios measured in the same run.

Part 2, the patched ``mineru-router`` with two local workers under the same
kind of load, ``production`` preset, no fault injected, twice in the same run:
(a) probing the workers' main ports with the 0.1 defaults
(``MINERU_ROUTER_HEALTH_NATIVE_PROBES=0``: the main port's /health is then the
health URL, probed with ``TIMEOUT_S``, 1.5 s, 3 failures) and
(b) the defaults (native endpoints). Reported: ejections, restarts and failed
tasks from the router's audit log and task statuses, and the wall time.

    python bench/busy/run.py [--pages 100] [--tasks 4] [--part 1|2|all] [--json out.json]

Timings depend on the machine; read the ratios. A run takes a few minutes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from mineru_health.testing.sandbox import (
    Processes,
    fake_vlm_command,
    free_port,
    make_pdf,
    mineru_env,
    mineru_health_path,
    mineru_python,
    patched_site,
    wait_until,
)

BACKEND = "vlm-http-client"
PROBE_PERIOD_S = 0.1
PROBE_TIMEOUT_S = 60.0
START_TIMEOUT_S = 240.0


@dataclass
class Probes:
    """Latencies (seconds) of one endpoint's probes; failures are counted apart."""

    latencies: list[float] = field(default_factory=list)
    failures: int = 0
    max_loop_lag_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        values = sorted(self.latencies)
        if not values:
            return {"probes": 0, "failures": self.failures}
        p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
        return {
            "probes": len(values),
            "failures": self.failures,
            "p50_ms": round(statistics.median(values) * 1000, 2),
            "p99_ms": round(p99 * 1000, 2),
            "max_ms": round(values[-1] * 1000, 2),
            "max_loop_lag_s": round(self.max_loop_lag_s, 2),
        }


def _probe_loop(url: str, out: Probes, stop: threading.Event) -> None:
    with httpx.Client(timeout=PROBE_TIMEOUT_S) as client:
        while not stop.is_set():
            started = time.monotonic()
            try:
                response = client.get(url)
                elapsed = time.monotonic() - started
                if response.status_code != 200:
                    out.failures += 1
                out.latencies.append(elapsed)
                lag = response.json().get("loop_lag_s")
                if isinstance(lag, int | float):
                    out.max_loop_lag_s = max(out.max_loop_lag_s, float(lag))
            except (httpx.HTTPError, ValueError):
                out.failures += 1
            stop.wait(PROBE_PERIOD_S)


def _probe_while(urls: dict[str, str], busy: Callable[[], None]) -> dict[str, Probes]:
    """Probes every URL in its own thread while ``busy()`` runs."""
    results = {name: Probes() for name in urls}
    stop = threading.Event()
    threads = [
        threading.Thread(target=_probe_loop, args=(url, results[name], stop), daemon=True)
        for name, url in urls.items()
    ]
    for thread in threads:
        thread.start()
    try:
        busy()
    finally:
        stop.set()
        for thread in threads:
            thread.join(PROBE_TIMEOUT_S + 5)
    return results


def _submit(base: str, pdf: bytes, vlm: str, name: str) -> str:
    response = httpx.post(
        f"{base}/tasks",
        files={"files": (name, pdf, "application/pdf")},
        data={"backend": BACKEND, "server_url": vlm},
        timeout=600.0,
    )
    response.raise_for_status()
    task_id: str = response.json()["task_id"]
    return task_id


def _run_tasks(base: str, pdf: bytes, vlm: str, count: int, timeout_s: float) -> list[str]:
    """Submits ``count`` tasks at once and waits for all; returns their final statuses."""
    with ThreadPoolExecutor(max_workers=count) as pool:
        ids = list(pool.map(lambda i: _submit(base, pdf, vlm, f"doc-{i}.pdf"), range(count)))
    finals: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=120.0) as client:
        while len(finals) < len(ids) and time.monotonic() < deadline:
            for task_id in ids:
                if task_id in finals:
                    continue
                try:
                    status = client.get(f"{base}/tasks/{task_id}").json()["status"]
                except (httpx.HTTPError, ValueError, KeyError):
                    continue
                if status in ("completed", "failed"):
                    finals[task_id] = status
            time.sleep(1.0)
    return [finals.get(task_id, "hung") for task_id in ids]


class Sandbox:
    """A patched MinerU copy, the fake VLM server and a PDF, for the whole run."""

    def __init__(self, root: Path, pages: int, images: int) -> None:
        self.root = root
        self.python = mineru_python()
        self.site = patched_site(root / "site", self.python)
        self.health_path = mineru_health_path()
        self.procs = Processes()
        self.vlm = ""
        self.restart_vlm()
        self.pdf = make_pdf(pages=pages, images_per_page=images, image_px=128, seed=7)

    def restart_vlm(self) -> None:
        """(Re)starts the fake VLM server: every part stops its processes when it ends."""
        self.procs.stop_all()
        port = free_port()
        self.vlm = f"http://127.0.0.1:{port}"
        self.procs.start("fake-vlm", fake_vlm_command(self.python, port),
                         env=self.env(self.root / "vlm-out"),
                         log_path=self.root / f"fake-vlm-{port}.log")
        if not wait_until(lambda: _get(f"{self.vlm}/v1/models") == 200, 60.0):
            raise RuntimeError("the fake VLM server did not start")

    def env(self, output: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
        return mineru_env(self.site, health_path=self.health_path, output_root=output,
                          extra=extra)

    def close(self) -> None:
        self.procs.stop_all()


def _get(url: str, timeout_s: float = 5.0) -> int | None:
    try:
        return httpx.get(url, timeout=timeout_s).status_code
    except httpx.HTTPError:
        return None


# --- part 1: one worker, two endpoints ------------------------------------------------------


def part1(box: Sandbox, tasks: int, task_timeout_s: float) -> dict[str, Any]:
    port, health_port = free_port(), free_port()
    worker = box.procs.start(
        "mineru-api",
        [box.python, "-m", "mineru.cli.fast_api", "--host", "127.0.0.1", "--port", str(port)],
        env=box.env(box.root / "worker-out", {"MINERU_HEALTH_PORT": str(health_port)}),
        log_path=box.root / "worker.log",
    )
    base = f"http://127.0.0.1:{port}"
    urls = {"main": f"{base}/health", "native": f"http://127.0.0.1:{health_port}/health"}
    if not wait_until(lambda: _get(urls["main"]) == 200, START_TIMEOUT_S, 0.5):
        raise RuntimeError(f"the worker did not start:\n{worker.log_tail()}")

    idle = _probe_while(urls, lambda: time.sleep(10.0))
    statuses: list[str] = []
    started = time.monotonic()
    loaded = _probe_while(
        urls,
        lambda: statuses.extend(_run_tasks(base, box.pdf, box.vlm, tasks, task_timeout_s)),
    )
    wall = time.monotonic() - started
    worker_main = loaded["main"].summary()
    worker_native = loaded["native"].summary()
    return {
        "tasks": {s: statuses.count(s) for s in sorted(set(statuses))},
        "load_wall_s": round(wall, 1),
        "idle": {name: probes.summary() for name, probes in idle.items()},
        "loaded": {"main": worker_main, "native": worker_native},
        "loaded_ratio_main_over_native": {
            key: round(worker_main[key] / max(worker_native[key], 0.01), 1)
            for key in ("p50_ms", "p99_ms", "max_ms")
            if key in worker_main and key in worker_native
        },
    }


def _print_part1(result: dict[str, Any]) -> None:
    print(f"part 1: one worker, {result['tasks']} in {result['load_wall_s']} s")
    print(f"  {'endpoint':<8} {'phase':<7} {'probes':>7} {'fail':>5} {'p50 ms':>9} "
          f"{'p99 ms':>9} {'max ms':>9} {'max lag s':>10}")
    for phase in ("idle", "loaded"):
        for name, row in result[phase].items():
            print(f"  {name:<8} {phase:<7} {row.get('probes', 0):>7} {row.get('failures', 0):>5} "
                  f"{row.get('p50_ms', '-'):>9} {row.get('p99_ms', '-'):>9} "
                  f"{row.get('max_ms', '-'):>9} {row.get('max_loop_lag_s', '-'):>10}")
    ratios = result["loaded_ratio_main_over_native"]
    print("  loaded main/native: " + ", ".join(f"{k} {v}x" for k, v in ratios.items()))


# --- part 2: the router, with and without native endpoints -------------------------------

#: Audit actions that hurt a healthy fleet.
DISRUPTIONS = ("ejected", "health_failed", "auto_restart_requested")
SIDES = {
    # mineru-health 0.1: every probe on the main port, 1.5 s timeout, 3 failures.
    "main_port": {"MINERU_ROUTER_HEALTH_NATIVE_PROBES": "0"},
    # The defaults: native endpoints.
    "native": {},
}


def _router_run(box: Sandbox, side: str, extra: dict[str, str], tasks: int,
                task_timeout_s: float) -> dict[str, Any]:
    root = box.root / f"router-{side}"
    root.mkdir()
    audit = root / "audit.jsonl"
    port = free_port()
    env = box.env(root / "out", {"MINERU_ROUTER_HEALTH_AUDIT_PATH": str(audit), **extra})
    router = box.procs.start(
        f"router-{side}",
        [box.python, "-m", "mineru.cli.router", "--host", "127.0.0.1", "--port", str(port),
         "--local-gpus", "0,1"],
        env=env, log_path=root / "router.log", cwd=root,
    )
    base = f"http://127.0.0.1:{port}"

    def both_in_rotation() -> bool:
        try:
            servers = httpx.get(f"{base}/health", timeout=5.0).json().get("servers", [])
        except (httpx.HTTPError, ValueError):
            return False
        return len(servers) == 2 and all(s.get("in_rotation") for s in servers)

    if not wait_until(both_in_rotation, START_TIMEOUT_S, 0.5):
        raise RuntimeError(f"the router did not start:\n{router.log_tail()}")
    started = time.monotonic()
    statuses = _run_tasks(base, box.pdf, box.vlm, tasks, task_timeout_s)
    wall = time.monotonic() - started
    records = [json.loads(line) for line in audit.read_text().splitlines() if line]
    counts = {action: sum(1 for r in records if r["action"] == action) for action in DISRUPTIONS}
    return {
        "tasks": {status: statuses.count(status) for status in sorted(set(statuses))},
        "wall_s": round(wall, 1),
        "ejections": counts["ejected"],
        "marked_failed": counts["health_failed"],
        "restarts": counts["auto_restart_requested"],
    }


def part2(box: Sandbox, tasks: int, task_timeout_s: float) -> dict[str, Any]:
    result = {}
    for side, extra in SIDES.items():
        result[side] = _router_run(box, side, extra, tasks, task_timeout_s)
        box.restart_vlm()
    return result


def _print_part2(result: dict[str, Any]) -> None:
    print("part 2: router + two workers, production preset, no fault injected")
    print(f"  {'probes on':<10} {'tasks':<28} {'wall s':>7} {'ejections':>10} "
          f"{'failed':>7} {'restarts':>9}")
    for side, row in result.items():
        print(f"  {side:<10} {json.dumps(row['tasks']):<28} {row['wall_s']:>7} "
              f"{row['ejections']:>10} {row['marked_failed']:>7} {row['restarts']:>9}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=100, help="pages per PDF (default 100)")
    parser.add_argument("--images", type=int, default=1, help="images per page (default 1)")
    parser.add_argument("--tasks", type=int, default=4,
                        help="tasks in flight per worker (default 4)")
    parser.add_argument("--task-timeout", type=float, default=1200.0)
    parser.add_argument("--part", choices=("1", "2", "all"), default="all")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    results: dict[str, Any] = {"pages": args.pages, "images_per_page": args.images,
                               "tasks": args.tasks}
    with tempfile.TemporaryDirectory(prefix="mineru-health-busy-") as tmp:
        box = Sandbox(Path(tmp), args.pages, args.images)
        try:
            if args.part in ("1", "all"):
                results["part1"] = part1(box, args.tasks, args.task_timeout)
                _print_part1(results["part1"])
                box.restart_vlm()
            if args.part in ("2", "all"):
                results["part2"] = part2(box, args.tasks * 2, args.task_timeout)
                _print_part2(results["part2"])
        finally:
            box.close()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

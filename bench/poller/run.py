#!/usr/bin/env python3
"""Compare one native Poller.sweep with two Python probe loops, same endpoints.

For each scenario (endpoint count x share of hung endpoints) this starts
``poller_bench --serve`` (forked epoll responders on 127.0.0.x), then probes
every endpoint's /health three ways, each in its own process so that CPU time
and peak RSS belong to that prober alone:

* ``cpp``        -- ``poller_bench --sweep``: Poller::sweep, libcurl multi.
* ``async50``    -- asyncio + httpx, all probes gathered under a semaphore of
                    50 (the orchestrator's reference design).
* ``sequential`` -- one httpx.AsyncClient, one probe after another, the way
                    mineru-router 3.4.4 refreshes its workers.

A sequential sweep costs about ``hung * timeout`` seconds, so above
``--seq-limit`` endpoints it probes an evenly spread prefix (the hung share is
the same in every prefix) and scales wall and CPU time linearly; such rows are
marked ``extrapolated``. Ratios are against the C++ sweep of the same run.

Usage: python bench/poller/run.py [--bench build/x/poller_bench]
           [--sizes 100,1000,10000] [--hung 0,10] [--timeout 1] [--json out.json]

``--live SECONDS`` measures the running Poller instead (production config:
2 s interval, 1.5 s timeout) over fleets with a share of hung workers, and
reports CPU per finished probe side by side with the healthy fleet of the
same size, plus the CPU one timed-out probe costs, estimated from the two
(``cpu_hung_fleet - healthy_probes * cpu_per_healthy_probe``) / timeouts.
``--compare OTHER_BENCH`` runs a second build (e.g. one from before a
change) on the same scenarios in the same run, interleaved:

    python bench/poller/run.py --live 8 --sizes 2000,10000 --hung 0,10,50 \
        [--compare /tmp/poller_bench_before]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def read_urls(path: str) -> list[str]:
    with open(path, encoding="utf-8") as handle:
        return [line.split()[0] for line in handle if line.strip()]


async def probe_one(client, url: str) -> bool:
    """True when the answer is what mineru-router 3.4.4 calls healthy."""
    import httpx

    try:
        response = await client.get(f"{url}/health")
    except httpx.HTTPError:
        return False
    if response.status_code != 200:
        return False
    try:
        payload = response.json()
    except ValueError:
        return False
    return (
        isinstance(payload, dict)
        and payload.get("status") == "healthy"
        and payload.get("protocol_version") == 2
        and int(payload.get("max_concurrent_requests", 0)) > 0
    )


async def sweep_python(urls: list[str], timeout_s: float, concurrency: int | None) -> int:
    import httpx

    timeout = httpx.Timeout(timeout_s, connect=min(0.5, timeout_s))
    async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:
        if concurrency is None:
            healthy = 0
            for url in urls:
                healthy += await probe_one(client, url)
            return healthy
        gate = asyncio.Semaphore(concurrency)

        async def guarded(url: str) -> bool:
            async with gate:
                return await probe_one(client, url)

        results = await asyncio.gather(*(guarded(url) for url in urls))
        return sum(results)


def python_worker(impl: str, url_file: str, timeout_s: float, limit: int | None) -> None:
    urls = read_urls(url_file)
    total = len(urls)
    if limit is not None and limit < total:
        urls = urls[:limit]
    concurrency = 50 if impl == "async50" else None
    cpu0 = cpu_seconds()
    wall0 = time.perf_counter()
    healthy = asyncio.run(sweep_python(urls, timeout_s, concurrency))
    wall = time.perf_counter() - wall0
    cpu = cpu_seconds() - cpu0
    scale = total / len(urls) if urls else 1.0
    print(
        json.dumps(
            {
                "impl": impl,
                "endpoints": total,
                "probed": len(urls),
                "extrapolated": scale != 1.0,
                "healthy": round(healthy * scale),
                "wall_s": wall * scale,
                "cpu_s": cpu * scale,
                "probes_per_cpu_s": len(urls) / cpu if cpu > 0 else 0.0,
                "max_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            }
        )
    )


def run_json(cmd: list[str], timeout: float) -> dict:
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=timeout)
    return json.loads(out.stdout.strip().splitlines()[-1])


def find_bench(explicit: str | None) -> str:
    if explicit:
        return explicit
    candidates = sorted(ROOT.glob("build/*/poller_bench"), key=lambda p: p.stat().st_mtime)
    if not candidates:
        sys.exit("poller_bench not found: build it (MINERU_HEALTH_BUILD_BENCH=ON) or pass --bench")
    return str(candidates[-1])


def live(benches: list[tuple[str, str]], sizes: str, hung: str, window_s: float) -> list[dict]:
    """Runs every (label, binary) on every scenario; prints one table."""
    rows: list[dict] = []
    print(
        f"{'build':<8} {'workers':>7} {'hung':>5} {'probes':>7} {'timeouts':>8} "
        f"{'cpu_s':>7} {'core':>6} {'us/probe':>9} {'x_healthy':>9} "
        f"{'us/timeout':>10} {'timeout_x':>9}"
    )
    for n in (int(x) for x in sizes.split(",")):
        for label, binary in benches:
            healthy_per_probe = None
            for pct in (int(x) for x in hung.split(",")):
                cmd = [binary, "--live", str(window_s), "--sizes", str(n), "--hung", str(pct)]
                r = run_json(cmd, 600)
                r["build"] = label
                per_probe = r["cpu_s"] / r["probes"] if r["probes"] else 0.0
                if pct == 0:
                    healthy_per_probe = per_probe
                ratio = per_probe / healthy_per_probe if healthy_per_probe else None
                per_timeout = None
                if healthy_per_probe is not None and r["timeouts"]:
                    rest = r["cpu_s"] - r["healthy"] * healthy_per_probe
                    per_timeout = rest / r["timeouts"]
                r["cpu_per_probe_ratio_vs_healthy"] = ratio
                r["cpu_per_timeout_us"] = per_timeout * 1e6 if per_timeout is not None else None
                r["timeout_ratio_vs_healthy_probe"] = (
                    per_timeout / healthy_per_probe
                    if per_timeout is not None and healthy_per_probe
                    else None
                )
                print(
                    f"{label:<8} {n:>7} {pct:>4}% {r['probes']:>7} {r['timeouts']:>8} "
                    f"{r['cpu_s']:>7.3f} {r['core_share']:>6.2f} {per_probe * 1e6:>9.1f} "
                    f"{(ratio or 0):>8.2f}x "
                    f"{(r['cpu_per_timeout_us'] or 0):>10.1f} "
                    f"{(r['timeout_ratio_vs_healthy_probe'] or 0):>8.2f}x",
                    flush=True,
                )
                rows.append(r)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bench")
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--hung", default="0,10")
    parser.add_argument("--timeout", type=float, default=1.0)
    parser.add_argument("--seq-limit", type=int, default=1000)
    parser.add_argument("--seq-limit-hung", type=int, default=200)
    parser.add_argument("--json")
    parser.add_argument("--live", type=float, help="seconds per live-poller scenario")
    parser.add_argument("--compare", help="a second poller_bench build to run alongside")
    parser.add_argument("--worker", choices=["sequential", "async50"], help=argparse.SUPPRESS)
    parser.add_argument("--urls", help=argparse.SUPPRESS)
    parser.add_argument("--limit", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        python_worker(args.worker, args.urls, args.timeout, args.limit)
        return

    bench = find_bench(args.bench)
    if args.live:
        benches = [("current", bench)]
        if args.compare:
            benches.append(("compare", args.compare))
        sizes = args.sizes if args.sizes != "100,1000,10000" else "2000,10000"
        hung = args.hung if args.hung != "0,10" else "0,10,50"
        live_rows = live(benches, sizes, hung, args.live)
        if args.json:
            Path(args.json).write_text(json.dumps(live_rows, indent=2) + "\n", encoding="utf-8")
        return
    rows: list[dict] = []
    print(
        f"{'endpoints':>9} {'hung':>5} {'impl':<11} {'wall_s':>9} {'cpu_s':>8} "
        f"{'probes/cpu_s':>12} {'rss_MiB':>8} {'healthy':>8}  wall_x  cpu_x"
    )
    for n in (int(x) for x in args.sizes.split(",")):
        for pct in (int(x) for x in args.hung.split(",")):
            with tempfile.TemporaryDirectory() as tmp:
                url_file = os.path.join(tmp, "urls.txt")
                server = subprocess.Popen(
                    [bench, "--serve", str(n), str(pct), url_file],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                try:
                    ready = server.stdout.readline() if server.stdout else ""
                    if not ready.startswith("READY"):
                        sys.exit(f"responders did not start for {n} endpoints")
                    results = [
                        run_json([bench, "--sweep", url_file, "--timeout", str(args.timeout)], 600)
                    ]
                    results[0]["impl"] = "cpp"
                    results[0]["extrapolated"] = False
                    for impl in ("async50", "sequential"):
                        cmd = [
                            sys.executable,
                            __file__,
                            "--worker",
                            impl,
                            "--urls",
                            url_file,
                            "--timeout",
                            str(args.timeout),
                        ]
                        limit = args.seq_limit_hung if pct else args.seq_limit
                        if impl == "sequential" and n > limit:
                            cmd += ["--limit", str(limit)]
                        results.append(run_json(cmd, 900))
                finally:
                    if server.stdin:
                        server.stdin.close()
                    server.wait(timeout=60)
            base = results[0]
            for r in results:
                r.update(endpoints=n, hung_pct=pct)
                r["wall_ratio_vs_cpp"] = r["wall_s"] / base["wall_s"] if base["wall_s"] else None
                r["cpu_ratio_vs_cpp"] = r["cpu_s"] / base["cpu_s"] if base["cpu_s"] else None
                mark = " (extrapolated)" if r.get("extrapolated") else ""
                print(
                    f"{n:>9} {pct:>4}% {r['impl']:<11} {r['wall_s']:>9.3f} {r['cpu_s']:>8.3f} "
                    f"{r['probes_per_cpu_s']:>12.0f} {r['max_rss_kb'] / 1024:>8.1f} "
                    f"{r['healthy']:>8} {r['wall_ratio_vs_cpp']:>6.1f}x "
                    f"{r['cpu_ratio_vs_cpp']:>5.1f}x{mark}",
                    flush=True,
                )
                rows.append(r)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

"""What the router's store writes cost its event loop (issue 35), no processes.

8 clients at once each have ``--jobs``/8 submissions kept by one supervisor (a ~1 KB row),
the row written either on the event loop (``Supervisor.commit``: how every write was made
before) or on a thread (``Supervisor.commit_off_loop``), against the SQLite file and
against PostgreSQL on loopback (a server started here with its durable settings, where
Debian's binaries and psycopg are installed: ``tests/harness/postgres.py``). Arms alternate
in one run, ``--rounds`` times. A ticker coroutine asks for 1 ms sleeps meanwhile: how late
it wakes is how long the loop was held (what every other request of the router waits).
Reported per arm, the median over the rounds: the ticker's p99 and largest delay, the
submissions' p50 and p99 (keep + row written, as each client sees it: a client's clock
does not run while the loop is held, so the on-loop arm's look shorter than they are), and
submissions per second; then the ratios thread / loop.

    python bench/router_store/loop_stall.py [--jobs 400] [--rounds 3] [--json out.json]

Timings depend on the machine (a shared 2-core one is noisy): read the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from mineru_health.runtime.router.line import Kept, Snapshot
from mineru_health.runtime.router.store import RouterStore
from mineru_health.runtime.router.supervisor import Supervisor
from mineru_health.runtime.settings import HealthSettings

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # the tests' harness
from harness import postgres

CLIENTS = 8
TICK_S = 0.001


class RowLine:
    """A line reduced to what keeping a submission and writing its row call."""

    def snapshot(self, kept: Kept) -> Snapshot:
        record = {"task": {"task_id": kept.key, "file_names": ["report"], "pad": "x" * 900}}
        return Snapshot(state="pending", upstream_id="up-1", source="/kept/r", record=record)

    def release(self, kept: Kept) -> None:
        pass


def quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def one_arm(store: Any, off_loop: bool, jobs: int, tag: str) -> dict[str, float]:
    settings = HealthSettings.preset("production")
    supervisor = Supervisor(SimpleNamespace(), RowLine(), settings, store=store)  # type: ignore[arg-type]
    delays: list[float] = []
    submissions: list[float] = []
    running = True

    async def ticker() -> None:
        while running:
            start = time.perf_counter()
            await asyncio.sleep(TICK_S)
            delays.append(time.perf_counter() - start - TICK_S)

    async def client(first: int) -> None:
        for n in range(first, jobs, CLIENTS):
            start = time.perf_counter()
            kept = supervisor.keep(f"{tag}-{n}", None, "w0", "http://w0:1", save=False)
            if off_loop:
                await supervisor.commit_off_loop(kept)
            else:
                supervisor.commit(kept)
            submissions.append(time.perf_counter() - start)
            await asyncio.sleep(0)  # its next request: the others get their turn

    tick = asyncio.create_task(ticker())
    start = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(CLIENTS)))
    wall = time.perf_counter() - start
    running = False
    await tick
    # Not closed: the store serves the next arm (asyncio.run cancels its idle sweep).
    delays.sort()
    submissions.sort()
    return {
        "loop_delay_p99_ms": quantile(delays, 0.99) * 1e3,
        "loop_delay_max_ms": delays[-1] * 1e3,
        "submit_p50_ms": quantile(submissions, 0.5) * 1e3,
        "submit_p99_ms": quantile(submissions, 0.99) * 1e3,
        "per_s": jobs / wall,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    stores: dict[str, Any] = {}
    server = None
    with tempfile.TemporaryDirectory() as tmp:
        stores["sqlite"] = RouterStore(Path(tmp) / "router.sqlite3")
        if postgres.unavailable() is None:
            from mineru_health.runtime.router.pg_store import PostgresStore

            server = postgres.PostgresServer.start(durable=True)
            stores["postgresql"] = PostgresStore.open(
                server.new_database(), router_id="bench", kept_dir=None
            )
        else:
            print(f"PostgreSQL left out: {postgres.unavailable()}", file=sys.stderr)
        runs: dict[str, list[dict[str, float]]] = {}
        try:
            for round_ in range(args.rounds):
                order = (False, True) if round_ % 2 == 0 else (True, False)
                for backend, store in stores.items():
                    for off_loop in order:
                        arm = f"{backend} {'thread' if off_loop else 'loop'}"
                        tag = f"{arm}-{round_}".replace(" ", "-")
                        result = asyncio.run(one_arm(store, off_loop, args.jobs, tag))
                        runs.setdefault(arm, []).append(result)
        finally:
            for store in stores.values():
                store.close()
            if server is not None:
                server.stop()
    report: dict[str, Any] = {
        arm: {k: statistics.median(r[k] for r in results) for k in results[0]}
        for arm, results in runs.items()
    }
    print(f"{args.jobs} submissions from {CLIENTS} clients, median of {args.rounds} rounds")
    for arm, figures in report.items():
        print(f"{arm:18s} " + "  ".join(f"{k} {v:9.2f}" for k, v in figures.items()))
    for backend in stores:
        loop, thread = report[f"{backend} loop"], report[f"{backend} thread"]
        ratios = {k: thread[k] / loop[k] for k in loop}
        report[f"{backend} thread/loop"] = ratios
        print(f"{backend:10s} thread/loop " + "  ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

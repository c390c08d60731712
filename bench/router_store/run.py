"""What the router's store costs (issue 24): per job, and in jobs per second through a real router.

Part 1, the raw cost, no processes: one job's writes as the supervisor makes
them (its row when accepted, again when it ends; a realistic MinerU 3.x
record of ~1 KB), N jobs, on

1. ``:memory:`` (the same SQL, nothing on disk: the baseline),
2. the file as shipped (WAL, ``synchronous=NORMAL``),
3. the file with ``synchronous=FULL`` (an fsync per commit: power-loss safe too),
4. the file as shipped without the check that follows each write (is the file at
   the store's path still the one it writes: issue 31), and that check alone,

and the same two writes as the supervisor makes them with MinerU 3.x's line
(its snapshot of a real ``RouterTaskRecord`` and staged form, then the
write), the move of a staged upload into the router's state directory
(3.x; a rename on one file system), the file's size per job, and how long
a new router takes to read N rows back.

Part 2, end to end: the patched ``mineru-router`` with two real local
workers, in the same run, alternately without a store (no
``MINERU_HEALTH_STATE_DIR``: nothing outlives the router, as before) and
with one, ``--rounds`` times each (the order alternates between rounds):
``--jobs`` submissions from 8 client threads at once, then every one
followed to its end. Reported per arm: submissions accepted per second (the
path the writes are on), jobs completed per second, and the router
process's CPU time per job (user + system, from ``/proc``: what the store
adds to the router itself, the least noisy of the three on a shared
machine), and the ratios store / none. ``--line 3`` (the default;
the fake VLM server as engine) or ``--line 4`` (flash tier, text PDFs;
``MINERU_HEALTH_MINERU4_PYTHON``).

    python bench/router_store/run.py [--jobs-raw 2000] [--part 1|2|all] [--line 3|4]
                                     [--jobs 48] [--rounds 4] [--json out.json]

Timings depend on the machine (a shared 2-core one is noisy): read the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from mineru_health.runtime.router.store import DB_NAME, RouterStore, Saved

RECORD = {
    "task": {"task_id": "00000000-0000-4000-8000-000000000000", "upstream_server_id":
             "local-gpu-0", "upstream_task_id": "11111111-1111-4111-8111-111111111111",
             "upstream_base_url": "http://127.0.0.1:40123", "backend": "vlm-http-client",
             "file_names": ["quarterly-report-2026"], "created_at": "2026-12-04T10:00:00+00:00",
             "status": "pending", "started_at": None, "completed_at": None, "error": None,
             "queued_ahead": 3, "upstream_error_count": 0},
    "fields": [["backend", "vlm-http-client"], ["server_url", "http://127.0.0.1:30000"],
               ["lang_list", "ch"], ["return_md", "true"], ["formula_enable", "true"],
               ["table_enable", "true"], ["parse_method", "auto"]],
    "uploads": [{"field_name": "files", "upload_name": "quarterly-report-2026.pdf",
                 "content_type": "application/pdf",
                 "path": "/var/lib/mineru-router/kept/mineru-router-request-abcdefgh/"
                         "quarterly-report-2026.pdf"}],
}


def one_job(store: RouterStore, index: int) -> float:
    """The supervisor's two writes of one job (accepted, then ended); seconds."""
    key = f"{index:08d}-0000-4000-8000-000000000000"
    accepted = Saved(key, "pending", "local-gpu-0", f"up-{index}", "http://127.0.0.1:40123",
                     ["local-gpu-0"], f"/var/lib/mineru-router/kept/{key}", None, RECORD)
    ended = Saved(key, "completed", "local-gpu-0", f"up-{index}", "http://127.0.0.1:40123",
                  ["local-gpu-0"], "", None, RECORD, accepted.accepted_at)
    start = time.perf_counter()
    store.save(accepted)
    store.save(ended)
    return time.perf_counter() - start


def raw(jobs: int, root: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, path, synchronous in (("memory", ":memory:", None),
                                    ("normal", root / "normal" / DB_NAME, None),
                                    ("full", root / "full" / DB_NAME, "FULL")):
        if isinstance(path, Path):
            path.parent.mkdir(parents=True)
        store = RouterStore(path)
        if synchronous:
            store._db.execute(f"PRAGMA synchronous={synchronous}")
        count = jobs if synchronous is None else max(1, jobs // 10)
        times = [one_job(store, i) for i in range(count)]
        entry: dict[str, Any] = {"median_us": statistics.median(times) * 1e6,
                                 "p99_us": sorted(times)[int(0.99 * (count - 1))] * 1e6,
                                 "jobs_per_s": count / sum(times)}
        if name == "normal":
            store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            assert isinstance(path, Path)
            entry["bytes_per_job"] = sum(p.stat().st_size for p in path.parent.iterdir()) / count
            store.close()
            start = time.perf_counter()
            rows = RouterStore(path).rows()
            entry["read_back_s"] = time.perf_counter() - start
            assert len(rows) == count
        results[name] = entry
    results["check_median_us"], results["check_us"] = unchecked(jobs, root / "check")
    line_times = through_the_line(root / "line" / DB_NAME, jobs)
    if line_times:
        results["line3_median_us"] = statistics.median(line_times) * 1e6
    moves = []
    for i in range(min(jobs, 500)):
        staged = root / "tmp" / f"mineru-router-request-{i}"
        staged.mkdir(parents=True)
        (staged / "doc.pdf").write_bytes(b"%PDF-1.4\n" + b"x" * 200_000)
        start = time.perf_counter()
        shutil.move(str(staged), str(root / "kept" / staged.name))
        moves.append(time.perf_counter() - start)
    results["move_staged_median_us"] = statistics.median(moves) * 1e6
    return results


def unchecked(jobs: int, root: Path) -> tuple[dict[str, float], float]:
    """One job's writes to the file as shipped, with and without the check that follows each
    write (two stores, jobs alternating between them: the same noise on both), medians in us;
    and that check alone, median us."""
    stores = {}
    for arm in ("checked", "unchecked"):
        (root / arm).mkdir(parents=True)
        stores[arm] = RouterStore(root / arm / DB_NAME)
    check = stores["checked"]._vanished
    checks = []
    for _ in range(max(1000, jobs)):
        start = time.perf_counter()
        assert check() is None
        checks.append(time.perf_counter() - start)
    stores["unchecked"]._vanished = lambda: None  # type: ignore[method-assign]
    times: dict[str, list[float]] = {"checked": [], "unchecked": []}
    for i in range(jobs):
        for arm in ("checked", "unchecked") if i % 2 else ("unchecked", "checked"):
            times[arm].append(one_job(stores[arm], i))
    for store in stores.values():
        store.close()
    return ({arm: statistics.median(t) * 1e6 for arm, t in times.items()},
            statistics.median(checks) * 1e6)


def through_the_line(path: Path, jobs: int) -> list[float]:
    """One job's two writes as the supervisor makes them on MinerU 3.x (snapshot + write);
    [] without MinerU 3.x."""
    try:
        from mineru.cli import router
    except ImportError:
        return []
    from types import SimpleNamespace

    from mineru_health.mineru3.router.tasks import Task, TaskLine
    from mineru_health.runtime.router.line import Kept
    from mineru_health.runtime.router.supervisor import Supervisor
    from mineru_health.settings import HealthSettings

    path.parent.mkdir(parents=True)
    line = TaskLine(SimpleNamespace(), {})
    supervisor = Supervisor(SimpleNamespace(), line, HealthSettings.preset("production"),
                            store=RouterStore(path))
    fields = {k: v for k, v in RECORD["task"].items()}
    times = []
    for index in range(jobs):
        record = router.RouterTaskRecord(**{**fields, "task_id": f"{index:08d}"})
        staged = f"/var/lib/mineru-router/kept/mineru-router-request-{index}"
        payload = router.MultipartPayload(
            temp_dir=staged, fields=[tuple(f) for f in RECORD["fields"]],
            uploads=[router.StagedUpload("files", "report.pdf", "application/pdf",
                                         f"{staged}/report.pdf")])
        kept = Kept(record.task_id, Task(record, payload, None), ["local-gpu-0"],
                    "http://127.0.0.1:40123", None, 0)
        start = time.perf_counter()
        supervisor.save(kept)  # accepted
        record.status = "completed"
        supervisor.save(kept)  # ended
        times.append(time.perf_counter() - start)
    return times


# --- part 2: a real router, with and without its store -------------------------------------


def through_router(line_name: str, jobs: int, rounds: int, root: Path) -> dict[str, Any]:
    from mineru_health.demo.fleet import (
        LINE3,
        LINE4,
        Client,
        fleet,
        start_fake_vlm,
        text_pdf,
    )
    from mineru_health.demo.sandbox import Processes, make_pdf, mineru4_python, mineru_python

    line = LINE4 if line_name == "4" else LINE3
    python = mineru4_python() if line is LINE4 else mineru_python()
    if python is None:
        raise SystemExit("MINERU_HEALTH_MINERU4_PYTHON is not set")
    site = line.site(root / "site", python, faults=False)
    env = {"MINERU_ROUTER_HEALTH_PRESET": "fast"}
    arms: dict[str, list[dict[str, float]]] = {"none": [], "store": []}
    with Processes() as procs:
        engine = start_fake_vlm(procs, root, python) if line is LINE3 else ""
        pdf = make_pdf(text="router store bench")

        def document(n: int) -> tuple[str, bytes]:
            return f"doc{n}.pdf", text_pdf(1, seed=n) if line is LINE4 else pdf

        for round_ in range(rounds):
            for arm in ("none", "store") if round_ % 2 == 0 else ("store", "none"):
                scratch = root / f"{arm}-{round_}"
                extra = dict(env)
                if arm == "store":
                    extra["MINERU_HEALTH_STATE_DIR"] = str(scratch / "state")
                with fleet(line, scratch, python, site=site, env=extra, fault_plan=None) as r:
                    client = Client(r.base, line, engine_url=engine)
                    for n in range(4):  # warm both workers
                        client.run(*document(10_000 + n))
                    arms[arm].append(measure(client, document, jobs, r.proc.pid))
                print(f"round {round_ + 1} {arm:5s}: {arms[arm][-1]}", file=sys.stderr)
    summary: dict[str, Any] = {arm: {k: statistics.mean(m[k] for m in runs) for k in runs[0]}
                               for arm, runs in arms.items()}
    summary["ratio"] = {k: summary["store"][k] / summary["none"][k] for k in summary["none"]}
    summary["runs"] = arms
    return summary


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(client: Any, document: Callable[[int], tuple[str, bytes]],
            jobs: int, router_pid: int) -> dict[str, float]:
    """``jobs`` submissions from 8 threads at once; each followed to its end."""
    cpu_before = cpu_s(router_pid)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=8) as pool:
        accepted = list(pool.map(lambda n: client.submit(*document(n))[0], range(jobs)))
    submitted_s = time.perf_counter() - start
    assert all(accepted), "a submission was refused"
    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(lambda task_id: client.wait(task_id), accepted))
    done_s = time.perf_counter() - start
    assert all(o.status == "completed" for o in outcomes), [o.detail for o in outcomes]
    return {"accepted_per_s": jobs / submitted_s, "completed_per_s": jobs / done_s,
            "router_cpu_ms_per_job": (cpu_s(router_pid) - cpu_before) * 1e3 / jobs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("1", "2", "all"), default="all")
    parser.add_argument("--jobs-raw", type=int, default=2000)
    parser.add_argument("--line", choices=("3", "4"), default="3")
    parser.add_argument("--jobs", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="mineru-health-router-store-") as tmp:
        if args.part in ("1", "all"):
            part1 = report["raw"] = raw(args.jobs_raw, Path(tmp) / "raw")
            memory, normal, full = part1["memory"], part1["normal"], part1["full"]
            unchecked_us = part1["check_median_us"]["unchecked"]
            checked_us = part1["check_median_us"]["checked"]
            rows = [
                ("one job's writes, :memory: (median us)", f"{memory['median_us']:.1f}", ""),
                ("one job's writes, file, WAL + NORMAL (median us)", f"{normal['median_us']:.1f}",
                 f"{normal['median_us'] / memory['median_us']:.2f}x :memory:"),
                ("  p99 (us)", f"{normal['p99_us']:.1f}", ""),
                ("one job's writes, file, without / with the check (median us)",
                 f"{unchecked_us:.1f} / {checked_us:.1f}",
                 f"{checked_us / unchecked_us:.3f}x (jobs alternating)"),
                ("the check after each write, alone (median us)", f"{part1['check_us']:.2f}",
                 "stat + pread of the file, stat + pread of its -wal"),
                ("one job's writes, file, WAL + FULL (median us)", f"{full['median_us']:.1f}",
                 f"{full['median_us'] / normal['median_us']:.1f}x NORMAL"),
                ("jobs' writes per second, NORMAL", f"{normal['jobs_per_s']:.0f}", ""),
                ("one job's writes through the 3.x line (snapshot + write, median us)",
                 f"{part1.get('line3_median_us', float('nan')):.1f}", "as the supervisor makes them"),
                ("move of a staged upload into the state dir (median us)",
                 f"{part1['move_staged_median_us']:.1f}", "same file system: a rename"),
                ("disk per job (bytes, after checkpoint)", f"{normal['bytes_per_job']:.0f}", ""),
                (f"read {args.jobs_raw} rows back at start-up (ms)",
                 f"{normal['read_back_s'] * 1e3:.1f}", ""),
            ]
            width = max(len(r[0]) for r in rows)
            for name, value, note in rows:
                print(f"{name.ljust(width)}  {value.rjust(10)}  {note}")
        if args.part in ("2", "all"):
            part2 = report["router"] = through_router(args.line, args.jobs, args.rounds,
                                                      Path(tmp) / "router")
            print(f"\nline {args.line}, {args.jobs} jobs x {args.rounds} rounds per arm "
                  "(8 client threads)")
            for key in ("accepted_per_s", "completed_per_s", "router_cpu_ms_per_job"):
                print(f"{key:22s}  none {part2['none'][key]:8.2f}  "
                      f"store {part2['store'][key]:8.2f}  ratio store/none "
                      f"{part2['ratio'][key]:.3f}")
            if "raw" in report and "line3_median_us" in report["raw"]:
                share = report["raw"]["line3_median_us"] / 1e3 / part2["none"][
                    "router_cpu_ms_per_job"]
                print(f"the store's writes per job against the router's CPU per job without "
                      f"it: {share:.2%}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

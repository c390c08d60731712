"""What the router's store costs (issue 24): per job, and in jobs per second through a real router.

Part 1, the raw cost, no processes: one job's writes as the supervisor makes
them (its row when accepted, again when it ends; a realistic MinerU 3.x
record of ~1 KB), N jobs, on

1. ``:memory:`` (the same SQL, nothing on disk: the baseline),
2. the file as shipped (WAL, ``synchronous=NORMAL``),
3. the file with ``synchronous=FULL`` (an fsync per commit: power-loss safe too),
4. the file as shipped without the check that follows each write (is the file at
   the store's path still the one it writes: issue 31), and that check alone,
5. PostgreSQL (``MINERU_ROUTER_HEALTH_STORE_URL``, issue 35) on loopback, a server
   started here with its own durable settings (every commit flushed), where Debian's
   binaries and psycopg are installed (``tests/harness/postgres.py``); there also the
   same writes with the job's upload kept in the database (0.2, 2 and 20 MB of
   incompressible bytes, jobs alternating with the rows alone: the ratio), the part of
   it before the client's answer, and how fast a router on another node reads such an
   upload back (``kept_uploads.restore``),

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

Part 3, submission latency (issue 35): the patched ``mineru-router`` with two
real local workers and a durable state directory, its rows alternately in the
SQLite file and in PostgreSQL on loopback (a server started here with its
durable settings), ``--rounds`` times each (the order alternates), in the
same run: ``--jobs`` submissions one after another, each timed from the
client (send to 202), then every one followed to its end. Reported: p50 and
p99 per arm over every round's submissions, and the ratios PostgreSQL /
SQLite.

Part 4, several routers (issue 35): jobs per second through 1 router and through
3 routers sharing one PostgreSQL on loopback (a server started here with its
durable settings), the same two remote ``mineru-api`` workers behind both arms
(``--upstream-url``, started once; the fake VLM with no delay as engine: the
routers and the store, not the engine, are the work), ``--rounds`` times each
(the order alternates), in the same run: each arm's routers start on a new
database, then ``--jobs`` submissions from 8 client threads at once, spread
over the arm's routers in turn, each followed to its end. Reported per arm:
submissions accepted per second, jobs completed per second, the routers' CPU
time per job (all of them, from ``/proc``), and the ratios 3 routers / 1. 3.x only.

    python bench/router_store/run.py [--jobs-raw 2000] [--part 1|2|3|4|all] [--line 3|4]
                                     [--jobs 48] [--rounds 4] [--json out.json]

Timings depend on the machine (a shared 2-core one is noisy): read the ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # the tests' harness
from harness import postgres

RECORD = {
    "task": {
        "task_id": "00000000-0000-4000-8000-000000000000",
        "upstream_server_id": "local-gpu-0",
        "upstream_task_id": "11111111-1111-4111-8111-111111111111",
        "upstream_base_url": "http://127.0.0.1:40123",
        "backend": "vlm-http-client",
        "file_names": ["quarterly-report-2026"],
        "created_at": "2026-12-04T10:00:00+00:00",
        "status": "pending",
        "started_at": None,
        "completed_at": None,
        "error": None,
        "queued_ahead": 3,
        "upstream_error_count": 0,
    },
    "fields": [
        ["backend", "vlm-http-client"],
        ["server_url", "http://127.0.0.1:30000"],
        ["lang_list", "ch"],
        ["return_md", "true"],
        ["formula_enable", "true"],
        ["table_enable", "true"],
        ["parse_method", "auto"],
    ],
    "uploads": [
        {
            "field_name": "files",
            "upload_name": "quarterly-report-2026.pdf",
            "content_type": "application/pdf",
            "path": "/var/lib/mineru-router/kept/mineru-router-request-abcdefgh/"
            "quarterly-report-2026.pdf",
        }
    ],
}


def one_job(store: Any, index: int) -> float:
    """The supervisor's two writes of one job (accepted, then ended); seconds."""
    key = f"{index:08d}-0000-4000-8000-000000000000"
    accepted = Saved(
        key,
        "pending",
        "local-gpu-0",
        f"up-{index}",
        "http://127.0.0.1:40123",
        ["local-gpu-0"],
        f"/var/lib/mineru-router/kept/{key}",
        None,
        RECORD,
    )
    ended = Saved(
        key,
        "completed",
        "local-gpu-0",
        f"up-{index}",
        "http://127.0.0.1:40123",
        ["local-gpu-0"],
        "",
        None,
        RECORD,
        accepted.accepted_at,
    )
    start = time.perf_counter()
    store.save(accepted)
    store.save(ended)
    return time.perf_counter() - start


def raw(jobs: int, root: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, path, synchronous in (
        ("memory", ":memory:", None),
        ("normal", root / "normal" / DB_NAME, None),
        ("full", root / "full" / DB_NAME, "FULL"),
    ):
        if isinstance(path, Path):
            path.parent.mkdir(parents=True)
        store = RouterStore(path)
        if synchronous:
            store._db.execute(f"PRAGMA synchronous={synchronous}")
        count = jobs if synchronous is None else max(1, jobs // 10)
        times = [one_job(store, i) for i in range(count)]
        entry: dict[str, Any] = {
            "median_us": statistics.median(times) * 1e6,
            "p99_us": sorted(times)[int(0.99 * (count - 1))] * 1e6,
            "jobs_per_s": count / sum(times),
        }
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
    if postgres.unavailable() is None:
        results["postgresql"] = on_postgresql(jobs, root / "postgresql")
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


def on_postgresql(jobs: int, root: Path) -> dict[str, Any]:
    """One job's writes in PostgreSQL on loopback (a server started with its durable
    settings), and ``jobs`` rows read back by a new router of the same name; then the
    same with its upload kept (``with_upload``)."""
    from mineru_health.runtime.router.pg_store import PostgresStore

    server = postgres.PostgresServer.start(durable=True)
    try:
        url = server.new_database()
        store = PostgresStore(url, router_id="bench")
        times = [one_job(store, i) for i in range(jobs)]
        store.close()
        again = PostgresStore(url, router_id="bench")
        start = time.perf_counter()
        rows = again.rows()
        read_back_s = time.perf_counter() - start
        again.close()
        assert len(rows) == jobs
        uploads = with_upload(server.new_database(), jobs, root)
    finally:
        server.stop()
    return {
        "median_us": statistics.median(times) * 1e6,
        "p99_us": sorted(times)[int(0.99 * (jobs - 1))] * 1e6,
        "jobs_per_s": jobs / sum(times),
        "read_back_s": read_back_s,
        "uploads": uploads,
    }


#: Upload sizes of the kept-upload arms: a small scanned page, a typical report, a large one.
UPLOAD_SIZES = (200_000, 2_000_000, 20_000_000)


def with_upload(url: str, jobs: int, root: Path) -> dict[str, Any]:
    """What keeping a job's upload in PostgreSQL adds (issue 35): per upload size, ``jobs``
    jobs alternating between the rows only (``one_job``) and the rows plus the upload as
    the supervisor keeps it (its row, then its files, before the client's answer; at its
    end the row, then its uploads dropped), in one run; medians in ms and their ratio. And
    what a router that takes such a row over on another node pays to read it back
    (``kept_uploads.restore``), MB/s."""
    from mineru_health.runtime.router import kept_uploads
    from mineru_health.runtime.router.pg_store import PostgresStore

    store = PostgresStore(url, router_id="bench")
    taker = PostgresStore(url, router_id="taker")
    results: dict[str, Any] = {}
    try:
        for size in UPLOAD_SIZES:
            staged = root / f"upload-{size}" / "mineru-router-request-x"
            staged.mkdir(parents=True)
            (staged / "doc.pdf").write_bytes(b"%PDF-1.4\n" + os.urandom(size - 9))  # compressed
            arms: dict[str, list[float]] = {"rows": [], "accepted": [], "kept": []}
            for i in range(max(5, min(40, jobs // 10, 400_000_000 // size))):
                for arm in ("rows", "kept") if i % 2 else ("kept", "rows"):
                    index = size * 10 + 2 * i + (arm == "kept")
                    if arm == "rows":
                        arms[arm].append(one_job(store, index))
                        continue
                    accepted, taken = kept_job(store, index, staged, kept_uploads)
                    arms["accepted"].append(accepted)
                    arms[arm].append(taken)
            reads = []
            for i in range(3):
                key = f"read-{size}-{i}"
                saved = Saved(key, "pending", "w", "u", "http://w:1", ["w"], str(staged), None, {})
                assert store.save(saved) and kept_uploads.keep(store, saved)
                gone = dataclasses.replace(saved, source=str(root / "gone" / staged.name))
                into = root / f"restored-{size}-{i}"
                into.mkdir()
                start = time.perf_counter()
                kept_uploads.restore(taker, gone, into)
                reads.append(time.perf_counter() - start)
            rows_ms = statistics.median(arms["rows"]) * 1e3
            results[str(size)] = {
                "rows_ms": rows_ms,
                "accepted_ms": statistics.median(arms["accepted"]) * 1e3,
                "kept_ms": statistics.median(arms["kept"]) * 1e3,
                "ratio": statistics.median(arms["kept"]) * 1e3 / rows_ms,
                "restore_mb_per_s": size / 1e6 / statistics.median(reads),
            }
            shutil.rmtree(root / f"upload-{size}")
    finally:
        store.close()
        taker.close()
    return results


def kept_job(store: Any, index: int, staged: Path, kept_uploads: Any) -> tuple[float, float]:
    """One job's writes with its upload kept, as the supervisor makes them: (seconds to
    its client's answer, seconds in all)."""
    key = f"{index:08d}-0000-4000-8000-000000000000"
    accepted = Saved(
        key, "pending", "w", "up", "http://127.0.0.1:40123", ["w"], str(staged), None, RECORD
    )
    start = time.perf_counter()
    assert store.save(accepted) and kept_uploads.keep(store, accepted)
    answered = time.perf_counter()
    ended = dataclasses.replace(accepted, state="completed", source="")
    assert store.save(ended)
    kept_uploads.drop(store, key)
    return answered - start, time.perf_counter() - start


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
    return (
        {arm: statistics.median(t) * 1e6 for arm, t in times.items()},
        statistics.median(checks) * 1e6,
    )


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
    from mineru_health.runtime.settings import HealthSettings

    path.parent.mkdir(parents=True)
    line = TaskLine(SimpleNamespace(), {})
    supervisor = Supervisor(
        SimpleNamespace(), line, HealthSettings.preset("production"), store=RouterStore(path)
    )
    fields = {k: v for k, v in RECORD["task"].items()}
    times = []
    for index in range(jobs):
        record = router.RouterTaskRecord(**{**fields, "task_id": f"{index:08d}"})
        staged = f"/var/lib/mineru-router/kept/mineru-router-request-{index}"
        payload = router.MultipartPayload(
            temp_dir=staged,
            fields=[tuple(f) for f in RECORD["fields"]],
            uploads=[
                router.StagedUpload(
                    "files", "report.pdf", "application/pdf", f"{staged}/report.pdf"
                )
            ],
        )
        kept = Kept(
            record.task_id,
            Task(record, payload, None),
            ["local-gpu-0"],
            "http://127.0.0.1:40123",
            None,
            0,
        )
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
    summary: dict[str, Any] = {
        arm: {k: statistics.mean(m[k] for m in runs) for k in runs[0]} for arm, runs in arms.items()
    }
    summary["ratio"] = {k: summary["store"][k] / summary["none"][k] for k in summary["none"]}
    summary["runs"] = arms
    return summary


# --- part 3: submission latency through a real router, SQLite vs PostgreSQL -----------------


def submission_latency(line_name: str, jobs: int, rounds: int, root: Path) -> dict[str, Any]:
    """p50/p99 of one submission (client send to 202), the router's rows in its SQLite
    file or in PostgreSQL on loopback, arms alternating in one run."""
    from mineru_health.demo.fleet import LINE3, LINE4, Client, fleet, start_fake_vlm, text_pdf
    from mineru_health.demo.sandbox import Processes, make_pdf, mineru4_python, mineru_python

    reason = postgres.unavailable()
    if reason is not None:
        raise SystemExit(f"part 3 needs PostgreSQL: {reason}")
    line = LINE4 if line_name == "4" else LINE3
    python = mineru4_python() if line is LINE4 else mineru_python()
    if python is None:
        raise SystemExit("MINERU_HEALTH_MINERU4_PYTHON is not set")
    site = line.site(root / "site", python, faults=False)
    arms: dict[str, list[float]] = {"sqlite": [], "postgresql": []}
    server = postgres.PostgresServer.start(durable=True)
    try:
        with Processes() as procs:
            engine = start_fake_vlm(procs, root, python) if line is LINE3 else ""
            pdf = make_pdf(text="router store latency bench")

            def document(n: int) -> tuple[str, bytes]:
                return f"doc{n}.pdf", text_pdf(1, seed=n) if line is LINE4 else pdf

            for round_ in range(rounds):
                order = ("sqlite", "postgresql") if round_ % 2 == 0 else ("postgresql", "sqlite")
                for arm in order:
                    scratch = root / f"latency-{arm}-{round_}"
                    env = {
                        "MINERU_ROUTER_HEALTH_PRESET": "fast",
                        "MINERU_HEALTH_STATE_DIR": str(scratch / "state"),
                    }
                    if arm == "postgresql":
                        env["MINERU_ROUTER_HEALTH_STORE_URL"] = server.new_database()
                        env["MINERU_ROUTER_HEALTH_ROUTER_ID"] = "bench"
                    with fleet(line, scratch, python, site=site, env=env, fault_plan=None) as r:
                        client = Client(r.base, line, engine_url=engine)
                        for n in range(4):  # warm both workers and the store
                            client.run(*document(10_000 + n))
                        times = []
                        for n in range(jobs):
                            start = time.perf_counter()
                            task_id, refusal = client.submit(*document(n))
                            times.append(time.perf_counter() - start)
                            assert task_id, refusal
                        outcomes = [client.wait(t) for t in client.task_ids[4:]]
                        assert all(o.status == "completed" for o in outcomes), outcomes
                    arms[arm].extend(times)
                    print(
                        f"round {round_ + 1} {arm:10s}: p50 "
                        f"{statistics.median(times) * 1e3:.1f} ms",
                        file=sys.stderr,
                    )
    finally:
        server.stop()
    summary: dict[str, Any] = {arm: percentiles(times) for arm, times in arms.items()}
    summary["ratio"] = {
        k: summary["postgresql"][k] / summary["sqlite"][k] for k in summary["sqlite"]
    }
    summary["samples"] = {arm: len(times) for arm, times in arms.items()}
    return summary


# --- part 4: jobs/s through 1 router vs 3 routers on one PostgreSQL -----------------------

#: The arms of part 4: routers sharing the store.
ROUTER_ARMS = (1, 3)


def several_routers(jobs: int, rounds: int, root: Path) -> dict[str, Any]:
    """Jobs/s through 1 and through 3 routers on one PostgreSQL, the same two remote
    workers behind both, arms alternating in one run (3.x)."""
    from mineru_health.demo.fleet import LINE3, Client, start_fake_vlm, start_worker
    from mineru_health.demo.sandbox import Processes, make_pdf, mineru_python
    from shared_routers import start_routers  # the tests' several routers

    reason = postgres.unavailable()
    if reason is not None:
        raise SystemExit(f"part 4 needs PostgreSQL: {reason}")
    python = mineru_python()
    site = LINE3.site(root / "site", python, faults=False)
    pdf = make_pdf(text="several routers bench")
    arms: dict[int, list[dict[str, float]]] = {n: [] for n in ROUTER_ARMS}
    server = postgres.PostgresServer.start(durable=True)
    try:
        with Processes() as shared:
            engine = start_fake_vlm(shared, root, python)
            workers = [
                start_worker(shared, LINE3, site, python, root / f"worker-{n}", name=f"api-{n}")
                for n in range(2)
            ]

            for round_ in range(rounds):
                for count in ROUTER_ARMS if round_ % 2 == 0 else ROUTER_ARMS[::-1]:
                    url = server.new_database()
                    with Processes() as procs:
                        routers = start_routers(
                            procs,
                            LINE3,
                            python,
                            site,
                            [worker.proc.base_url for worker in workers],
                            url,
                            root / f"routers-{count}-{round_}",
                            count=count,
                            env={"MINERU_ROUTER_HEALTH_PRESET": "fast"},
                        )
                        clients = [Client(r.base, LINE3, engine_url=engine) for r in routers]
                        for n in range(2 * len(clients)):  # warm every router and worker
                            clients[n % len(clients)].run(f"warm{n}.pdf", pdf)
                        arms[count].append(
                            measure_spread(clients, pdf, jobs, [r.proc.pid for r in routers])
                        )
                    print(
                        f"round {round_ + 1} {count} router(s): {arms[count][-1]}", file=sys.stderr
                    )
    finally:
        server.stop()
    one, three = ROUTER_ARMS
    summary: dict[str, Any] = {
        f"{n}_routers": {k: statistics.mean(m[k] for m in runs) for k in runs[0]}
        for n, runs in arms.items()
    }
    summary["ratio"] = {
        k: summary[f"{three}_routers"][k] / summary[f"{one}_routers"][k]
        for k in summary[f"{one}_routers"]
    }
    summary["runs"] = {str(n): runs for n, runs in arms.items()}
    return summary


def measure_spread(clients: list[Any], pdf: bytes, jobs: int, pids: list[int]) -> dict[str, float]:
    """``jobs`` submissions from 8 threads at once, job n through ``clients[n % len]``;
    each followed to its end through the router that accepted it."""
    cpu_before = sum(cpu_s(pid) for pid in pids)

    def submit(n: int) -> tuple[Any, str]:
        client = clients[n % len(clients)]
        task_id, refusal = client.submit(f"doc{n}.pdf", pdf)
        assert task_id, refusal
        return client, task_id

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=8) as pool:
        accepted = list(pool.map(submit, range(jobs)))
    submitted_s = time.perf_counter() - start
    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(lambda job: job[0].wait(job[1]), accepted))
    done_s = time.perf_counter() - start
    assert all(o.status == "completed" for o in outcomes), [o.detail for o in outcomes]
    return {
        "accepted_per_s": jobs / submitted_s,
        "completed_per_s": jobs / done_s,
        "routers_cpu_ms_per_job": (sum(cpu_s(pid) for pid in pids) - cpu_before) * 1e3 / jobs,
    }


def percentiles(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "p50_ms": statistics.median(ordered) * 1e3,
        "p99_ms": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))] * 1e3,
    }


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(
    client: Any, document: Callable[[int], tuple[str, bytes]], jobs: int, router_pid: int
) -> dict[str, float]:
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
    return {
        "accepted_per_s": jobs / submitted_s,
        "completed_per_s": jobs / done_s,
        "router_cpu_ms_per_job": (cpu_s(router_pid) - cpu_before) * 1e3 / jobs,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("1", "2", "3", "4", "all"), default="all")
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
                (
                    "one job's writes, file, WAL + NORMAL (median us)",
                    f"{normal['median_us']:.1f}",
                    f"{normal['median_us'] / memory['median_us']:.2f}x :memory:",
                ),
                ("  p99 (us)", f"{normal['p99_us']:.1f}", ""),
                (
                    "one job's writes, file, without / with the check (median us)",
                    f"{unchecked_us:.1f} / {checked_us:.1f}",
                    f"{checked_us / unchecked_us:.3f}x (jobs alternating)",
                ),
                (
                    "the check after each write, alone (median us)",
                    f"{part1['check_us']:.2f}",
                    "stat + pread of the file, stat + pread of its -wal",
                ),
                (
                    "one job's writes, file, WAL + FULL (median us)",
                    f"{full['median_us']:.1f}",
                    f"{full['median_us'] / normal['median_us']:.1f}x NORMAL",
                ),
                ("jobs' writes per second, NORMAL", f"{normal['jobs_per_s']:.0f}", ""),
            ]
            pg = part1.get("postgresql")
            if pg is not None:
                rows += [
                    (
                        "one job's writes, PostgreSQL on loopback, durable (median us)",
                        f"{pg['median_us']:.1f}",
                        (
                            f"{pg['median_us'] / normal['median_us']:.1f}x NORMAL, "
                            f"{pg['median_us'] / full['median_us']:.2f}x FULL"
                        ),
                    ),
                    ("  p99 (us)", f"{pg['p99_us']:.1f}", ""),
                    (
                        f"read {args.jobs_raw} rows back at start-up, PostgreSQL (ms)",
                        f"{pg['read_back_s'] * 1e3:.1f}",
                        f"{pg['read_back_s'] / normal['read_back_s']:.2f}x the file",
                    ),
                ]
                for size, kept in pg["uploads"].items():
                    mb = int(size) / 1e6
                    rows += [
                        (
                            f"one job's writes + its {mb:g} MB upload kept, PostgreSQL (median ms)",
                            f"{kept['kept_ms']:.1f}",
                            f"{kept['ratio']:.2f}x the rows alone ({kept['rows_ms']:.1f} ms)",
                        ),
                        (
                            "  of which before the client's answer (row + upload, median ms)",
                            f"{kept['accepted_ms']:.1f}",
                            f"restored on another node: {kept['restore_mb_per_s']:.0f} MB/s",
                        ),
                    ]
            rows += [
                (
                    "one job's writes through the 3.x line (snapshot + write, median us)",
                    f"{part1.get('line3_median_us', float('nan')):.1f}",
                    "as the supervisor makes them",
                ),
                (
                    "move of a staged upload into the state dir (median us)",
                    f"{part1['move_staged_median_us']:.1f}",
                    "same file system: a rename",
                ),
                ("disk per job (bytes, after checkpoint)", f"{normal['bytes_per_job']:.0f}", ""),
                (
                    f"read {args.jobs_raw} rows back at start-up (ms)",
                    f"{normal['read_back_s'] * 1e3:.1f}",
                    "",
                ),
            ]
            width = max(len(r[0]) for r in rows)
            for name, value, note in rows:
                print(f"{name.ljust(width)}  {value.rjust(10)}  {note}")
        if args.part in ("2", "all"):
            part2 = report["router"] = through_router(
                args.line, args.jobs, args.rounds, Path(tmp) / "router"
            )
            print(
                f"\nline {args.line}, {args.jobs} jobs x {args.rounds} rounds per arm "
                "(8 client threads)"
            )
            for key in ("accepted_per_s", "completed_per_s", "router_cpu_ms_per_job"):
                print(
                    f"{key:22s}  none {part2['none'][key]:8.2f}  "
                    f"store {part2['store'][key]:8.2f}  ratio store/none "
                    f"{part2['ratio'][key]:.3f}"
                )
            if "raw" in report and "line3_median_us" in report["raw"]:
                share = (
                    report["raw"]["line3_median_us"] / 1e3 / part2["none"]["router_cpu_ms_per_job"]
                )
                print(
                    f"the store's writes per job against the router's CPU per job without "
                    f"it: {share:.2%}"
                )
        if args.part in ("3", "all"):
            part3 = report["latency"] = submission_latency(
                args.line, args.jobs, args.rounds, Path(tmp) / "latency"
            )
            print(
                f"\nline {args.line}, submission latency, {args.jobs} submissions one after "
                f"another x {args.rounds} rounds per arm ({part3['samples']['sqlite']} each)"
            )
            for key in ("p50_ms", "p99_ms"):
                print(
                    f"{key:7s}  SQLite {part3['sqlite'][key]:7.2f}  PostgreSQL "
                    f"{part3['postgresql'][key]:7.2f}  ratio PostgreSQL/SQLite "
                    f"{part3['ratio'][key]:.3f}"
                )
        if args.part in ("4", "all"):
            part4 = report["routers"] = several_routers(
                args.jobs, args.rounds, Path(tmp) / "routers"
            )
            print(
                f"\nline 3, 1 vs 3 routers on one PostgreSQL, {args.jobs} jobs x {args.rounds} "
                "rounds per arm (8 client threads, 2 shared workers)"
            )
            for key in ("accepted_per_s", "completed_per_s", "routers_cpu_ms_per_job"):
                print(
                    f"{key:22s}  1 router {part4['1_routers'][key]:8.2f}  3 routers "
                    f"{part4['3_routers'][key]:8.2f}  ratio 3/1 {part4['ratio'][key]:.3f}"
                )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

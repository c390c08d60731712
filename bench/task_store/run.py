"""What the worker's task store costs: per completion, per row on disk, and at restart.

MinerU 3.4.4's real ``AsyncTaskManager`` and ``AsyncParseTask`` (imported
from the installed MinerU, no server started) with N finished tasks, each
with realistic fields (one upload, options, timestamps, an output dir):

1. baseline: MinerU's own ``_signal_task_event`` for each task (in memory);
2. the same call wrapped by ``task_store.attach`` (a row written at once:
   SQLite, WAL, ``synchronous=NORMAL``, as shipped);
3. the same with ``synchronous=FULL`` (an fsync per completion: durable
   against power loss too), to show what NORMAL saves;

then the file size per task, and the time a restarted worker takes to load
the N tasks back (``attach`` on a fresh manager). Timings are
machine-dependent: read the ratios, and the per-completion cost against the
seconds a real parse takes.

    python bench/task_store/run.py [--tasks 2000] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def mineru_fast_api() -> Any:
    os.environ.setdefault("MINERU_API_DISABLE_ACCESS_LOG", "1")
    from mineru.cli import fast_api

    return fast_api


def finished_task(fast_api: Any, index: int, root: Path) -> Any:
    task_id = f"00000000-0000-4000-8000-{index:012d}"
    output_dir = root / task_id
    (output_dir / "uploads").mkdir(parents=True)
    return fast_api.AsyncParseTask(
        task_id=task_id,
        status=fast_api.TASK_COMPLETED,
        backend="vlm-http-client",
        file_names=[f"report-{index}"],
        created_at="2026-01-05T10:00:00.000000+00:00",
        output_dir=str(output_dir),
        effort="medium",
        parse_method="auto",
        lang_list=["ch"],
        formula_enable=True,
        table_enable=True,
        image_analysis=True,
        server_url="http://127.0.0.1:30000",
        return_md=True,
        return_middle_json=False,
        return_model_output=False,
        return_content_list=False,
        return_images=False,
        response_format_zip=False,
        return_original_file=False,
        client_side_output_generation=False,
        start_page_id=0,
        end_page_id=99999,
        upload_names=[f"report-{index}.pdf"],
        uploads=[str(output_dir / "uploads" / f"report-{index}.pdf")],
        submit_order=index,
        started_at="2026-01-05T10:00:01.000000+00:00",
        completed_at="2026-01-05T10:00:09.000000+00:00",
    )


def manager_with(fast_api: Any, tasks: list[Any]) -> Any:
    manager = fast_api.AsyncTaskManager(fast_api.app)
    for task in tasks:
        manager.tasks[task.task_id] = task
        manager.task_events[task.task_id] = asyncio.Event()
    return manager


def time_signals(manager: Any, tasks: list[Any]) -> list[float]:
    times = []
    for task in tasks:
        start = time.perf_counter()
        manager._signal_task_event(task.task_id)
        times.append(time.perf_counter() - start)
    return times


def run_store(fast_api: Any, tasks: list[Any], state: Path, synchronous: str) -> dict[str, Any]:
    from mineru_health.mineru3.worker import task_store
    from mineru_health.runtime.settings import WorkerSettings
    from mineru_health.runtime.worker import store as task_stores
    from mineru_health.runtime.worker.context import runtime

    settings = WorkerSettings.from_env({"MINERU_HEALTH_STATE_DIR": str(state)})
    runtime.store = None  # one store per measurement in this process
    store = task_stores.open_store(settings, state)
    runtime.store = store
    assert store is not None
    store._db.execute(f"PRAGMA synchronous={synchronous}")
    manager = manager_with(fast_api, tasks)
    task_store.attach(manager)
    times = time_signals(manager, tasks)
    store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = sum(p.stat().st_size for p in state.iterdir() if p.is_file())
    restarted = manager_with(fast_api, [])
    runtime.store = task_stores.open_store(settings, state)
    start = time.perf_counter()
    loaded = task_store.attach(restarted)
    restore_s = time.perf_counter() - start
    assert loaded == len(tasks), (loaded, len(tasks))
    current = runtime.store
    assert current is not None
    current.close()
    runtime.store = None
    return {"times": times, "bytes_per_task": size / len(tasks), "restore_s": restore_s}


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "median_us": statistics.median(ordered) * 1e6,
        "p99_us": ordered[int(0.99 * (len(ordered) - 1))] * 1e6,
        "per_s": len(ordered) / sum(ordered),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    fast_api = mineru_fast_api()
    with tempfile.TemporaryDirectory(prefix="mineru-health-task-store-") as tmp:
        root = Path(tmp)
        tasks = [finished_task(fast_api, i, root / "out") for i in range(args.tasks)]
        baseline = summary(time_signals(manager_with(fast_api, tasks), tasks))
        normal = run_store(fast_api, tasks, root / "normal", "NORMAL")
        full = run_store(fast_api, tasks[: max(1, args.tasks // 10)], root / "full", "FULL")
    ours, durable = summary(normal["times"]), summary(full["times"])
    rows = [
        ("MinerU's completion signal alone (median us)", f"{baseline['median_us']:.2f}", ""),
        (
            "  + task store, WAL + NORMAL (median us)",
            f"{ours['median_us']:.1f}",
            f"{ours['median_us'] / baseline['median_us']:.0f}x the signal",
        ),
        ("  + task store, p99 (us)", f"{ours['p99_us']:.1f}", ""),
        (
            "  + task store, WAL + FULL (median us)",
            f"{durable['median_us']:.1f}",
            f"{durable['median_us'] / ours['median_us']:.1f}x NORMAL",
        ),
        ("rows per second, NORMAL", f"{ours['per_s']:.0f}", ""),
        ("disk per task (bytes, after checkpoint)", f"{normal['bytes_per_task']:.0f}", ""),
        (
            f"restore {args.tasks} tasks at start-up (ms)",
            f"{normal['restore_s'] * 1e3:.1f}",
            f"{normal['restore_s'] * 1e6 / args.tasks:.1f} us per task",
        ),
    ]
    width = max(len(r[0]) for r in rows)
    for name, value, note in rows:
        print(f"{name.ljust(width)}  {value.rjust(10)}  {note}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "tasks": args.tasks,
                    "baseline": baseline,
                    "normal": ours,
                    "full": durable,
                    "bytes_per_task": normal["bytes_per_task"],
                    "restore_s": normal["restore_s"],
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

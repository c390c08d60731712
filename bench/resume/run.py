"""How soon a router started on a big store answers, and when it has reconciled it (issue 32).

A store of N unfinished tasks, as a router killed with ``kill -9`` leaves
it: rows written by the supervisor itself through MinerU 3.x's task line
(real ``RouterTaskRecord`` and staged form, each with its kept upload in the
state directory), every one last submitted to an instance that is gone
(the new instances do not know it: each is asked, then sent again under its
id). The patched ``mineru-router`` with two real local workers (the fake
VLM server as engine) is started on it; measured from its start:

- ``first_answer_s``: its first ``GET /health`` answer (it serves);
- ``first_status_s``: the first answer about one of the stored tasks (the newest);
- ``new_accepted_s``: a new submission accepted;
- ``reconciled_s``: every stored task checked and sent again (its log's
  count of resubmissions reaches N);
- ``resumed_s``: its log says it took the store back (the workers are up
  then: they boot with the router, 5 to 20 s on a shared machine), and
  ``*_after_resume_s``: each mark from there, what the store itself costs.

N = 0 is the same router's boot in the same run. Run it with another
release's Python (``/path/to/venv/bin/python bench/resume/run.py``) for a
baseline: the router runs the mineru-health that Python imports.

    python bench/resume/run.py [--sizes 100,1000,5000] [--json out.json]

Timings depend on the machine (a shared 2-core one is noisy).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from mineru_health.runtime.router.store import KEPT_NAME, RouterStore


def fill(state: Path, count: int, pdf: bytes, engine: str, workers: tuple[str, ...]) -> list[str]:
    """``count`` unfinished tasks in the router's store under ``state``, oldest first."""
    from types import SimpleNamespace

    from mineru.cli import router
    from mineru_health.mineru3.router.tasks import Task, TaskLine
    from mineru_health.runtime.router.line import Kept
    from mineru_health.runtime.router.supervisor import Supervisor
    from mineru_health.runtime.settings import HealthSettings

    state.mkdir(parents=True, exist_ok=True)
    store = RouterStore(state / "mineru-health-router.sqlite3")
    line = TaskLine(SimpleNamespace(), {})
    supervisor = Supervisor(
        SimpleNamespace(), line, HealthSettings.preset("production"), store=store
    )
    keys = []
    start = time.time() - count
    for index in range(count):
        key = str(uuid.uuid4())
        worker = workers[index % len(workers)]
        staged = state / KEPT_NAME / f"mineru-router-request-{key}"
        staged.mkdir(parents=True)
        (staged / f"doc{index}.pdf").write_bytes(pdf)
        record = router.RouterTaskRecord(
            task_id=key,
            upstream_server_id=worker,
            upstream_task_id=str(uuid.uuid4()),
            upstream_base_url="http://127.0.0.1:9",
            backend="vlm-http-client",
            file_names=[f"doc{index}"],
            created_at="2026-12-06T00:00:00+00:00",
            status="pending",
        )
        payload = router.MultipartPayload(
            temp_dir=str(staged),
            fields=[("backend", "vlm-http-client"), ("server_url", engine)],
            uploads=[
                router.StagedUpload(
                    "files", f"doc{index}.pdf", "application/pdf", str(staged / f"doc{index}.pdf")
                )
            ],
        )
        kept = Kept(key, Task(record, payload, None), [worker], "http://127.0.0.1:9", None, 0)
        kept.accepted_at = start + index  # oldest first
        supervisor.save(kept)
        keys.append(key)
    store.close()
    return keys


def one_size(
    count: int, root: Path, site: Path, python: str, engine: str, pdf: bytes, procs: Any
) -> dict[str, float]:
    import httpx
    from mineru_health.demo.fleet import LINE3, Client, start_router

    scratch = root / f"n{count}"
    state = scratch / "state"
    keys = fill(state, count, pdf, engine, ("local-gpu-0", "local-gpu-1"))
    started = time.monotonic()
    router = start_router(
        procs,
        LINE3,
        site,
        python,
        scratch,
        env={
            "MINERU_ROUTER_HEALTH_PRESET": "fast",
            "MINERU_HEALTH_STATE_DIR": str(state),
            "MINERU_ROUTER_HEALTH_MAX_KEPT_TASKS": str(max(1000, 2 * count)),
        },
        fault_plan=None,
    )
    marks: dict[str, float] = {}
    client = Client(router.base, LINE3, engine_url=engine)
    wanted = 5 if count else 3
    deadline = started + 1500.0
    with httpx.Client(timeout=30.0) as http:
        while time.monotonic() < deadline and len(marks) < wanted:
            tick = time.monotonic()
            log = router.proc.log_path.read_text(errors="replace")
            if count and "resumed_s" not in marks and "resumed from the router's store" in log:
                marks["resumed_s"] = time.monotonic() - started
            if count and "reconciled_s" not in marks and log.count("(router_restart on") >= count:
                marks["reconciled_s"] = time.monotonic() - started
            try:
                if "first_answer_s" not in marks:
                    if http.get(f"{router.base}/health").status_code in (200, 503):
                        marks["first_answer_s"] = time.monotonic() - started
                    continue
                if "first_status_s" not in marks and (
                    not keys or http.get(f"{router.base}/tasks/{keys[-1]}").status_code == 200
                ):
                    marks["first_status_s"] = time.monotonic() - started
                if "new_accepted_s" not in marks:
                    task_id, _ = client.submit("new.pdf", pdf)
                    if task_id:
                        marks["new_accepted_s"] = time.monotonic() - started
            except httpx.HTTPError:
                pass
            finally:
                if router.proc.poll() is not None:
                    raise SystemExit(f"the router exited:\n{router.proc.log_tail()}")
                time.sleep(max(0.0, 0.05 - (time.monotonic() - tick)))
    if "resumed_s" in marks:  # what the store adds once the workers are up
        marks.update(
            {
                f"{k[:-2]}_after_resume_s": marks[k] - marks["resumed_s"]
                for k in ("first_answer_s", "first_status_s", "new_accepted_s", "reconciled_s")
                if k in marks
            }
        )
    os.kill(router.proc.pid, signal.SIGTERM)
    if router.proc.wait(60.0) is None:
        os.kill(router.proc.pid, signal.SIGKILL)
        router.proc.wait(30.0)
    return marks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,5000")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from mineru_health.demo.fleet import LINE3, start_fake_vlm
    from mineru_health.demo.sandbox import Processes, make_pdf, mineru_python

    python = mineru_python()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as tmp, Processes() as procs:
        root = Path(tmp)
        site = LINE3.site(root / "site", python, faults=False)
        engine = start_fake_vlm(procs, root, python)
        pdf = make_pdf(text="resume bench")
        for count in [0, *[int(s) for s in args.sizes.split(",")]]:
            marks = one_size(count, root, site, python, engine, pdf, procs)
            results[str(count)] = marks
            print(
                f"{count:5d} stored: " + ", ".join(f"{k} {v:.1f}" for k, v in marks.items()),
                file=sys.stderr,
            )
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""MinerU 4.0's finished jobs in the runtime's task store
(:mod:`~mineru_health.runtime.worker.store`).

4.0 keeps its jobs (``JobStore._jobs``) and its file metadata
(``FileStore._files``) in memory: after a restart, a finished job and its
outputs answer 404 although the output blobs are still in the upload
directory (the store's default directory). A row is the job's fields and the
records of its output files, no document content, and the worker's verdict
on a job that failed ``engine_dead`` (:func:`.fatal_check.job_verdict`); a job
comes back if its blobs are all there and its retention has not run out.

``attach(app)`` (lifespan complete) wraps two methods of the app's
``JobStore``: ``_record_usage``, which 4.0 calls once a job's task is done
(its status and output expiry final), writes the row there;
``collect_expired`` (run on every job lookup) deletes the rows of the jobs
MinerU expired. A job its shutdown canceled (4.0 cancels what is queued or
running when it stops) is not finished work: it is not kept.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from typing import Any

from ...runtime.verdict import Role, TaskVerdict
from ...runtime.worker import store
from ...runtime.worker.worker_runtime import WorkerRuntime
from .. import ENGINE_DEAD_CODE
from . import fatal_check

__all__ = ["FINISHED", "attach"]

FINISHED = frozenset({"completed", "partial", "failed", "canceled"})
#: _JobRecord fields that are this process's handles, not the job's data.
_LIVE_FIELDS = frozenset({"input_blobs", "file_store", "usage_counted"})


def _plain(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def _row(runtime: WorkerRuntime, record: Any) -> store.Row | None:
    """The row of ``record`` (4.0's ``_JobRecord``) if the job is finished."""
    if getattr(record, "status", None) not in FINISHED:
        return None
    job = {
        f.name: _plain(getattr(record, f.name))
        for f in dataclasses.fields(record)
        if f.name not in _LIVE_FIELDS
    }
    file_store = getattr(record, "file_store", None)
    files = [
        dataclasses.asdict(r)
        for r in list(getattr(file_store, "_files", {}).values())
        if r.job_id == record.id
    ]
    return record.id, {"job": job, "files": files}, fatal_check.job_verdict(runtime, record)


def _put_back(
    jobs: Any, file_store: Any, job_id: str, stored: dict[str, Any], verdict: dict[str, Any] | None
) -> bool | None:
    """Puts a stored job back into ``jobs`` (4.0's JobStore), its files into ``file_store``."""
    if job_id in jobs._jobs:
        return None
    job, files = stored["job"], stored["files"]
    now = time.time()
    if any(f.get("expires_at") is not None and f["expires_at"] <= now for f in files):
        return False
    if not all(f.get("sha256sum") and file_store.blob_exists(f["sha256sum"]) for f in files):
        return False
    module = sys.modules[type(jobs).__module__]
    engine_dead = any(
        isinstance(f, dict)
        and isinstance(f.get("error"), dict)
        and f["error"].get("code") == ENGINE_DEAD_CODE
        for f in job.get("files") or []
    )
    job["progress"] = module.JobProgress.model_validate(job.get("progress") or {})
    job["files"] = [module.JobFileResult.model_validate(f) for f in job.get("files") or []]
    if job.get("links") is not None:
        job["links"] = module.JobLinks.model_validate(job["links"])
    record = module._JobRecord(**job, file_store=file_store, usage_counted=True)
    if verdict is None and engine_dead:
        # Failed with an engine an earlier instance ran, with no verdict kept:
        # say so, lest the router read the error code as this instance's death.
        verdict = TaskVerdict.engine_dead(
            Role.COLLATERAL, "", ENGINE_DEAD_CODE, restored=True
        ).to_wire()
    if verdict is not None:
        setattr(record, fatal_check.VERDICT_ATTR, verdict)
    jobs._jobs[job_id] = record
    for fields in files:
        file_store._files.setdefault(fields["id"], module._FileRecord(**fields))
    return True


def attach(runtime: WorkerRuntime, app: Any) -> int:
    """Loads the jobs stored in ``runtime``'s store into ``app``'s stores and records the jobs
    that finish (idempotent)."""
    state = getattr(app, "state", None)
    jobs = getattr(state, "job_store", None)
    file_store = getattr(state, "file_store", None)
    if jobs is None or file_store is None:
        return 0

    def row_of(record: Any) -> store.Row | None:
        # 4.0's shutdown cancels what is still queued or running: no client
        # canceled those, they are unfinished work, never kept as canceled
        # (a new instance answers 404 for them, and the router sends them again).
        if getattr(record, "status", None) == "canceled" and getattr(jobs, "_closing", False):
            return None
        return _row(runtime, record)

    return store.attach(
        runtime.store,
        jobs,
        functools.partial(_put_back, jobs, file_store),
        finish="_record_usage",
        row_of=row_of,
        expire="collect_expired",
        live=lambda: jobs._jobs,
    )

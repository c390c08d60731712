"""Finished 4.0 jobs kept on disk next to their outputs, so that a restarted worker still serves them.

4.0 keeps its jobs (``JobStore._jobs``) and its file metadata
(``FileStore._files``) in memory: after a restart, a finished job and its
outputs answer 404 although the output blobs are still in the upload
directory. This store keeps one row per finished job in a SQLite file in
that directory (``MINERU_HEALTH_STATE_DIR`` if set): the job's fields and
the records of its output files, no document content. A worker started on
the same directory loads them back, for the jobs whose blobs are all there
and whose retention has not run out.

``attach(app)`` (lifespan complete) loads the rows and wraps two methods of
the app's ``JobStore`` instance: ``_record_usage``, which 4.0 calls once a
job's task is done (its status and output expiry final), writes the row
there, synchronously, so that a job is on disk as soon as it is finished;
``collect_expired`` (run on every job lookup) deletes the rows of the jobs
MinerU expired.

Thread-safety: one connection per store behind a lock; each call is one
short statement. Failures are logged; MinerU keeps working without the store.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ...runtime.worker.context import log, runtime
from ...worker import describe_exception

DB_NAME = "mineru-health-jobs.sqlite3"
FINISHED = frozenset({"completed", "partial", "failed", "canceled"})
#: _JobRecord fields that are this process's handles, not the job's data.
_LIVE_FIELDS = frozenset({"input_blobs", "file_store", "usage_counted"})
_MARK = "_mineru_health_job_store"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id    TEXT PRIMARY KEY,
    job       TEXT NOT NULL,   -- the job's fields, JSON
    files     TEXT NOT NULL,   -- the records of its output files, JSON
    stored_at REAL NOT NULL
)
"""


def _plain(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


class Rows:
    """The SQLite file of one upload directory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(_SCHEMA)

    def put(self, job_id: str, job: dict[str, Any], files: list[dict[str, Any]]) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO jobs VALUES (?, ?, ?, ?)",
                             (job_id, json.dumps(job), json.dumps(files), time.time()))

    def delete(self, job_ids: set[str]) -> None:
        with self._lock:
            self._db.executemany("DELETE FROM jobs WHERE job_id = ?", [(i,) for i in job_ids])

    def all(self) -> list[tuple[str, dict[str, Any], list[dict[str, Any]]]]:
        with self._lock:
            rows = list(self._db.execute("SELECT job_id, job, files FROM jobs"))
        return [(job_id, json.loads(job), json.loads(files)) for job_id, job, files in rows]


def _save(rows: Rows, store: Any, record: Any) -> None:
    if getattr(record, "status", None) not in FINISHED:
        return
    job = {f.name: _plain(getattr(record, f.name)) for f in dataclasses.fields(record)
           if f.name not in _LIVE_FIELDS}
    file_store = getattr(record, "file_store", None)
    files = [dataclasses.asdict(r) for r in list(getattr(file_store, "_files", {}).values())
             if r.job_id == record.id]
    rows.put(record.id, job, files)


def _load(rows: Rows, store: Any, file_store: Any) -> int:
    """Puts the stored jobs back into ``store`` (and their files into ``file_store``)."""
    module = sys.modules[type(store).__module__]
    now = time.time()
    loaded = 0
    for job_id, job, files in rows.all():
        if job_id in store._jobs:
            continue
        if any(f.get("expires_at") is not None and f["expires_at"] <= now for f in files):
            continue
        if not all(f.get("sha256sum") and file_store.blob_exists(f["sha256sum"]) for f in files):
            continue
        job["progress"] = module.JobProgress.model_validate(job.get("progress") or {})
        job["files"] = [module.JobFileResult.model_validate(f) for f in job.get("files") or []]
        if job.get("links") is not None:
            job["links"] = module.JobLinks.model_validate(job["links"])
        store._jobs[job_id] = module._JobRecord(**job, file_store=file_store, usage_counted=True)
        for fields in files:
            file_store._files.setdefault(fields["id"], module._FileRecord(**fields))
        loaded += 1
    return loaded


def attach(app: Any) -> None:
    """Loads the stored jobs into ``app``'s stores and records the jobs that finish (idempotent)."""
    state = getattr(app, "state", None)
    store = getattr(state, "job_store", None)
    file_store = getattr(state, "file_store", None)
    if store is None or file_store is None or getattr(store, _MARK, None) is not None:
        return
    settings = runtime.settings
    if not settings.task_store:
        return
    try:
        directory = Path(settings.state_dir or getattr(state, "upload_dir", ""))
        rows = Rows(directory / DB_NAME)
        setattr(store, _MARK, rows)
        loaded = _load(rows, store, file_store)
    except Exception as error:  # noqa: BLE001 - MinerU works on without the store
        log("ERROR", f"job store unavailable: {describe_exception(error)}")
        return
    if loaded:
        log("INFO", f"job store: {loaded} finished job(s) loaded back from {rows.path}")

    record_usage = store._record_usage
    collect_expired = store.collect_expired

    @functools.wraps(record_usage)
    def record_usage_and_store(record: Any) -> Any:
        result = record_usage(record)
        try:
            _save(rows, store, record)
        except Exception as error:  # noqa: BLE001
            log("ERROR", f"job store: cannot keep job {record.id}: {describe_exception(error)}")
        return result

    @functools.wraps(collect_expired)
    def collect_and_forget() -> Any:
        before = set(store._jobs)
        result = collect_expired()
        try:
            gone = before.difference(store._jobs)
            if gone:
                rows.delete(gone)
        except Exception as error:  # noqa: BLE001
            log("ERROR", f"job store: cannot drop expired jobs: {describe_exception(error)}")
        return result

    store._record_usage = record_usage_and_store
    store.collect_expired = collect_and_forget

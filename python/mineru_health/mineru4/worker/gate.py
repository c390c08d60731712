"""4.0's event-loop watcher, its jobs followed by the task watchdog, and the main-port gate.

The watcher starts when MinerU's start-up is over (lifespan complete): a
tick every 100 ms (loop lag), MinerU's job figures pushed to the native state
every 0.5 s, and once per fatal record every app's ``JobStore.fail_engine``
(a stalled engine, a liveness check or an error budget turns the worker fatal
without a job failing through MinerU's own path).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import MutableMapping
from typing import Any

from ...runtime.worker import engine_calls
from ...runtime.worker.context import mineru_version, runtime, worker_health
from ...runtime.worker.gate import HealthGate, JsonEdit
from ...runtime.worker.log import log
from ...runtime.worker.loop_watch import int_or, start_watcher, stop_watcher
from ...worker import fatal_cause
from .. import TASK_HUNG_CODE
from . import job_store, verdicts

#: 4.0's routes: its health check, and the three ways to submit work.
HEALTH_PATHS = frozenset({"/v1/health"})
GATED_POSTS = frozenset({"/v1/tasks", "/v1/parse/jobs", "/v1/file_parse"})
#: Where a job's status is read (the job id follows).
JOB_PATHS = ("/v1/tasks/", "/v1/parse/jobs/")
_COUNTED = {"queued": 0, "running": 1, "completed": 2, "partial": 2, "failed": 3}
_MARK = "__mineru_health_followed__"


def job_stores() -> list[Any]:
    stores = []
    for app in runtime.apps:
        store = getattr(getattr(app, "state", None), "job_store", None)
        if store is not None:
            stores.append(store)
    return stores


def report_service() -> None:
    stores = job_stores()
    if not stores:
        return
    store = stores[0]
    module = sys.modules.get("mineru.utils.retention")
    worker_health().set_service(
        version=mineru_version(), protocol_version=0,
        max_concurrent_requests=int_or(getattr(store, "_concurrency", 1), 1),
        processing_window_size=1,
        task_retention_seconds=int_or(getattr(store, "retention_seconds", 0), 0),
        task_cleanup_interval_seconds=int_or(
            getattr(module, "RETENTION_SCAN_INTERVAL_SECONDS", 0), 0),
    )


def report_jobs() -> None:
    """MinerU's job figures and its own verdict (engine error, failed preload)."""
    counts = [0, 0, 0, 0]
    errors = []
    for app in runtime.apps:
        state = getattr(app, "state", None)
        store = getattr(state, "job_store", None)
        if store is None:
            continue
        for record in list(getattr(store, "_jobs", {}).values()):
            index = _COUNTED.get(getattr(record, "status", ""))
            if index is not None:
                counts[index] += 1
        owner_error = getattr(getattr(store, "runtime_owner", None), "engine_error", None)
        preload = getattr(state, "model_preload_error", None)
        if owner_error:
            errors.append(str(owner_error))
        elif preload is not None:
            errors.append(str(getattr(preload, "message", preload)))
    queued, running, completed, failed = counts
    worker_health().set_tasks(queued, running, completed, failed, "; ".join(errors))




def follow_jobs(namespace: MutableMapping[str, Any]) -> None:
    """Wraps 4.0's ``_run_job`` (looked up by name per job): its job tracked and in context.

    The job id is in context for the work it does (its engine calls and
    requests are its progress); each file parsed is progress too. Idempotent.
    """
    run_job = namespace.get("_run_job")
    if run_job is None or getattr(run_job, _MARK, False):
        return
    parse = namespace.get("parse_async")

    @functools.wraps(run_job)
    async def run_job_followed(record: Any, *args: Any, **kwargs: Any) -> Any:
        job_id = str(getattr(record, "id", "") or "")
        state = worker_health()
        state.task_started(job_id)
        try:
            with engine_calls.task_context(job_id):
                return await run_job(record, *args, **kwargs)
        finally:
            state.task_finished(job_id)

    setattr(run_job_followed, _MARK, True)
    namespace["_run_job"] = run_job_followed
    if parse is not None and not getattr(parse, _MARK, False):

        @functools.wraps(parse)
        async def parse_counted(*args: Any, **kwargs: Any) -> Any:
            try:
                return await parse(*args, **kwargs)
            finally:
                worker_health().task_progress(engine_calls.current_task_id())

        setattr(parse_counted, _MARK, True)
        namespace["parse_async"] = parse_counted


def fail_hung_jobs() -> int:
    """Fails the jobs the native task watchdog found hung (loop thread); returns how many.

    Their unfinished files fail with code ``task_hung`` and the job's task is
    cancelled (its concurrency slot is freed); every job hung makes the
    worker stalled, natively, and ``act_on_fatal`` does the rest.
    """
    hung = set(worker_health().take_hung_tasks())
    if not hung:
        return 0
    failed = 0
    for store in job_stores():
        error_detail = getattr(sys.modules.get(type(store).__module__), "ErrorDetail", None)
        for job_id in sorted(hung):
            record = getattr(store, "_jobs", {}).get(job_id)
            if record is None or getattr(record, "status", "") not in ("queued", "running"):
                continue
            message = ("mineru-health: the parse made no progress for "
                       f"{runtime.settings.task_hang_s:g} s (hung); resubmit it")
            record.status = "failed"
            for file in getattr(record, "files", ()):
                if getattr(file, "status", "") != "completed":
                    file.status = "failed"
                    if error_detail is not None:
                        file.error = error_detail(type="engine_error", code=TASK_HUNG_CODE,
                                                  message=message)
            # Out of MinerU's running set at once: an engine death recorded
            # next (every job hung) must not relabel it as that death's collateral.
            task = getattr(store, "_tasks", {}).pop(job_id, None)
            if task is not None and not task.done():
                task.cancel()
            failed += 1
            log("ERROR", f"job {job_id} failed: no progress for "
                         f"{runtime.settings.task_hang_s:g} s (hung parse)")
    return failed


def act_on_fatal() -> None:
    """Once per fatal record: every app fails its unfinished jobs (loop thread).

    A job store whose ``fail_engine`` MinerU already ran (its ``_run_job`` met the
    fatal exception: ``engine_error`` is set) is left alone: its jobs failed once,
    with MinerU's message, and a job still being cancelled keeps that message.
    Stalls, hung tasks and verified deaths never pass there: those we fail.
    """
    health = worker_health()
    if health.healthy or runtime.acted_on_fatal:
        return
    runtime.acted_on_fatal = True
    what = fatal_cause(health.snapshot().first_fatal)
    failed = 0
    for store in job_stores():
        if getattr(getattr(store, "runtime_owner", None), "engine_error", None) is None:
            store.fail_engine(f"inference engine unusable ({what})")
            failed += 1
    log("ERROR", f"inference engine unusable ({what}); unfinished jobs failed"
                 + ("" if failed else " by MinerU itself"))


def _act() -> None:
    fail_hung_jobs()
    act_on_fatal()


def _add_verdict(job_id: str, payload: dict[str, Any]) -> None:
    """Adds the worker's verdict to a job payload that failed ``engine_dead`` (as on 3.x)."""
    for store in job_stores():
        record = getattr(store, "_jobs", {}).get(job_id)
        verdict = verdicts.job_verdict(record) if record is not None else None
        if verdict is not None and payload.get("job_id", job_id) == job_id:
            payload["verdict"] = verdict
            return


class Gate(HealthGate):
    """The gate on 4.0's paths (``/v1/health`` and the submissions); its watcher starts with
    MinerU's start-up (preload included): from then on a blocked loop is hung. A job's
    status answer carries the worker's verdict when the job failed ``engine_dead``."""

    health_paths = HEALTH_PATHS
    gated_posts = GATED_POSTS

    def answer_edit(self, method: str, path: str) -> JsonEdit | None:
        if method != "GET":
            return None
        for prefix in JOB_PATHS:
            job_id = path[len(prefix):] if path.startswith(prefix) else ""
            if job_id and "/" not in job_id:
                return functools.partial(_add_verdict, job_id)
        return None

    def started(self) -> None:
        runtime.open_store()  # the task store, now that the worker serves
        for app in runtime.apps:
            job_store.attach(app)  # finished jobs of an earlier run back; new ones kept
        report_service()
        report_jobs()
        start_watcher(report_jobs, _act)

    def stopped(self) -> None:
        stop_watcher()

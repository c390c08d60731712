"""4.0's jobs for the runtime (:class:`JobLine`), its jobs followed by the task watchdog,
and the main-port gate.

The runtime's watcher starts when MinerU's start-up is over (lifespan
complete: :func:`~mineru_health.runtime.worker.line.serve`): a tick every
100 ms (loop lag), MinerU's job figures pushed to the native state every
0.5 s, hung jobs failed through :meth:`JobLine.fail`, and once per fatal
record every app's ``JobStore.fail_engine`` (:meth:`JobLine.fail_with_engine`:
a stalled engine, a liveness check or an error budget turns the worker fatal
without a job failing through MinerU's own path).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import MutableMapping
from typing import Any

from ...runtime.verdict import Kind, TaskVerdict
from ...runtime.worker import engine_calls, line
from ...runtime.worker.gate import HealthGate, JsonEdit
from ...runtime.worker.health import FatalInfo, fatal_cause
from ...runtime.worker.loop_watch import int_or, stop_watcher
from ...runtime.worker.worker_runtime import WorkerRuntime, mineru_version
from .. import TASK_HUNG_CODE
from . import fatal_check, job_store

#: 4.0's routes: its health check, and the three ways to submit work.
HEALTH_PATHS = frozenset({"/v1/health"})
GATED_POSTS = frozenset({"/v1/tasks", "/v1/parse/jobs", "/v1/file_parse"})
#: Where a job's status is read (the job id follows).
JOB_PATHS = ("/v1/tasks/", "/v1/parse/jobs/")
_COUNTED = {"queued": 0, "running": 1, "completed": 2, "partial": 2, "failed": 3}
_MARK = "__mineru_health_followed__"


def job_stores(runtime: WorkerRuntime) -> list[Any]:
    stores = []
    for app in runtime.apps:
        store = getattr(getattr(app, "state", None), "job_store", None)
        if store is not None:
            stores.append(store)
    return stores


def report_service(runtime: WorkerRuntime) -> None:
    stores = job_stores(runtime)
    if not stores:
        return
    store = stores[0]
    module = sys.modules.get("mineru.utils.retention")
    runtime.health.set_service(
        version=mineru_version(),
        protocol_version=0,
        max_concurrent_requests=int_or(getattr(store, "_concurrency", 1), 1),
        processing_window_size=1,
        task_retention_seconds=int_or(getattr(store, "retention_seconds", 0), 0),
        task_cleanup_interval_seconds=int_or(
            getattr(module, "RETENTION_SCAN_INTERVAL_SECONDS", 0), 0
        ),
    )


def report_jobs(runtime: WorkerRuntime) -> None:
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
    runtime.health.set_tasks(queued, running, completed, failed, "; ".join(errors))


def follow_jobs(runtime: WorkerRuntime, namespace: MutableMapping[str, Any]) -> None:
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
        state = runtime.health
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
                runtime.health.task_progress(engine_calls.current_task_id())

        setattr(parse_counted, _MARK, True)
        namespace["parse_async"] = parse_counted


class JobLine:
    """4.0's jobs, for the runtime (:class:`~mineru_health.runtime.worker.line.Line`)."""

    item = "job"
    #: A remote wait past its bound ends at its next read, and 4.0's ``_run_job``
    #: fails the job itself with the error that names the server.
    fails_remote_waits = False

    def __init__(self, runtime: WorkerRuntime) -> None:
        self.runtime = runtime

    def started(self) -> None:
        runtime = self.runtime
        for app in runtime.apps:
            job_store.attach(runtime, app)  # finished jobs of an earlier run back; new ones kept
        report_service(runtime)
        report_jobs(runtime)

    def report(self) -> None:
        report_jobs(self.runtime)

    def remote_engine(self, item_id: str) -> bool:
        return False  # a failed job's answer carries a verdict only for an engine death

    def fail(self, item_id: str, text: str, verdict: TaskVerdict) -> bool:
        """Its unfinished files fail with ``text`` and a code for the verdict (``task_hung``;
        the verdict itself is kept only on an engine death's jobs), and its task is
        cancelled (its slot freed)."""
        code = TASK_HUNG_CODE if verdict.kind is Kind.HUNG else verdict.category
        failed = False
        for store in job_stores(self.runtime):
            error_detail = getattr(sys.modules.get(type(store).__module__), "ErrorDetail", None)
            record = getattr(store, "_jobs", {}).get(item_id)
            if record is None or getattr(record, "status", "") not in ("queued", "running"):
                continue
            record.status = "failed"
            for file in getattr(record, "files", ()):
                if getattr(file, "status", "") != "completed":
                    file.status = "failed"
                    if error_detail is not None:
                        file.error = error_detail(type="engine_error", code=code, message=text)
            # Out of MinerU's running set at once: an engine death recorded
            # next (every job hung) must not relabel it as that death's collateral.
            task = getattr(store, "_tasks", {}).pop(item_id, None)
            if task is not None and not task.done():
                task.cancel()
            failed = True
        return failed

    def fail_with_engine(self, first: FatalInfo | None) -> str:
        """Every app's ``JobStore.fail_engine``, except where MinerU already ran it.

        A job store whose ``fail_engine`` MinerU ran (its ``_run_job`` met the
        fatal exception: ``engine_error`` is set) is left alone: its jobs failed
        once, with MinerU's message, and a job still being cancelled keeps that
        message. Stalls, hung tasks and verified deaths never pass there: those we fail.
        """
        failed = 0
        for store in job_stores(self.runtime):
            if getattr(getattr(store, "runtime_owner", None), "engine_error", None) is None:
                store.fail_engine(f"inference engine unusable ({fatal_cause(first)})")
                failed += 1
        return "unfinished jobs failed" + ("" if failed else " by MinerU itself")


def act_on_fatal(runtime: WorkerRuntime) -> None:
    """Once per fatal record: every app fails its unfinished jobs (loop thread)."""
    line.act_on_fatal(runtime, JobLine(runtime))


def _add_verdict(runtime: WorkerRuntime, job_id: str, payload: dict[str, Any]) -> None:
    """Adds the worker's verdict to a job payload that failed ``engine_dead`` (as on 3.x)."""
    for store in job_stores(runtime):
        record = getattr(store, "_jobs", {}).get(job_id)
        verdict = fatal_check.job_verdict(runtime, record) if record is not None else None
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
            job_id = path[len(prefix) :] if path.startswith(prefix) else ""
            if job_id and "/" not in job_id:
                return functools.partial(_add_verdict, self.runtime, job_id)
        return None

    def started(self) -> None:
        line.serve(self.runtime, JobLine(self.runtime))

    def stopped(self) -> None:
        stop_watcher(self.runtime)

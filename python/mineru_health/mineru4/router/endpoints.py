"""Helpers of MinerU 4.0's router app wrapped, so that jobs survive their worker.

4.0's routes look these up in ``app.py``'s globals when they run (or, for
``submit_job``, take what the patched ``create_app`` rebinds);
``install_endpoints(line, namespace)`` (called by ``install_app``) rebinds
the first two:

- ``rewrite_job_payload``: every job payload 4.0 read from a worker (client
  requests, its reconciliation loop) goes to the job line
  (``JobLine.observe``): an engine death is sent again, else it lets go;
- ``_mark_missing_job``: a worker's 404 for a kept job sends it again
  (``JobLine.missing``), 4.0's failure for any other;
- ``submit_job`` (``failover``): every submission (``/v1/parse/jobs``,
  ``/v1/tasks``, ``/v1/file_parse``) is refused with 422 when its document is
  quarantined (``poison.py``), else admitted (``runtime/router/admission.py``)
  before ``submit_job`` stages its inputs or asks a worker: its inputs' bytes
  (uploaded with it, or the stored files it names) are reserved under
  ``MAX_KEPT_TASKS`` and ``MAX_KEPT_MB`` and checked against the room left
  in the state and scratch directories (503 or 507 with Retry-After,
  answered by the handler ``install_app`` adds). A submission its worker
  lost on the way (502/504, a 503 ``engine_dead``) is made again on another
  worker, once per other worker at most;
- ``job_submitted`` (the patched ``submit_job``'s line): the job is kept
  until it ends (``JobLine.track``), taking the admission over (a context
  variable carries it through 4.0's ``submit_job``). A job whose row cannot
  be written at 4.0's first read of it is undone (``JobLine.unaccept``) and
  the client gets 507: it was never accepted.

Everything runs on the router's event loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
from collections.abc import Mapping, MutableMapping
from typing import Any

from mineru_health import safe_text
from mineru_health.runtime.router.admission import Admission, Refused
from mineru_health.runtime.router.poison import Quarantine

from .jobs import Job, JobLine

__all__ = [
    "failover",
    "install_endpoints",
    "job_submitted",
    "submit_with_failover",
    "track_submitted",
]

_log = safe_text.logger("mineru_health.router.jobs")

#: The admission of the submission ``submit_job`` is making (set by ``submit_with_failover``,
#: taken over by ``job_submitted``): 4.0's ``submit_job`` has no parameter to carry it.
_ADMISSION: contextvars.ContextVar[Admission | None] = contextvars.ContextVar(
    "mineru_health_admission", default=None
)


def install_endpoints(line: JobLine, namespace: MutableMapping[str, Any]) -> None:
    """Wraps the two helpers of ``app.py`` through which 4.0 ends a job its worker lost."""
    rewrite, mark_missing = line.rewrite, line.mark_missing  # 4.0's own, unwrapped

    def rewrite_job_payload(
        payload: dict[str, Any], worker: Any, registry: Any, pool: Any, owner_scope: str
    ) -> dict[str, Any]:
        return line.observe(rewrite(payload, worker, registry, pool, owner_scope), worker)

    def mark_missing_job(route: Any, pool: Any) -> dict[str, Any]:
        return line.missing(route, pool)

    rewrite_job_payload.__wrapped__ = rewrite  # type: ignore[attr-defined]
    mark_missing_job.__wrapped__ = mark_missing  # type: ignore[attr-defined]
    namespace["rewrite_job_payload"] = rewrite_job_payload
    namespace["_mark_missing_job"] = mark_missing_job


def _line(app: Any) -> JobLine | None:
    return getattr(app.state.worker_pool, "job_line", None)


def job_submitted(app: Any, route: Any, body: dict[str, Any]) -> None:
    """``submit_job`` handed ``body`` on as the job of ``route``: keep it until it ends."""
    line = _line(app)
    if line is not None:
        track_submitted(line, route, body)


def track_submitted(line: JobLine, route: Any, body: dict[str, Any]) -> None:
    """``job_submitted`` for ``line``: the job kept, the submission's admission taken over."""
    line.track(route, body, admission=_ADMISSION.get())


def failover(app: Any, submit_job: Any) -> Any:
    """``submit_job`` that tries another worker when the chosen one fails on the way.

    4.0 hands a 502/504 (the worker died or hung during the upload) or a
    503 ``engine_dead`` straight to the client; such a submission is made
    again, once per other worker at most. Anything else is the answer.
    """

    async def submit_with_failover_of_app(
        body: dict[str, Any], request: Any, uploads: Any = None
    ) -> Any:
        line = _line(app)
        if line is None:
            return await submit_job(body, request, uploads)
        return await submit_with_failover(line, submit_job, body, request, uploads)

    return submit_with_failover_of_app


async def submit_with_failover(
    line: JobLine, submit_job: Any, body: dict[str, Any], request: Any, uploads: Any
) -> Any:
    """4.0's ``submit_job``, made again on another worker when the chosen one failed.

    Before each new try the launched workers' processes are checked (a
    killed one leaves rotation at once) and one probe interval passes,
    so that the policy has taken in what the failure showed. A 503 of
    4.0's own (no healthy worker) while a local worker is being restarted
    is not the answer either: the submission waits for a worker back in
    rotation (at most ``BOOT_TIMEOUT_S``, as a resubmission does), so a
    fault that takes every worker out for a moment refuses nothing.
    """
    error = line.namespace["RouterProxyError"]
    quarantine = _quarantined(line, body, uploads or {})
    if quarantine is not None:
        names = [getattr(u, "filename", "") for u in (uploads or {}).values()]
        raise error(422, "document_quarantined", quarantine.message([n for n in names if n]))
    admission = line.supervisor.admit(_declared_size(line, body, uploads or {}))
    token = _ADMISSION.set(admission)
    try:
        return await _submit(line, submit_job, body, request, uploads)
    except Refused as refusal:
        if isinstance(refusal.item, Job):
            line.unaccept(refusal.item, uploads or {})
        raise
    finally:
        _ADMISSION.reset(token)
        admission.close()


async def _submit(
    line: JobLine, submit_job: Any, body: dict[str, Any], request: Any, uploads: Any
) -> Any:
    error, pool, supervisor = line.namespace["RouterProxyError"], line.pool, line.supervisor
    tries = len(pool.workers) + 1
    attempt = waits = 0
    while True:
        attempt += 1
        last = attempt >= tries
        try:
            response = await submit_job(body, request, uploads)
        except error as exc:
            if exc.status_code == 503 and exc.code == "quality_tier_unavailable":
                waits += 1  # bounded: a worker back that still cannot take it is the answer
                if waits > tries or not supervisor.healing() or not await _worker_back(line):
                    raise
                attempt -= 1  # no worker tried it: not a try
                continue
            if last or exc.status_code not in (502, 504):
                raise
            _log.warning("a submission failed on its worker (%s); trying again", exc)
        else:
            if last or response.status_code != 503 or b'"engine_dead"' not in bytes(response.body):
                return response
            _log.warning("a submission was refused with 503 engine_dead; trying again")
        for worker in pool.workers:
            pool.fleet.local.check_process(worker.worker_id)
        await asyncio.sleep(supervisor.retry_interval_s)


def _declared_size(line: JobLine, body: dict[str, Any], uploads: Mapping[int, Any]) -> int:
    """Bytes the job's inputs will take in the router: those uploaded with it, and the
    stored files it names by id (what ``JobLine.track`` keeps)."""
    size = sum(int(getattr(u, "bytes", 0) or 0) for u in uploads.values())
    for index, entry in enumerate(body.get("files") or []):
        source = entry.get("source") if isinstance(entry, dict) else None
        if index in uploads or not isinstance(source, dict) or source.get("type") != "file_id":
            continue
        stored = line.find_source(str(source.get("file_id")))
        size += int(stored.bytes) if stored is not None else 0
    return size


def _quarantined(
    line: JobLine, body: dict[str, Any], uploads: Mapping[int, Any]
) -> Quarantine | None:
    """The quarantine of the submission's document, if the poison guard has one.

    Its digest is the one ``JobLine.track`` keeps (the inputs' own SHA-256s,
    in order), read from what 4.0 already hashed: the uploads and the source
    store. Only once some document killed an engine (``suspects``): a
    healthy fleet's submissions never pay for it.
    """
    poison = line.supervisor.poison
    if not poison.suspects():
        return None
    digests = []
    for index, entry in enumerate(body.get("files") or []):
        source = entry.get("source") if isinstance(entry, dict) else None
        upload = uploads.get(index)
        if upload is not None:
            digests.append(str(getattr(upload, "sha256sum", "")))
        elif isinstance(source, dict) and source.get("type") == "file_id":
            stored = line.find_source(str(source.get("file_id")))
            if stored is None:
                return None
            digests.append(str(stored.sha256sum))
        else:
            return None  # a url or inline source: not sent again, never counted
    if not digests or not all(digests):
        return None
    return poison.quarantined(hashlib.sha256("".join(digests).encode()).hexdigest())


async def _worker_back(line: JobLine) -> bool:
    """Waits (bounded) until a worker is in rotation; False when none came back."""
    _log.warning("no healthy worker while the fleet heals; the submission waits for one")
    return await line.supervisor.wait_for_worker(line.pool.routable)

"""Module-level names of MinerU's router rebound, so that tasks survive their worker.

MinerU's endpoints look these names up in the router module's globals when
they run; ``install_endpoints(namespace)`` (called by ``install_app`` once
the module is fully defined) rebinds them:

- ``stage_multipart_request`` admits the submission first
  (``Supervisor.admit``, ``runtime/router/admission.py``): its declared size
  (``Content-Length``) is reserved under the caps (``MAX_KEPT_TASKS``,
  ``MAX_KEPT_MB``) and checked against the room left in the router's state
  and scratch directories, before anything is staged; past a cap it answers
  503 with Retry-After, without room 507 ``insufficient_storage`` with
  Retry-After, naming the directory. Else MinerU stages it, the reservation
  is resized to what was staged, and it returns a ``RetainedPayload``: MinerU
  calls its ``cleanup()`` in a ``finally`` right after submitting, which
  ends the admission and does nothing else once the task supervisor kept the
  payload; the supervisor deletes the staged files when the task is terminal
  (or at shutdown). With the router's store the staged directory is moved
  into the router's state directory first, so that a new router can send the
  task again. A staging or move that fails for lack of storage (ENOSPC,
  EDQUOT, EIO, EROFS) leaves nothing behind and answers 507, never a 500.
- ``startup_router_state``: once MinerU's registry and pool are up, the
  router's store is taken back (``TaskLine.resume``).
- ``submit_router_task`` hashes the uploaded files (the poison guard's key),
  refuses a quarantined document with 422, submits as MinerU does, then
  hands the task to the supervisor; when MinerU finds no healthy worker but
  one is being restarted, the supervisor holds the task instead of the 503.
  A task whose store row cannot be written is taken out of MinerU's registry,
  its staged files deleted, and answered 507: never acknowledged unkept (its
  worker, which 3.x cannot tell to cancel, finishes it for nobody).
- ``fetch_router_task_status`` lets the supervisor refresh a tracked task
  (and resubmit it when its worker lost it); other tasks as MinerU does.
  ``/file_parse`` polls through it, so it gets the same behaviour.
- ``proxy_router_task_result`` and ``build_sync_router_task_result_response``
  send a finished task's result request to its worker's current instance
  (503 with Retry-After while that worker is restarting; ``/file_parse``,
  whose caller waits on its connection, first waits up to ``BOOT_TIMEOUT_S``
  for the restarted instance), under a result's bounds
  (``runtime.router.upstream_reads``): a worker that breaks one is answered
  502 naming it and the bound; ``proxy_router_task_result`` streams every
  result, JSON too (MinerU's reads a JSON result whole).
- ``RouterTaskRecord.to_status_payload`` adds ``attempts`` (submissions
  made, 1 without resubmission) and ``workers_tried`` (server ids, in order).

Everything runs on the router's event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import tempfile
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any, NoReturn

from mineru_health.runtime.router.admission import (
    STORAGE,
    Admission,
    Refused,
    answer_refusals,
    storage_error,
)
from mineru_health.runtime.router.poison import content_digest
from mineru_health.runtime.router.supervisor import Supervisor

from .tasks import (
    RETAINED_CLASS,
    TaskLine,
    move_staged,
    upload_bytes,
    upload_names,
    workers_tried,
)

__all__ = ["answer_storage_errors", "install_endpoints", "retained_payload_class"]

_INSTALLED = "_mineru_health_endpoints"


def retained_payload_class(base: type) -> type:
    """MinerU's MultipartPayload whose ``cleanup`` waits for ``release`` once retained."""

    class RetainedPayload(base):  # type: ignore[misc]
        retained = False
        # The submission's reservation under the caps (admission.py) until it is kept or
        # refused; MinerU's cleanup right after submitting ends it either way.
        admission: Admission | None = None

        def cleanup(self) -> None:
            admission, self.admission = self.admission, None
            if admission is not None:
                admission.close()
            if not self.retained:
                super().cleanup()

        def release(self) -> None:
            """Deletes the staged files now (the task is terminal, or the router stops)."""
            self.retained = False
            super().cleanup()

    RetainedPayload.__qualname__ = RetainedPayload.__name__ = f"Retained{base.__name__}"
    return RetainedPayload


def _line(request: Any) -> TaskLine | None:
    pool = getattr(getattr(getattr(request, "app", None), "state", None), "worker_pool", None)
    line = getattr(pool, "task_line", None)
    return line if isinstance(line, TaskLine) else None


def install_endpoints(namespace: MutableMapping[str, Any]) -> None:
    """Rebinds the names above in a MinerU router module's globals (idempotent)."""
    if namespace.get(_INSTALLED):
        return
    retained_class: Any = retained_payload_class(namespace["MultipartPayload"])
    namespace[RETAINED_CLASS] = retained_class
    http_exception = namespace["HTTPException"]
    stage = namespace["stage_multipart_request"]
    submit = namespace["submit_router_task"]
    fetch = namespace["fetch_router_task_status"]
    startup = namespace["startup_router_state"]

    def refused(refusal: Refused) -> NoReturn:
        raise http_exception(
            status_code=refusal.status, detail=refusal.detail, headers=refusal.headers
        ) from None

    @functools.wraps(stage)
    async def stage_multipart_request(request: Any) -> Any:
        line = _line(request)
        if line is None:
            return await stage(request)
        try:
            admission = line.supervisor.admit(_declared_size(request))
        except Refused as refusal:
            refused(refusal)
        retained = None
        try:
            payload = await stage(request)  # MinerU deletes its directory when this fails
            fields = {f.name: getattr(payload, f.name) for f in dataclasses.fields(payload)}
            retained = retained_class(**fields)
            retained.admission = admission
            admission.resize(upload_bytes(retained))
            kept_dir = line.kept_dir()
            if kept_dir is not None:
                await asyncio.to_thread(move_staged, retained, kept_dir)
        except BaseException as error:
            admission.close()
            if retained is not None:
                retained.cleanup()
            if isinstance(error, Refused):
                refused(error)
            full = storage_error(error)
            if full is None:
                raise
            refused(_staging_refused(line.supervisor, full))
        return retained

    @functools.wraps(submit)
    async def submit_router_task(request: Any, payload: Any) -> Any:
        line = _line(request)
        if line is None or not isinstance(payload, retained_class):
            return await submit(request, payload)
        supervisor = line.supervisor
        digest = None
        if supervisor.poison.suspects():
            # Hashed only once some document killed an engine: a healthy
            # fleet's submissions never pay for it (a resubmission hashes
            # on demand).
            digest = await asyncio.to_thread(content_digest, [u.path for u in payload.uploads])
            quarantine = supervisor.poison.quarantined(digest)
            if quarantine is not None:
                raise http_exception(
                    status_code=422, detail=quarantine.message(upload_names(payload))
                )
        registry = request.app.state.router_task_registry
        try:
            try:
                record = await submit(request, payload)
            except http_exception as exc:
                if exc.status_code != 503 or not supervisor.healing():
                    raise
                return await line.hold(payload, digest, registry)
            await line.track(record, payload, digest, registry)
        except Refused as refusal:  # its row could not be written: not accepted
            refused(refusal)
        return record

    @functools.wraps(fetch)
    async def fetch_router_task_status(request: Any, task: Any) -> Any:
        line = _line(request)
        if line is not None and line.tracks(task):
            return await line.refresh(task)
        if line is not None and line.owner(task) is not None:
            return await line.refresh_shared(task)  # another router's: read only
        return await fetch(request, task)

    @functools.wraps(startup)
    async def startup_router_state(app: Any, settings: Any) -> None:
        await startup(app, settings)
        line = getattr(app.state.worker_pool, "task_line", None)
        if isinstance(line, TaskLine):
            line.resume(app.state.router_task_registry)

    namespace["stage_multipart_request"] = stage_multipart_request
    namespace["submit_router_task"] = submit_router_task
    namespace["fetch_router_task_status"] = fetch_router_task_status
    namespace["startup_router_state"] = startup_router_state
    namespace["proxy_router_task_result"] = _streaming_result(namespace)
    for name, synchronous in (
        ("proxy_router_task_result", False),
        ("build_sync_router_task_result_response", True),
    ):
        namespace[name] = _following_restarts(namespace[name], http_exception, synchronous)
    _add_attempts(namespace["RouterTaskRecord"])
    namespace[_INSTALLED] = True


def answer_storage_errors(app: Any) -> None:
    """A storage write failure that reaches the app outside the wrappers above (Starlette
    spooling a form to the scratch directory) is answered 507 with Retry-After, not 500."""

    def supervisor_of(request: Any) -> Supervisor | None:
        line = _line(request)
        return line.supervisor if line is not None else None

    answer_refusals(app, supervisor_of, lambda refusal: {"detail": refusal.detail})


def _declared_size(request: Any) -> int:
    """The request's ``Content-Length`` (the upload and its form), 0 when it declares none:
    its staged size is reserved then."""
    try:
        return max(0, int(request.headers.get("content-length") or 0))
    except (AttributeError, TypeError, ValueError):
        return 0


def _staging_refused(supervisor: Supervisor, error: OSError) -> Refused:
    """The 507 of an upload that could not be staged or moved for lack of storage."""
    where = Path(error.filename).parent if error.filename else Path(tempfile.gettempdir())
    return supervisor.refuse(
        STORAGE,
        f"insufficient storage: the upload could not be written "
        f"to {where} ({error.strerror or error}); retry once "
        "room returns",
        str(where),
    )


def _following_restarts(
    proxy: Callable[..., Any], http_exception: type, synchronous: bool
) -> Callable[..., Any]:
    from mineru_health.runtime.router import upstream_reads  # imports httpx: at install

    @functools.wraps(proxy)
    async def proxy_to_current_instance(request: Any, task: Any) -> Any:
        line = _line(request)
        if line is not None and not line.follow_restart(task):
            # /file_parse's caller holds its connection for this result: wait for the
            # restarted instance (bounded) rather than answer 503 for a kept result.
            back = synchronous and await line.supervisor.wait_for_worker(
                lambda: line.follow_restart(task)
            )
            if not back:
                raise http_exception(
                    status_code=503,
                    detail=f"worker {task.upstream_server_id} is restarting; the result of "
                    f"task {task.task_id} is kept and will be served again, retry shortly",
                    headers={"Retry-After": str(line.supervisor.retry_after_s)},
                )
        # A result's bounds (MAX_RESULT_MB, MAX_RESULT_S) for what the proxy fetches; a
        # worker that breaks one is this task's worker error, a 502 that names it.
        with upstream_reads.results():
            try:
                return await proxy(request, task)
            except upstream_reads.BoundBroken as exc:
                await request.app.state.router_task_registry.increment_upstream_error(
                    task.task_id, str(exc)
                )
                raise http_exception(
                    status_code=502, detail=f"worker {task.upstream_server_id}: {exc}"
                ) from exc

    return proxy_to_current_instance


def _streaming_result(namespace: MutableMapping[str, Any]) -> Callable[..., Any]:
    """``proxy_router_task_result`` that streams every result to the client.

    MinerU's reads a JSON result (markdown and all) whole before answering;
    this one relays it as it comes, like any other result. An error answer
    is read (at most MAX_STATUS_MB) and answered with its status, counted as
    the task's upstream error, as MinerU does.
    """
    httpx = namespace["httpx"]
    http_exception = namespace["HTTPException"]
    streaming_response = namespace["StreamingResponse"]
    background_task = namespace["BackgroundTask"]
    download_timeout = namespace["build_result_download_timeout"]
    tasks_endpoint = namespace["TASKS_ENDPOINT"]

    @functools.wraps(namespace["proxy_router_task_result"])
    async def proxy_router_task_result(request: Any, task: Any) -> Any:
        client = request.app.state.http_client
        registry = request.app.state.router_task_registry
        url = f"{task.upstream_base_url}{tasks_endpoint}/{task.upstream_task_id}/result"
        try:
            upstream = await client.send(
                client.build_request("GET", url, timeout=download_timeout()), stream=True
            )
        except httpx.HTTPError as exc:
            await registry.increment_upstream_error(task.task_id, str(exc))
            raise http_exception(status_code=502, detail=str(exc)) from exc
        if upstream.status_code != 200:
            try:
                body = await upstream.aread()
            finally:
                await upstream.aclose()
            detail = body.decode("utf-8", errors="replace").strip() or upstream.reason_phrase
            await registry.increment_upstream_error(
                task.task_id, f"{upstream.status_code} {detail}"
            )
            raise http_exception(status_code=upstream.status_code, detail=detail)
        disposition = upstream.headers.get("content-disposition")

        async def relay() -> Any:
            try:
                async for chunk in upstream.aiter_bytes():
                    yield chunk
            finally:  # also when the client went away mid-result
                await upstream.aclose()

        return streaming_response(
            relay(),
            status_code=200,
            media_type=upstream.headers.get("content-type") or "application/octet-stream",
            headers={"content-disposition": disposition} if disposition else {},
            background=background_task(upstream.aclose),
        )

    return proxy_router_task_result


def _add_attempts(record_class: type) -> None:
    current = record_class.__dict__["to_status_payload"]

    @functools.wraps(current)
    def to_status_payload(record: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        payload: dict[str, Any] = current(record, *args, **kwargs)
        tried = workers_tried(record)
        payload["attempts"] = max(1, len(tried))
        payload["workers_tried"] = tried
        return payload

    record_class.to_status_payload = to_status_payload  # type: ignore[attr-defined]

"""MinerU 4.0's router answers for the jobs another router drives (a shared store, issue 35).

Behind one Service a client's status or result request reaches any router; 4.0 answers
404 for a job or file id its registry does not have. With a shared store
(``STORE_URL``), the ASGI middleware :class:`AnotherRoutersJobs` (``install_app`` adds
it) looks such an id up in the store first (``runtime/router/shared_rows.py``: a job by
its key, a file by the row that names it) and, when another router's row has it (for
the same caller: 4.0's owner scope), answers from that row, read only: nothing is
written, nothing is driven (only the owner checks a job and sends it again)::

    app.add_middleware(AnotherRoutersJobs, line=line, registry=state.registry)

- A read (``GET /v1/parse/jobs/{id}``, ``/v1/tasks/{id}``, ``/v1/tasks/{id}/result``,
  ``/v1/files/{id}/content``) runs 4.0's own route with the row's routes *lent* for that
  request: built from the row as ``JobLine.revive`` builds them, never registered,
  found by the registry's ``find`` only inside the request (:func:`lend_routes`). The
  job route is ``upstream_lost``, so 4.0 answers its status from the row's payload: the
  owner writes the row when the job is accepted, sent again and ended, so an unfinished
  job shows its status of then (``queued``) until it ends, or ``running`` while the
  worker the row names runs it (its word, nothing else of its payload). A
  result's files are fetched from the worker the row names, as 4.0 fetches its own,
  when that worker is one of this router's too, at the same URL (the shared remote
  workers of several routers); another router's local worker is not asked: 503 with
  ``Retry-After`` (behind the Service a retry may reach the owner).
- ``GET /v1/files/{id}``: the file's metadata, read from its worker (4.0's route would
  register the file as this router's own), its id the public one.
- A cancel (``DELETE /v1/parse/jobs/{id}``, ``/v1/tasks/{id}``) or a file's deletion:
  409 ``owned_by_another_router`` naming the owner, with ``Retry-After``: only the
  router that drives a job changes it (a cancel sent to its worker from here would race
  the owner sending it again elsewhere); an ended job's, 4.0's ``job_already_terminal``.
- A store that cannot be read: 503 ``store_unreachable`` with ``Retry-After``, never 404.

Everything runs on the router's event loop.
"""

from __future__ import annotations

import contextvars
import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mineru_health.runtime.router.line import ask_status
from mineru_health.runtime.router.policy import AnswerKind, is_terminal
from mineru_health.runtime.router.shared_rows import (
    StoreUnreadable,
    row_naming,
    row_of_another_router,
)
from mineru_health.runtime.router.store import Saved

from .jobs import JobLine

__all__ = ["AnotherRoutersJobs", "Asked", "Lent", "asked", "lend_routes", "lent_routes"]

#: The routes lent to the request being answered: (kind, public id) -> 4.0 ResourceRoute.
_LENT: contextvars.ContextVar[Mapping[tuple[str, str], Any] | None] = contextvars.ContextVar(
    "mineru_health_lent_routes", default=None
)
_LENDING = "_mineru_health_lends_routes"

_JOB = re.compile(r"/v1/(?:parse/jobs|tasks)/([A-Za-z0-9_-]+)(/result)?")
_FILE = re.compile(r"/v1/files/([A-Za-z0-9_-]+)(/content)?")
STATUS, RESULT, CHANGE, METADATA = "status", "result", "change", "metadata"


@dataclass(frozen=True)
class Asked:
    """What a request asks of a job or file: its kind, public id, and one of STATUS,
    RESULT (a result's bytes), CHANGE (a cancel or deletion), METADATA (a file's)."""

    kind: str
    public_id: str
    what: str


def asked(method: str, path: str) -> Asked | None:
    """The job or file a request names and what it asks; None for any other request."""
    job, file = _JOB.fullmatch(path), _FILE.fullmatch(path)
    if job is not None and method in ("GET", "DELETE"):
        if method == "DELETE":
            return None if job.group(2) else Asked("job", job.group(1), CHANGE)
        return Asked("job", job.group(1), RESULT if job.group(2) else STATUS)
    if file is not None and method in ("GET", "DELETE"):
        if method == "DELETE":
            return None if file.group(2) else Asked("file", file.group(1), CHANGE)
        return Asked("file", file.group(1), RESULT if file.group(2) else METADATA)
    return None


@dataclass(frozen=True)
class Lent:
    """Another router's row as 4.0's routes: the job's and its files', by (kind, id)."""

    owner: str  # the router that drives the job
    saved: Saved
    routes: Mapping[tuple[str, str], Any]

    @property
    def job(self) -> Any:
        return self.routes[("job", self.saved.key)]


def lent_routes(route_class: Any, owner: str, saved: Saved) -> Lent:
    """The routes of ``saved`` (another router's row), as ``JobLine.revive`` builds them,
    registered nowhere; the job's is ``upstream_lost`` (4.0 answers from its payload)."""
    record = saved.record
    fields = record["route"]
    payload = fields.get("payload")
    if not isinstance(payload, dict):
        payload = {"job_id": saved.key, "status": saved.state}
    job = route_class(
        kind="job",
        public_id=saved.key,
        owner_scope=fields["owner_scope"],
        worker_id=fields["worker_id"],
        upstream_id=fields["upstream_id"],
        created_at=fields["created_at"],
        metadata={
            "payload": copy.deepcopy(payload),
            "upstream_lost": True,
            "input_aliases": dict(fields.get("input_aliases") or {}),
        },
    )
    routes: dict[tuple[str, str], Any] = {("job", saved.key): job}
    for file in record.get("files") or []:
        metadata = {"payload": file["payload"]} if isinstance(file.get("payload"), dict) else {}
        routes[("file", file["public_id"])] = route_class(
            kind="file",
            public_id=file["public_id"],
            owner_scope=file["owner_scope"],
            worker_id=file["worker_id"],
            upstream_id=file["upstream_id"],
            created_at=file["created_at"],
            metadata=metadata,
        )
    return Lent(owner, saved, routes)


def lend_routes(registry: Any) -> None:
    """4.0's ``registry.find`` finds the routes lent to the request being answered too
    (after its own: a route of this router's always wins). Idempotent."""
    if getattr(registry, _LENDING, False):
        return
    find = registry.find

    def find_or_lent(kind: str, public_id: str) -> Any:
        route = find(kind, public_id)
        lent = _LENT.get()
        if route is None and lent is not None:
            return lent.get((kind, public_id))
        return route

    registry.find = find_or_lent
    setattr(registry, _LENDING, True)


class AnotherRoutersJobs:
    """ASGI middleware: another router's jobs answered from the shared store (module doc)."""

    def __init__(self, app: Any, line: JobLine, registry: Any) -> None:
        self.app = app
        self._line = line
        self._registry = registry
        lend_routes(registry)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        question = None
        if scope["type"] == "http":
            question = asked(scope.get("method", ""), scope.get("path", ""))
        if question is None or self._registry.find(question.kind, question.public_id) is not None:
            await self.app(scope, receive, send)
            return
        from starlette.requests import Request

        request = Request(scope, receive)
        try:
            lent = await self._lend(question, self._line.namespace["_caller_scope"](request))
        except StoreUnreadable as error:
            await self._error(503, "store_unreachable", error.detail, error.headers)(
                scope, receive, send
            )
            return
        if lent is None:
            await self.app(scope, receive, send)  # no router has it: 4.0's 404
            return
        answer = await self._answer(question, lent, request)
        if answer is not None:
            await answer(scope, receive, send)
            return
        token = _LENT.set(lent.routes)
        try:
            await self.app(scope, receive, send)
        finally:
            _LENT.reset(token)

    async def _lend(self, question: Asked, caller: str) -> Lent | None:
        """Another router's row with the asked job or file, as routes; None when no other
        router has it for this caller (4.0 answers 404)."""
        supervisor = self._line.supervisor
        if question.kind == "job":
            found = await row_of_another_router(supervisor, question.public_id)
        else:
            found = await row_naming(supervisor, question.public_id)
        if found is None:
            return None
        try:
            lent = lent_routes(self._line.namespace["ResourceRoute"], *found)
        except (KeyError, TypeError, AttributeError):
            return None  # not a 4.0 job's row (another line's router on the same store)
        route = lent.routes.get((question.kind, question.public_id))
        return lent if route is not None and route.owner_scope == caller else None

    async def _answer(self, question: Asked, lent: Lent, request: Any) -> Any:
        """The answer made here (a refusal, a file's metadata), or None: 4.0's route
        answers, with the routes lent."""
        retry = {"Retry-After": str(self._line.supervisor.retry_after_s)}
        if question.what == CHANGE:
            status = str(lent.job.metadata["payload"].get("status") or lent.saved.state)
            if question.kind == "job" and is_terminal(status):
                return self._error(409, "job_already_terminal", f"Job is {status}")
            what = "job" if question.kind == "job" else f"the job of file {question.public_id}"
            return self._error(
                409,
                "owned_by_another_router",
                f"router {lent.owner!r} drives {what} {lent.saved.key}: only it cancels or "
                "deletes; retry (behind the routers' Service the request may reach it)",
                retry,
            )
        if question.what == STATUS:
            await self._show_running(lent)
            return None
        # A result's bytes: from the worker the row names (a job's outputs are on its own).
        route = lent.routes[(question.kind, question.public_id)]
        if self._worker(route.worker_id, lent.saved) is None:
            return self._error(
                503,
                "worker_of_another_router",
                f"{question.kind} {question.public_id} is on worker {route.worker_id} of "
                f"router {lent.owner!r}, not one of this router's; retry (behind the "
                "routers' Service the request may reach it)",
                retry,
            )
        if question.what == METADATA:
            return await self._metadata(route, request)
        return None

    async def _show_running(self, lent: Lent) -> None:
        """An unfinished job's row says what it was when its owner last wrote it (``queued``,
        mostly): while its worker (one of this router's, at the row's URL) runs it, it
        shows ``running`` and when it started; nothing else of the worker's payload (its
        file ids are for the owner to name), and any other answer leaves the row's."""
        payload, saved = lent.job.metadata["payload"], lent.saved
        worker = self._worker(saved.worker, saved)
        if is_terminal(payload.get("status")) or worker is None:
            return
        answer = await ask_status(
            self._line.pool.fleet,
            worker.base_url,
            f"/v1/parse/jobs/{saved.upstream_id}",
            self._line.supervisor.status_timeout_s,
        )
        if answer.kind is AnswerKind.STATUS and answer.status == "running":
            payload["status"] = "running"
            started = (answer.payload or {}).get("started_at")
            if isinstance(started, str):
                payload["started_at"] = started

    def _worker(self, worker_id: str, saved: Saved) -> Any:
        """This router's worker ``worker_id`` if it is the one the row names (the job's
        worker at the row's URL), else None."""
        worker = next((w for w in self._line.pool.workers if w.worker_id == worker_id), None)
        if worker is None or worker_id != saved.worker or not saved.instance:
            return worker
        return worker if worker.base_url.rstrip("/") == saved.instance.rstrip("/") else None

    async def _metadata(self, route: Any, request: Any) -> Any:
        ns, pool = self._line.namespace, self._line.pool
        try:
            upstream = await ns["request_upstream"](
                pool,
                pool.get(route.worker_id),
                "GET",
                f"/v1/files/{route.upstream_id}",
                request=request,
            )
        except ns["RouterProxyError"] as error:  # outside 4.0's handlers: answered here
            return self._error(error.status_code, error.code, error.message)
        result = ns["_successful_json"](upstream)
        if not isinstance(result, dict):
            return result  # the worker's error, as 4.0 passes it on
        for name in ("id", "file_id"):
            if name in result:
                result[name] = route.public_id
        return ns["JSONResponse"](result, status_code=upstream.status_code)

    def _error(
        self, status: int, code: str, message: str, headers: Mapping[str, str] | None = None
    ) -> Any:
        kind = "invalid_request_error" if status == 409 else "api_error"
        return self._line.namespace["JSONResponse"](
            {"error": {"type": kind, "code": code, "message": message}},
            status_code=status,
            headers=dict(headers or {}),
        )

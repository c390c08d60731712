"""MinerU 4.0's router jobs as the supervisor keeps them, asks about them and sends them again.

4.0.12's router hands a job's inputs to one worker and keeps nothing it
could send again; a job whose worker dies, stalls, is killed or restarted
ends ``failed``. The ``JobLine`` is the :class:`Line` of the runtime's
:class:`~mineru_health.runtime.router.supervisor.Supervisor` for 4.0: it
keeps each job's request body and pins its inputs' bytes in the router's
source store (``track``) until the job is terminal, reads 4.0's job payloads
into the policy's words (``policy_payload``: 4.0's own ``engine_dead`` code,
a patched worker's verdict, the task watchdog's ``task_hung``), and moves
4.0's routes: a job sent again keeps its public id, its route points at the
new worker and upstream id (``ResourceRegistry`` aliases), so 4.0's own
``get_job``, reconciliation, hydration and clean-up follow it; while it is
being sent, 4.0 answers from the kept payload (status ``queued``).

4.0 reads job statuses itself (client requests, its reconciliation loop);
the line sees each of them (``observe``) and each 404 (``missing``), through
``app.py``'s helpers that ``endpoints.py`` wraps, as it wraps the submission
(admission, failover). What the endpoints call:

    line = JobLine(pool)                                  # the pool, beside its supervisor
    line.install(registry, source_store, app_globals)    # install_app
    line.track(route, body, admission=admission)          # submit_job handed ``body`` on
    line.observe(payload, worker)  # 4.0 read a job's payload: an engine death sent again
    line.missing(route, pool)      # its worker answered 404: a kept job sent again
    line.unaccept(job, uploads)    # its row could not be written: undone, never accepted
    line.resume()                  # start-up, workers up: the router's store taken back

When the job's row cannot be written at 4.0's first read of it
(``observe``), the job is undone (``unaccept``: its route and the files
staged with it leave 4.0's registry and source store, its worker's load is
released, the worker is asked to cancel it and delete those files) and the
client gets 507: it was never accepted.

With the router's store (``store``), a job's row is its route (worker,
upstream id, payload, input aliases, the caller's authorization for 4.0's
reconciliation), the routes of its input and output files, its kept body
and its inputs' bytes, which the source store then keeps in the router's
state directory (``sources/``) rather than a temporary one. The row is
written when 4.0 first reads the created job's payload, before the client's
answer, again when the job is sent again and when it ends. A new router
answers for an ended job from its stored payload (its outputs are read from
the worker, whose outputs and task store outlive the router too); an
unfinished one is kept and checked again. Runs on the router's event loop;
not thread-safe.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import hashlib
import sys
import time
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mineru_health import safe_text
from mineru_health.mineru4 import ENGINE_DEAD_CODE, TASK_HUNG_CODE
from mineru_health.runtime.router.admission import Admission, Refused
from mineru_health.runtime.router.line import (
    Kept,
    NotSent,
    Revived,
    Sent,
    Snapshot,
    Unavailable,
    ask_status,
)
from mineru_health.runtime.router.policy import (
    Action,
    Answer,
    AnswerKind,
    Refusal,
    is_terminal,
)
from mineru_health.runtime.router.store import Saved
from mineru_health.runtime.router.supervisor import Supervisor
from mineru_health.runtime.verdict import TaskVerdict

__all__ = ["Job", "JobLine", "policy_payload"]

_log = safe_text.logger("mineru_health.router.jobs")

#: The source store's directory inside the router's state directory (with a store).
SOURCES_NAME = "sources"


@dataclass
class Job:
    """A kept job: its route, its body (inputs by public file id) and their bytes."""

    route: Any  # 4.0's ResourceRoute, moved to the new worker on each resubmission
    body: dict[str, Any]
    sources: dict[str, tuple[Any, str]]  # public file id -> (StoredSourceFile, file name)
    pins: ExitStack
    headers: dict[str, str]
    resendable: bool  # False: an input has no bytes here (e.g. an earlier job's output)
    saved: bool = False  # its row, with the payload 4.0 answers with, is in the router's store


def policy_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """A 4.0 job payload in the resubmission policy's words (status, engine_dead, error)."""
    files = [f for f in payload.get("files") or [] if isinstance(f, dict)]
    errors: list[dict[str, Any]] = [f["error"] for f in files if isinstance(f.get("error"), dict)]
    dead = payload.get("engine_dead") is True or any(
        e.get("code") == ENGINE_DEAD_CODE for e in errors
    )
    view: dict[str, Any] = {"status": payload.get("status"), "engine_dead": dead}
    if errors:
        view["error"] = str(errors[0].get("message") or errors[0].get("code") or "")
    if isinstance(payload.get("verdict"), dict):  # a patched worker's verdict
        view["verdict"] = payload["verdict"]
    elif any(e.get("code") == TASK_HUNG_CODE for e in errors):
        # The worker's task watchdog failed it: resubmit it, count it against
        # the document (poison guard), never eject the worker for it.
        view["verdict"] = TaskVerdict.hung().to_wire()
    return view


class JobLine:
    """MinerU 4.0's side of the supervisor: jobs, their statuses, their submissions."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self._registry: Any = None  # 4.0's ResourceRegistry, SourceFileStore and app.py's
        self._sources: Any = None  # globals, given by ``install``
        self._ns: MutableMapping[str, Any] = {}
        #: ``app.py``'s helpers that end a job its worker lost, as 4.0 wrote them
        #: (``endpoints.py`` wraps them in ``app.py``).
        self.rewrite: Any = None
        self.mark_missing: Any = None
        self._sources_dir: Path | None = None
        self._undoing: set[asyncio.Task[None]] = set()  # upstream deletions of unaccepted jobs
        #: Jobs another router took over from this one (``disowned``): their routes stay.
        self._disowned: set[str] = set()

    @property
    def supervisor(self) -> Supervisor:
        return self._pool.supervisor  # type: ignore[no-any-return]

    @property
    def pool(self) -> Any:
        return self._pool

    @property
    def namespace(self) -> MutableMapping[str, Any]:
        """``app.py``'s globals."""
        return self._ns

    def install(self, registry: Any, sources: Any, namespace: MutableMapping[str, Any]) -> None:
        """Takes 4.0's registry, source store and ``app.py``'s globals (``namespace``)."""
        self._registry, self._sources, self._ns = registry, sources, namespace
        store = self.supervisor.store
        if store is not None and store.path is not None and sources is not None:
            # Nothing staged yet (create_app): inputs land where they outlive the router.
            self._sources_dir = store.path.parent / SOURCES_NAME
            sources._root = self._sources_dir
        rewrite, missing = namespace["rewrite_job_payload"], namespace["_mark_missing_job"]
        self.rewrite = getattr(rewrite, "__wrapped__", rewrite)
        self.mark_missing = getattr(missing, "__wrapped__", missing)
        if self.supervisor.store is not None:
            self._forget_expired()

    def _forget_expired(self) -> None:
        """4.0's retention takes the rows of the jobs it expires out of the router's store."""
        registry, collect = self._registry, self._registry.collect_expired

        @functools.wraps(collect)
        def collect_and_forget(sources: Any) -> None:
            before = {r.public_id for r in registry.list("job", include_expired=True)}
            collect(sources)
            after = {r.public_id for r in registry.list("job", include_expired=True)}
            self.supervisor.forget(before - after)

        registry.collect_expired = collect_and_forget

    # -- keeping -------------------------------------------------------------------------
    def track(
        self, route: Any, body: dict[str, Any], *, admission: Admission | None = None
    ) -> None:
        """Keeps ``body`` (as sent to the worker) and pins its inputs until the job ends,
        taking ``admission`` (the submission's reservation) over."""
        aliases = dict(route.metadata.get("input_aliases") or {})
        kept_body = copy.deepcopy(body)
        sources: dict[str, tuple[Any, str]] = {}
        pins = ExitStack()
        resendable = True
        for entry in kept_body.get("files") or []:
            source = entry.get("source") if isinstance(entry, dict) else None
            if not isinstance(source, dict) or source.get("type") != "file_id":
                continue  # url, inline and local sources are sent again as they are
            public_id = aliases.get(str(source.get("file_id")))
            stored = self._sources.find_file(public_id) if public_id else None
            if public_id is None or stored is None:
                resendable = False
                continue
            pins.enter_context(self._sources.pin(stored))
            file_route = self._registry.find("file", public_id)
            meta = (file_route.metadata.get("payload") if file_route is not None else None) or {}
            sources[public_id] = (stored, str(meta.get("filename") or "input.pdf"))
            source["file_id"] = public_id
        digest = None
        if sources:
            digest = hashlib.sha256(
                "".join(stored.sha256sum for stored, _ in sources.values()).encode()
            ).hexdigest()
        job = Job(
            route=route,
            body=kept_body,
            sources=sources,
            pins=pins,
            headers=dict(route.metadata.get("upstream_headers") or {}),
            resendable=resendable,
        )
        # Saved once 4.0 has read its payload (``observe``), still before the client's answer.
        self.supervisor.keep(
            route.public_id,
            job,
            route.worker_id,
            self._pool.get(route.worker_id).base_url,
            digest=digest,
            save=False,
            size_bytes=sum(stored.bytes for stored, _ in sources.values()),
            admission=admission,
        )

    def find_source(self, file_id: str) -> Any:
        """4.0's stored source file of ``file_id``, or None."""
        return self._sources.find_file(file_id)

    def file_payloads(self, worker_id: str) -> list[tuple[str, dict[str, Any] | None]]:
        """(upstream id, metadata) of every file the router knows on ``worker_id``; None for
        metadata 4.0 has not read yet (it reads an output's after the job ended, and the
        worker may be drained in between)."""
        if self._registry is None:
            return []  # not installed: the router knows no file
        return [
            (r.upstream_id, p if isinstance(p := r.metadata.get("payload"), dict) else None)
            for r in self._registry.list("file", include_expired=True)
            if r.worker_id == worker_id
        ]

    # -- answers 4.0 read itself -----------------------------------------------------------
    def observe(self, rewritten: dict[str, Any], worker: Any) -> dict[str, Any]:
        """Every job payload 4.0 read from a worker: send an engine death again, else let go."""
        kept = self.supervisor.find(str(rewritten.get("job_id") or ""))
        if kept is not None and not kept.item.saved:
            kept.item.saved = True  # the first read: submit_job answers the client next
            try:
                self.supervisor.commit(kept)
            except Refused as refusal:  # not kept: endpoints.py undoes it (unaccept)
                refusal.item = kept.item
                raise
        if (
            kept is None
            or kept.busy
            or kept.worker != worker.worker_id
            or not is_terminal(rewritten.get("status"))
        ):
            return rewritten
        step = self.supervisor.decide(kept, Answer.of_status(policy_payload(rewritten)))
        if step.action is Action.RESUBMIT:
            return copy.deepcopy(kept.item.route.metadata.get("payload") or {})
        self.supervisor.release(kept)
        return rewritten

    def missing(self, route: Any, pool: Any) -> dict[str, Any]:
        """4.0's worker answered 404 for the job: send a kept one again, else 4.0's failure."""
        kept = self.supervisor.find(route.public_id)
        if kept is None and route.public_id in self._disowned:
            # Another router drives it now, maybe on another worker: never failed here.
            return copy.deepcopy(route.metadata.get("payload") or {})
        if kept is None or kept.item.route is not route:
            return self.mark_missing(route, pool)  # type: ignore[no-any-return]
        if not kept.busy:
            self.supervisor.decide(
                kept,
                Answer(
                    AnswerKind.NOT_FOUND,
                    detail=(f"worker {route.worker_id} does not know job {route.upstream_id}"),
                ),
            )
        return copy.deepcopy(route.metadata.get("payload") or {})

    def unaccept(self, job: Job, uploads: Mapping[int, Any]) -> None:
        """Undoes a job whose row could not be written (the client gets 507): its route and
        the files uploaded with it leave 4.0's registry and source store (their bytes are
        deleted), its worker's load is released, and its worker is asked (in the background)
        to cancel it and delete those files. The supervisor already dropped it."""
        route, files = job.route, job.body.get("files") or []
        self._ns["release_job_load"](route, self._pool)
        self._registry.remove("job", route.public_id)
        upstream = [(route.worker_id, f"/v1/parse/jobs/{route.upstream_id}")]
        for index in uploads:
            source = files[index].get("source") if index < len(files) else None
            public_id = str(source.get("file_id")) if isinstance(source, dict) else ""
            file_route = self._registry.remove("file", public_id)
            self._sources.delete_file(public_id)
            if file_route is not None:
                upstream.append((file_route.worker_id, f"/v1/files/{file_route.upstream_id}"))
        _log.warning("job %s: not accepted (its row could not be written); undone", route.public_id)
        task = asyncio.get_running_loop().create_task(self._delete_upstream(upstream))
        self._undoing.add(task)
        task.add_done_callback(self._undoing.discard)

    async def _delete_upstream(self, paths: list[tuple[str, str]]) -> None:
        for worker_id, path in paths:
            try:
                await self._ns["request_upstream"](
                    self._pool, self._pool.get(worker_id), "DELETE", path
                )
            except Exception as exc:  # noqa: BLE001 -- best effort: the worker's retention ends it
                _log.info("%s on %s: not deleted (%s)", path, worker_id, exc)

    # -- the supervisor's Line ----------------------------------------------------------------
    async def ask(self, kept: Kept, url: str) -> Answer:
        return await ask_status(
            self._pool.fleet,
            url,
            f"/v1/parse/jobs/{kept.item.route.upstream_id}",
            self.supervisor.status_timeout_s,
            policy_payload,
        )

    async def stored(self, kept: Kept) -> Answer | None:
        # Not read: a restarted 4.0 instance has a fresh upload directory, so neither it
        # nor the retired outputs (the router never saw the files) can serve a job the
        # dead instance finished unseen. The new instance's 404 sends it again.
        return None

    async def apply(self, kept: Kept, answer: Answer, url: str, *, adopt: bool) -> None:
        pass  # 4.0's own reads (client requests, its reconciliation) take statuses on

    async def count_error(self, kept: Kept, detail: str) -> None:
        pass  # likewise: 4.0 counts and reports its own upstream errors

    def lost(self, kept: Kept) -> None:
        """The job has no upstream now: 4.0 answers from a pending copy of its payload."""
        route = kept.item.route
        self._ns["release_job_load"](route, self._pool)  # the lost worker's reservation
        route.metadata["upstream_lost"] = True
        route.metadata["payload"] = _pending(route.metadata.get("payload") or {})

    async def digest(self, kept: Kept) -> str | None:
        return kept.digest  # hashed from the stored inputs' own digests when kept

    async def send(self, kept: Kept, avoid: set[str]) -> Sent | Unavailable | NotSent | None:
        job = kept.item
        if not job.resendable:
            return NotSent(
                Refusal.REJECTED,
                "not sent again: an input of the job has no bytes "
                "in the router (it could not be sent again)",
            )
        reservation = self._reserve(job)
        if reservation is None:
            return None
        worker = reservation.worker
        if worker.worker_id in avoid:
            reservation.release()
            return None
        try:
            await self._send(kept, reservation)
        except Exception as exc:  # noqa: BLE001 -- another worker may take it
            reservation.release()
            status = int(getattr(exc, "status_code", 0) or 0)
            if 400 <= status < 500 and status not in (404, 408, 409, 429):
                return NotSent(
                    Refusal.REJECTED, f"not sent again: {worker.worker_id} refused it ({exc})"
                )
            return Unavailable(worker.worker_id, str(exc))
        return Sent(worker.worker_id, worker.base_url)

    def _reserve(self, job: Job) -> Any:
        body = job.body
        flash_only = self._ns["is_flash_only_parse_extension"]
        return self._pool.reserve_job(
            tier=body.get("tier"),
            required_sources={f["source"]["type"] for f in body.get("files") or []},
            required_outputs=set(body.get("output_formats") or ["markdown"]),
            require_flash=any(flash_only(name) for _, name in job.sources.values()),
        )

    async def _send(self, kept: Kept, reservation: Any) -> None:
        """Uploads the kept inputs to the reserved worker, creates the job, moves the route."""
        ns, job, registry = self._ns, kept.item, self._registry
        route = job.route
        worker, generation = reservation.worker, reservation.generation
        body = copy.deepcopy(job.body)
        aliases: dict[str, str] = {}
        copies: list[Any] = []
        for entry in body.get("files") or []:
            source = entry["source"]
            if source.get("type") != "file_id":
                continue
            public_id = source["file_id"]
            stored, name = job.sources[public_id]
            uploaded = await ns["upload_stored_source"](
                stored, name, worker, request=None, pool=self._pool, generation=generation
            )
            file_id = str(uploaded["file"]["id"])
            source["file_id"] = file_id
            aliases[file_id] = public_id
            # Deleted from that worker once the job ends, as 4.0's cross-worker copies.
            copies.append(
                ns["CopiedInputFile"](
                    source_public_id=public_id,
                    owner_scope=route.owner_scope,
                    worker_id=worker.worker_id,
                    upstream_file_id=file_id,
                )
            )
        response = await ns["request_upstream"](
            self._pool, worker, "POST", "/v1/parse/jobs", json_body=body, headers=job.headers
        )
        ns["require_worker_generation"](worker, generation)
        result = ns["json_or_error"](response)
        job_id = result.get("job_id")
        if not isinstance(job_id, str):
            raise ns["RouterProxyError"](
                502, "invalid_upstream_response", "Created job did not return a job_id"
            )
        registry.remove_upstream_alias(
            "job",
            owner_scope=route.owner_scope,
            worker_id=route.worker_id,
            upstream_id=route.upstream_id,
        )
        route.worker_id, route.upstream_id = worker.worker_id, job_id
        registry.alias_upstream(route, worker_id=worker.worker_id, upstream_id=job_id)
        route.metadata.update(
            input_aliases=aliases,
            copied_inputs=[*(route.metadata.get("copied_inputs") or []), *copies],
            active_counted=True,
            reservation=reservation,
            upstream_headers=dict(job.headers),
        )
        route.metadata.pop("upstream_lost", None)
        self.rewrite(result, worker, registry, self._pool, route.owner_scope)
        _log.warning(
            "job %s: sent to %s as upstream job %s", route.public_id, worker.worker_id, job_id
        )

    async def fail(self, kept: Kept, text: str) -> None:
        """Ends the job failed, every unfinished file with ``engine_dead`` and ``text``."""
        route = kept.item.route
        payload = route.metadata.get("payload") or {}
        payload["status"] = "failed"
        payload["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for file in payload.get("files") or []:
            if file.get("status") != "completed":
                file["status"] = "failed"
                file["error"] = {"type": "engine_error", "code": ENGINE_DEAD_CODE, "message": text}
        route.metadata["payload"] = payload
        route.metadata["upstream_lost"] = True

    def release(self, kept: Kept) -> None:
        kept.item.pins.close()

    def disowned(self, kept: Kept) -> None:
        # 4.0 keeps the route (its own reads ask the worker it names); the pins go. Taking
        # the route out of 4.0's registry here would race the reads under way: a read whose
        # route went meanwhile has its worker's ids given new public ones (seen: a paused
        # router's answer named a job id nobody had). Should the new owner send the job to
        # another worker, the first one answers 404 (``missing``: the job's last
        # payload here, never failed).
        self._disowned.add(kept.key)
        kept.item.pins.close()

    def names(self, kept: Kept) -> list[str]:
        return [name for _, name in kept.item.sources.values()]

    def terminal(self, kept: Kept) -> bool:
        return is_terminal((kept.item.route.metadata.get("payload") or {}).get("status"))

    # -- the router's store -----------------------------------------------------------------
    def _file_ids(self, job: Job) -> Iterator[str]:
        """Public ids of the job's input and output files."""
        yield from job.sources
        yield from (job.route.metadata.get("input_aliases") or {}).values()
        for file in (job.route.metadata.get("payload") or {}).get("files") or []:
            if not isinstance(file, dict):
                continue
            if isinstance(file.get("file_id"), str):
                yield file["file_id"]
            for output in (file.get("output_files") or {}).values():
                if isinstance(output, dict) and isinstance(output.get("file_id"), str):
                    yield output["file_id"]

    def snapshot(self, kept: Kept) -> Snapshot:
        job = kept.item
        route = job.route
        payload = route.metadata.get("payload")
        state = str((payload or {}).get("status") or "queued")
        done = is_terminal(state)
        files = []
        for public_id in dict.fromkeys(self._file_ids(job)):
            found = self._registry.find("file", public_id)
            if found is not None:
                files.append(_route_fields(found))
        sources = (
            {}
            if done
            else {
                public_id: {
                    "path": str(stored.path),
                    "bytes": stored.bytes,
                    "sha256sum": stored.sha256sum,
                    "mime_type": stored.mime_type,
                    "name": name,
                }
                for public_id, (stored, name) in job.sources.items()
            }
        )
        fields = _route_fields(route)
        fields.update(
            input_aliases=dict(route.metadata.get("input_aliases") or {}),
            headers=dict(job.headers),
            finalized_at=route.metadata.get("finalized_at"),
        )
        return Snapshot(
            state=state,
            upstream_id=str(route.upstream_id),
            source="\n".join(s["path"] for s in sources.values()),
            record={
                "route": fields,
                "files": files,
                "body": job.body,
                "sources": sources,
                "resendable": job.resendable,
            },
        )

    def revive(self, saved: Saved) -> Revived | None:
        """Puts the job's route and its files' routes back; its inputs' bytes if it is not over."""
        record, registry = saved.record, self._registry
        fields = record["route"]
        route = registry.register(
            "job",
            owner_scope=fields["owner_scope"],
            worker_id=fields["worker_id"],
            upstream_id=fields["upstream_id"],
            public_id=saved.key,
        )
        route.created_at = fields["created_at"]
        for file in record.get("files") or []:
            file_route = registry.register(
                "file",
                owner_scope=file["owner_scope"],
                worker_id=file["worker_id"],
                upstream_id=file["upstream_id"],
                public_id=file["public_id"],
            )
            file_route.created_at = file["created_at"]
            if isinstance(file.get("payload"), dict):
                file_route.metadata["payload"] = file["payload"]
        route.metadata.update(
            input_aliases=dict(fields.get("input_aliases") or {}),
            upstream_headers=dict(fields.get("headers") or {}),
        )
        if isinstance(fields.get("payload"), dict):
            route.metadata["payload"] = fields["payload"]
        if is_terminal(saved.state):
            # 4.0 answers for it from this payload; its outputs are read from its worker.
            route.metadata["upstream_lost"] = True
            route.metadata["finalized_at"] = fields.get("finalized_at") or self._ns["utc_now_iso"]()
            return None
        if any(w.worker_id == route.worker_id for w in self._pool.workers):
            # Counted on its worker as 4.0 counts a job it sent, so that 4.0's reconciliation
            # reads it until it ends and its row says so, whichever router a client asks.
            route.metadata["active_counted"] = True
            self._pool.mark_job_started(route.worker_id)
        stored_class = sys.modules[type(self._sources).__module__].StoredSourceFile
        sources: dict[str, tuple[Any, str]] = {}
        pins = ExitStack()
        resendable = bool(record.get("resendable", True))
        for public_id, source in (record.get("sources") or {}).items():
            stored = stored_class(
                path=Path(source["path"]),
                bytes=int(source["bytes"]),
                sha256sum=str(source["sha256sum"]),
                mime_type=str(source["mime_type"]),
            )
            if not stored.path.is_file():
                resendable = False
                continue
            self._sources.bind_source(public_id, stored, owner_scope=route.owner_scope)
            pins.enter_context(self._sources.pin(stored))
            sources[public_id] = (stored, str(source["name"]))
        job = Job(
            route=route,
            body=dict(record.get("body") or {}),
            sources=sources,
            pins=pins,
            headers=dict(fields.get("headers") or {}),
            resendable=resendable,
            saved=True,
        )
        return Revived(job, list(saved.workers), sum(s.bytes for s, _ in sources.values()))

    def resume(self) -> None:
        """Takes the router's store back (start-up, workers up, before any request).

        Inputs' bytes no unfinished job holds (those of ended jobs, or left by
        a router killed while staging) are deleted from the sources directory.
        """
        if self.supervisor.store is None:
            return
        self.supervisor.resume()
        uploads = self._sources_dir / "uploads" if self._sources_dir is not None else None
        if uploads is None or not uploads.is_dir():
            return
        held = {
            stored.path
            for kept in self.supervisor.kept()
            for stored, _ in kept.item.sources.values()
        }
        for leftover in uploads.iterdir():
            if leftover not in held and leftover.is_file():
                leftover.unlink(missing_ok=True)


def _route_fields(route: Any) -> dict[str, Any]:
    """A 4.0 ``ResourceRoute`` as the router's store keeps it."""
    return {
        "public_id": route.public_id,
        "owner_scope": route.owner_scope,
        "worker_id": route.worker_id,
        "upstream_id": route.upstream_id,
        "created_at": route.created_at,
        "payload": route.metadata.get("payload"),
    }


def _pending(payload: dict[str, Any]) -> dict[str, Any]:
    """The job as the client sees it while it is sent again: queued, nothing failed."""
    pending = copy.deepcopy(payload)
    pending["status"] = "queued"
    pending["finished_at"] = None
    for file in pending.get("files") or []:
        if isinstance(file, dict) and file.get("status") != "completed":
            file.update(status="queued", error=None, output_files=None, parse=None)
    progress = pending.get("progress")
    if isinstance(progress, dict):
        progress["failed"] = 0
    return pending

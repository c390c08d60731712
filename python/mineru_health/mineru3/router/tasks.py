"""MinerU 3.x's router tasks as the supervisor keeps them, asks about them and sends them again.

A task is MinerU's ``RouterTaskRecord`` plus its staged upload (``endpoints.py``
defers MinerU's cleanup of it): the ``TaskLine`` is the :class:`Line` of the
runtime's :class:`~mineru_health.runtime.router.supervisor.Supervisor` for
MinerU 3.x, and what the task endpoints call:

    await line.track(record, payload, digest, registry)  # MinerU registered it: kept until it ends
    await line.hold(payload, digest, registry)      # no healthy worker, one restarting: pending
    await line.refresh(record)                      # a client asked for its status
    line.follow_restart(record)                     # a result request: to the current instance
    line.resume(registry)                           # start-up: the router's store taken back
    line.owner(record)                              # another router's task (a shared store)
    await line.refresh_shared(record)               # its status, read only

A task's status shows ``attempts`` and ``workers_tried`` (``workers_tried``).
With the router's store, a task's row is MinerU's ``RouterTaskRecord`` and
its staged form (fields, uploads); its uploads live in the router's state
directory (``kept_dir``, moved there by ``endpoints.py`` when staged) until
it ends. Runs on the router's event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import shutil
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import Any

from mineru_health import safe_text
from mineru_health.runtime.router.admission import Refused
from mineru_health.runtime.router.fleet import DECLARED_FAILED
from mineru_health.runtime.router.leases import shared
from mineru_health.runtime.router.line import (
    Kept,
    NotSent,
    Revived,
    Sent,
    Snapshot,
    Unavailable,
    ask_status,
)
from mineru_health.runtime.router.poison import content_digest
from mineru_health.runtime.router.policy import Answer, AnswerKind, Refusal, is_terminal
from mineru_health.runtime.router.shared_rows import StoreUnreadable, row_of_another_router
from mineru_health.runtime.router.store import Saved
from mineru_health.runtime.router.supervisor import Supervisor

__all__ = [
    "RETAINED_CLASS",
    "WORKERS_ATTR",
    "Task",
    "TaskLine",
    "move_staged",
    "upload_bytes",
    "upload_names",
    "workers_tried",
]

_log = safe_text.logger("mineru_health.router.tasks")

#: Attribute on MinerU's RouterTaskRecord: the server ids it was submitted to, in order.
WORKERS_ATTR = "_mineru_health_workers_tried"
#: Name in the router module's globals of the payload class whose cleanup waits (endpoints.py).
RETAINED_CLASS = "_mineru_health_retained_payload"
#: Attribute on a RouterTaskRecord read from another router's row: that router's id.
OWNER_ATTR = "_mineru_health_owner"
#: A worker's statuses that another router's task shows before its row says it ended.
SHOWN_FROM_WORKER = frozenset({"pending", "processing", "completed"})


def workers_tried(record: Any) -> list[str]:
    """Server ids the task was submitted to, first one first."""
    tried = getattr(record, WORKERS_ATTR, None)
    if isinstance(tried, list):  # empty: a held task not sent yet
        return list(tried)
    server = getattr(record, "upstream_server_id", "")
    return [server] if server else []


def upload_names(payload: Any) -> list[str]:
    """The names the client uploaded, in order (MinerU's staged payload)."""
    return [str(u.upload_name) for u in getattr(payload, "uploads", [])]


def upload_bytes(payload: Any) -> int:
    """Bytes the staged uploads take on disk (0 for one already gone)."""
    total = 0
    for upload in getattr(payload, "uploads", []):
        with contextlib.suppress(OSError, TypeError):
            total += os.stat(upload.path).st_size
    return total


def _record_fields(record: Any) -> dict[str, Any]:
    """MinerU's RouterTaskRecord as plain fields (ours left out)."""
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    return {k: v for k, v in vars(record).items() if k != WORKERS_ATTR}


def move_staged(payload: Any, kept_dir: Path) -> Any:
    """Moves a staged upload's directory into ``kept_dir`` (blocking: a copy across file
    systems); its uploads' paths follow. Returns ``payload``."""
    old = Path(payload.temp_dir)
    kept_dir.mkdir(parents=True, exist_ok=True)
    new = kept_dir / old.name
    try:
        shutil.move(str(old), str(new))
    except BaseException:
        # A copy cut short (a full disk) leaves nothing in kept_dir; the caller deletes ``old``.
        if new.exists() and old.exists():
            shutil.rmtree(new, ignore_errors=True)
        raise
    payload.temp_dir = str(new)
    for upload in payload.uploads:
        upload.path = str(new / Path(upload.path).relative_to(old))
    return payload


class Task:
    """A kept task: MinerU's record of it, its staged upload, the registry it is in."""

    __slots__ = ("payload", "record", "registry")

    def __init__(self, record: Any, payload: Any, registry: Any) -> None:
        self.record, self.payload, self.registry = record, payload, registry


class TaskLine:
    """MinerU 3.x's side of the supervisor: tasks, their statuses, their submissions."""

    def __init__(self, pool: Any, namespace: Mapping[str, Any]) -> None:
        self._pool = pool
        self._ns = namespace
        self._registry: Any = None  # MinerU's task registry, once resumed

    @property
    def supervisor(self) -> Supervisor:
        return self._pool.supervisor  # type: ignore[no-any-return]

    def kept_dir(self) -> Path | None:
        """Where staged uploads go to outlive the router (its store's), or None."""
        store = self.supervisor.store
        return store.kept_dir if store is not None else None

    # -- what the endpoints call -------------------------------------------------------
    async def track(self, record: Any, payload: Any, digest: str | None, registry: Any) -> None:
        """Keeps ``payload`` for ``record`` (MinerU registered the task) until it is terminal.

        The router's store has its row when this returns (before the client's answer);
        when it cannot be written the task leaves MinerU's registry, its staged files are
        deleted, and :class:`Refused` (507) is raised: it was never accepted.
        """
        kept = await self._keep(
            record, payload, digest, registry, record.upstream_server_id, record.upstream_base_url
        )
        if is_terminal(record.status):
            self.supervisor.release(kept)

    async def hold(self, payload: Any, digest: str | None, registry: Any) -> Any:
        """A pending task for ``payload``, sent once a worker is healthy (bounded, as a
        resubmission is: ``BOOT_TIMEOUT_S``, then it fails clearly). Returns its record."""
        names = upload_names(payload)
        record = await registry.register(
            upstream_server_id="",
            upstream_base_url="",
            upstream_task_id="",
            backend=payload.get_field_value("backend") or "",
            file_names=[PurePath(self._ns["normalize_upload_filename"](n)).stem for n in names],
            created_at=self._ns["utc_now_iso"](),
            status="pending",
            started_at=None,
            completed_at=None,
            error=None,
            queued_ahead=None,
        )
        kept = await self._keep(record, payload, digest, registry, "", "")
        self.supervisor.hold(kept)
        return record

    async def _keep(
        self,
        record: Any,
        payload: Any,
        digest: str | None,
        registry: Any,
        worker_id: str,
        instance: str,
    ) -> Kept:
        """The supervisor keeps the task (its admission taken over) and writes its row (on a
        thread: the router serves meanwhile); a row that cannot be written takes it out of
        MinerU's registry (Refused, 507)."""
        tried: list[str] = []
        setattr(record, WORKERS_ATTR, tried)
        payload.retained = True
        try:
            kept = self.supervisor.keep(
                record.task_id,
                Task(record, payload, registry),
                worker_id,
                instance,
                digest=digest,
                size_bytes=upload_bytes(payload),
                workers=tried,
                save=False,
                admission=getattr(payload, "admission", None),
            )
            await self.supervisor.commit_off_loop(kept)
            return kept
        except Refused:
            # Not served as accepted: MinerU's registry has no removal, its dict is it.
            registry._tasks.pop(record.task_id, None)
            raise

    def result_urls(self, worker_id: str) -> list[str]:
        """The worker URLs of the results of the completed tasks MinerU's registry still
        lists on ``worker_id`` (a drained worker's, copied before it is forgotten)."""
        tasks = getattr(self._registry, "_tasks", None) or {}
        return [
            f"{r.upstream_base_url}{self._ns['TASKS_ENDPOINT']}/{r.upstream_task_id}/result"
            for r in list(tasks.values())
            if r.upstream_server_id == worker_id and r.status == self._ns["TASK_COMPLETED"]
        ]

    def tracks(self, record: Any) -> bool:
        return self.supervisor.find(getattr(record, "task_id", "")) is not None

    async def refresh(self, record: Any) -> Any:
        """MinerU's status refresh for a kept task; returns the (updated) record."""
        kept = self.supervisor.find(record.task_id)
        if kept is not None:
            await self.supervisor.refresh(kept)
            if self.supervisor.find(record.task_id) is None and not is_terminal(record.status):
                # Let go meanwhile: another router took it over (leases.py) and its row
                # answers now, as any other router's task.
                shared = await self._registry.get(record.task_id)
                if shared is not None and self.owner(shared) is not None:
                    return await self.refresh_shared(shared)
        return record

    def follow_restart(self, record: Any) -> bool:
        """Points a finished task's result request at its worker's *current* instance.

        A restarted local worker restored the task from its task store; only
        a restart changes a local worker's URL, so the new URL is the right
        one. False while that worker is declared failed or restarting: the
        caller answers 503 rather than let MinerU count upstream errors (at
        three, MinerU turns a completed task into a failed one).
        """
        server = self._pool.get_server(getattr(record, "upstream_server_id", ""))
        if server is None or not is_terminal(record.status):
            return True
        if server.local_server is not None and server.base_url:
            record.upstream_base_url = server.base_url
        status = self._pool.fleet.status(server.server_id)
        return status is None or status.in_rotation or status.phase not in DECLARED_FAILED

    # -- tasks another router drives (a shared store) ------------------------------------
    def _or_another_routers(self, get: Any) -> Any:
        """MinerU's ``registry.get``, which falls back on the shared store's row of a task
        this router does not know (another router's): every endpoint that reads a task
        answers it then, where it answered 404 (shared_rows.py)."""

        @functools.wraps(get)
        async def get_or_shared(task_id: str) -> Any:
            record = await get(task_id)
            if record is not None:
                return record
            try:
                found = await row_of_another_router(self.supervisor, task_id)
            except StoreUnreadable as error:
                raise self._ns["HTTPException"](
                    status_code=503, detail=error.detail, headers=error.headers
                ) from None
            if found is None:
                return None
            owner, saved = found
            record = self._record(saved)
            setattr(record, OWNER_ATTR, owner)
            return record

        return get_or_shared

    @staticmethod
    def owner(record: Any) -> str | None:
        """The router that drives ``record``'s task when it is another one's, else None."""
        owner = getattr(record, OWNER_ATTR, None)
        return owner if isinstance(owner, str) else None

    async def refresh_shared(self, record: Any) -> Any:
        """Another router's task, read only: its row's status, or its worker's when the
        row is not terminal and the worker has it running or done (a failure there is
        for the owner to judge: it may send the task again). Returns ``record``."""
        if is_terminal(record.status) or not record.upstream_base_url:
            return record
        answer = await ask_status(
            self._pool.fleet,
            record.upstream_base_url,
            f"/tasks/{record.upstream_task_id}",
            self.supervisor.status_timeout_s,
        )
        payload = answer.payload or {}
        if answer.kind is AnswerKind.STATUS and answer.status in SHOWN_FROM_WORKER:
            record.status = answer.status
            for name in ("started_at", "completed_at", "queued_ahead"):
                if name in payload:
                    setattr(record, name, payload[name])
        return record

    # -- the supervisor's Line -----------------------------------------------------------
    async def ask(self, kept: Kept, url: str) -> Answer:
        record = kept.item.record
        return await ask_status(
            self._pool.fleet,
            url,
            f"/tasks/{record.upstream_task_id}",
            self.supervisor.status_timeout_s,
        )

    async def stored(self, kept: Kept) -> Answer | None:
        """The task store of the dead local worker, for the instance that cannot answer.

        Its replacement may take minutes to boot; the store lives in the
        worker's state directory on this machine: a task that finished before
        the crash is there, and is kept rather than sent again (the restarted
        worker serves its result). Remote workers: no store to read.
        """
        member = self._pool.fleet.member(kept.worker)
        if member is None or not member.local:
            return None
        from mineru_health.runtime.worker import store

        record = kept.item.record
        stored = await asyncio.to_thread(
            store.read, self._pool.fleet.state_dirs.state_dir(kept.worker), record.upstream_task_id
        )
        if stored is None:
            return None
        fields, verdict = stored
        payload = {
            k: fields.get(k)
            for k in ("status", "backend", "file_names", "started_at", "completed_at", "error")
        }
        if verdict is not None:
            payload["engine_dead"] = bool(verdict.get("engine_dead"))
            payload["verdict"] = verdict
        _log.info(
            "task %s: %s is gone; its task store says %s",
            record.task_id,
            kept.worker,
            payload["status"],
        )
        return Answer.of_status(payload, detail="task store", from_store=True)

    async def apply(self, kept: Kept, answer: Answer, url: str, *, adopt: bool) -> None:
        record = kept.item.record
        if adopt:
            record.upstream_base_url = url
        payload = dict(answer.payload or {})
        payload["created_at"] = record.created_at  # the client's task began then
        await kept.item.registry.update_from_upstream_payload(record.task_id, payload)

    async def count_error(self, kept: Kept, detail: str) -> None:
        await kept.item.registry.increment_upstream_error(kept.item.record.task_id, detail)

    def lost(self, kept: Kept) -> None:
        pass  # MinerU's record keeps its last status until the task is sent again

    async def digest(self, kept: Kept) -> str | None:
        return await asyncio.to_thread(content_digest, [u.path for u in kept.item.payload.uploads])

    async def send(self, kept: Kept, avoid: set[str]) -> Sent | Unavailable | NotSent | None:
        pool = self._pool
        server = await pool.acquire_submission_server(excluded_server_ids=avoid)
        if server is None:
            return None
        try:
            upstream = await self._ns["submit_payload_to_upstream"](
                server.base_url, kept.item.payload
            )
        except self._ns["UpstreamSubmissionUnavailable"] as exc:
            await pool.mark_submission_failure(server.server_id, str(exc))
            return Unavailable(server.server_id, str(exc))
        except self._ns["UpstreamSubmissionRejected"] as exc:
            return NotSent(
                Refusal.REJECTED,
                f"submission to {server.server_id} refused: {exc.status_code} {exc.detail}",
            )
        finally:
            await pool.release_submission_server(server.server_id)
        record = kept.item.record
        record.upstream_server_id = server.server_id
        record.upstream_base_url = server.base_url
        record.upstream_task_id = upstream["task_id"]
        record.status = upstream["status"]
        started = upstream.get("started_at")
        record.started_at = started if isinstance(started, str) else None
        record.completed_at = None
        record.error = None
        record.queued_ahead = upstream.get("queued_ahead")
        record.upstream_error_count = 0
        return Sent(server.server_id, server.base_url)

    async def fail(self, kept: Kept, text: str) -> None:
        await kept.item.registry.mark_failed(kept.item.record.task_id, text)

    def release(self, kept: Kept) -> None:
        kept.item.payload.release()

    def disowned(self, kept: Kept) -> None:
        # MinerU's registry has no removal, its dict is it.
        kept.item.registry._tasks.pop(kept.key, None)

    def names(self, kept: Kept) -> list[str]:
        return upload_names(kept.item.payload)

    def terminal(self, kept: Kept) -> bool:
        return is_terminal(kept.item.record.status)

    # -- the router's store ---------------------------------------------------------------
    def snapshot(self, kept: Kept) -> Snapshot:
        record, payload = kept.item.record, kept.item.payload
        done = is_terminal(record.status)
        uploads = [
            {
                "field_name": getattr(u, "field_name", "files"),
                "upload_name": str(u.upload_name),
                "content_type": getattr(u, "content_type", "application/octet-stream"),
                "path": str(u.path),
            }
            for u in getattr(payload, "uploads", [])
        ]
        return Snapshot(
            state=str(record.status),
            upstream_id=str(record.upstream_task_id),
            source="" if done else str(getattr(payload, "temp_dir", "") or ""),
            record={
                "task": _record_fields(record),
                "fields": [list(f) for f in getattr(payload, "fields", [])],
                "uploads": [] if done else uploads,
            },
        )

    def _record(self, saved: Saved) -> Any:
        """MinerU's RouterTaskRecord of a stored row (not put into any registry)."""
        fields = saved.record["task"]
        known = {f.name for f in dataclasses.fields(self._ns["RouterTaskRecord"])}
        record = self._ns["RouterTaskRecord"](**{k: v for k, v in fields.items() if k in known})
        setattr(record, WORKERS_ATTR, list(saved.workers))
        return record

    def revive(self, saved: Saved) -> Revived | None:
        """Puts the task back into MinerU's registry; its staged form too if it is not over."""
        registry, ns = self._registry, self._ns
        record = self._record(saved)
        tried = workers_tried(record)
        setattr(record, WORKERS_ATTR, tried)
        registry._tasks[record.task_id] = record  # MinerU's registry has no insert by id
        if is_terminal(record.status):
            return None
        payload = ns[RETAINED_CLASS](
            temp_dir=saved.source,
            fields=[tuple(f) for f in saved.record.get("fields") or []],
            uploads=[ns["StagedUpload"](**u) for u in saved.record.get("uploads") or []],
        )
        payload.retained = True
        return Revived(Task(record, payload, registry), tried, upload_bytes(payload))

    def resume(self, registry: Any) -> None:
        """Takes the router's store back (start-up, workers up, before any request).

        MinerU's retention then takes rows out of the store with the tasks
        it expires; staged uploads no unfinished task holds (left by a router
        killed while staging) are deleted.
        """
        self._registry = registry
        if self.supervisor.store is None:
            return
        self.supervisor.resume()
        expire = registry.cleanup_expired_tasks

        @functools.wraps(expire)
        async def cleanup_and_forget() -> int:
            before = set(registry._tasks)
            expired: int = await expire()
            self.supervisor.forget(before.difference(registry._tasks))
            return expired

        registry.cleanup_expired_tasks = cleanup_and_forget
        if shared(self.supervisor.store) is not None:
            registry.get = self._or_another_routers(registry.get)
        kept_dir = self.kept_dir()
        if kept_dir is not None and kept_dir.is_dir():
            held = {Path(k.item.payload.temp_dir) for k in self.supervisor.kept()}
            for leftover in kept_dir.iterdir():
                if leftover not in held:
                    shutil.rmtree(leftover, ignore_errors=True)

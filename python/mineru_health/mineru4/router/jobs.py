"""MinerU 4.0's router jobs kept until they end, and sent again when a worker lost them.

4.0.12's router hands a job's inputs to one worker and keeps nothing it
could send again; a job whose worker dies, stalls, is killed or restarted
ends ``failed`` (``engine_dead``, "Worker engine was replaced", or
``upstream_job_lost``). The ``JobSupervisor`` keeps each job's request body
and pins its inputs' bytes in the router's source store (``track``) until
the job is terminal, and resubmits it, under the same public job id, when

(a) its status says ``failed`` because the engine died (4.0's own verdict,
    ``error.code == "engine_dead"`` on its files, or ``"engine_dead": true``);
(b) its worker is declared failed (threshold, definitive 503, process exit,
    stall) or is being restarted: reacted to on the poller's events;
(c) the worker's current instance does not know the job (404).

The decisions are the line-agnostic ones of
``integration/router/resubmit_policy.py`` (retry limit, fleet-wide retry
budget) and ``poison.py`` (a document that killed two workers' engines as
the trigger is not sent again); this module only reads 4.0's payloads into
the policy's vocabulary and moves 4.0's routes. A resubmitted job's route
points at its new worker and upstream id (``ResourceRegistry`` aliases), so
4.0's own ``get_job``, reconciliation, hydration and clean-up follow it;
while it is being sent again, 4.0 answers from the kept payload (status
``queued``).

    supervisor = JobSupervisor(pool, registry, source_store, app_globals)
    supervisor.install(app_globals)   # wraps rewrite_job_payload, _mark_missing_job
    supervisor.track(route, body)     # submit_job handed ``body`` on (patched line)
    supervisor.on_event(event)        # every poller event (the pool calls it)
    await supervisor.close()          # router shutdown: every pin released

Its interface to the pool is small: ``reserve_job``/``get`` (4.0's),
``status``, ``check_process``, ``report_passive``. Runs on the router's event
loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import time
from collections.abc import Callable, MutableMapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from mineru_health import _native, metrics, safe_text
from mineru_health.integration.router.poison import PoisonGuard
from mineru_health.integration.router.projection import DECLARED_FAILED
from mineru_health.integration.router.resubmit_policy import (
    Action,
    Answer,
    AnswerKind,
    Refusal,
    RetryBudget,
    WorkerView,
    failure_text,
    is_terminal,
    next_step,
    refuse_resubmission,
    trigger_rule,
)
from mineru_health.mineru4 import TASK_HUNG_CODE

__all__ = ["JobSupervisor", "KeptJob", "policy_payload"]

_log = safe_text.logger("mineru_health.router.jobs")

_AUDIT = _native.PollerEventKind.AUDIT
_RESTART = _native.PollerEventKind.RESTART_REQUESTED
_ENGINE_DEAD = "engine_dead"


@dataclass
class KeptJob:
    """One job the router keeps: its route, its body (inputs by public file id), their bytes."""

    route: Any  # 4.0's ResourceRoute, moved to the new worker on each resubmission
    body: dict[str, Any]
    sources: dict[str, tuple[Any, str]]  # public file id -> (StoredSourceFile, file name)
    pins: ExitStack
    headers: dict[str, str]
    digest: str | None
    resendable: bool
    workers: list[str] = field(default_factory=list)
    submissions: int = 1
    resubmitting: bool = False  # being sent again right now (waiting included)
    counted: bool = False  # past the retry budget's check
    check: asyncio.Task[None] | None = None

    @property
    def retrying(self) -> bool:
        """Counted as a retry in flight (the budget), from its first resubmission to its end."""
        return self.counted or self.submissions > 1


def policy_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """A 4.0 job payload in the resubmission policy's words (status, engine_dead, error)."""
    files = [f for f in payload.get("files") or [] if isinstance(f, dict)]
    errors: list[dict[str, Any]] = [f["error"] for f in files if isinstance(f.get("error"), dict)]
    dead = payload.get("engine_dead") is True or any(e.get("code") == _ENGINE_DEAD
                                                     for e in errors)
    view: dict[str, Any] = {"status": payload.get("status"), "engine_dead": dead}
    if errors:
        view["error"] = str(errors[0].get("message") or errors[0].get("code") or "")
    if isinstance(payload.get("verdict"), dict):  # a patched worker's verdict
        view["verdict"] = payload["verdict"]
    elif any(e.get("code") == TASK_HUNG_CODE for e in errors):
        # The worker's task watchdog failed it: resubmit it, count it against
        # the document (poison guard), never eject the worker for it.
        view["verdict"] = {"hung": True, "role": "trigger", "rule": "watchdog.task_hung",
                           "category": TASK_HUNG_CODE}
    return view


class JobSupervisor:
    """Keeps unfinished jobs' inputs and resubmits those a worker lost."""

    def __init__(self, pool: Any, registry: Any, sources: Any,
                 namespace: MutableMapping[str, Any], *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        s = pool.health_settings
        self._pool = pool
        self._registry = registry
        self._sources = sources
        self._ns = namespace
        self._clock = clock
        self.task_retries = int(s.task_retries)
        self.budget = RetryBudget(float(s.retry_budget_percent), int(s.retry_budget_min))
        self.poison = PoisonGuard()
        self.wait_for_worker_s = float(s.boot_timeout_s)
        self.retry_interval_s = float(s.interval_s)
        self.status_timeout_s = max(3.0, 2.0 * float(s.probe_timeout_s))
        self._jobs: dict[str, KeptJob] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._rewrite: Any = None
        self._mark_missing: Any = None

    # -- hooks into app.py ----------------------------------------------------------
    def install(self, ns: MutableMapping[str, Any]) -> None:
        """Wraps the two helpers through which 4.0 ends a job its worker lost."""
        rewrite, missing = ns["rewrite_job_payload"], ns["_mark_missing_job"]
        self._rewrite = getattr(rewrite, "__wrapped__", rewrite)
        self._mark_missing = getattr(missing, "__wrapped__", missing)

        def rewrite_job_payload(payload: dict[str, Any], worker: Any, registry: Any,
                                pool: Any, owner_scope: str) -> dict[str, Any]:
            rewritten = self._rewrite(payload, worker, registry, pool, owner_scope)
            return self.observe(rewritten, worker)

        def mark_missing_job(route: Any, pool: Any) -> dict[str, Any]:
            return self.missing(route, pool)

        rewrite_job_payload.__wrapped__ = self._rewrite  # type: ignore[attr-defined]
        mark_missing_job.__wrapped__ = self._mark_missing  # type: ignore[attr-defined]
        ns["rewrite_job_payload"] = rewrite_job_payload
        ns["_mark_missing_job"] = mark_missing_job

    # -- registration -------------------------------------------------------------
    def track(self, route: Any, body: dict[str, Any]) -> None:
        """Keeps ``body`` (as sent to the worker) and pins its inputs until the job ends."""
        if self._closed:
            return
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
                resendable = False  # e.g. an earlier job's output as input: no bytes here
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
        self._jobs[route.public_id] = KeptJob(
            route=route, body=kept_body, sources=sources, pins=pins,
            headers=dict(route.metadata.get("upstream_headers") or {}), digest=digest,
            resendable=resendable, workers=[route.worker_id])

    @property
    def in_flight(self) -> int:
        return len(self._jobs)

    def retries_in_flight(self, exclude: KeptJob | None = None) -> int:
        return sum(1 for j in self._jobs.values() if j is not exclude and j.retrying)

    def file_payloads(self, worker_id: str) -> list[tuple[str, dict[str, Any]]]:
        """(upstream id, metadata) of every file the router knows on ``worker_id``."""
        return [(r.upstream_id, r.metadata["payload"])
                for r in self._registry.list("file", include_expired=True)
                if r.worker_id == worker_id and isinstance(r.metadata.get("payload"), dict)]

    async def submit_with_failover(self, submit_job: Any, body: dict[str, Any], request: Any,
                                   uploads: Any) -> Any:
        """4.0's ``submit_job``, made again on another worker when the chosen one failed.

        Before each new try the launched workers' processes are checked (a
        killed one leaves rotation at once) and one probe interval passes,
        so that the policy has taken in what the failure showed.
        """
        error = self._ns["RouterProxyError"]
        tries = len(self._pool.workers) + 1
        for attempt in range(1, tries + 1):
            last = attempt == tries
            try:
                response = await submit_job(body, request, uploads)
            except error as exc:
                if last or exc.status_code not in (502, 504):
                    raise
                _log.warning("a submission failed on its worker (%s); trying again", exc)
            else:
                if (last or response.status_code != 503
                        or b'"engine_dead"' not in bytes(response.body)):
                    return response
                _log.warning("a submission was refused with 503 engine_dead; trying again")
            for worker in self._pool.workers:
                self._pool.check_process(worker)
            await asyncio.sleep(self.retry_interval_s)
        raise AssertionError("unreachable")

    # -- answers 4.0 got from a worker ------------------------------------------------
    def observe(self, rewritten: dict[str, Any], worker: Any) -> dict[str, Any]:
        """Every job payload 4.0 read from a worker: resubmit an engine death, else let go."""
        kept = self._jobs.get(str(rewritten.get("job_id") or ""))
        if (kept is None or kept.resubmitting or kept.route.worker_id != worker.worker_id
                or not is_terminal(rewritten.get("status"))):
            return rewritten
        view = policy_payload(rewritten)
        step = next_step(Answer(AnswerKind.STATUS, payload=view), self._view(kept))
        if step.action is Action.RESUBMIT:
            if view["engine_dead"]:
                # The worker's own verdict: out of rotation before the next probe.
                self._pool.report_passive(worker, "a job failed with engine_dead")
            return self._resubmit(kept, step.reason, str(view.get("error") or ""),
                                  trigger_rule(view))
        self._forget(kept)
        return rewritten

    def missing(self, route: Any, pool: Any) -> dict[str, Any]:
        """4.0's worker answered 404 for the job: resubmit a kept one, else 4.0's failure."""
        kept = self._jobs.get(route.public_id)
        if kept is None or kept.route is not route:
            return self._mark_missing(route, pool)  # type: ignore[no-any-return]
        if kept.resubmitting:
            return copy.deepcopy(route.metadata.get("payload") or {})
        step = next_step(Answer(AnswerKind.NOT_FOUND, detail="404"), self._view(kept))
        return self._resubmit(kept, step.reason or "lost",
                              f"worker {route.worker_id} does not know job {route.upstream_id}",
                              None)

    # -- poller events ----------------------------------------------------------------
    def on_event(self, event: Any) -> None:
        """A worker declared failed or being restarted: check every job it holds, at once."""
        if self._closed:
            return
        restarting = event.kind == _RESTART
        if not restarting and not (event.kind == _AUDIT and event.audit.to_phase in DECLARED_FAILED):
            return
        for kept in [j for j in self._jobs.values() if j.route.worker_id == event.worker_id]:
            if restarting:
                # The pool is stopping that instance now: what it holds is lost.
                if not kept.resubmitting:
                    self._resubmit(kept, "worker_failed",
                                   f"worker {event.worker_id} is being restarted", None)
            elif kept.check is None or kept.check.done():
                kept.check = self._spawn(self._check(kept), "check")

    async def _check(self, kept: KeptJob) -> None:
        """Asks the worker about a job of a worker declared failed; resubmits if it is lost."""
        route = kept.route
        worker_id, upstream_id = route.worker_id, route.upstream_id
        worker = self._pool.get(worker_id)
        answer = await self._ask(worker.base_url, upstream_id)
        if answer.kind is AnswerKind.UNREACHABLE:
            self._pool.check_process(worker)  # a dead process is reported now
        if (kept.resubmitting or self._jobs.get(route.public_id) is not kept
                or route.worker_id != worker_id or route.upstream_id != upstream_id):
            return  # resubmitted or ended meanwhile: this answer is about the past
        step = next_step(answer, self._view(kept))
        if step.action is Action.RESUBMIT:
            view = answer.payload or {}
            self._resubmit(kept, step.reason, str(view.get("error") or "") or step.detail,
                           trigger_rule(view) if view else None)
        # Otherwise 4.0's own reads (client requests, its reconciliation) take it on.

    async def _ask(self, base_url: str, upstream_id: str) -> Answer:
        import httpx

        if not base_url:
            return Answer(AnswerKind.UNREACHABLE, detail="the worker has no URL (restarting)")
        try:
            response = await self._pool.client.get(f"{base_url}/v1/parse/jobs/{upstream_id}",
                                                   timeout=self.status_timeout_s)
        except httpx.HTTPError as exc:
            return Answer(AnswerKind.UNREACHABLE, detail=f"{type(exc).__name__}: {exc}".strip())
        if response.status_code == 404:
            return Answer(AnswerKind.NOT_FOUND, detail=f"404 from {base_url}")
        try:
            payload = response.json() if response.status_code == 200 else None
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            return Answer(AnswerKind.BAD_ANSWER, detail=f"{response.status_code} from {base_url}")
        return Answer(AnswerKind.STATUS, payload=policy_payload(payload))

    def _view(self, kept: KeptJob) -> WorkerView:
        status = self._pool.status(kept.route.worker_id)
        worker = self._pool.get(kept.route.worker_id)
        declared = status is not None and status.phase in DECLARED_FAILED
        return WorkerView(
            in_rotation=bool(status is not None and status.in_rotation),
            declared_failed=declared,
            same_instance=True,
            # A local worker declared failed is restarted: what it runs is lost.
            replaced=declared and worker.local_worker is not None,
        )

    # -- sending again ---------------------------------------------------------------
    def _resubmit(self, kept: KeptJob, reason: str, error: str,
                  trigger: str | None) -> dict[str, Any]:
        """Starts sending ``kept`` again; returns the payload the client sees meanwhile."""
        route = kept.route
        self._ns["release_job_load"](route, self._pool)  # the lost worker's reservation
        kept.resubmitting = True
        if trigger and kept.digest:
            quarantine = self.poison.record_trigger(kept.digest, route.worker_id, trigger)
            if quarantine is not None:
                metrics.router.record_poison_document()
        # 4.0 answers from the kept payload while the job has no upstream.
        route.metadata["upstream_lost"] = True
        pending = _pending(route.metadata.get("payload") or {})
        route.metadata["payload"] = pending
        _log.warning("job %s: %s lost it (%s); sending it again", route.public_id,
                     route.worker_id, reason)
        self._spawn(self._send_again(kept, reason, error), "resubmit")
        return copy.deepcopy(pending)

    async def _send_again(self, kept: KeptJob, reason: str, error: str) -> None:
        try:
            deadline = self._clock() + self.wait_for_worker_s
            refusal = await self._within_budget(kept, deadline)
            if refusal is not None:
                self._fail(kept, refusal, error)
                return
            while not self._closed:
                reservation = self._reserve(kept)
                if reservation is not None:
                    try:
                        await self._send(kept, reservation)
                    except Exception as exc:  # noqa: BLE001 -- try another worker, bounded
                        reservation.release()
                        status = int(getattr(exc, "status_code", 0) or 0)
                        if 400 <= status < 500 and status not in (404, 408, 409, 429):
                            self._fail(kept, Refusal.REJECTED, f"{error} ({exc})")
                            return
                        _log.info("job %s: sending it to %s failed: %s", kept.route.public_id,
                                  reservation.worker.worker_id, exc)
                    else:
                        metrics.router.record_resubmission(reason)
                        return
                if self._clock() >= deadline:
                    self._fail(kept, Refusal.NO_WORKER, error)
                    return
                await asyncio.sleep(self.retry_interval_s)
        finally:
            kept.resubmitting = False

    async def _within_budget(self, kept: KeptJob, deadline: float) -> Refusal | None:
        """None once ``kept`` may be sent again; else why not.

        As on 3.x, the retry budget bounds how many resubmissions run at
        once, not whether a job is sent again: one over it waits (queued for
        its client, adding no load) until earlier ones end, until ``deadline``.
        """
        if kept.digest and self.poison.quarantined(kept.digest) is not None:
            return Refusal.POISON
        if not kept.resendable:
            return Refusal.REJECTED
        while True:
            refusal = refuse_resubmission(
                submissions=kept.submissions, task_retries=self.task_retries, budget=self.budget,
                retries_in_flight=self.retries_in_flight(exclude=kept),
                tasks_in_flight=self.in_flight)
            left = deadline - self._clock()
            if refusal is None:
                kept.counted = True  # no await since the check: two cannot take one place
                return None
            if refusal is not Refusal.BUDGET or self._closed or left <= 0:
                return refusal
            await asyncio.sleep(min(self.retry_interval_s, left))

    def _reserve(self, kept: KeptJob) -> Any:
        body = kept.body
        names = [name for _, name in kept.sources.values()]
        flash_only = self._ns["is_flash_only_parse_extension"]
        return self._pool.reserve_job(
            tier=body.get("tier"),
            required_sources={f["source"]["type"] for f in body.get("files") or []},
            required_outputs=set(body.get("output_formats") or ["markdown"]),
            require_flash=any(flash_only(name) for name in names),
        )

    async def _send(self, kept: KeptJob, reservation: Any) -> None:
        """Uploads the kept inputs to the reserved worker, creates the job, moves the route."""
        ns, route, registry = self._ns, kept.route, self._registry
        worker, generation = reservation.worker, reservation.generation
        body = copy.deepcopy(kept.body)
        aliases: dict[str, str] = {}
        copies: list[Any] = []
        for entry in body.get("files") or []:
            source = entry["source"]
            if source.get("type") != "file_id":
                continue
            public_id = source["file_id"]
            stored, name = kept.sources[public_id]
            uploaded = await ns["upload_stored_source"](stored, name, worker, request=None,
                                                        pool=self._pool, generation=generation)
            file_id = str(uploaded["file"]["id"])
            source["file_id"] = file_id
            aliases[file_id] = public_id
            # Deleted from that worker once the job ends, as 4.0's cross-worker copies.
            copies.append(ns["CopiedInputFile"](source_public_id=public_id,
                                                owner_scope=route.owner_scope,
                                                worker_id=worker.worker_id,
                                                upstream_file_id=file_id))
        response = await ns["request_upstream"](self._pool, worker, "POST", "/v1/parse/jobs",
                                                json_body=body, headers=kept.headers)
        ns["require_worker_generation"](worker, generation)
        result = ns["json_or_error"](response)
        job_id = result.get("job_id")
        if not isinstance(job_id, str):
            raise ns["RouterProxyError"](502, "invalid_upstream_response",
                                         "Created job did not return a job_id")
        registry.remove_upstream_alias("job", owner_scope=route.owner_scope,
                                       worker_id=route.worker_id, upstream_id=route.upstream_id)
        route.worker_id, route.upstream_id = worker.worker_id, job_id
        registry.alias_upstream(route, worker_id=worker.worker_id, upstream_id=job_id)
        route.metadata.update(
            input_aliases=aliases,
            copied_inputs=[*(route.metadata.get("copied_inputs") or []), *copies],
            active_counted=True, reservation=reservation, upstream_headers=dict(kept.headers))
        route.metadata.pop("upstream_lost", None)
        kept.submissions += 1
        kept.workers.append(worker.worker_id)
        kept.resubmitting = False
        self._rewrite(result, worker, registry, self._pool, route.owner_scope)
        _log.warning("job %s: sent again to %s (submission %d, upstream job %s)",
                     route.public_id, worker.worker_id, kept.submissions, job_id)

    def _fail(self, kept: KeptJob, refusal: Refusal, error: str) -> None:
        """Ends the job failed, with the reason it was not sent again."""
        metrics.router.record_resubmission_refused(refusal.value)
        route = kept.route
        payload = route.metadata.get("payload") or {}
        payload["status"] = "failed"
        payload["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        note = {
            Refusal.RETRIES: f"sent {kept.submissions} times, to {', '.join(kept.workers)}",
            Refusal.BUDGET: "the router's retry budget is spent",
            Refusal.NO_WORKER: f"no healthy worker within {self.wait_for_worker_s:g} s",
            Refusal.POISON: "the document killed the engine of two workers (quarantined)",
            Refusal.REJECTED: "it could not be sent again",
        }[refusal]
        for file in payload.get("files") or []:
            if file.get("status") != "completed":
                file["status"] = "failed"
                file["error"] = {"type": "engine_error", "code": _ENGINE_DEAD,
                                 "message": failure_text(error, f"not sent again: {note}")}
        route.metadata["payload"] = payload
        route.metadata["upstream_lost"] = True
        _log.error("job %s: not sent again (%s)", route.public_id, note)
        self._forget(kept)

    # -- end of a job -------------------------------------------------------------------
    def _forget(self, kept: KeptJob) -> None:
        if self._jobs.get(kept.route.public_id) is kept:
            del self._jobs[kept.route.public_id]
        kept.pins.close()

    def _spawn(self, coro: Any, what: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=f"mineru-health-job-{what}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def close(self) -> None:
        """Stops checks and resubmissions; every pinned input is let go (router shutdown)."""
        self._closed = True
        pending = [t for t in self._background if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        for kept in list(self._jobs.values()):
            self._forget(kept)

    def __repr__(self) -> str:
        return (f"JobSupervisor(in_flight={self.in_flight}, "
                f"retries_in_flight={self.retries_in_flight()})")


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

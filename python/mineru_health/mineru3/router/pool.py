"""MinerU 3.x's WorkerPool supervised by the fleet (native poller and restart policy).

``healing_pool_class(WorkerPool, globals())`` is the class ``router.py`` uses
after the patch. What it replaces of MinerU's pool: ``refresh_all`` and the
monitor loop (one native thread probes every worker on its own schedule;
its events write ``healthy``, the load figures and ``last_error`` onto
MinerU's ``WorkerState`` objects and keep nothing else), restarts (each its
own task), ``/health`` (the policy's fields added to every worker's entry).
A worker's own verdict seen in traffic ejects it at once: a submission
refused with 503 ``engine_unusable:`` (``mark_submission_failure``) or a
task status ``failed`` with ``"engine_dead": true``
(``observe_task_status``); no text is classified here.

The output directory of an instance a restart replaces is kept (MinerU's
``stop`` would delete it) until MinerU's task retention has passed, so that
the new instance still serves what the old one completed. Runs on the
router's event loop; not thread-safe, like the class it extends.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from mineru_health import _native
from mineru_health._names import enum_name
from mineru_health.runtime.router.audit import iso_time
from mineru_health.runtime.router.fleet import (
    expectations,
    probe_reason,
    short_reason,
)
from mineru_health.runtime.router.launch import PORTS, launching_class
from mineru_health.runtime.router.policy import Answer, passive_reason
from mineru_health.runtime.router.runtime import RouterRuntime, RuntimeParts, open_runtime
from mineru_health.runtime.router.stores import add_store_field
from mineru_health.runtime.verdict import REFUSAL_ERROR_PREFIX

from .tasks import TaskLine

if TYPE_CHECKING:  # result_copies imports httpx: only a running router loads it
    from mineru_health.runtime.router.result_copies import Copied, CopyReport, Served

__all__ = ["HealingPool", "RetiredOutputs", "Server", "add_policy_fields", "healing_pool_class"]

_PROBE = _native.PollerEventKind.PROBE
_AUDIT = _native.PollerEventKind.AUDIT


def healing_pool_class(base: type, namespace: Mapping[str, Any]) -> type:
    """The self-healing WorkerPool for a MinerU 3.x router module's globals()."""
    local_base = namespace.get("ManagedLocalServer")
    attrs = {
        "_router": namespace,
        "_local_server_class": launching_class(local_base) if local_base else None,
        "_mineru_health": True,
        "__module__": namespace.get("__name__", __name__),
        "__doc__": HealingPool.__doc__,
    }
    return type(base.__name__, (HealingPool, base), attrs)


class RetiredOutputs:
    """Output directories of instances a restart replaced, kept for MinerU's retention; and
    copies of the finished results of remote workers DNS drained (``result_copies.py``)."""

    def __init__(self, retention_s: float) -> None:
        self._retention_s = retention_s
        self._dirs: list[tuple[float, Any]] = []  # (monotonic time, TemporaryDirectory)
        self._copies: dict[str, Copied] = {}  # a result's URL (url_key) -> its copy
        self._copy_dirs: list[tuple[float, Any, list[str]]] = []  # (time, directory, keys)

    def retire(self, local_server: Any) -> None:
        """Keeps the outputs of the instance about to be stopped (MinerU's stop deletes them)."""
        temp_dir, local_server.temp_dir = local_server.temp_dir, None
        if temp_dir is None:
            return
        self._dirs.append((time.monotonic(), temp_dir))
        self._expire()

    def _expire(self) -> None:
        # MinerU expires those tasks after its retention; what they kept can go then.
        now = time.monotonic()
        if self._retention_s <= 0:
            return
        while self._dirs and now - self._dirs[0][0] > self._retention_s:
            _remove(self._dirs.pop(0)[1])
        while self._copy_dirs and now - self._copy_dirs[0][0] > self._retention_s:
            _, temp_dir, keys = self._copy_dirs.pop(0)
            for key in keys:
                self._copies.pop(key, None)
            _remove(temp_dir)

    async def copy_results(self, client: Any, urls: Iterable[str], *, max_bytes: int) -> CopyReport:
        """Copies the results at ``urls`` (a drained worker's ``/tasks/<id>/result``) through
        ``client``, at most ``max_bytes`` of copies in all; they are answered from the copy
        from then on (``transport``)."""
        from mineru_health.runtime.router.result_copies import (
            CopyFailed,
            CopyReport,
            copy_result,
            url_key,
        )

        self._expire()
        report, keys = CopyReport(), []
        temp_dir = tempfile.TemporaryDirectory(prefix="mineru-health-drained-")
        for number, url in enumerate(urls):
            key = url_key(url)
            if key in self._copies:
                continue
            room = max_bytes - sum(c.size for c in self._copies.values())
            try:
                copied = await copy_result(client, url, Path(temp_dir.name) / str(number), room)
            except CopyFailed as exc:
                report.failed.append(str(exc))
                continue
            self._copies[key] = copied
            keys.append(key)
            report.copied += 1
            report.size += copied.size
        if keys:
            self._copy_dirs.append((time.monotonic(), temp_dir, keys))
        else:
            _remove(temp_dir)
        return report

    def answer(self, method: str, url: Any) -> Served | None:
        """The answer to a request for a copied result, or None (not one: ask the worker)."""
        from mineru_health.runtime.router.result_copies import FileStream, url_key

        copied = self._copies.get(url_key(url)) if method == "GET" else None
        if copied is None:
            return None
        headers = {"content-type": copied.content_type, "content-length": str(copied.size)}
        if copied.content_disposition:
            headers["content-disposition"] = copied.content_disposition
        try:
            return 200, headers, FileStream(copied.path)
        except OSError:
            return 404, {"content-type": "application/json"}, b'{"detail":"Task result not found"}'

    def answer_under(self, client: Any) -> None:
        """Puts the answers for copied results under MinerU's ``client`` (before the fleet
        puts its bounds above them): its routes read results through it."""
        import httpx

        from mineru_health.runtime.router.result_copies import answering_transport

        inner = getattr(client, "_transport", None)  # httpx's name for it since 0.18
        if isinstance(inner, httpx.AsyncBaseTransport):
            client._transport = answering_transport(self.answer, inner)

    def close(self) -> None:
        for _, temp_dir in self._dirs:
            _remove(temp_dir)
        self._dirs.clear()
        for _, temp_dir, _keys in self._copy_dirs:
            _remove(temp_dir)
        self._copy_dirs.clear()
        self._copies.clear()

    def __len__(self) -> int:
        return len(self._dirs)


def add_policy_fields(entry: dict[str, Any], status: Any, *, restarting: bool, now: float) -> None:
    """Writes the policy's ``status`` of a worker into its ``/health`` ``entry``."""
    entry["state"] = enum_name(status.phase)
    # ``healthy`` and, in rotation, ``last_error`` (MinerU's meaning: the last probe's
    # failure, None after a healthy one) read here, not from MinerU's attributes: the
    # event that writes those may still be on its way, and one answer says one thing.
    entry["healthy"] = bool(status.in_rotation)
    probe = status.last_probe
    if status.in_rotation:
        entry["last_error"] = None if probe is None or probe.healthy else probe_reason(probe)
    elif entry.get("last_error") is None and status.last_error:
        entry["last_error"] = status.last_error  # what took it out, MinerU's said nothing yet
    entry["in_rotation"] = bool(status.in_rotation)
    entry["restartable"] = bool(status.restartable)
    entry["consecutive_failures"] = int(status.consecutive_failures)
    entry["restart_attempt"] = int(status.attempt)
    entry["restarting"] = restarting
    delay = status.next_restart_in_s
    entry["next_restart_at"] = None if delay is None else iso_time(now + max(0.0, delay))
    stable = status.stable_in_s
    entry["restart_confirmed_at"] = None if stable is None else iso_time(now + max(0.0, stable))
    entry["probe_endpoint"] = enum_name(status.endpoint)
    entry["probe_url"] = status.probe_url
    entry["last_cause"] = status.last_cause or None
    entry["last_exit_code"] = status.last_exit_code
    entry["ejection_suppressed"] = bool(status.ejection_suppressed)
    entry["loop_lag_s"] = probe.loop_lag_s if probe is not None else None
    entry["engine_calls_in_flight"] = probe.engine_calls_in_flight if probe is not None else None


def _remove(temp_dir: Any) -> None:
    with contextlib.suppress(Exception):  # already gone, or busy: the OS cleans /tmp eventually
        temp_dir.cleanup()


class Server:
    """One MinerU 3.x ``WorkerState`` as the fleet sees it (a :class:`Member`)."""

    def __init__(self, state: Any, pool: HealingPool) -> None:
        self.state = state
        self.id: str = state.server_id
        self.local = state.local_server is not None
        self._pool = pool

    def base_url(self) -> str:
        return str(self.state.base_url or "")

    probe_base = base_url

    def connect_host(self) -> str:
        return str(self.state.local_server.connect_host)

    def process(self) -> Any:
        return self.state.local_server.process

    def show(self, event: Any) -> None:
        """``healthy`` is the event's rotation; a probe brings its time and load or reason."""
        state = self.state
        state.healthy = bool(event.in_rotation)
        if event.kind == _PROBE:
            probe = event.probe
            state.last_checked_at = iso_time(event.unix_time)
            if probe.healthy:
                load = probe.load
                state.queued_tasks = int(load.queued_tasks)
                state.processing_tasks = int(load.processing_tasks)
                state.completed_tasks = int(load.completed_tasks)
                state.failed_tasks = int(load.failed_tasks)
                state.max_concurrent_requests = int(load.max_concurrent_requests)
                state.processing_window_size = max(1, int(load.processing_window_size))
                state.last_error = None
            else:
                state.last_error = probe_reason(probe)
        elif event.kind == _AUDIT and not state.healthy and event.audit.reason:
            state.last_error = short_reason(event.audit.reason)

    def show_rotation(self, in_rotation: bool, reason: str | None = None) -> None:
        self.state.healthy = in_rotation
        if reason:
            self.state.last_error = reason

    async def launch(self, env: Mapping[str, str]) -> None:
        local = self.state.local_server
        port = PORTS.take("127.0.0.1", f"{self.id} main")  # never the router's, nor held
        local.launch_env = dict(env)
        await local.launch(self._pool.client, port=port)
        self.state.base_url = self._pool._router["normalize_base_url"](local.base_url or "")

    async def stop(self) -> None:
        local = self.state.local_server
        self._pool.retired.retire(local)  # its completed results stay downloadable
        await asyncio.to_thread(local.stop)  # MinerU's stop may wait ~10 s


class HealingPool(RuntimeParts[RetiredOutputs]):
    """Replaces MinerU 3.x's sequential refresh loop with the fleet and the task supervisor.

    Mixed in before MinerU's WorkerPool (see ``healing_pool_class``).
    """

    _router: ClassVar[Mapping[str, Any]] = {}
    _local_server_class: ClassVar[type | None] = None

    # Attributes of MinerU's WorkerPool this class relies on (for type checkers).
    _servers: dict[str, Any]
    _monitor_task: asyncio.Task[Any] | None
    client: Any
    settings: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        ns = self._router

        def open_mineru() -> tuple[Any, RetiredOutputs]:
            super(HealingPool, self).__init__(*args, **kwargs)
            retention = getattr(self.settings, "task_retention_seconds", 0)
            retired = RetiredOutputs(retention_s=float(retention or 0))
            retired.answer_under(self.client)  # a drained worker's results, once copied
            return self.client, retired

        self._startup_check = False
        self.task_line = TaskLine(self, ns)
        # Settings, scratch, MinerU's pool, fleet, supervisor and store, discovery (runtime.py).
        self.runtime: RouterRuntime[RetiredOutputs] = open_runtime(
            self,
            self.task_line,
            open_mineru=open_mineru,
            expect=lambda settings: expectations(
                settings, protocol_version=ns.get("API_PROTOCOL_VERSION")
            ),
        )
        for server in self._servers.values():
            local = server.local_server
            if local is not None and self._local_server_class is not None:
                fields = {
                    f.name: getattr(local, f.name) for f in dataclasses.fields(local) if f.init
                }
                server.local_server = self._local_server_class(**fields)
            self.fleet.add(Server(server, self))

    @property
    def health_settings(self) -> Any:
        return self.fleet.settings

    async def start(self) -> None:
        # Unlike MinerU's start, local workers are not waited for (Fleet.start): the
        # router serves at once, holding submissions until a worker is in rotation.
        s = self.fleet.settings
        if self.discovery is not None:
            await self.discovery.first()
        await self.fleet.start(wait_s=float(s.boot_timeout_s))
        if self.discovery is not None:
            self.discovery.start()
        # MinerU's start-up asks health_payload next and refuses to serve when no
        # worker is healthy: that one question is answered for the workers still booting.
        self._startup_check = True

    async def shutdown(self) -> None:
        # MinerU's shutdown (it stops the current instances) in the runtime's order.
        await self.runtime.close(super().shutdown)  # type: ignore[misc]

    async def refresh_all(self) -> None:
        """MinerU's probe-everything pass is the poller's job now; only check processes."""
        for server_id in self._servers:
            self.fleet.local.check_process(server_id)

    # -- workers found by DNS (discovery.Workers) -------------------------------------------
    def add_remote(self, worker_id: str, url: str) -> Server:
        ns = self._router
        state = ns["WorkerState"](
            server_id=worker_id, source=ns["SOURCE_REMOTE"], base_url=url, gpu=None
        )
        self._servers[worker_id] = state
        return Server(state, self)

    def remove_remote(self, worker_id: str) -> None:
        self._servers.pop(worker_id, None)

    def in_flight(self, worker_id: str) -> bool:
        server = self._servers.get(worker_id)
        return server is not None and server.pending_assignments > 0

    async def keep_results(self, worker_id: str) -> str:
        """Copies the finished results of a drained worker the router still lists, so that
        they stay downloadable once it is gone; says what it copied."""
        from mineru_health.runtime.router.result_copies import room_for_copies

        report = await self.retired.copy_results(
            self.client,
            self.task_line.result_urls(worker_id),
            max_bytes=room_for_copies(self.fleet.settings),
        )
        return str(report)

    async def acquire_submission_server(self, excluded_server_ids: set[str] | None = None) -> Any:
        """MinerU's choice among healthy workers, draining ones left out."""
        excluded = {i for i in self._servers if self.fleet.draining(i)}
        return await super().acquire_submission_server(  # type: ignore[misc]
            excluded | (excluded_server_ids or set())
        )

    async def mark_submission_failure(self, server_id: str, error: str) -> None:
        """MinerU's hook for a failed submission; a dead worker's own refusal ejects it."""
        await super().mark_submission_failure(server_id, error)  # type: ignore[misc]
        if server_id not in self._servers:
            return
        self.fleet.local.check_process(server_id)
        # MinerU words retryable submit answers "<status> <detail>".
        refusal = f"503 {REFUSAL_ERROR_PREFIX}"
        if error.startswith(refusal):
            self.fleet.report_passive(
                server_id, f"a submission was refused with 503 ({error[len(refusal) :].strip()})"
            )

    def observe_task_status(self, task: Any, payload: Any) -> None:
        """Hook: an upstream task status arrived; the worker's engine_dead verdict ejects it."""
        reason = passive_reason(Answer.of_status(payload)) if isinstance(payload, dict) else None
        server = self._servers.get(task.upstream_server_id)
        # A status from an instance we already replaced says nothing about the new one.
        if reason and server is not None and task.upstream_base_url == server.base_url:
            self.fleet.report_passive(server.server_id, reason)

    def health_payload(self) -> tuple[bool, dict[str, Any]]:
        healthy, payload = super().health_payload()  # type: ignore[misc]
        if not healthy and self.supervisor.healing():
            payload["error"] = (
                "no worker is in rotation yet (local workers are starting or "
                "being restarted); submissions are accepted and held until one is"
            )
            if self._startup_check:
                healthy = True
        self._startup_check = False
        statuses = {status.id: status for status in self.fleet.statuses()}
        now = time.time()
        for entry in payload.get("servers", []):
            status = statuses.get(entry.get("server_id"))
            if status is not None:
                add_policy_fields(
                    entry, status, restarting=self.fleet.local.restarting(status.id), now=now
                )
                entry["process_scope"] = self.fleet.local.process_scope(status.id)
                entry["draining"] = self.fleet.draining(status.id)
        add_store_field(payload, self.supervisor.store)
        return healthy, payload

"""Self-healing for MinerU's ``mineru-router`` (mineru/cli/router.py, MinerU 3.4.4).

The patch adds three lines to the router: right after ``class WorkerPool`` it
rebinds the name to ``install(globals())``, a subclass whose health loop is
the native poller; ``create_app`` calls ``install_app(app)`` (adds
``/metrics``); ``fetch_router_task_status`` calls
``worker_pool.observe_task_status(task, payload)``. Everything else lives here.

What changes against MinerU's own loop (which probes workers one after
another every 2 s and awaits restarts inside that loop):

- One native thread probes every worker concurrently on its own jittered
  schedule; a 503 carrying ``"engine_dead": true`` ejects at once, other
  failures after ``MINERU_ROUTER_HEALTH_FAILURE_THRESHOLD`` probes.
- ``WorkerState.healthy`` is the policy's "in rotation"; load fields come
  from the probe that found the worker healthy.
- A local worker's restart is its own asyncio task: the old process stops in
  a thread (MinerU's stop may wait ~10 s), the new one starts without waiting
  for health, and the poller decides when it is healthy (or that the boot
  deadline passed). Probing, routing and other restarts never wait on it.
- Passive ejection: a task status ``failed`` whose error the classifier calls
  fatal, or a submission answered 503 with a fatal error, ejects the worker
  before the next probe.
- Every audit event is one JSON line in ``MINERU_ROUTER_HEALTH_AUDIT_PATH``
  (stderr by default); ``/health`` shows each worker's phase, rotation,
  consecutive failures, restart attempt, next restart time and last error.

Remote upstream workers (``--upstream-url``) are never restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar

from mineru_health import _native, metrics
from mineru_health.audit import AuditLog
from mineru_health.errors import ConfigError
from mineru_health.monitor import HealthMonitor
from mineru_health.settings import HealthSettings

__all__ = ["HealingPoolMixin", "install", "install_app", "is_fatal_error"]

_log = logging.getLogger("mineru_health.router")

_PROBE = _native.PollerEventKind.PROBE
_AUDIT = _native.PollerEventKind.AUDIT
_RESTART = _native.PollerEventKind.RESTART_REQUESTED
_A = _native.AuditAction

# A task error longer than this is cut in audit reasons and logs.
_REASON_CHARS = 300


def _iso(unix_time: float) -> str:
    return datetime.fromtimestamp(unix_time, tz=UTC).isoformat()


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 3] + "..."


def is_fatal_error(text: str) -> tuple[bool, str]:
    """(fatal, rule id) for an error text, by the shared classifier."""
    # Imported here: the classifier loads its rules on first use, and a
    # router that never sees a failed task should not pay for it.
    from mineru_health.classifier import classify_text

    verdict = classify_text(text)
    return bool(verdict.fatal), str(verdict.rule)


def install_app(app: Any) -> None:
    """Adds ``GET /metrics`` to the router's FastAPI app."""
    metrics.mount_metrics(app, role="router")


def _launching_server_class(base: type) -> type:
    """A ManagedLocalServer whose ``launch`` starts the process without waiting for health."""

    class HealingLocalServer(base):  # type: ignore[misc]
        _skip_ready = False

        async def launch(self, client: Any, port: int) -> None:
            # MinerU's start() spawns the process, then polls /health; the
            # poller owns that decision here, so the poll is skipped.
            self._skip_ready = True
            try:
                await self.start(client, port=port)
            finally:
                self._skip_ready = False

        async def wait_until_ready(self, client: Any, *args: Any, **kwargs: Any) -> None:
            if self._skip_ready:
                return
            await super().wait_until_ready(client, *args, **kwargs)

    HealingLocalServer.__name__ = HealingLocalServer.__qualname__ = base.__name__
    return HealingLocalServer


class HealingPoolMixin:
    """Replaces MinerU's sequential refresh loop with the native poller and restart policy.

    Mixed in before MinerU's WorkerPool (see ``install``). Runs on the
    router's event loop; not thread-safe, like the class it extends.
    """

    _router: ClassVar[Mapping[str, Any]] = {}
    _local_server_class: ClassVar[type | None] = None

    # Attributes of MinerU's WorkerPool this class relies on (for type checkers).
    _servers: dict[str, Any]
    _monitor_task: asyncio.Task[Any] | None
    client: Any
    _start_local_server: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Configuration first: a bad value refuses the router before any
        # worker process is spawned, and the message names the variable.
        try:
            self.health_settings = HealthSettings.from_env()
            # The rules decide passive ejection; a bad MINERU_HEALTH_RULES file
            # must stop the router here, not surface in a request handler.
            from mineru_health.classifier import default_rules

            default_rules()
        except ConfigError as exc:
            _log.error("mineru-router refuses to start: %s (variable %s)", exc, exc.variable)
            raise
        super().__init__(*args, **kwargs)
        ns = self._router
        self._audit = AuditLog(self.health_settings.audit_path)
        self._monitor = HealthMonitor(
            self.health_settings,
            protocol_version=ns.get("API_PROTOCOL_VERSION"),
            on_event=self._on_health_event,
        )
        self._restart_tasks: dict[str, asyncio.Task[None]] = {}
        self._exit_reported: set[int] = set()
        self._passive_reported: dict[str, str] = {}
        self._last_cause: dict[str, str] = {}
        self._phase: dict[str, str] = {}
        self._probed: dict[str, int] = {}
        self._first_health: asyncio.Event | None = None
        for server in self._servers.values():
            local = server.local_server is not None
            if local and self._local_server_class is not None:
                old = server.local_server
                fields = {f.name: getattr(old, f.name) for f in dataclasses.fields(old) if f.init}
                server.local_server = self._local_server_class(**fields)
            server.healthy = False
            self._phase[server.server_id] = "starting"
            self._monitor.add_worker(server.server_id, server.base_url or "", restartable=local)

    # -- start-up / shut-down -------------------------------------------------
    async def start(self) -> None:
        ns = self._router
        locals_ = [s for s in self._servers.values() if s.local_server is not None]
        ports = ns["reserve_unique_local_ports"](len(locals_))
        # As MinerU does: start every local worker and wait for its first
        # healthy answer, each failure kept to its own worker.
        await asyncio.gather(
            *(self._start_local_server(s, p) for s, p in zip(locals_, ports, strict=True))
        )
        for server in locals_:
            if server.base_url:
                self._monitor.set_url(server.server_id, server.base_url)
        loop = asyncio.get_running_loop()
        self._first_health = asyncio.Event()
        self._monitor.attach(loop)
        for server in locals_:
            if not server.base_url:
                # Never came up: let the policy schedule its restart.
                self._monitor.report_process_exit(
                    server.server_id, _short(f"failed to start: {server.last_error}")
                )
        await self._wait_first_health()
        if self._monitor_task is None or self._monitor_task.done():
            self._monitor_task = asyncio.create_task(
                self._watch_processes(), name="mineru-health-process-watch"
            )

    async def _wait_first_health(self) -> None:
        """Returns once every worker with a URL is in rotation or had its first answers."""
        s = self.health_settings
        deadline = s.interval_s * (s.healthy_threshold + 1) + s.probe_timeout_s + 1.0
        assert self._first_health is not None
        self._check_first_health()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._first_health.wait(), timeout=deadline)

    def _check_first_health(self) -> None:
        event = self._first_health
        if event is None or event.is_set():
            return
        probed = [s for s in self._servers.values() if s.base_url]
        need = self.health_settings.healthy_threshold
        # Like MinerU's refresh_all before it returns: every worker has an answer.
        if all(s.healthy or self._probed.get(s.server_id, 0) >= need for s in probed):
            event.set()

    async def shutdown(self) -> None:
        await self._monitor.aclose()
        tasks = [t for t in self._restart_tasks.values() if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._restart_tasks.clear()
        await super().shutdown()  # type: ignore[misc]
        self._audit.close()

    async def refresh_all(self) -> None:
        """MinerU's probe-everything pass is the poller's job now; only check processes."""
        self._check_processes()

    async def _watch_processes(self) -> None:
        # A cheap poll() per local worker; exit detection must not wait for
        # failed probes to reach the threshold.
        while True:
            await asyncio.sleep(self.health_settings.interval_s)
            self._check_processes()

    def _check_processes(self) -> None:
        for server in self._servers.values():
            self._check_process(server)

    def _check_process(self, server: Any) -> None:
        local = server.local_server
        if local is None or self._restarting(server.server_id):
            return
        process = local.process
        if process is None:
            return
        code = process.poll()
        if code is None or process.pid in self._exit_reported:
            return
        self._exit_reported.add(process.pid)
        reason = f"worker process {process.pid} exited with code {code}"
        server.healthy = False
        server.last_error = reason
        self._last_cause[server.server_id] = "process_exit"
        self._monitor.report_process_exit(server.server_id, reason)

    # -- events from the poller ------------------------------------------------
    def _on_health_event(self, event: Any) -> None:
        server = self._servers.get(event.worker_id)
        if server is None:
            return
        if event.kind == _PROBE:
            self._on_probe(server, event)
        elif event.kind == _AUDIT:
            self._on_audit(server, event)
        elif event.kind == _RESTART:
            self._schedule_restart(server)
        self._check_first_health()

    def _on_probe(self, server: Any, event: Any) -> None:
        probe = event.probe
        worker_id = server.server_id
        server.last_checked_at = _iso(event.unix_time)
        self._probed[worker_id] = self._probed.get(worker_id, 0) + 1
        status_name = _native.to_string(probe.status)
        if probe.healthy:
            load = probe.load
            server.queued_tasks = int(load.queued_tasks)
            server.processing_tasks = int(load.processing_tasks)
            server.completed_tasks = int(load.completed_tasks)
            server.failed_tasks = int(load.failed_tasks)
            server.max_concurrent_requests = int(load.max_concurrent_requests)
            server.processing_window_size = max(1, int(load.processing_window_size))
            server.consecutive_health_failures = 0
            server.last_error = None
        else:
            server.consecutive_health_failures += 1
            server.last_error = _short(f"{status_name}: {probe.detail}")
            self._last_cause[worker_id] = status_name
            self._check_process(server)
        server.healthy = bool(event.in_rotation)
        metrics.observe_probe(worker_id, probe.latency_s, status_name, event.unix_time)
        metrics.set_worker_state(
            worker_id, self._phase.get(worker_id, "starting"), server.consecutive_health_failures
        )

    def _on_audit(self, server: Any, event: Any) -> None:
        worker_id = server.server_id
        record = self._audit.write(event)
        audit = event.audit
        self._phase[worker_id] = record["to"]
        server.healthy = bool(event.in_rotation)
        if not server.healthy and audit.reason:
            server.last_error = _short(audit.reason)
        if audit.action in (_A.RESTART_SUCCEEDED, _A.RECOVERED):
            self._passive_reported.pop(worker_id, None)
        metrics.record_audit(worker_id, record["action"], self._last_cause.get(worker_id, ""))
        metrics.set_worker_state(worker_id, record["to"], server.consecutive_health_failures)
        level = logging.INFO if server.healthy else logging.WARNING
        _log.log(level, "worker %s: %s (%s)", worker_id, record["action"], record["reason"])

    # -- restarts ---------------------------------------------------------------
    def _restarting(self, worker_id: str) -> bool:
        task = self._restart_tasks.get(worker_id)
        return task is not None and not task.done()

    def _schedule_restart(self, server: Any) -> None:
        if server.local_server is None or self._restarting(server.server_id):
            return
        self._restart_tasks[server.server_id] = asyncio.get_running_loop().create_task(
            self._restart(server), name=f"mineru-health-restart-{server.server_id}"
        )

    async def _restart(self, server: Any) -> None:
        worker_id = server.server_id
        local = server.local_server
        server.healthy = False
        # Stop probing the old process: its answers say nothing about the new one.
        self._monitor.set_url(worker_id, "")
        try:
            await asyncio.to_thread(local.stop)
        except Exception as exc:  # noqa: BLE001 -- a failed stop must not block the new start
            _log.warning("worker %s: stopping the old process failed: %s", worker_id, exc)
        try:
            port = self._router["find_free_port"]()
            await local.launch(self.client, port)
        except Exception as exc:  # noqa: BLE001 -- any spawn failure is a failed restart
            server.last_error = _short(f"restart failed: {exc}")
            self._monitor.report_restart_failed(worker_id, server.last_error)
            return
        server.base_url = self._router["normalize_base_url"](local.base_url or "")
        self._monitor.set_url(worker_id, server.base_url)
        _log.info("worker %s: restarted on %s", worker_id, server.base_url)

    # -- passive signals -----------------------------------------------------------
    def observe_task_status(self, task: Any, payload: Any) -> None:
        """Hook: an upstream task status arrived; a fatal failure ejects its worker now."""
        if not isinstance(payload, dict) or payload.get("status") != "failed":
            return
        error = payload.get("error")
        if not isinstance(error, str) or not error:
            return
        server = self._servers.get(task.upstream_server_id)
        # A status from an instance we already replaced says nothing about the new one.
        if server is None or task.upstream_base_url != server.base_url:
            return
        fatal, rule = is_fatal_error(error)
        if fatal:
            self._passive_failure(server, f"task failed with a fatal error ({rule}): {error}")

    async def mark_submission_failure(self, server_id: str, error: str) -> None:
        await super().mark_submission_failure(server_id, error)  # type: ignore[misc]
        server = self._servers.get(server_id)
        if server is None:
            return
        self._check_process(server)
        # MinerU words retryable submit answers "<status> <detail>".
        if error.startswith("503"):
            fatal, rule = is_fatal_error(error)
            if fatal:
                self._passive_failure(server, f"submission answered 503 ({rule}): {error}")

    def _passive_failure(self, server: Any, reason: str) -> None:
        worker_id = server.server_id
        # Once per instance: a burst of failed tasks is one failure.
        if self._passive_reported.get(worker_id) == server.base_url:
            return
        self._passive_reported[worker_id] = server.base_url
        server.healthy = False
        server.last_error = _short(reason)
        self._last_cause[worker_id] = "passive_failure"
        self._monitor.report_passive_failure(worker_id, _short(reason))

    # -- /health ----------------------------------------------------------------
    def health_payload(self) -> tuple[bool, dict[str, Any]]:
        healthy, payload = super().health_payload()  # type: ignore[misc]
        statuses = {status.id: status for status in self._monitor.statuses()}
        now = time.time()
        for entry in payload.get("servers", []):
            status = statuses.get(entry.get("server_id"))
            if status is None:
                continue
            entry["state"] = _native.to_string(status.phase)
            entry["in_rotation"] = bool(status.in_rotation)
            entry["restartable"] = bool(status.restartable)
            entry["consecutive_failures"] = int(status.consecutive_failures)
            entry["restart_attempt"] = int(status.attempt)
            entry["restarting"] = self._restarting(status.id)
            delay = status.next_restart_in_s
            entry["next_restart_at"] = None if delay is None else _iso(now + max(0.0, delay))
            if entry.get("last_error") is None and not status.in_rotation and status.last_error:
                entry["last_error"] = status.last_error
        return healthy, payload


def install(namespace: Mapping[str, Any]) -> type:
    """Returns the self-healing WorkerPool for a MinerU router module's globals()."""
    base = namespace["WorkerPool"]
    if getattr(base, "_mineru_health", False):
        return base  # type: ignore[no-any-return]
    local_base = namespace.get("ManagedLocalServer")
    attrs = {
        "_router": namespace,
        "_local_server_class": _launching_server_class(local_base) if local_base else None,
        "_mineru_health": True,
        "__module__": namespace.get("__name__", __name__),
        "__doc__": HealingPoolMixin.__doc__,
    }
    return type(base.__name__, (HealingPoolMixin, base), attrs)

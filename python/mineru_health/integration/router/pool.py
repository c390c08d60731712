"""The self-healing pool's lifecycle: start, shut down, watch processes, restart workers.

``PoolLifecycleMixin`` replaces MinerU's sequential refresh loop with the
native poller (``HealthMonitor``): it registers every worker, starts local
workers as MinerU does, hands every poller event to the projection
(``projection.py``), the audit log and the metrics, and runs each restart
as its own asyncio task:

- the old process stops in a thread (MinerU's stop may wait ~10 s), the new
  one starts on a new port without waiting for health, and the poller
  decides when it is healthy (or that the boot deadline passed); probing,
  routing and other restarts never wait on it;
- a launched worker's process is polled every interval, so an exit is
  reported at once instead of after failed probes;
- each local worker gets its own variables for each launch
  (``HealingLocalServer.launch_env``: its state directory, see
  ``instance_dirs.py``), and the output directory of an instance a restart
  replaces is kept until the router shuts down, so that the new instance
  still serves what the old one completed.

Runs on the router's event loop; not thread-safe, like the class it extends.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Mapping
from typing import Any, ClassVar

from mineru_health import _native, metrics, patching, safe_text
from mineru_health.audit import AuditLog
from mineru_health.errors import ConfigError
from mineru_health.monitor import HealthMonitor
from mineru_health.safe_text import printable
from mineru_health.settings import HealthSettings

from .instance_dirs import STATE_DIR_ENV, InstanceDirs
from .projection import (
    add_policy_fields,
    process_exit_reason,
    project_event,
    project_status,
    short_reason,
    start_failure_reason,
)

__all__ = ["PoolLifecycleMixin", "launching_server_class", "log_audit"]

_log = safe_text.logger("mineru_health.router")

PARENT_PID_ENV = "MINERU_HEALTH_PARENT_PID"
_PROBE = _native.PollerEventKind.PROBE
_AUDIT = _native.PollerEventKind.AUDIT
_RESTART = _native.PollerEventKind.RESTART_REQUESTED
_ERROR = _native.PollerEventKind.ERROR


#: Variables set for one worker launch only (see ``launching_server_class``).
HEALTH_PORT_ENV = "MINERU_HEALTH_PORT"
HEALTH_BIND_ENV = "MINERU_HEALTH_BIND"


def launching_server_class(base: type) -> type:
    """A ManagedLocalServer that starts its process with per-worker variables, and whose
    ``launch`` starts it without waiting for health.

    MinerU's ``start`` copies ``os.environ`` right before its ``Popen`` and
    then awaits ``wait_until_ready``: the per-worker variables (``launch_env``,
    e.g. the native health port) are set just before ``start`` and restored
    first thing in ``wait_until_ready``, with no ``await`` in between, so no
    other coroutine ever sees them.
    """

    class HealingLocalServer(base):  # type: ignore[misc]
        _skip_ready = False
        launch_env: dict[str, str] | None = None
        _saved_env: dict[str, str | None] | None = None

        async def start(self, client: Any, port: int | None = None) -> None:
            self._apply_launch_env()
            try:
                await super().start(client, port=port)
            finally:
                self._restore_env()  # start failed before its Popen, or already done

        async def launch(self, client: Any, port: int) -> None:
            # MinerU's start() spawns the process, then polls /health; the
            # poller owns that decision here, so the poll is skipped.
            self._skip_ready = True
            try:
                await self.start(client, port=port)
            finally:
                self._skip_ready = False

        async def wait_until_ready(self, client: Any, *args: Any, **kwargs: Any) -> None:
            self._restore_env()  # the process is spawned: the variables did their job
            if self._skip_ready:
                return
            await super().wait_until_ready(client, *args, **kwargs)

        def _apply_launch_env(self) -> None:
            if not self.launch_env:
                return
            self._saved_env = {name: os.environ.get(name) for name in self.launch_env}
            os.environ.update(self.launch_env)

        def _restore_env(self) -> None:
            saved, self._saved_env = self._saved_env, None
            for name, value in (saved or {}).items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    HealingLocalServer.__name__ = HealingLocalServer.__qualname__ = base.__name__
    return HealingLocalServer


def log_audit(record: Mapping[str, Any], *, in_rotation: bool) -> None:
    """One plain-text log line per audit record; the reason can quote a worker's answer,
    so it is escaped (a newline or an ANSI escape never forges or repaints a line)."""
    level = logging.INFO if in_rotation else logging.WARNING
    _log.log(level, "worker %s: %s (%s)", record["worker_id"], record["action"],
             printable(str(record["reason"])))


class PoolLifecycleMixin:
    """Start-up, shut-down, process watch, restarts and ``/health`` of the healing pool."""

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
            # Local workers inherit MINERU_HEALTH_RULES: a bad file stops the
            # router here, not each worker it would spawn and restart in a loop.
            from mineru_health.classifier import default_rules

            default_rules()
        except ConfigError as exc:
            _log.error("mineru-router refuses to start: %s (variable %s)", exc, exc.variable)
            raise
        problem = patching.running_problem()
        if problem:
            _log.warning("this MinerU is not one mineru-health patched as a whole: %s", problem)
        super().__init__(*args, **kwargs)
        # Workers launched from here die with this process, however it dies
        # (they inherit the environment; see parent_watch.h).
        os.environ[PARENT_PID_ENV] = str(os.getpid())
        self._audit = AuditLog(self.health_settings.audit_path)
        self._monitor = HealthMonitor(
            self.health_settings,
            protocol_version=self._router.get("API_PROTOCOL_VERSION"),
            on_event=self._on_health_event,
        )
        self._native_probes = bool(self.health_settings.native_probes)
        self._health_ports: dict[str, int] = {}
        self._restart_tasks: dict[str, asyncio.Task[None]] = {}
        self._exit_reported: set[int] = set()
        self._first_health: asyncio.Event | None = None
        # Task store directories and replaced instances' outputs (issue 9).
        retention = getattr(getattr(self, "settings", None), "task_retention_seconds", 0)
        try:
            self._instance_dirs = InstanceDirs(retention_s=float(retention or 0))
        except ConfigError as exc:
            _log.error("mineru-router refuses to start: %s (variable %s)", exc, exc.variable)
            raise
        for server in self._servers.values():
            local = server.local_server is not None
            if local and self._local_server_class is not None:
                old = server.local_server
                fields = {f.name: getattr(old, f.name) for f in dataclasses.fields(old) if f.init}
                server.local_server = self._local_server_class(**fields)
            self._monitor.add_worker(server.server_id, server.base_url or "", restartable=local,
                                     health_url=self._health_url(server))
            project_status(server, self._monitor.status(server.server_id))
        # The state gauges read the poller at every scrape: they cannot drift.
        metrics.router.bind_worker_statuses(self._monitor.statuses)
        metrics.router.bind_poller_stats(self._monitor.stats)

    # -- start-up / shut-down -------------------------------------------------
    async def start(self) -> None:
        locals_ = [s for s in self._servers.values() if s.local_server is not None]
        # One main port per local worker, and one native health port when
        # native probes are on, all reserved at once so that none repeats.
        ports = self._router["reserve_unique_local_ports"](
            len(locals_) * (2 if self._native_probes else 1))
        main_ports, health_ports = ports[: len(locals_)], ports[len(locals_):]
        for index, server in enumerate(locals_):
            self._prepare_launch(server, health_ports[index] if index < len(health_ports) else None)
        # As MinerU does: start every local worker and wait for its first
        # healthy answer, each failure kept to its own worker.
        await asyncio.gather(
            *(self._start_local_server(s, p) for s, p in zip(locals_, main_ports, strict=True))
        )
        for server in locals_:
            if server.base_url:
                self._monitor.set_url(server.server_id, server.base_url, self._health_url(server))
        self._first_health = asyncio.Event()
        self._monitor.attach(asyncio.get_running_loop())
        for server in locals_:
            if not server.base_url:
                # Never came up: let the policy schedule its restart.
                self._report_exit(server, start_failure_reason(server.last_error))
        await self._wait_first_health()
        if self._monitor_task is None or self._monitor_task.done():
            self._monitor_task = asyncio.create_task(
                self._watch_processes(), name="mineru-health-process-watch"
            )

    # -- native health endpoints -----------------------------------------------
    def _prepare_launch(self, server: Any, health_port: int | None) -> None:
        """The per-launch variables of a local worker: its state directory, native port, bind."""
        local = server.local_server
        # The same task store on every launch (issue 9: results survive restarts).
        env = {STATE_DIR_ENV: str(self._instance_dirs.state_dir(server.server_id))}
        local.launch_env = env
        if health_port is None or not self._native_probes:
            self._health_ports.pop(server.server_id, None)
            return
        self._health_ports[server.server_id] = health_port
        # Bound where the router connects to the worker (loopback for
        # 0.0.0.0), so the native endpoint is no more exposed than needed.
        env.update({HEALTH_PORT_ENV: str(health_port), HEALTH_BIND_ENV: str(local.connect_host)})

    def _health_url(self, server: Any) -> str:
        """Where to probe ``server``: its native endpoint, its main port, or "" (discover)."""
        if not self._native_probes:
            # An explicit URL: the poller neither discovers nor switches.
            return f"{server.base_url}/health" if server.base_url else ""
        port = self._health_ports.get(server.server_id)
        if port is None or server.local_server is None:
            return ""  # remote: probe the main port until it advertises its native one
        host = str(server.local_server.connect_host)
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}/health"

    async def _wait_first_health(self) -> None:
        """Returns once every worker with a URL is in rotation or had its first answers."""
        s = self.health_settings
        deadline = s.interval_s * (s.healthy_threshold + 1) + s.probe_timeout_s + 1.0
        assert self._first_health is not None
        self._check_first_health()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._first_health.wait(), timeout=deadline)

    def _check_first_health(self) -> None:
        event = self._first_health
        if event is None or event.is_set():
            return
        need = self.health_settings.healthy_threshold
        # Like MinerU's refresh_all before it returns: every worker has an answer.
        statuses = [s for s in self._monitor.statuses() if s.url]
        if all(s.in_rotation or s.probes >= need for s in statuses):
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
        self._instance_dirs.close()  # after MinerU stopped the current instances
        self._audit.close()

    async def refresh_all(self) -> None:
        """MinerU's probe-everything pass is the poller's job now; only check processes."""
        self._check_processes()

    # -- processes ------------------------------------------------------------------
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
        self._report_exit(server, process_exit_reason(process.pid, code), code)

    def _report_exit(self, server: Any, reason: str, exit_code: int | None = None) -> None:
        server.last_error = reason
        self._monitor.report_process_exit(server.server_id, reason, exit_code)
        # The policy applied the report already: routing follows it at once.
        project_status(server, self._monitor.status(server.server_id))

    # -- events from the poller ------------------------------------------------
    def _on_health_event(self, event: Any) -> None:
        if event.kind == _ERROR:
            # The poller's own I/O failed (it keeps trying); never a worker's fault.
            _log.error("health poller: %s", printable(event.error))
            return
        server = self._servers.get(event.worker_id)
        if server is None:
            return
        worker_id = server.server_id
        project_event(server, event)
        if event.kind == _PROBE:
            probe = event.probe
            metrics.router.observe_probe(worker_id, probe.latency_s, probe.status, event.unix_time)
            if not probe.healthy:
                self._check_process(server)
        elif event.kind == _AUDIT:
            record = self._audit.write(event)
            metrics.router.record_audit(worker_id, event.audit.action, event.audit.cause)
            log_audit(record, in_rotation=server.healthy)
        elif event.kind == _RESTART:
            self._schedule_restart(server)
        self._check_first_health()

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
        # Stop probing the old process: its answers say nothing about the new one.
        self._monitor.set_url(worker_id, "")
        self._instance_dirs.retire(local)  # its completed results stay downloadable
        try:
            await asyncio.to_thread(local.stop)
        except Exception as exc:  # noqa: BLE001 -- a failed stop must not block the new start
            _log.warning("worker %s: stopping the old process failed: %s", worker_id,
                         printable(str(exc)))
        try:
            # Fresh ports, the native one too: the old process may still hold its own.
            port, health_port = self._router["reserve_unique_local_ports"](2)
            self._prepare_launch(server, health_port)
            await local.launch(self.client, port)
        except Exception as exc:  # noqa: BLE001 -- any spawn failure is a failed restart
            server.last_error = short_reason(f"restart failed: {exc}")
            self._monitor.report_restart_failed(worker_id, server.last_error)
            return
        server.base_url = self._router["normalize_base_url"](local.base_url or "")
        self._monitor.set_url(worker_id, server.base_url, self._health_url(server))
        _log.info("worker %s: restarted on %s", worker_id, server.base_url)

    # -- /health ----------------------------------------------------------------
    def health_payload(self) -> tuple[bool, dict[str, Any]]:
        healthy, payload = super().health_payload()  # type: ignore[misc]
        statuses = {status.id: status for status in self._monitor.statuses()}
        now = time.time()
        for entry in payload.get("servers", []):
            status = statuses.get(entry.get("server_id"))
            if status is not None:
                add_policy_fields(entry, status, restarting=self._restarting(status.id), now=now)
        return healthy, payload

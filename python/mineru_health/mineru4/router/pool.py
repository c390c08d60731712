"""MinerU 4.0's WorkerPool supervised by the native poller and restart policy.

``healing_pool_class(WorkerPool, globals())`` is the class ``workers.py``
uses after the patch. What it replaces of 4.0.12's pool:

- ``_monitor_loop``/``refresh_all``/``_refresh_worker``: one native thread
  probes every worker on its own schedule (``HealthMonitor``); poller events
  set ``WorkerState.healthy`` (the policy's "in rotation", nothing else is
  kept). A worker's tiers, models and features are read once per instance,
  when it first enters rotation, as a task of its own;
- restarts: each one is its own asyncio task (stop the old process, launch
  the new one without waiting for health; the poller decides when it is
  healthy or the boot deadline passed); probes, routing and other restarts
  never wait on it; ``generation`` counts instances, as in 4.0;
- ``notify_engine_dead`` (a 503 ``engine_dead`` seen by the proxy) is a
  passive failure reported to the policy;
- a launched worker's process is polled every interval, so an exit is
  reported at once.

Local workers launch with their own variables (``launching_worker_class``):
the native health port and bind address, a state directory that outlives
their restarts, and ``MINERU_HEALTH_PARENT_PID``. The upload directory of an
instance a restart replaces is kept (``retired.py``) so that its finished
results stay downloadable.

Runs on the router's event loop; not thread-safe, like the class it extends.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import shutil
import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, cast

from mineru_health import _native, metrics, safe_text
from mineru_health._names import enum_name
from mineru_health.audit import AuditLog
from mineru_health.errors import ConfigError
from mineru_health.integration.router.instance_dirs import STATE_DIR_ENV
from mineru_health.integration.router.pool import (
    HEALTH_BIND_ENV,
    HEALTH_PORT_ENV,
    PARENT_PID_ENV,
    log_audit,
)
from mineru_health.integration.router.projection import (
    DECLARED_FAILED,
    process_exit_reason,
    short_reason,
    start_failure_reason,
)
from mineru_health.monitor import HealthMonitor
from mineru_health.safe_text import printable
from mineru_health.settings import HealthSettings

from .retired import RetiredOutputs

__all__ = ["HealingPoolMixin", "healing_pool_class", "launching_worker_class"]

_log = safe_text.logger("mineru_health.router")
#: MinerU 4.0's main port says this when healthy (the native endpoint: "healthy").
MAIN_PORT_STATUS = "ok"
_PROBE = _native.PollerEventKind.PROBE
_AUDIT = _native.PollerEventKind.AUDIT
_RESTART = _native.PollerEventKind.RESTART_REQUESTED
_ERROR = _native.PollerEventKind.ERROR
_STARTING = _native.WorkerPhase.STARTING


def launching_worker_class(base: type) -> type:
    """A ManagedLocalWorker that starts with per-launch variables and can skip the health wait.

    4.0's ``start`` copies ``os.environ`` right before its ``Popen`` and then
    awaits ``wait_until_ready``: ``launch_env`` is set just before ``start``
    and restored first thing in ``wait_until_ready``, with no ``await`` in
    between, so no other coroutine ever sees it.
    """

    class HealingLocalWorker(base):  # type: ignore[misc]
        temp_dir: Any
        launch_env: dict[str, str] | None = None
        _skip_ready = False
        _saved_env: dict[str, str | None] | None = None

        async def start(self, client: Any) -> None:
            self._apply_env()
            try:
                await super().start(client)
            finally:
                self._restore_env()

        async def launch(self, client: Any) -> None:
            """Spawns the process; the poller, not 4.0's health loop, says when it is up."""
            self._skip_ready = True
            try:
                await self.start(client)
            finally:
                self._skip_ready = False

        async def wait_until_ready(self, client: Any, *args: Any, **kwargs: Any) -> None:
            self._restore_env()  # the process is spawned: the variables did their job
            if not self._skip_ready:
                await super().wait_until_ready(client, *args, **kwargs)

        def take_upload_dir(self) -> Any:
            """The instance's temporary directory, which ``stop`` then leaves alone."""
            temp_dir, self.temp_dir = self.temp_dir, None
            return temp_dir

        def _apply_env(self) -> None:
            if self.launch_env:
                self._saved_env = {name: os.environ.get(name) for name in self.launch_env}
                os.environ.update(self.launch_env)

        def _restore_env(self) -> None:
            saved, self._saved_env = self._saved_env, None
            for name, value in (saved or {}).items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    HealingLocalWorker.__name__ = HealingLocalWorker.__qualname__ = base.__name__
    return HealingLocalWorker


def healing_pool_class(base: type, namespace: Mapping[str, Any]) -> type:
    attrs = {
        "_ns": namespace,
        "_mineru_health": True,
        "__module__": namespace.get("__name__", __name__),
        "__doc__": HealingPoolMixin.__doc__,
    }
    return type(base.__name__, (HealingPoolMixin, base), attrs)


def _reserve_port(host: str) -> int:
    host = host.strip("[]") or "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _workers_serve_native() -> bool:
    """True when this MinerU's worker is patched, so a native port passed to it is served.

    An unpatched worker ignores ``MINERU_HEALTH_PORT``: probing that port
    would fail forever, so such workers are probed on their main port.
    """
    spec = importlib.util.find_spec("mineru.parser.api_server")
    origin = spec.origin if spec is not None else None
    try:
        return origin is not None and "mineru_health" in Path(origin).read_text(encoding="utf-8")
    except OSError:
        return False


class HealingPoolMixin:
    """Replaces MinerU 4.0's refresh loop with the native poller and restart policy."""

    _ns: ClassVar[Mapping[str, Any]] = {}
    #: The job supervisor (``jobs.py``), set by ``install_app``.
    job_supervisor: Any = None

    # Attributes of MinerU's WorkerPool this class relies on (for type checkers).
    _workers: dict[str, Any]
    client: Any
    settings: Any
    workers: list[Any]
    _build_workers: Any

    def __init__(self, settings: Any, *, transport: Any = None,
                 on_local_worker_replaced: Any = None) -> None:
        try:
            self.health_settings = HealthSettings.from_env()
            # Local workers inherit MINERU_HEALTH_RULES: a bad file stops the
            # router here, not each worker it would spawn and restart in a loop.
            from mineru_health.classifier import default_rules

            default_rules()
        except ConfigError as exc:
            _log.error("mineru-router refuses to start: %s (variable %s)", exc, exc.variable)
            raise
        # 4.0's replacement hook fails the replaced worker's jobs and drops its
        # routes; the job supervisor and the retired outputs take its place.
        del on_local_worker_replaced
        super().__init__(settings, transport=transport)  # type: ignore[call-arg]
        import httpx

        self.retired = RetiredOutputs()
        # One client, as 4.0's, whose transport also answers for retired outputs.
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(60.0, connect=10.0), transport=self.retired.transport(transport)
        )
        os.environ[PARENT_PID_ENV] = str(os.getpid())
        s = self.health_settings
        self._audit = AuditLog(s.audit_path)
        self._monitor = HealthMonitor(s, require_load_fields=False,
                                      main_port_status=MAIN_PORT_STATUS,
                                      on_event=self._on_health_event)
        self._native_probes = bool(s.native_probes) and _workers_serve_native()
        self._state_root = Path(tempfile.mkdtemp(prefix="mineru-health-router-"))
        self._health_ports: dict[str, int] = {}
        self._restart_tasks: dict[str, asyncio.Task[None]] = {}
        self._capability_tasks: dict[str, asyncio.Task[None]] = {}
        self._capabilities_of: dict[str, int] = {}  # worker id -> generation read
        self._exit_reported: set[int] = set()
        self._watch_task: asyncio.Task[None] | None = None
        self._first_health: asyncio.Event | None = None
        metrics.router.bind_worker_statuses(self._monitor.statuses)
        metrics.router.bind_poller_stats(self._monitor.stats)

    # -- start-up / shut-down ---------------------------------------------------
    async def start(self) -> None:
        self._build_workers()
        for worker in self.workers:
            self._monitor.add_worker(worker.worker_id, self._probe_base(worker),
                                     restartable=worker.local_worker is not None,
                                     health_url=self._health_url(worker))
        locals_ = [w for w in self.workers if w.local_worker is not None]
        errors = await asyncio.gather(*(self._launch(w) for w in locals_))
        for worker, error in zip(locals_, errors, strict=True):
            if error is not None:  # never came up: the policy schedules its restart
                self._monitor.report_process_exit(worker.worker_id, error)
        self._first_health = asyncio.Event()
        self._monitor.attach(asyncio.get_running_loop())
        await self._wait_first_health()
        self._watch_task = asyncio.get_running_loop().create_task(
            self._watch_processes(), name="mineru-health-process-watch")

    async def _launch(self, worker: Any) -> str | None:
        """Starts a local worker's process (no health wait); why it could not, or None."""
        local = worker.local_worker
        self._prepare_launch(worker)
        try:
            await local.launch(self.client)
        except Exception as exc:  # noqa: BLE001 -- any spawn failure is the policy's to handle
            worker.last_error = start_failure_reason(exc)
            return cast(str, worker.last_error)
        worker.base_url = local.base_url
        worker.generation = max(worker.generation, 1)
        self._monitor.set_url(worker.worker_id, self._probe_base(worker), self._health_url(worker))
        return None

    def _prepare_launch(self, worker: Any) -> None:
        local = worker.local_worker
        state_dir = self._state_root / worker.worker_id
        state_dir.mkdir(parents=True, exist_ok=True)
        env = {STATE_DIR_ENV: str(state_dir)}
        connect_host = str(self._ns["worker_connect_host"](local.host))
        # A fresh port per launch: the old process may still hold its own.
        port = _reserve_port(connect_host)
        self._health_ports[worker.worker_id] = port
        # Bound where the router connects (loopback for 0.0.0.0): no more exposed than needed.
        env.update({HEALTH_PORT_ENV: str(port), HEALTH_BIND_ENV: connect_host})
        local.launch_env = env

    def _probe_base(self, worker: Any) -> str:
        # The poller appends "/health": 4.0's is /v1/health.
        return f"{worker.base_url}/v1" if worker.base_url else ""

    def _health_url(self, worker: Any) -> str:
        """The native endpoint of a local worker known to serve one; "" = main port, discover."""
        port = self._health_ports.get(worker.worker_id)
        if not self._native_probes or port is None or worker.local_worker is None:
            return ""
        host = str(self._ns["worker_connect_host"](worker.local_worker.host))
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}/health"

    async def _wait_first_health(self) -> None:
        """Returns once every worker is routable or out of its first boot (as 4.0's start)."""
        assert self._first_health is not None
        self._check_first_health()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._first_health.wait(),
                                   timeout=float(self.health_settings.boot_timeout_s))

    def _check_first_health(self) -> None:
        event = self._first_health
        if event is None or event.is_set():
            return
        need = self.health_settings.healthy_threshold
        for status in self._monitor.statuses():
            worker = self._workers.get(status.id)
            if worker is None:
                continue
            ready = worker.healthy and self._capabilities_of.get(status.id) == worker.generation
            if worker.local_worker is not None:
                if not ready and status.phase == _STARTING:
                    return
            elif not ready and status.probes < need:
                return
        event.set()

    async def close(self) -> None:
        await self._monitor.aclose()
        tasks = [t for t in (self._watch_task, *self._restart_tasks.values(),
                             *self._capability_tasks.values()) if t is not None and not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self.job_supervisor is not None:
            await self.job_supervisor.close()
        await super().close()  # type: ignore[misc]
        self.retired.close()
        shutil.rmtree(self._state_root, ignore_errors=True)
        self._audit.close()

    # 4.0's refresh is the poller's job now; callers still get a process check.
    async def refresh_all(self) -> None:
        self._check_processes()

    async def refresh(self, worker: Any) -> None:
        self._check_process(worker)

    # -- the small interface the job supervisor uses ---------------------------------
    def status(self, worker_id: str) -> Any | None:
        """The policy's status of one worker."""
        return self._monitor.status(worker_id)

    def statuses(self) -> list[Any]:
        return self._monitor.statuses()

    def check_process(self, worker: Any) -> None:
        """Reports a local worker's exited process now, not at the next poll."""
        self._check_process(worker)

    def report_passive(self, worker: Any, reason: str) -> None:
        """A worker's own verdict seen in traffic: out of rotation before the next probe."""
        status = self._monitor.status(worker.worker_id)
        if status is None or status.phase in DECLARED_FAILED:
            return  # already being handled: a burst of failures is one failure
        worker.last_error = reason
        self._monitor.report_passive_failure(worker.worker_id, reason)
        self._project(worker)

    def notify_engine_dead(self, worker: Any) -> None:
        """4.0's proxy saw a 503 ``engine_dead`` from ``worker``."""
        self.report_passive(worker, "a request was refused with 503 engine_dead")

    # -- processes --------------------------------------------------------------
    async def _watch_processes(self) -> None:
        while True:
            await asyncio.sleep(float(self.health_settings.interval_s))
            self._check_processes()

    def _check_processes(self) -> None:
        for worker in self.workers:
            self._check_process(worker)

    def _check_process(self, worker: Any) -> None:
        local = worker.local_worker
        if local is None or self._restarting(worker.worker_id):
            return
        process = local.process
        if process is None:
            return
        code = process.poll()
        if code is None or process.pid in self._exit_reported:
            return
        self._exit_reported.add(process.pid)
        worker.last_error = process_exit_reason(process.pid, code)
        self._monitor.report_process_exit(worker.worker_id, worker.last_error, code)
        self._project(worker)

    def _project(self, worker: Any) -> None:
        status = self._monitor.status(worker.worker_id)
        worker.healthy = bool(status is not None and status.in_rotation and worker.base_url)

    # -- events from the poller ------------------------------------------------
    def _on_health_event(self, event: Any) -> None:
        if event.kind == _ERROR:
            _log.error("health poller: %s", printable(event.error))  # never a worker's fault
            return
        worker = self._workers.get(event.worker_id)
        if worker is None:
            return
        worker.healthy = bool(event.in_rotation) and bool(worker.base_url)
        if event.kind == _PROBE:
            probe = event.probe
            metrics.router.observe_probe(worker.worker_id, probe.latency_s, probe.status,
                                         event.unix_time)
            if probe.healthy:
                worker.last_error = None
            else:
                worker.last_error = short_reason(f"{enum_name(probe.status)}: {probe.detail}")
                self._check_process(worker)
        elif event.kind == _AUDIT:
            record = self._audit.write(event)
            metrics.router.record_audit(worker.worker_id, event.audit.action, event.audit.cause)
            log_audit(record, in_rotation=worker.healthy)
        elif event.kind == _RESTART:
            self._schedule_restart(worker)
        if worker.healthy and self._capabilities_of.get(worker.worker_id) != worker.generation:
            self._read_capabilities(worker)
        if self.job_supervisor is not None:
            self.job_supervisor.on_event(event)
        self._check_first_health()

    # -- tiers, models, features (once per instance) -----------------------------------
    def _read_capabilities(self, worker: Any) -> None:
        task = self._capability_tasks.get(worker.worker_id)
        if task is None or task.done():
            self._capability_tasks[worker.worker_id] = asyncio.get_running_loop().create_task(
                self._capabilities(worker), name=f"mineru-health-capabilities-{worker.worker_id}")

    async def _capabilities(self, worker: Any) -> None:
        generation, base = worker.generation, worker.base_url
        timeout = float(self.health_settings.main_port_timeout_s)
        try:
            health, tiers, models = await asyncio.gather(
                *(self.client.get(f"{base}/v1/{what}", timeout=timeout)
                  for what in ("health", "tiers", "models")))
            for response in (health, tiers, models):
                response.raise_for_status()
            features = dict(health.json().get("features") or {})
            tier_data = {str(item["id"]): dict(item) for item in tiers.json().get("data", [])
                         if item.get("id")}
            model_data = [dict(item) for item in models.json().get("data", [])]
        except Exception as exc:  # noqa: BLE001 -- read again at the next healthy probe
            _log.info("worker %s: reading tiers and models failed: %s", worker.worker_id,
                      printable(str(exc)))
            return
        if worker.generation != generation or worker.base_url != base:
            return  # replaced meanwhile
        worker.features, worker.tier_metadata, worker.models = features, tier_data, model_data
        self._capabilities_of[worker.worker_id] = generation
        self._check_first_health()

    # -- restarts ---------------------------------------------------------------
    def _restarting(self, worker_id: str) -> bool:
        task = self._restart_tasks.get(worker_id)
        return task is not None and not task.done()

    def _schedule_restart(self, worker: Any) -> None:
        if worker.local_worker is None or self._restarting(worker.worker_id):
            return
        self._restart_tasks[worker.worker_id] = asyncio.get_running_loop().create_task(
            self._restart(worker), name=f"mineru-health-restart-{worker.worker_id}")

    async def _restart(self, worker: Any) -> None:
        worker_id = worker.worker_id
        local = worker.local_worker
        # Stop probing the old process: its answers say nothing about the new one.
        self._monitor.set_url(worker_id, "")
        worker.healthy = False
        worker.base_url = ""
        worker.tier_metadata.clear()
        worker.models.clear()
        worker.features.clear()
        # Its finished outputs stay downloadable from the kept upload directory.
        files = self.job_supervisor.file_payloads(worker_id) if self.job_supervisor else []
        self.retired.retire(local.take_upload_dir(), files)
        # As 4.0: a new generation, so late answers of the old one publish nothing.
        worker.generation += 1
        worker.active_jobs = 0
        try:
            await local.stop()
        except Exception as exc:  # noqa: BLE001 -- a failed stop must not block the new start
            _log.warning("worker %s: stopping the old process failed: %s", worker_id,
                         printable(str(exc)))
        error = await self._launch(worker)
        if error is not None:
            self._monitor.report_restart_failed(worker_id, short_reason(f"restart failed: {error}"))
            return
        _log.info("worker %s: restarted on %s", worker_id, worker.base_url)

"""Pythonic wrapper of the native health poller.

``HealthMonitor`` owns a native ``Poller`` thread and hands its events to an
asyncio loop through ``loop.add_reader`` on the poller's eventfd, so nothing
polls in Python. Its configuration is a ``settings.HealthSettings``; audit
records are written by ``audit.AuditLog``.

    settings = HealthSettings.from_env()          # raises ConfigError
    monitor = HealthMonitor(settings, on_event=handle)
    monitor.add_worker("local-gpu-0", "http://127.0.0.1:8001", restartable=True)
    monitor.attach(asyncio.get_running_loop())     # starts the poller thread
    ...
    monitor.close()
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from mineru_health import _native
from mineru_health.settings import HealthSettings

from . import safe_text

__all__ = [
    "AuditAction",
    "HealthMonitor",
    "PollerEvent",
    "PollerEventKind",
    "ProbeResult",
    "ProbeStatus",
    "WorkerPhase",
    "WorkerStatus",
    "expectations",
]

ProbeStatus = _native.ProbeStatus
ProbeResult = _native.ProbeResult
WorkerPhase = _native.WorkerPhase
AuditAction = _native.AuditAction
PollerEventKind = _native.PollerEventKind
PollerEvent = _native.PollerEvent
WorkerStatus = _native.WorkerStatus

_log = safe_text.logger("mineru_health.monitor")


def expectations(
    settings: HealthSettings,
    *,
    protocol_version: int | None = None,
    require_load_fields: bool = True,
    main_port_status: str = "",
) -> Any:
    """The ``_native.ProbeExpectations`` matching ``settings``.

    ``main_port_status``: the healthy ``status`` word of a worker's main port
    when it is not the native endpoint's (MinerU 4.0 says ``"ok"``).
    """
    expect = _native.ProbeExpectations()
    expect.expected_status = settings.expected_status
    expect.max_body_bytes = settings.max_body_bytes
    expect.protocol_version = protocol_version
    expect.require_load_fields = require_load_fields
    expect.main_port_status = main_port_status
    return expect


EventCallback = Callable[[Any], None]


class HealthMonitor:
    """Owns a native Poller and dispatches its events to callbacks on an asyncio loop.

    Callbacks run on the loop's thread, one event at a time, in the order the
    poller produced them. Methods other than ``attach``/``detach``/``close``
    are thread-safe (they go straight to the native poller).
    """

    def __init__(
        self,
        settings: HealthSettings,
        *,
        protocol_version: int | None = None,
        require_load_fields: bool = True,
        main_port_status: str = "",
        seed: int = 0,
        on_event: EventCallback | None = None,
    ) -> None:
        self.settings = settings
        self._expect = expectations(
            settings, protocol_version=protocol_version, require_load_fields=require_load_fields,
            main_port_status=main_port_status,
        )
        self._poller = _native.Poller(settings.native, self._expect, seed)
        self._on_event = on_event
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd = self._poller.notify_fd()

    # -- workers ---------------------------------------------------------
    def add_worker(self, worker_id: str, url: str = "", *, restartable: bool = False,
                   health_url: str = "") -> None:
        """Adds a worker; ``health_url`` is its native ``/health`` when known.

        Without it the worker's main-port ``/health`` is probed (with the main
        port timeout) until the worker advertises a native endpoint.
        """
        self._poller.add_worker(_native.Target(worker_id, _base_url(url), restartable, health_url))

    def remove_worker(self, worker_id: str) -> None:
        self._poller.remove_worker(worker_id)

    def set_url(self, worker_id: str, url: str, health_url: str = "") -> None:
        """A restarted worker answers on a new URL ("" stops probing it)."""
        self._poller.set_url(worker_id, _base_url(url), health_url)

    # -- inputs seen outside probes ----------------------------------------
    def report_process_exit(self, worker_id: str, reason: str,
                            exit_code: int | None = None) -> None:
        self._poller.report_process_exit(worker_id, reason, exit_code)

    def report_passive_failure(self, worker_id: str, reason: str) -> None:
        self._poller.report_passive_failure(worker_id, reason)

    def report_restart_failed(self, worker_id: str, reason: str) -> None:
        self._poller.report_restart_failed(worker_id, reason)

    # -- state ----------------------------------------------------------------
    def statuses(self) -> list[Any]:
        return list(self._poller.statuses())

    def status(self, worker_id: str) -> Any | None:
        """One worker's state (None for an unknown id)."""
        return self._poller.status(worker_id)

    def stats(self) -> Any:
        """The poller's own counters (dropped events, I/O errors, suppressed ejections...)."""
        return self._poller.stats()

    @property
    def running(self) -> bool:
        return bool(self._poller.running())

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> None:
        """Starts the poller thread without a loop (drain with ``drain()``)."""
        self._poller.start()

    def attach(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Registers the poller's eventfd with ``loop`` and starts the poller thread.

        Raises the process's file-descriptor limit first, as far as this
        fleet needs (one descriptor per probe in flight; see poller.h).
        """
        if self._loop is not None:
            raise RuntimeError("HealthMonitor is already attached to a loop")
        loop = loop or asyncio.get_running_loop()
        workers = self._poller.stats().workers
        limit = _native.raise_fd_limit(min(workers, self.settings.concurrency))
        if limit.error:
            _log.warning("file-descriptor limit not raised (%s): large fleets are probed "
                         "in more rounds", limit.error)
        loop.add_reader(self._fd, self._dispatch)
        self._loop = loop
        self._poller.start()

    def detach(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._fd)
            self._loop = None

    def drain(self) -> list[Any]:
        """Events queued since the last drain (for owners without an asyncio loop)."""
        return list(self._poller.drain_events())

    def stop(self) -> None:
        """Stops the poller thread (blocks until it has joined; see ``aclose``)."""
        self.detach()
        self._poller.stop()

    async def aclose(self) -> None:
        """Stops the poller without blocking the loop."""
        self.detach()
        await asyncio.to_thread(self._poller.stop)

    close = stop

    def _dispatch(self) -> None:
        for event in self._poller.drain_events():
            if self._on_event is None:
                continue
            try:
                self._on_event(event)
            except Exception:  # noqa: BLE001 -- one bad callback must not stop health handling
                _log.exception("health event callback failed for %s", event.worker_id)

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"HealthMonitor({state}, workers={self._poller.stats().workers})"


def _base_url(url: str) -> str:
    url = url.strip().rstrip("/")
    url = url.removesuffix("/health")
    return url

"""Pythonic wrapper of the native health poller and its configuration.

``HealthSettings`` is the validated ``MINERU_ROUTER_HEALTH_*`` configuration;
``HealthMonitor`` owns a native ``Poller`` thread and hands its events to an
asyncio loop through ``loop.add_reader`` on the poller's eventfd, so nothing
polls in Python; ``AuditLog`` writes one JSON line per audit event;
``probe_urls`` runs one concurrent sweep for the ``mineru-health probe`` CLI.

    settings = HealthSettings.from_env()          # raises ConfigError
    monitor = HealthMonitor(settings, on_event=handle)
    monitor.add_worker("local-gpu-0", "http://127.0.0.1:8001", restartable=True)
    monitor.attach(asyncio.get_running_loop())     # starts the poller thread
    ...
    monitor.close()
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import IO, Any, TextIO

from mineru_health import _native
from mineru_health.errors import ConfigError

__all__ = [
    "ENV_PREFIX",
    "AuditAction",
    "AuditLog",
    "HealthMonitor",
    "HealthSettings",
    "PollerEvent",
    "PollerEventKind",
    "ProbeResult",
    "ProbeStatus",
    "WorkerPhase",
    "WorkerStatus",
    "audit_record",
    "expectations",
    "probe_urls",
]

ENV_PREFIX = "MINERU_ROUTER_HEALTH_"

ProbeStatus = _native.ProbeStatus
ProbeResult = _native.ProbeResult
WorkerPhase = _native.WorkerPhase
AuditAction = _native.AuditAction
PollerEventKind = _native.PollerEventKind
PollerEvent = _native.PollerEvent
WorkerStatus = _native.WorkerStatus

_log = logging.getLogger("mineru_health.monitor")

_FIELDS = (
    "interval_s",
    "probe_timeout_s",
    "connect_timeout_s",
    "failure_threshold",
    "healthy_threshold",
    "backoff_base_s",
    "backoff_max_s",
    "max_attempts",
    "boot_timeout_s",
    "concurrency",
    "jitter",
    "expected_status",
    "max_body_bytes",
    "audit_path",
    "ca_file",
)


class HealthSettings:
    """Validated router health configuration; immutable (``replace`` returns a copy)."""

    __slots__ = ("_config",)

    def __init__(self, config: Any = None) -> None:
        native = _copy(config) if config is not None else _native.HealthConfig()
        _native.validate(native)
        self._config = native

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> HealthSettings:
        """Reads ``MINERU_ROUTER_HEALTH_*`` from ``environ`` (``os.environ`` by default).

        Raises ``mineru_health.errors.ConfigError`` whose ``variable`` names the
        variable to fix, for a bad value and for an unknown name alike.
        """
        source = os.environ if environ is None else environ
        env = {key: str(value) for key, value in source.items() if key.startswith(ENV_PREFIX)}
        return cls(_native.health_config_from_env(env))

    @classmethod
    def preset(cls, name: str) -> HealthSettings:
        return cls(_native.preset(name))

    @staticmethod
    def preset_names() -> list[str]:
        return list(_native.preset_names())

    @staticmethod
    def variables() -> list[tuple[str, str, str]]:
        """(name, default, meaning) of every documented variable."""
        return [(v.name, v.default_value, v.meaning) for v in _native.config_variables()]

    def replace(self, **changes: Any) -> HealthSettings:
        """A validated copy with some fields changed."""
        native = _copy(self._config)
        for key, value in changes.items():
            if key not in _FIELDS:
                raise TypeError(f"unknown HealthSettings field: {key}")
            setattr(native, key, value)
        return HealthSettings(native)

    @property
    def native(self) -> Any:
        """A copy of the underlying ``_native.HealthConfig``."""
        return _copy(self._config)

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self._config, name) for name in _FIELDS}

    def __getattr__(self, name: str) -> Any:
        if name in _FIELDS:
            return getattr(self._config, name)
        raise AttributeError(name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HealthSettings) and self.as_dict() == other.as_dict()

    def __hash__(self) -> int:
        return hash(tuple(self.as_dict().items()))

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items())
        return f"HealthSettings({fields})"


def _copy(config: Any) -> Any:
    native = _native.HealthConfig()
    for name in _FIELDS:
        setattr(native, name, getattr(config, name))
    return native


def expectations(
    settings: HealthSettings,
    *,
    protocol_version: int | None = None,
    require_load_fields: bool = True,
) -> Any:
    """The ``_native.ProbeExpectations`` matching ``settings``."""
    expect = _native.ProbeExpectations()
    expect.expected_status = settings.expected_status
    expect.max_body_bytes = settings.max_body_bytes
    expect.protocol_version = protocol_version
    expect.require_load_fields = require_load_fields
    return expect


def _iso(unix_time: float) -> str:
    return datetime.fromtimestamp(unix_time, tz=UTC).isoformat()


def audit_record(event: Any) -> dict[str, Any]:
    """The JSON object of one audit event: time, worker_id, action, attempt, reason, from, to."""
    audit = event.audit
    return {
        "time": _iso(event.unix_time),
        "worker_id": event.worker_id,
        "action": _native.to_string(audit.action),
        "attempt": audit.attempt,
        "reason": audit.reason,
        "from": _native.to_string(audit.from_phase),
        "to": _native.to_string(audit.to_phase),
    }


class AuditLog:
    """Appends audit events as JSON lines to a file opened once (stderr when path is "").

    Line-buffered, so each record reaches the file as one write. Not
    thread-safe: call it from the thread that drains the poller's events.
    """

    def __init__(self, path: str = "") -> None:
        self.path = path
        self._owned: IO[str] | None = None
        if path:
            self._owned = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        self._stream: TextIO = self._owned if self._owned is not None else sys.stderr

    def write(self, event: Any) -> dict[str, Any]:
        record = audit_record(event)
        try:
            self._stream.write(json.dumps(record, ensure_ascii=False) + "\n")
        except (OSError, ValueError) as exc:  # a full disk must not stop health handling
            _log.warning("cannot write audit record to %s: %s", self.path or "stderr", exc)
        return record

    def close(self) -> None:
        if self._owned is not None:
            self._owned.close()
            self._owned = None
            self._stream = sys.stderr

    def __repr__(self) -> str:
        return f"AuditLog(path={self.path!r})"


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
        seed: int = 0,
        on_event: EventCallback | None = None,
    ) -> None:
        self.settings = settings
        self._expect = expectations(
            settings, protocol_version=protocol_version, require_load_fields=require_load_fields
        )
        self._poller = _native.Poller(settings.native, self._expect, seed)
        self._on_event = on_event
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd = self._poller.notify_fd()

    # -- workers ---------------------------------------------------------
    def add_worker(self, worker_id: str, url: str = "", *, restartable: bool = False) -> None:
        self._poller.add_worker(_native.Target(worker_id, _base_url(url), restartable))

    def remove_worker(self, worker_id: str) -> None:
        self._poller.remove_worker(worker_id)

    def set_url(self, worker_id: str, url: str) -> None:
        """A restarted worker answers on a new URL ("" stops probing it)."""
        self._poller.set_url(worker_id, _base_url(url))

    # -- inputs seen outside probes ----------------------------------------
    def report_process_exit(self, worker_id: str, reason: str) -> None:
        self._poller.report_process_exit(worker_id, reason)

    def report_passive_failure(self, worker_id: str, reason: str) -> None:
        self._poller.report_passive_failure(worker_id, reason)

    def report_restart_failed(self, worker_id: str, reason: str) -> None:
        self._poller.report_restart_failed(worker_id, reason)

    # -- state ----------------------------------------------------------------
    def statuses(self) -> list[Any]:
        return list(self._poller.statuses())

    def status(self, worker_id: str) -> Any | None:
        for status in self._poller.statuses():
            if status.id == worker_id:
                return status
        return None

    @property
    def running(self) -> bool:
        return bool(self._poller.running())

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> None:
        """Starts the poller thread without a loop (drain with ``drain()``)."""
        self._poller.start()

    def attach(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Registers the poller's eventfd with ``loop`` and starts the poller thread."""
        if self._loop is not None:
            raise RuntimeError("HealthMonitor is already attached to a loop")
        loop = loop or asyncio.get_running_loop()
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
        return f"HealthMonitor({state}, workers={len(self.statuses())})"


def _base_url(url: str) -> str:
    url = url.strip().rstrip("/")
    url = url.removesuffix("/health")
    return url


def probe_urls(
    urls: Iterable[str],
    *,
    timeout_s: float | None = None,
    expected_status: str | None = None,
    as_json: bool = False,
    settings: HealthSettings | None = None,
    out: TextIO | None = None,
) -> int:
    """Probes every URL once, all concurrently; prints a table (or JSON).

    Returns 0 when every URL answered healthy, 1 otherwise. Settings come from
    ``MINERU_ROUTER_HEALTH_*`` unless given; ``timeout_s`` and
    ``expected_status`` override them. Load fields are required only when the
    expected status is MinerU's ``"healthy"``.
    """
    out = out or sys.stdout
    base = settings or HealthSettings.from_env()
    changes: dict[str, Any] = {}
    if timeout_s is not None:
        if timeout_s <= 0:
            raise ConfigError("timeout must be positive", variable="--timeout")
        changes["probe_timeout_s"] = timeout_s
        changes["connect_timeout_s"] = min(base.connect_timeout_s, timeout_s)
        changes["interval_s"] = max(base.interval_s, timeout_s * 2)
    if expected_status is not None:
        changes["expected_status"] = expected_status
    current = base.replace(**changes) if changes else base
    url_list = list(urls)
    # Ids are positions, so a URL given twice is probed twice and reported in order.
    targets = [_native.Target(str(i), _base_url(url), False) for i, url in enumerate(url_list)]
    expect = expectations(current, require_load_fields=current.expected_status == "healthy")
    results, _stats = _native.Poller.sweep(targets, current.native, expect)
    by_id = {result.worker_id: result for result in results}
    rows = []
    for target, url in zip(targets, url_list):
        result = by_id.get(target.id)
        if result is None:  # the sweep answers every target; stay safe if one is missing
            rows.append(_row(url, False, "transport_error", 0, 0.0, "no result"))
            continue
        rows.append(
            _row(
                url,
                bool(result.healthy),
                _native.to_string(result.status),
                int(result.http_status),
                result.latency_s,
                result.detail,
            )
        )
    if as_json:
        out.write(json.dumps(rows, ensure_ascii=False, indent=2) + "\n")
    else:
        _print_table(rows, out)
    return 0 if rows and all(row["healthy"] for row in rows) else 1


def _row(
    url: str, healthy: bool, status: str, http_status: int, latency_s: float, detail: str
) -> dict[str, Any]:
    return {
        "url": url,
        "healthy": healthy,
        "status": status,
        "http_status": http_status,
        "latency_ms": round(latency_s * 1000.0, 1),
        "detail": detail,
    }


def _print_table(rows: list[dict[str, Any]], out: TextIO) -> None:
    headers = ["URL", "STATUS", "HTTP", "LATENCY_MS", "DETAIL"]
    cells = [
        [r["url"], r["status"], str(r["http_status"] or "-"), f"{r['latency_ms']:.1f}", r["detail"]]
        for r in rows
    ]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(headers[:-1])]
    for line in [headers, *cells]:
        padded = [cell.ljust(width) for cell, width in zip(line[:-1], widths)]
        out.write("  ".join([*padded, line[-1]]).rstrip() + "\n")

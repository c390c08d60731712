"""Fake MinerU workers on one loopback server, and helpers shared by the monitor tests.

Every fake worker is one path on a threaded HTTP server bound to 127.0.0.1
port 0 (plus one bound-but-not-listening port for "connection refused").
Waits are bounded in time and count; nothing asserts on timings.
"""

from __future__ import annotations

import asyncio
import functools
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import pytest
from mineru_health import _native
from mineru_health._native import AuditAction, PollerEventKind, WorkerPhase
from mineru_health.runtime.router.fleet import Fleet as HealthFleet
from mineru_health.runtime.router.fleet import expectations
from mineru_health.runtime.settings import HealthSettings

if TYPE_CHECKING:
    from typing_extensions import Self

HEALTHY_BODY = {
    "status": "healthy",
    "version": "3.4.4",
    "protocol_version": 2,
    "queued_tasks": 1,
    "processing_tasks": 2,
    "completed_tasks": 3,
    "failed_tasks": 4,
    "max_concurrent_requests": 3,
    "processing_window_size": 64,
}
ENGINE_DEAD_BODY = {
    "status": "unhealthy",
    "version": "3.4.4",
    "error": "EngineDeadError: EngineCore encountered an issue.",
    "rule": "vllm-engine-dead",
    "category": "engine_dead",
    "since": "2026-01-01T00:00:00+00:00",
    "engine_dead": True,
}
#: A worker's error text as a hostile or broken worker could send it: a forged
#: log line after a newline, ANSI colour and screen-clearing escapes, a bidi override.
HOSTILE_ERROR = "boom\n2026-01-01 INFO all good \x1b[31mred\x1b[0m\x1b[2J\u202eevil\r"
WAIT_S = 15.0  # upper bound of every wait below; the expected case takes well under a second


class _Handler(BaseHTTPRequestHandler):
    server: _FleetServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _send(self, code: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        name = self.path.strip("/").split("/")[0]
        self.server.hits[name] = self.server.hits.get(name, 0) + 1
        behaviour = self.server.behaviours.get(name, "healthy")
        stop = self.server.stop_event
        if behaviour == "healthy":
            self._send(200, json.dumps(HEALTHY_BODY).encode())
        elif behaviour == "http_503":
            self._send(503, b'{"status": "unhealthy", "error": "Task dispatcher is not running"}')
        elif behaviour == "hostile":
            body = {"status": "unhealthy", "error": HOSTILE_ERROR}
            self._send(503, json.dumps(body).encode())
        elif behaviour == "engine_dead":
            self._send(503, json.dumps(ENGINE_DEAD_BODY).encode())
        elif behaviour == "bad_status":
            self._send(200, json.dumps({**HEALTHY_BODY, "status": "starting"}).encode())
        elif behaviour == "not_json":
            self._send(200, b"<html>all good</html>", "text/html")
        elif behaviour == "oversized":
            pad = "x" * (256 * 1024)
            self._send(200, json.dumps({**HEALTHY_BODY, "pad": pad}).encode())
        elif behaviour == "hang":
            stop.wait(WAIT_S)
        elif behaviour == "slow_drip":
            body = json.dumps(HEALTHY_BODY).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            for i in range(len(body)):
                if stop.wait(0.2):
                    return
                try:
                    self.wfile.write(body[i : i + 1])
                    self.wfile.flush()
                except OSError:
                    return
        elif behaviour == "closed_mid":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b'{"status": "hea')
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)


class _FleetServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    # Every probe of a sweep connects at once; the default backlog of 5 would
    # drop SYNs and turn them into connect timeouts.
    request_queue_size = 256

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Probes that time out reset their connections; that is expected here.
        return

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.behaviours: dict[str, str] = {}
        self.hits: dict[str, int] = {}
        self.stop_event = threading.Event()


class Fleet:
    """Fake MinerU workers, one per behaviour, on one loopback server."""

    BEHAVIOURS = (
        "healthy",
        "http_503",
        "engine_dead",
        "bad_status",
        "not_json",
        "oversized",
        "hang",
        "slow_drip",
        "closed_mid",
    )

    def __init__(self) -> None:
        self.server = _FleetServer()
        self.port = self.server.server_address[1]
        for name in self.BEHAVIOURS:
            self.server.behaviours[name] = name
        # Bound but never listening: connecting is refused, and no other
        # test can take the port meanwhile.
        self._refused = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._refused.bind(("127.0.0.1", 0))
        self.refused_url = f"http://127.0.0.1:{self._refused.getsockname()[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def set(self, name: str, behaviour: str) -> None:
        self.server.behaviours[name] = behaviour

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self.server.stop_event.set()
        self.server.shutdown()
        self.server.server_close()
        self._refused.close()
        self._thread.join(timeout=WAIT_S)


def run_async(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Runs an async test body in a fresh event loop (no pytest plugin needed)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return asyncio.run(fn(*args, **kwargs))

    return wrapper


def fast_settings(**changes: Any) -> HealthSettings:
    base: dict[str, Any] = {
        "interval_s": 1.0,
        "probe_timeout_s": 0.8,
        "connect_timeout_s": 0.8,
        # The fakes are probed on their main port (no native endpoint).
        "main_port_timeout_s": 0.8,
        "failure_threshold": 2,
        "healthy_threshold": 1,
        "backoff_base_s": 0.05,
        "backoff_max_s": 0.1,
        "max_attempts": 2,
        "boot_timeout_s": 5.0,
        "jitter": 0.0,
        "max_body_bytes": 4096,
    }
    base.update(changes)
    return HealthSettings.preset("production").replace(**base)


class Recorder:
    """Collects events and wakes waiters on the loop."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.changed = asyncio.Event()

    def __call__(self, event: Any) -> None:
        self.events.append(event)
        self.changed.set()

    def of(self, worker: str, kind: Any | None = None) -> list[Any]:
        return [
            e for e in self.events if e.worker_id == worker and (kind is None or e.kind == kind)
        ]

    def audits(self, worker: str) -> list[Any]:
        """Audit events of `worker` after its start-up admission.

        starting -> healthy is an audit event ("admitted") since every phase
        change is one; the tests look at what happens after it.
        """
        events = self.of(worker, PollerEventKind.AUDIT)
        if events and events[0].audit.action == AuditAction.ADMITTED:
            return events[1:]
        return events

    def actions(self, worker: str) -> list[str]:
        return [_native.to_string(e.audit.action) for e in self.audits(worker)]

    async def wait_for(self, predicate: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail(f"timed out waiting for {what}; events: {self.summary()}")
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), timeout=remaining)
            except asyncio.TimeoutError:
                pass

    def summary(self) -> list[tuple[str, str, str]]:
        out = []
        for e in self.events[-40:]:
            detail = ""
            if e.probe is not None:
                detail = _native.to_string(e.probe.status)
            if e.audit is not None:
                detail = _native.to_string(e.audit.action)
            out.append((e.worker_id, _native.to_string(e.kind), detail))
        return out


class FakeMember:
    """A worker as the runtime's fleet sees it, served by a path of the fake server.

    A local one takes the next of ``urls`` at each launch (the first at the
    fleet's start); ``failing_launches`` launches after the first raise, as a
    spawn that fails would. With ``spawn``, each launch also starts a real
    process (a sleeper leading its own session), ended by the fleet.
    """

    def __init__(
        self,
        worker_id: str,
        *urls: str,
        local: bool = False,
        failing_launches: int = 0,
        spawn: bool = False,
    ) -> None:
        self.spawn = spawn
        self.processes: list[subprocess.Popen[bytes]] = []
        self.id = worker_id
        self.local = local
        self.url = urls[0] if urls and not local else ""
        self._urls = list(urls)
        self._failing = failing_launches
        self.launches = 0
        self.in_rotation = False

    def base_url(self) -> str:
        return self.url

    def probe_base(self) -> str:
        return self.url

    def connect_host(self) -> str:
        return "127.0.0.1"

    def process(self) -> Any:
        return self.processes[-1] if self.processes else None

    def show(self, event: Any) -> None:
        self.in_rotation = bool(event.in_rotation)

    def show_rotation(self, in_rotation: bool, reason: str | None = None) -> None:
        self.in_rotation = in_rotation

    async def launch(self, env: Any) -> None:
        self.launches += 1
        if self.launches > 1 and self._failing > 0:
            self._failing -= 1
            raise RuntimeError("spawn failed")
        self.url = self._urls[min(self.launches, len(self._urls)) - 1]
        if self.spawn:
            self.processes.append(_sleeper())

    def end_processes(self) -> None:
        """Whatever the fleet left of its processes, by pid (a failed test)."""
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait(WAIT_S)

    async def stop(self) -> None:
        self.url = ""


def _sleeper() -> subprocess.Popen[bytes]:
    """A real process for a spawning FakeMember: leads its own session, as a worker does."""
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )


async def start_fleet(
    settings: HealthSettings, rec: Any, *members: FakeMember, wait_s: float = 0.0
) -> HealthFleet:
    """The runtime's fleet over ``members``, probing their main ports, events to ``rec``;
    its start waits ``wait_s`` at most for the first answers."""
    fleet = HealthFleet(
        settings, expectations(settings, protocol_version=2), client=None, native_probes=False
    )
    for member in members:
        fleet.add(member)
    fleet.listen(rec)
    await fleet.start(wait_s=wait_s)
    return fleet


async def stop_fleet(fleet: HealthFleet) -> None:
    await fleet.close()
    fleet.close_files()


def phase(fleet: HealthFleet, worker: str) -> Any:
    status = fleet.status(worker)
    assert status is not None
    return status.phase


async def one_audit_event(fake: Fleet) -> Any:
    """Audit events of one worker ejected by a passive failure."""
    rec = Recorder()
    fleet = await start_fleet(
        fast_settings(),
        rec,
        FakeMember("w", fake.url("w"), local=True),
        # so the guard lets w go
        FakeMember("spare", fake.url("spare")),
    )
    try:
        await rec.wait_for(
            lambda: all(phase(fleet, n) == WorkerPhase.HEALTHY for n in ("w", "spare")),
            "healthy",
        )
        fleet.report_passive("w", "fatal task error")
        await rec.wait_for(lambda: bool(rec.audits("w")), "an audit event")
        return rec.audits("w")
    finally:
        await stop_fleet(fleet)

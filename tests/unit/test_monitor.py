"""HealthSettings, HealthMonitor, AuditLog and probe_urls against loopback fake workers.

Every fake worker is one path on a threaded HTTP server bound to 127.0.0.1
port 0 (plus one bound-but-not-listening port for "connection refused").
Waits are bounded in time and count; nothing asserts on timings.
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from mineru_health import _native
from mineru_health.errors import ConfigError
from mineru_health.monitor import (
    AuditAction,
    AuditLog,
    HealthMonitor,
    HealthSettings,
    PollerEventKind,
    ProbeStatus,
    WorkerPhase,
    audit_record,
    probe_urls,
)

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

    def close(self) -> None:
        self.server.stop_event.set()
        self.server.shutdown()
        self.server.server_close()
        self._refused.close()
        self._thread.join(timeout=WAIT_S)


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    f = Fleet()
    try:
        yield f
    finally:
        f.close()


def run_async(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Runs an async test body in a fresh event loop (no pytest plugin needed)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return asyncio.run(fn(*args, **kwargs))

    return wrapper


# The fake workers are probed on their main port, which is judged with
# main_port_timeout_s (60 s by default: a loaded MinerU answers slowly
# there). HealthSettings learns that field with the config-table work; until
# then these tests let it through to the native config.
_MAIN_PORT_FIELD = "main_port_timeout_s"


@pytest.fixture(autouse=True)
def _main_port_timeout_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    import mineru_health.monitor as monitor_module

    if _MAIN_PORT_FIELD not in monitor_module._FIELDS:
        monkeypatch.setattr(
            monitor_module, "_FIELDS", (*monitor_module._FIELDS, _MAIN_PORT_FIELD)
        )


def fast_settings(**changes: Any) -> HealthSettings:
    base: dict[str, Any] = {
        "interval_s": 1.0,
        "probe_timeout_s": 0.8,
        "connect_timeout_s": 0.8,
        _MAIN_PORT_FIELD: 0.8,
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


# --- configuration -----------------------------------------------------------


def test_defaults_are_the_production_preset() -> None:
    assert HealthSettings() == HealthSettings.preset("production")
    assert HealthSettings.from_env({}) == HealthSettings.preset("production")


def test_presets_listed_and_loadable() -> None:
    names = HealthSettings.preset_names()
    assert names == ["fast", "production", "outage-tolerant"]
    fast = HealthSettings.preset("fast")
    tolerant = HealthSettings.preset("outage-tolerant")
    assert fast.interval_s < HealthSettings().interval_s < tolerant.interval_s
    assert tolerant.failure_threshold > fast.failure_threshold


def test_preset_from_env_then_variables_over_it() -> None:
    s = HealthSettings.from_env(
        {
            "MINERU_ROUTER_HEALTH_PRESET": "fast",
            "MINERU_ROUTER_HEALTH_FAILURE_THRESHOLD": "7",
            "MINERU_ROUTER_HEALTH_AUDIT_PATH": "/tmp/audit.jsonl",
            "UNRELATED": "ignored",
        }
    )
    assert s.interval_s == HealthSettings.preset("fast").interval_s
    assert s.failure_threshold == 7
    assert s.audit_path == "/tmp/audit.jsonl"


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"MINERU_ROUTER_HEALTH_INTERVAL_S": "soon"}, "MINERU_ROUTER_HEALTH_INTERVAL_S"),
        ({"MINERU_ROUTER_HEALTH_INTERVAL_S": "-1"}, "MINERU_ROUTER_HEALTH_INTERVAL_S"),
        (
            {"MINERU_ROUTER_HEALTH_INTERVAL_S": "1", "MINERU_ROUTER_HEALTH_TIMEOUT_S": "2"},
            "MINERU_ROUTER_HEALTH_TIMEOUT_S",
        ),
        ({"MINERU_ROUTER_HEALTH_FAILURE_THRESHOLD": "0"}, "MINERU_ROUTER_HEALTH_FAILURE_THRESHOLD"),
        ({"MINERU_ROUTER_HEALTH_JITTER": "0.9"}, "MINERU_ROUTER_HEALTH_JITTER"),
        ({"MINERU_ROUTER_HEALTH_PRESET": "turbo"}, "MINERU_ROUTER_HEALTH_PRESET"),
        ({"MINERU_ROUTER_HEALTH_INTERVALS": "1"}, "MINERU_ROUTER_HEALTH_INTERVALS"),
        ({"MINERU_ROUTER_HEALTH_MAX_BODY_BYTES": "1"}, "MINERU_ROUTER_HEALTH_MAX_BODY_BYTES"),
    ],
)
def test_bad_config_names_the_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError) as info:
        HealthSettings.from_env(env)
    assert info.value.variable == variable
    assert variable in str(info.value)


def test_from_env_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINERU_ROUTER_HEALTH_MAX_ATTEMPTS", "not-a-number")
    with pytest.raises(ConfigError) as info:
        HealthSettings.from_env()
    assert info.value.variable == "MINERU_ROUTER_HEALTH_MAX_ATTEMPTS"


def test_replace_validates_and_copies() -> None:
    base = HealthSettings()
    changed = base.replace(failure_threshold=9)
    assert changed.failure_threshold == 9 and base.failure_threshold != 9
    with pytest.raises(ConfigError) as info:
        base.replace(probe_timeout_s=base.interval_s * 2)
    assert info.value.variable == "MINERU_ROUTER_HEALTH_TIMEOUT_S"
    with pytest.raises(TypeError):
        base.replace(no_such_field=1)
    assert "failure_threshold=3" in repr(base)


def test_documented_variables_cover_every_field() -> None:
    names = [name for name, _default, _meaning in HealthSettings.variables()]
    assert "MINERU_ROUTER_HEALTH_PRESET" in names
    assert "MINERU_ROUTER_HEALTH_AUDIT_PATH" in names
    assert "MINERU_ROUTER_HEALTH_CA_FILE" in names
    assert len(names) == len(set(names)) == 16
    for name in names:
        assert name.startswith("MINERU_ROUTER_HEALTH_")


# --- one synchronous sweep ------------------------------------------------------

EXPECTED_STATUS = {
    "healthy": ProbeStatus.HEALTHY,
    "http_503": ProbeStatus.HTTP_STATUS,
    "engine_dead": ProbeStatus.ENGINE_DEAD,
    "bad_status": ProbeStatus.UNEXPECTED_STATUS,
    "not_json": ProbeStatus.NOT_JSON_OBJECT,
    "oversized": ProbeStatus.BODY_TOO_LARGE,
    "hang": ProbeStatus.TIMEOUT,
    "slow_drip": ProbeStatus.TIMEOUT,
    "closed_mid": ProbeStatus.TRANSPORT_ERROR,
}


def _sweep(fleet: Fleet, settings: HealthSettings) -> dict[str, Any]:
    from mineru_health.monitor import expectations

    targets = [_native.Target(name, fleet.url(name)) for name in Fleet.BEHAVIOURS]
    targets.append(_native.Target("refused", fleet.refused_url))
    results, stats = _native.Poller.sweep(
        targets, settings.native, expectations(settings, protocol_version=2)
    )
    assert stats.probes == len(targets)
    assert stats.healthy == 1
    return {r.worker_id: r for r in results}


def test_sweep_classifies_every_failure_mode(fleet: Fleet) -> None:
    results = _sweep(fleet, fast_settings())
    for name, status in EXPECTED_STATUS.items():
        assert results[name].status == status, (name, results[name].detail)
    assert results["refused"].status == ProbeStatus.CONNECT_ERROR
    healthy = results["healthy"]
    assert healthy.healthy and not healthy.definitive and healthy.http_status == 200
    assert (healthy.load.queued_tasks, healthy.load.processing_tasks) == (1, 2)
    assert healthy.load.max_concurrent_requests == 3
    assert results["engine_dead"].definitive and results["engine_dead"].http_status == 503
    for name, result in results.items():
        if name != "healthy":
            assert result.detail, name


# --- the background poller with asyncio ---------------------------------------------


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
            except TimeoutError:
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


def _phase(monitor: HealthMonitor, worker: str) -> Any:
    status = monitor.status(worker)
    assert status is not None
    return status.phase


@run_async
async def test_monitor_dispatches_probe_events_on_the_loop(fleet: Fleet) -> None:
    rec = Recorder()
    monitor = HealthMonitor(fast_settings(), protocol_version=2, on_event=rec)
    for name in Fleet.BEHAVIOURS:
        monitor.add_worker(name, fleet.url(name))
    monitor.add_worker("refused", fleet.refused_url)
    monitor.attach(asyncio.get_running_loop())
    try:
        names = [*Fleet.BEHAVIOURS, "refused"]
        await rec.wait_for(
            lambda: all(rec.of(n, PollerEventKind.PROBE) for n in names), "a probe of every worker"
        )
        for name, status in EXPECTED_STATUS.items():
            first = rec.of(name, PollerEventKind.PROBE)[0].probe
            assert first.status == status, (name, first.detail)
        assert rec.of("refused", PollerEventKind.PROBE)[0].probe.status == (
            ProbeStatus.CONNECT_ERROR
        )
        await rec.wait_for(
            lambda: _phase(monitor, "healthy") == WorkerPhase.HEALTHY, "healthy in rotation"
        )
        status = monitor.status("healthy")
        assert status is not None and status.in_rotation and status.probes >= 1
        # Remote (not restartable) workers: a definitive 503 fails at once and stays failed.
        await rec.wait_for(
            lambda: _phase(monitor, "engine_dead") == WorkerPhase.FAILED, "engine_dead failed"
        )
        assert "health_failed" in rec.actions("engine_dead")
        assert not rec.of("engine_dead", PollerEventKind.RESTART_REQUESTED)
        # Ordinary failures reach the threshold, then fail too.
        await rec.wait_for(
            lambda: _phase(monitor, "http_503") == WorkerPhase.FAILED, "http_503 failed"
        )
        failed = monitor.status("http_503")
        assert failed is not None and failed.consecutive_failures >= 2 and not failed.in_rotation
    finally:
        await monitor.aclose()
    assert not monitor.running


@run_async
async def test_healthy_worker_ejected_then_recovers(fleet: Fleet) -> None:
    rec = Recorder()
    monitor = HealthMonitor(fast_settings(), protocol_version=2, on_event=rec)
    fleet.set("w", "healthy")
    fleet.set("spare", "healthy")
    monitor.add_worker("w", fleet.url("w"))
    # The mass-ejection guard never takes the last worker in rotation out
    # for an ordinary failure: a second one keeps the fleet whole.
    monitor.add_worker("spare", fleet.url("spare"))
    monitor.attach()
    try:
        await rec.wait_for(lambda: _phase(monitor, "w") == WorkerPhase.HEALTHY, "w healthy")
        await rec.wait_for(
            lambda: _phase(monitor, "spare") == WorkerPhase.HEALTHY, "spare healthy"
        )
        fleet.set("w", "http_503")
        await rec.wait_for(lambda: "health_failed" in rec.actions("w"), "w failed")
        assert rec.actions("w")[:2] == ["ejected", "health_failed"]
        fleet.set("w", "healthy")
        await rec.wait_for(lambda: "recovered" in rec.actions("w"), "w recovered")
        assert rec.of("w")[-1].in_rotation
        assert _phase(monitor, "w") == WorkerPhase.HEALTHY
    finally:
        await monitor.aclose()


@run_async
async def test_local_worker_engine_dead_requests_restart_then_succeeds(fleet: Fleet) -> None:
    rec = Recorder()
    monitor = HealthMonitor(fast_settings(), protocol_version=2, on_event=rec)
    fleet.set("old", "healthy")
    fleet.set("new", "healthy")
    monitor.add_worker("local", fleet.url("old"), restartable=True)
    monitor.attach()
    try:
        await rec.wait_for(lambda: _phase(monitor, "local") == WorkerPhase.HEALTHY, "healthy")
        fleet.set("old", "engine_dead")
        await rec.wait_for(
            lambda: bool(rec.of("local", PollerEventKind.RESTART_REQUESTED)), "restart request"
        )
        assert rec.actions("local")[:3] == ["ejected", "health_failed", "auto_restart_scheduled"]
        assert _phase(monitor, "local") == WorkerPhase.RESTARTING
        monitor.set_url("local", fleet.url("new"))
        # Back in rotation; the restart counts as a success only after the
        # stability window (600 s by default).
        await rec.wait_for(lambda: rec.actions("local")[-1] == "admitted", "restarted")
        assert rec.actions("local")[3:] == ["auto_restart_requested", "admitted"]
        status = monitor.status("local")
        assert status is not None and status.in_rotation and status.attempt == 0
        assert status.url.endswith("/new")
        assert status.stable_in_s is not None and status.stable_in_s > 0
    finally:
        await monitor.aclose()


@run_async
async def test_passive_failure_and_process_exit_eject_at_once(fleet: Fleet) -> None:
    rec = Recorder()
    monitor = HealthMonitor(fast_settings(), protocol_version=2, on_event=rec)
    fleet.set("a", "healthy")
    fleet.set("b", "healthy")
    monitor.add_worker("a", fleet.url("a"), restartable=True)
    monitor.add_worker("b", fleet.url("b"), restartable=True)
    monitor.attach()
    try:
        await rec.wait_for(
            lambda: all(_phase(monitor, w) == WorkerPhase.HEALTHY for w in "ab"), "both healthy"
        )
        monitor.report_passive_failure("a", "task failed: EngineDeadError")
        monitor.report_process_exit("b", "exit code -9")
        await rec.wait_for(
            lambda: (
                bool(rec.of("a", PollerEventKind.RESTART_REQUESTED))
                and bool(rec.of("b", PollerEventKind.RESTART_REQUESTED))
            ),
            "restart requests",
        )
        for worker, reason in (("a", "EngineDeadError"), ("b", "exit code -9")):
            audits = rec.audits(worker)
            assert _native.to_string(audits[0].audit.action) == "ejected"
            assert reason in audits[0].audit.reason
            assert not audits[0].in_rotation
        # The replacement of b cannot even start: counted, rescheduled.
        monitor.report_restart_failed("b", "spawn failed")
        await rec.wait_for(lambda: "auto_restart_failed" in rec.actions("b"), "restart failed")
        status = monitor.status("b")
        assert status is not None and status.attempt == 1
    finally:
        await monitor.aclose()


@run_async
async def test_gives_up_after_max_attempts(fleet: Fleet) -> None:
    rec = Recorder()
    monitor = HealthMonitor(fast_settings(max_attempts=1), protocol_version=2, on_event=rec)
    fleet.set("x", "healthy")
    monitor.add_worker("x", fleet.url("x"), restartable=True)
    monitor.attach()
    try:
        await rec.wait_for(lambda: _phase(monitor, "x") == WorkerPhase.HEALTHY, "healthy")
        monitor.report_process_exit("x", "killed")
        await rec.wait_for(
            lambda: bool(rec.of("x", PollerEventKind.RESTART_REQUESTED)), "restart request"
        )
        monitor.report_restart_failed("x", "spawn failed")
        await rec.wait_for(lambda: "auto_restart_gave_up" in rec.actions("x"), "gave up")
        assert _phase(monitor, "x") == WorkerPhase.GAVE_UP
        assert len(rec.of("x", PollerEventKind.RESTART_REQUESTED)) == 1
    finally:
        await monitor.aclose()


@run_async
async def test_callback_errors_do_not_stop_dispatch(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[Any] = []
    done = asyncio.Event()

    def flaky(event: Any) -> None:
        seen.append(event)
        if len(seen) >= 3:
            done.set()
        raise RuntimeError("callback bug")

    monitor = HealthMonitor(fast_settings(), protocol_version=2, on_event=flaky)
    monitor.add_worker("w", fleet.url("w"))
    monitor.attach()
    try:
        await asyncio.wait_for(done.wait(), timeout=WAIT_S)
    finally:
        await monitor.aclose()
    assert "callback bug" in caplog.text


def test_attach_twice_is_refused() -> None:
    loop = asyncio.new_event_loop()
    try:
        monitor = HealthMonitor(fast_settings())
        monitor.attach(loop)
        with pytest.raises(RuntimeError):
            monitor.attach(loop)
        monitor.stop()
        monitor.stop()  # idempotent
        assert not monitor.running
    finally:
        loop.close()


def test_drain_without_loop(fleet: Fleet) -> None:
    monitor = HealthMonitor(fast_settings(), protocol_version=2)
    monitor.add_worker("w", fleet.url("w") + "/health")  # a /health suffix is accepted
    monitor.start()
    try:
        events: list[Any] = []
        deadline = time.monotonic() + WAIT_S
        while not events and time.monotonic() < deadline:
            import select

            select.select([monitor._fd], [], [], 0.5)
            events.extend(monitor.drain())
        assert events and events[0].probe is not None and events[0].probe.healthy
        assert "HealthMonitor(running" in repr(monitor)
    finally:
        monitor.stop()


# --- audit log ---------------------------------------------------------------------


async def _one_audit_event(fleet: Fleet) -> Any:
    rec = Recorder()
    monitor = HealthMonitor(fast_settings(), protocol_version=2, on_event=rec)
    monitor.add_worker("w", fleet.url("w"), restartable=True)
    monitor.add_worker("spare", fleet.url("spare"))  # so the guard lets w go
    monitor.attach()
    try:
        await rec.wait_for(
            lambda: all(_phase(monitor, n) == WorkerPhase.HEALTHY for n in ("w", "spare")),
            "healthy",
        )
        monitor.report_passive_failure("w", "fatal task error")
        await rec.wait_for(lambda: bool(rec.audits("w")), "an audit event")
        return rec.audits("w")
    finally:
        await monitor.aclose()


@run_async
async def test_audit_log_writes_one_json_line_per_event(fleet: Fleet, tmp_path: Any) -> None:
    events = await _one_audit_event(fleet)
    path = tmp_path / "audit.jsonl"
    log = AuditLog(str(path))
    for event in events:
        log.write(event)
    log.close()
    lines = path.read_text().splitlines()
    assert len(lines) == len(events)
    first = json.loads(lines[0])
    assert set(first) == {"time", "worker_id", "action", "attempt", "reason", "from", "to"}
    assert first["worker_id"] == "w" and first["action"] == "ejected"
    assert first["from"] == "healthy" and first["to"] == "unhealthy"
    assert first["reason"] == "fatal task error"
    assert first["time"].endswith("+00:00") and "T" in first["time"]
    assert events[0].audit.action == AuditAction.EJECTED
    assert audit_record(events[0]) == first


@run_async
async def test_audit_log_defaults_to_stderr(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    events = await _one_audit_event(fleet)
    log = AuditLog("")
    log.write(events[0])
    log.close()
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert json.loads(line)["action"] == "ejected"


# --- the CLI's probe ---------------------------------------------------------------


def test_probe_urls_table_and_exit_codes(fleet: Fleet) -> None:
    out = io.StringIO()
    settings = HealthSettings()
    code = probe_urls([fleet.url("healthy")], timeout_s=1.0, settings=settings, out=out)
    assert code == 0
    header, row = out.getvalue().splitlines()
    assert header.split()[:4] == ["URL", "STATUS", "HTTP", "LATENCY_MS"]
    assert row.startswith(fleet.url("healthy")) and " healthy " in row

    out = io.StringIO()
    code = probe_urls(
        [fleet.url("healthy"), fleet.url("engine_dead"), fleet.refused_url],
        timeout_s=1.0,
        settings=settings,
        out=out,
    )
    assert code == 1
    assert "engine_dead" in out.getvalue() and "connect_error" in out.getvalue()


def test_probe_urls_json(fleet: Fleet) -> None:
    out = io.StringIO()
    code = probe_urls(
        [fleet.url("healthy") + "/health", fleet.url("hang")],
        timeout_s=0.3,
        as_json=True,
        settings=HealthSettings(),
        out=out,
    )
    rows = json.loads(out.getvalue())
    assert code == 1
    assert [r["status"] for r in rows] == ["healthy", "timeout"]
    assert rows[0]["healthy"] is True and rows[0]["http_status"] == 200
    assert set(rows[1]) == {"url", "healthy", "status", "http_status", "latency_ms", "detail"}


def test_probe_urls_expected_status_for_other_engines(fleet: Fleet) -> None:
    # {"status": "starting"} with load fields is healthy once "starting" is what is expected.
    out = io.StringIO()
    code = probe_urls(
        [fleet.url("bad_status")], expected_status="starting", settings=HealthSettings(), out=out
    )
    assert code == 0


def test_probe_urls_bad_timeout_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        probe_urls(["http://127.0.0.1:9"], timeout_s=0, settings=HealthSettings())


def test_probe_urls_no_urls_is_unhealthy() -> None:
    assert probe_urls([], settings=HealthSettings(), out=io.StringIO()) == 1

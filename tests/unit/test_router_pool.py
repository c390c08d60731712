"""The self-healing WorkerPool of MinerU 3.x (mineru_health.mineru3.router) with fake workers.

MinerU's real, unpatched ``mineru.cli.router`` supplies the base classes; only
``ManagedLocalServer.start`` is replaced, so that a "local worker" is a tiny
loopback HTTP server process instead of ``mineru-api``. Each fake worker reads
``<control_dir>/<port>`` on every request: absent means healthy,
``engine_dead`` answers MinerU-health's 503. Waits are bounded; nothing
asserts on timings.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

router_mod = pytest.importorskip("mineru.cli.router", reason="mineru 3.4.4 is not importable")

import httpx
from mineru_health import _native, metrics
from mineru_health.errors import ConfigError
from mineru_health.mineru3 import router as healing
from mineru_health.runtime.verdict import REFUSAL_ERROR_PREFIX
from prometheus_client.parser import text_string_to_metric_families

WAIT_S = 30.0

FAKE_WORKER = r"""
import json, os, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port, control_dir = int(sys.argv[1]), sys.argv[2]
HEALTHY = {"status": "healthy", "version": "3.4.4", "protocol_version": 2,
           "queued_tasks": 0, "processing_tasks": 0, "completed_tasks": 0,
           "failed_tasks": 0, "max_concurrent_requests": 3,
           "processing_window_size": 64}
DEAD = {"status": "unhealthy", "version": "3.4.4", "engine_dead": True,
        "error": "EngineDeadError: EngineCore encountered an issue."}

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        try:
            with open(os.path.join(control_dir, str(port))) as f:
                mode = f.read().strip()
        except FileNotFoundError:
            mode = "healthy"
        code, body = (503, DEAD) if mode == "engine_dead" else (200, HEALTHY)
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

# The router passes the native health port and bind of each launch in the
# environment: serve the same answers there, as a patched worker does.
native = os.environ.get("MINERU_HEALTH_PORT")
if native:
    bind = os.environ.get("MINERU_HEALTH_BIND", "127.0.0.1")
    extra = ThreadingHTTPServer((bind, int(native)), Handler)
    threading.Thread(target=extra.serve_forever, daemon=True).start()
ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


class FakeLocalServer(router_mod.ManagedLocalServer):  # type: ignore[misc, name-defined]
    """MinerU's ManagedLocalServer with a fake worker process; stop() is MinerU's own."""

    control_dir = ""
    spawned: ClassVar[list[subprocess.Popen[bytes]]] = []
    stop_gate: ClassVar[threading.Event | None] = None  # when set by a test, stop() waits on it

    async def start(self, client: Any, port: int | None = None) -> None:
        if self.is_running():
            return
        port = port or router_mod.find_free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(  # noqa: ASYNC220 -- as MinerU's start() does
            [sys.executable, "-c", FAKE_WORKER, str(port), self.control_dir],
            start_new_session=True,
        )
        FakeLocalServer.spawned.append(self.process)
        self.process_group_id = self.process.pid
        try:
            await self.wait_until_ready(client)
        except Exception:
            self.stop()
            raise

    def stop(self) -> None:
        gate = FakeLocalServer.stop_gate
        if gate is not None:
            gate.wait(WAIT_S)
        super().stop()


def run_async(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return asyncio.run(fn(*args, **kwargs))

    return wrapper


FAST_ENV = {
    "MINERU_ROUTER_HEALTH_PRESET": "fast",
    "MINERU_ROUTER_HEALTH_INTERVAL_S": "0.5",
    "MINERU_ROUTER_HEALTH_TIMEOUT_S": "0.4",
    "MINERU_ROUTER_HEALTH_CONNECT_TIMEOUT_S": "0.4",
    "MINERU_ROUTER_HEALTH_FAILURE_THRESHOLD": "2",
    "MINERU_ROUTER_HEALTH_BACKOFF_BASE_S": "0.05",
    "MINERU_ROUTER_HEALTH_BACKOFF_MAX_S": "0.2",
    "MINERU_ROUTER_HEALTH_BOOT_TIMEOUT_S": "20",
    "MINERU_ROUTER_HEALTH_JITTER": "0",
}


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[SimpleNamespace]:
    for key in list(os.environ):
        if key.startswith("MINERU_ROUTER_HEALTH_"):
            monkeypatch.delenv(key)
    for key, value in FAST_ENV.items():
        monkeypatch.setenv(key, value)
    audit = tmp_path / "audit.jsonl"
    monkeypatch.setenv("MINERU_ROUTER_HEALTH_AUDIT_PATH", str(audit))
    control = tmp_path / "control"
    control.mkdir()
    monkeypatch.setattr(FakeLocalServer, "control_dir", str(control))
    monkeypatch.setattr(FakeLocalServer, "spawned", [])
    monkeypatch.setattr(FakeLocalServer, "stop_gate", None)
    metrics._registry.reset()
    ns = dict(vars(router_mod))
    ns["ManagedLocalServer"] = FakeLocalServer
    pool_class = healing.install(ns)
    yield SimpleNamespace(audit=audit, control=control, pool_class=pool_class)
    for process in FakeLocalServer.spawned:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=WAIT_S)


class Recorder:
    def __init__(self) -> None:
        self.events: list[Any] = []
        self.changed = asyncio.Event()

    def attach(self, pool: Any) -> None:
        def record(event: Any) -> None:  # after the fleet handled it
            self.events.append(event)
            self.changed.set()

        pool.fleet.listen(record)

    def actions(self, worker: str) -> list[str]:
        """Audit actions of `worker`, without its start-up admission."""
        return _after_admission(
            [
                _native.to_string(e.audit.action)
                for e in self.events
                if e.worker_id == worker and e.audit is not None
            ]
        )

    def restarted(self, worker: str) -> bool:
        """A restart was requested and the new process is back in rotation.

        (The restart counts as a success only after the stability window,
        600 s by default, so the tests wait for the admission instead.)
        """
        actions = self.actions(worker)
        return "auto_restart_requested" in actions and actions[-1] == "admitted"

    def probes(self, worker: str) -> int:
        return sum(1 for e in self.events if e.worker_id == worker and e.probe is not None)

    async def wait_for(self, predicate: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                tail = [(e.worker_id, _native.to_string(e.kind)) for e in self.events[-20:]]
                pytest.fail(f"timed out waiting for {what}; last events {tail}")
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), timeout=remaining)
            except asyncio.TimeoutError:
                pass


@asynccontextmanager
async def running_pool(env: SimpleNamespace, **settings: Any) -> AsyncIterator[Any]:
    router_settings = router_mod.RouterSettings(**{"local_gpus": "0,1", **settings})
    client = httpx.AsyncClient(timeout=5.0)
    pool = env.pool_class(router_settings, client)
    rec = Recorder()
    rec.attach(pool)
    pool.recorder = rec
    try:
        await pool.start()
        # The router serves before its local workers are up (issue 32); these tests
        # begin where MinerU's start ended, with each worker in rotation or out of its boot.
        await rec.wait_for(
            lambda: all(s.phase != _native.WorkerPhase.STARTING for s in pool.fleet.statuses()),
            "the workers' boot",
        )
        pool.health_payload()  # MinerU's start-up check, answered once
        yield pool
    finally:
        await pool.shutdown()
        await client.aclose()


def _port(url: str) -> str:
    return url.rsplit(":", 1)[1]


def _entry(pool: Any, worker: str) -> dict[str, Any]:
    _healthy, payload = pool.health_payload()
    return next(s for s in payload["servers"] if s["server_id"] == worker)


def _samples(name: str) -> list[Any]:
    return [
        sample
        for family in text_string_to_metric_families(metrics.exposition().decode())
        for sample in family.samples
        if sample.name == name
    ]


def _metric_states() -> dict[str, str]:
    """Each worker's phase as /metrics shows it (the one state series at 1)."""
    return {
        s.labels["worker"]: s.labels["state"]
        for s in _samples("mineru_router_worker_state")
        if s.value == 1
    }


def _ejections(worker: str) -> dict[str, float]:
    return {
        s.labels["reason"]: s.value
        for s in _samples("mineru_router_ejections_total")
        if s.labels["worker"] == worker and s.value
    }


def _assert_metrics_agree(pool: Any) -> None:
    """/metrics, /health and MinerU's WorkerState say the same (call it at a settled moment)."""
    _healthy, payload = pool.health_payload()
    assert _metric_states() == {e["server_id"]: e["state"] for e in payload["servers"]}
    for entry in payload["servers"]:
        assert entry["healthy"] == entry["in_rotation"], entry


def _after_admission(actions: list[str]) -> list[str]:
    # starting -> healthy is an audit event ("admitted") since every phase
    # change is one; the tests look at what happens after it.
    return actions[1:] if actions[:1] == ["admitted"] else actions


def _audit_actions(path: Path, worker: str) -> list[str]:
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    # The policy's transitions (records the router originates, such as its
    # processes' launches and ends, have no phases).
    return _after_admission([r["action"] for r in rows if r["worker_id"] == worker and "from" in r])


# --- start-up ---------------------------------------------------------------------


@run_async
async def test_bad_config_refuses_before_spawning(
    env: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MINERU_ROUTER_HEALTH_FAILURE_THRESHOLD", "zero")
    async with httpx.AsyncClient() as client:
        with pytest.raises(ConfigError) as info:
            env.pool_class(router_mod.RouterSettings(local_gpus="0,1"), client)
    assert info.value.variable == "MINERU_ROUTER_HEALTH_FAILURE_THRESHOLD"
    assert FakeLocalServer.spawned == []


def test_install_is_idempotent_and_keeps_the_name() -> None:
    ns = dict(vars(router_mod))
    first = healing.install(ns)
    ns["WorkerPool"] = first
    assert healing.install(ns) is first
    assert first.__name__ == "WorkerPool" and issubclass(first, router_mod.WorkerPool)


@run_async
async def test_startup_routes_to_both_and_health_lists_policy_fields(env: SimpleNamespace) -> None:
    async with running_pool(env) as pool:
        # Out of its boot is not yet in rotation on a loaded machine (a first probe late).
        # MinerU's server states (its load figures) follow from the poller's events, a
        # moment after the policy's state: waited for too, as a client would see them.
        ids = ("local-gpu-0", "local-gpu-1")
        await pool.recorder.wait_for(
            lambda: (
                all(s.in_rotation for s in pool.fleet.statuses())
                and all(pool.get_server(i).max_concurrent_requests == 3 for i in ids)
            ),
            "both in rotation, their probes' load shown",
        )
        healthy, payload = pool.health_payload()
        assert healthy and payload["status"] == "healthy"
        assert {s["server_id"] for s in payload["servers"]} == {"local-gpu-0", "local-gpu-1"}
        for entry in payload["servers"]:
            assert entry["healthy"] and entry["in_rotation"]
            assert entry["state"] == "healthy" and entry["restartable"]
            assert entry["consecutive_failures"] == 0 and entry["restart_attempt"] == 0
            assert entry["next_restart_at"] is None and entry["last_error"] is None
            assert entry["max_concurrent_requests"] == 3
            # Probed on the native port the router reserved and passed on.
            assert entry["probe_endpoint"] == "native"
            assert entry["probe_url"].startswith("http://127.0.0.1:")
            assert entry["probe_url"] != entry["base_url"] + "/health"
        assert payload["max_concurrent_requests"] == 6
        # The per-launch variables never outlive the launch.
        assert "MINERU_HEALTH_PORT" not in os.environ and "MINERU_HEALTH_BIND" not in os.environ
        # In rotation means "healthy" in /metrics too (it once said "starting").
        assert _metric_states() == {"local-gpu-0": "healthy", "local-gpu-1": "healthy"}
        _assert_metrics_agree(pool)
        chosen = await pool.acquire_submission_server()
        assert chosen is not None and chosen.healthy
        await pool.release_submission_server(chosen.server_id)


# --- restarts -------------------------------------------------------------------------


@run_async
async def test_engine_death_restarts_that_worker_on_a_new_url(env: SimpleNamespace) -> None:
    async with running_pool(env) as pool:
        rec = pool.recorder
        dead, other = pool.get_server("local-gpu-0"), pool.get_server("local-gpu-1")
        old_url, old_process = dead.base_url, dead.local_server.process
        other_ejections = len([e for e in rec.events if e.worker_id == other.server_id])
        (env.control / _port(old_url)).write_text("engine_dead")

        await rec.wait_for(lambda: not dead.healthy, "the dead worker to leave rotation")
        chosen = await pool.acquire_submission_server()
        assert chosen is other  # routing avoids it at once
        await pool.release_submission_server(chosen.server_id)

        await rec.wait_for(lambda: rec.restarted(dead.server_id), "the restarted worker")
        assert dead.healthy and dead.base_url != old_url
        assert old_process.poll() is not None  # the old process was stopped
        assert rec.actions(dead.server_id) == [
            "ejected",
            "health_failed",
            "auto_restart_scheduled",
            "auto_restart_requested",
            "admitted",
        ]
        assert _audit_actions(env.audit, dead.server_id) == rec.actions(dead.server_id)
        # The other worker never left rotation.
        assert other.healthy
        assert not rec.actions(other.server_id)
        assert len([e for e in rec.events if e.worker_id == other.server_id]) > other_ejections
        entry = _entry(pool, dead.server_id)
        assert entry["state"] == "healthy" and entry["base_url"] == dead.base_url
        _assert_metrics_agree(pool)
        assert _ejections(dead.server_id) == {"engine_dead": 1}
        assert not _ejections(other.server_id)
    lines = [json.loads(line) for line in env.audit.read_text().splitlines()]
    assert all(
        set(r) == {"time", "worker_id", "action", "attempt", "reason", "cause", "from", "to"}
        for r in lines
        if not r["action"].startswith("worker_processes")
    )


@run_async
async def test_slow_stop_blocks_neither_probing_nor_routing(env: SimpleNamespace) -> None:
    gate = threading.Event()
    async with running_pool(env) as pool:
        rec = pool.recorder
        dead, other = pool.get_server("local-gpu-0"), pool.get_server("local-gpu-1")
        FakeLocalServer.stop_gate = gate  # MinerU's stop can take ~10 s; here: until released
        try:
            (env.control / _port(dead.base_url)).write_text("engine_dead")
            await rec.wait_for(
                lambda: pool.fleet.local.restarting(dead.server_id), "the restart to begin"
            )
            probes_before = rec.probes(other.server_id)
            await rec.wait_for(
                lambda: rec.probes(other.server_id) >= probes_before + 2,
                "the other worker to be probed while the stop hangs",
            )
            assert pool.fleet.local.restarting(dead.server_id)
            entry = _entry(pool, dead.server_id)
            assert entry["restarting"] and entry["state"] == "restarting"
            assert not entry["in_rotation"]
            _assert_metrics_agree(pool)
            chosen = await pool.acquire_submission_server()
            assert chosen is other
            await pool.release_submission_server(chosen.server_id)
        finally:
            FakeLocalServer.stop_gate = None
            gate.set()
        await rec.wait_for(lambda: rec.restarted(dead.server_id), "the restarted worker")


@run_async
async def test_process_exit_is_detected_and_restarted(env: SimpleNamespace) -> None:
    async with running_pool(env) as pool:
        rec = pool.recorder
        server = pool.get_server("local-gpu-1")
        old = server.local_server.process
        os.killpg(old.pid, signal.SIGKILL)
        await rec.wait_for(lambda: rec.restarted(server.server_id), "the restarted worker")
        ejected = next(
            e.audit
            for e in rec.events
            if e.worker_id == server.server_id
            and e.audit is not None
            and _native.to_string(e.audit.action) != "admitted"
        )
        assert _native.to_string(ejected.action) == "ejected"
        # Either the process check or failed probes may notice first; both are fine.
        assert ejected.reason
        assert server.local_server.process is not old and server.healthy
        # One ejection, named by whichever noticed first, never "other".
        causes = _ejections(server.server_id)
        assert sum(causes.values()) == 1 and "other" not in causes, causes


# --- passive signals ---------------------------------------------------------------------


def _task(server: Any) -> SimpleNamespace:
    return SimpleNamespace(upstream_server_id=server.server_id, upstream_base_url=server.base_url)


ENGINE_ERROR = "EngineCore encountered an issue. See stack trace (above) for the root cause."
#: A task status as a patched worker words it when the engine died under the task.
ENGINE_DEAD_STATUS = {
    "status": "failed",
    "error": ENGINE_ERROR,
    "engine_dead": True,
    "verdict": {
        "fatal": True,
        "engine_dead": True,
        "role": "trigger",
        "rule": "vllm.engine_dead",
        "category": "engine_dead",
        "ambiguous": False,
        "remote_engine": False,
    },
}


@run_async
async def test_fatal_task_failure_ejects_at_once(env: SimpleNamespace) -> None:
    async with running_pool(env) as pool:
        rec = pool.recorder
        server = pool.get_server("local-gpu-0")
        stale = SimpleNamespace(upstream_server_id=server.server_id, upstream_base_url="http://x")
        pool.observe_task_status(stale, ENGINE_DEAD_STATUS)
        pool.observe_task_status(_task(server), {"status": "failed", "error": "corrupt PDF"})
        pool.observe_task_status(_task(server), {"status": "completed", "error": None})
        # The worker's verdict decides, never the text: no engine_dead, no ejection.
        pool.observe_task_status(_task(server), {"status": "failed", "error": ENGINE_ERROR})
        assert server.healthy  # none of those is a fatal failure of this instance

        pool.observe_task_status(_task(server), ENGINE_DEAD_STATUS)
        assert not server.healthy  # synchronous: no probe needed
        pool.observe_task_status(_task(server), ENGINE_DEAD_STATUS)
        await rec.wait_for(lambda: bool(rec.actions(server.server_id)), "the ejection")
        first = rec.actions(server.server_id)[0]
        assert first == "ejected"
        await rec.wait_for(lambda: rec.restarted(server.server_id), "the restarted worker")
        # Two fatal statuses from one instance were reported once.
        assert rec.actions(server.server_id).count("ejected") == 1
        assert _ejections(server.server_id) == {"passive_failure": 1}


@run_async
async def test_submission_503_with_fatal_error_ejects(env: SimpleNamespace) -> None:
    async with running_pool(env) as pool:
        rec = pool.recorder
        a, b = pool.get_server("local-gpu-0"), pool.get_server("local-gpu-1")
        await pool.mark_submission_failure(b.server_id, "503 Task dispatcher is not running")
        assert not b.healthy  # MinerU's own behaviour: out until the next probe
        await rec.wait_for(lambda: b.healthy, "b back by the next healthy probe")
        assert not rec.actions(b.server_id)

        # Text that merely mentions an engine death is not the worker's verdict.
        await pool.mark_submission_failure(b.server_id, f"503 EngineDeadError: {ENGINE_ERROR}")
        await rec.wait_for(lambda: b.healthy, "b back again")
        assert not rec.actions(b.server_id)
        await pool.mark_submission_failure(
            a.server_id, f"503 {REFUSAL_ERROR_PREFIX} engine_dead, rule vllm.engine_dead"
        )
        assert not a.healthy
        await rec.wait_for(lambda: rec.restarted(a.server_id), "the restarted worker")
        assert rec.actions(a.server_id)[0] == "ejected"


# --- remote workers --------------------------------------------------------------------------


class _RemoteHandler(BaseHTTPRequestHandler):
    mode = "healthy"

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        if _RemoteHandler.mode == "engine_dead":
            code, body = 503, {"status": "unhealthy", "engine_dead": True, "error": ENGINE_ERROR}
        else:
            code, body = (
                200,
                {
                    "status": "healthy",
                    "protocol_version": 2,
                    "max_concurrent_requests": 2,
                    "queued_tasks": 5,
                },
            )
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@run_async
async def test_remote_upstream_is_ejected_never_restarted(
    env: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_RemoteHandler, "mode", "healthy")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RemoteHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        async with running_pool(env, local_gpus="none", upstream_urls=(url,)) as pool:
            rec = pool.recorder
            remote = pool.get_server("remote-1")
            assert remote.healthy and remote.queued_tasks == 5
            _RemoteHandler.mode = "engine_dead"
            await rec.wait_for(lambda: "health_failed" in rec.actions("remote-1"), "failure")
            entry = _entry(pool, "remote-1")
            assert entry["state"] == "failed" and not entry["restartable"]
            assert entry["next_restart_at"] is None and not entry["restarting"]
            assert "auto_restart_scheduled" not in rec.actions("remote-1")
            healthy, payload = pool.health_payload()
            assert not healthy and payload["status"] == "unhealthy"
            _RemoteHandler.mode = "healthy"
            await rec.wait_for(lambda: "recovered" in rec.actions("remote-1"), "recovery")
            assert remote.healthy
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=WAIT_S)

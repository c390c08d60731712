"""The runtime's fleet against loopback fake workers (fake_fleet.py): one sweep, then the
poller thread, reports and restarts through fake members.

Waits are bounded in time and count; nothing asserts on timings.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fake_fleet import (
    WAIT_S,
    FakeMember,
    Fleet,
    Recorder,
    fast_settings,
    run_async,
    start_fleet,
    stop_fleet,
)
from fake_fleet import phase as _phase
from mineru_health import _native
from mineru_health._native import AuditAction, PollerEventKind, ProbeStatus, WorkerPhase
from mineru_health.runtime.router.fleet import base_url_of, expectations
from mineru_health.runtime.settings import HealthSettings


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    with Fleet() as running:
        yield running


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


@run_async
async def test_fleet_dispatches_probe_events_on_the_loop(fleet: Fleet) -> None:
    rec = Recorder()
    members = [FakeMember(name, fleet.url(name)) for name in Fleet.BEHAVIOURS]
    monitor = await start_fleet(
        fast_settings(), rec, *members, FakeMember("refused", fleet.refused_url)
    )
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
        assert members[0].in_rotation  # the fleet wrote the rotation onto the worker
    finally:
        await stop_fleet(monitor)
    assert not monitor.running


@run_async
async def test_healthy_worker_ejected_then_recovers(fleet: Fleet) -> None:
    rec = Recorder()
    fleet.set("w", "healthy")
    fleet.set("spare", "healthy")
    # The mass-ejection guard never takes the last worker in rotation out
    # for an ordinary failure: a second one keeps the fleet whole.
    monitor = await start_fleet(
        fast_settings(),
        rec,
        FakeMember("w", fleet.url("w")),
        FakeMember("spare", fleet.url("spare")),
    )
    try:
        await rec.wait_for(lambda: _phase(monitor, "w") == WorkerPhase.HEALTHY, "w healthy")
        await rec.wait_for(lambda: _phase(monitor, "spare") == WorkerPhase.HEALTHY, "spare healthy")
        fleet.set("w", "http_503")
        await rec.wait_for(lambda: "health_failed" in rec.actions("w"), "w failed")
        assert rec.actions("w")[:2] == ["ejected", "health_failed"]
        fleet.set("w", "healthy")
        await rec.wait_for(lambda: "recovered" in rec.actions("w"), "w recovered")
        assert rec.of("w")[-1].in_rotation
        assert _phase(monitor, "w") == WorkerPhase.HEALTHY
    finally:
        await stop_fleet(monitor)


@run_async
async def test_local_worker_engine_dead_requests_restart_then_succeeds(fleet: Fleet) -> None:
    rec = Recorder()
    fleet.set("old", "healthy")
    fleet.set("new", "healthy")
    # Its first launch answers on "old"; the fleet's restart launches it on "new".
    local = FakeMember("local", fleet.url("old"), fleet.url("new"), local=True)
    monitor = await start_fleet(fast_settings(), rec, local)
    try:
        await rec.wait_for(lambda: _phase(monitor, "local") == WorkerPhase.HEALTHY, "healthy")
        fleet.set("old", "engine_dead")
        await rec.wait_for(
            lambda: bool(rec.of("local", PollerEventKind.RESTART_REQUESTED)), "restart request"
        )
        assert rec.actions("local")[:3] == ["ejected", "health_failed", "auto_restart_scheduled"]
        # The fleet restarts it at once (its relaunch is immediate here), so the
        # phase the request led to is read from its audit record.
        requested = [
            e.audit for e in rec.audits("local") if e.audit.action == AuditAction.RESTART_REQUESTED
        ]
        assert [a.to_phase for a in requested] == [WorkerPhase.RESTARTING]
        # Back in rotation; the restart counts as a success only after the
        # stability window (600 s by default).
        await rec.wait_for(lambda: rec.actions("local")[-1:] == ["admitted"], "restarted")
        assert rec.actions("local")[3:] == ["auto_restart_requested", "admitted"]
        status = monitor.status("local")
        assert status is not None and status.in_rotation and status.attempt == 0
        assert status.url.endswith("/new")
        assert status.stable_in_s is not None and status.stable_in_s > 0
        assert local.launches == 2 and local.in_rotation
    finally:
        await stop_fleet(monitor)


@run_async
async def test_a_dead_engines_worker_is_killed_at_once_a_shutdown_gets_the_grace(
    fleet: Fleet,
) -> None:
    rec = Recorder()
    fleet.set("old", "healthy")
    fleet.set("new", "healthy")
    local = FakeMember("local", fleet.url("old"), fleet.url("new"), local=True, spawn=True)
    monitor = await start_fleet(fast_settings(), rec, local)
    ends: list[tuple[int, bool]] = []
    end = monitor.local.processes.end

    def recorded(launch: Any, *, condemned: bool = False) -> Any:
        ends.append((launch.pid, condemned))
        return end(launch, condemned=condemned)

    monitor.local.processes.end = recorded  # type: ignore[method-assign]
    try:
        await rec.wait_for(lambda: _phase(monitor, "local") == WorkerPhase.HEALTHY, "healthy")
        first = local.processes[0]
        fleet.set("old", "engine_dead")
        await rec.wait_for(lambda: rec.actions("local")[-1:] == ["admitted"], "restarted")
        # Its processes were gone before the new one launched: SIGKILL, then the wait.
        assert ends == [(first.pid, True)] and first.poll() == -9
        assert len(local.processes) == 2 and local.processes[1].poll() is None
    finally:
        await stop_fleet(monitor)
        local.end_processes()
    # The shutdown ends the healthy new one with SIGTERM and the grace.
    assert ends[1:] == [(local.processes[1].pid, False)]
    assert local.processes[1].returncode == -15


@run_async
async def test_passive_failure_and_process_exit_eject_at_once(fleet: Fleet) -> None:
    rec = Recorder()
    fleet.set("a", "healthy")
    fleet.set("b", "healthy")
    # The replacement of b cannot even start.
    monitor = await start_fleet(
        fast_settings(),
        rec,
        FakeMember("a", fleet.url("a"), local=True),
        FakeMember("b", fleet.url("b"), local=True, failing_launches=9),
    )
    try:
        await rec.wait_for(
            lambda: all(_phase(monitor, w) == WorkerPhase.HEALTHY for w in "ab"), "both healthy"
        )
        monitor.report_passive("a", "task failed: EngineDeadError")
        monitor.report_exit("b", "exit code -9")
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
        await rec.wait_for(lambda: "auto_restart_failed" in rec.actions("b"), "restart failed")
        status = monitor.status("b")
        assert status is not None and status.attempt == 1
    finally:
        await stop_fleet(monitor)


@run_async
async def test_gives_up_after_max_attempts(fleet: Fleet) -> None:
    rec = Recorder()
    fleet.set("x", "healthy")
    monitor = await start_fleet(
        fast_settings(max_attempts=1),
        rec,
        FakeMember("x", fleet.url("x"), local=True, failing_launches=9),
    )
    try:
        await rec.wait_for(lambda: _phase(monitor, "x") == WorkerPhase.HEALTHY, "healthy")
        monitor.report_exit("x", "killed")
        await rec.wait_for(
            lambda: bool(rec.of("x", PollerEventKind.RESTART_REQUESTED)), "restart request"
        )
        await rec.wait_for(lambda: "auto_restart_gave_up" in rec.actions("x"), "gave up")
        assert _phase(monitor, "x") == WorkerPhase.GAVE_UP
        assert len(rec.of("x", PollerEventKind.RESTART_REQUESTED)) == 1
    finally:
        await stop_fleet(monitor)


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

    monitor = await start_fleet(fast_settings(), flaky, FakeMember("w", fleet.url("w")))
    try:
        await asyncio.wait_for(done.wait(), timeout=WAIT_S)
    finally:
        await stop_fleet(monitor)
    assert "callback bug" in caplog.text


@run_async
async def test_close_twice_is_harmless() -> None:
    monitor = await start_fleet(fast_settings(), Recorder())
    assert monitor.running
    await monitor.close()
    await monitor.close()  # idempotent
    monitor.close_files()
    assert not monitor.running


def test_poller_events_drain_without_a_loop(fleet: Fleet) -> None:
    settings = fast_settings()
    poller = _native.Poller(settings.native, expectations(settings, protocol_version=2), 0)
    # An operator's URL may name /health itself: the base URL is what the poller gets.
    poller.add_worker(_native.Target("w", base_url_of(fleet.url("w") + "/health"), False, ""))
    poller.start()
    try:
        events: list[Any] = []
        deadline = time.monotonic() + WAIT_S
        while not events and time.monotonic() < deadline:
            import select

            select.select([poller.notify_fd()], [], [], 0.5)
            events.extend(poller.drain_events())
        assert events and events[0].probe is not None and events[0].probe.healthy
        assert poller.running()
    finally:
        poller.stop()


def test_a_refused_start_up_is_reported_without_a_traceback() -> None:
    """Issue 24: uvicorn printed Starlette's traceback around the refusal's clear message."""
    import logging
    import traceback

    from mineru_health.errors import ConfigError
    from mineru_health.runtime.router.fleet import quiet_config_tracebacks

    quiet_config_tracebacks()
    quiet_config_tracebacks()  # idempotent
    logger = logging.getLogger("uvicorn.error")
    assert len([f for f in logger.filters if type(f).__name__ == "_NoConfigTraceback"]) == 1
    try:
        raise ConfigError("MINERU_HEALTH_STATE_DIR is in use", variable="MINERU_HEALTH_STATE_DIR")
    except ConfigError:
        text, info = traceback.format_exc(), __import__("sys").exc_info()
    message = logging.LogRecord("uvicorn.error", logging.ERROR, "", 0, text, (), None)
    assert logger.filters[-1].filter(message)
    assert message.getMessage().startswith("mineru_health.errors.ConfigError: MINERU_HEALTH")
    logged = logging.LogRecord("uvicorn.error", logging.ERROR, "", 0, "startup failed", (), info)
    assert logger.filters[-1].filter(logged) and logged.exc_info is None
    other = logging.LogRecord(
        "uvicorn.error", logging.ERROR, "", 0, "Traceback\nKeyError: 1", (), None
    )
    assert logger.filters[-1].filter(other) and other.getMessage() == "Traceback\nKeyError: 1"


@run_async
async def test_start_waits_for_remote_workers_answers_not_for_local_workers_boot(
    fleet: Fleet,
) -> None:
    """Issue 32: a router serves before its local workers are up (their boot takes 5-30 s),
    so the fleet's start returns once the remote workers answered; the local one boots on."""
    fleet.set("booting", "bad_status")  # answers "starting": never healthy here
    fleet.set("remote", "healthy")
    monitor = await asyncio.wait_for(
        start_fleet(
            fast_settings(boot_timeout_s=600.0),
            Recorder(),
            FakeMember("booting", fleet.url("booting"), local=True),
            FakeMember("remote", fleet.url("remote")),
            wait_s=WAIT_S * 4,
        ),
        timeout=WAIT_S,
    )
    try:
        assert _phase(monitor, "remote") == WorkerPhase.HEALTHY
        assert _phase(monitor, "booting") == WorkerPhase.STARTING
    finally:
        await stop_fleet(monitor)

"""WorkerHealth: recording, snapshots, reset and waiting across threads."""

from __future__ import annotations

import json
import threading
import urllib.request
from datetime import datetime

import pytest
from mineru_health.demo.faults import make_engine_dead_error
from mineru_health.errors import HealthEndpointError
from mineru_health.runtime.worker.health import (
    FatalInfo,
    HealthEndpoint,
    HealthPhase,
    HealthSnapshot,
    WorkerHealth,
    fatal_cause,
)
from mineru_health.safe_text import describe_exception


def test_starts_healthy() -> None:
    health = WorkerHealth()
    assert health.healthy
    snap = health.snapshot()
    assert snap.healthy and snap.fatal_count == 0 and snap.first_fatal is None
    assert isinstance(snap, HealthSnapshot)
    assert snap.phase == HealthPhase.STARTING  # MinerU has not reported its service yet
    assert "starting" in repr(health)


def test_task_local_failures_are_counted_only() -> None:
    health = WorkerHealth()
    verdict = health.record(ValueError("corrupt pdf"))
    assert not verdict.fatal
    assert health.healthy
    assert health.snapshot().task_local_count == 1


def test_fatal_failure_is_recorded_with_time() -> None:
    health = WorkerHealth()
    verdict = health.record(make_engine_dead_error(), unix_time=1_700_000_000.0)
    assert verdict.fatal
    assert not health.healthy
    snap = health.snapshot()
    assert snap.fatal_count == 1
    first = snap.first_fatal
    assert first is not None
    assert first.error.startswith("EngineDeadError: EngineCore encountered an issue")
    assert first.rule == verdict.rule and first.category == verdict.category
    assert isinstance(first, FatalInfo)
    assert first.since == "2023-11-14T22:13:20.000000+00:00"
    assert datetime.fromisoformat(first.since).tzinfo is not None
    assert first.cause == fatal_cause(first) == f"{first.category}, rule {first.rule}"
    assert fatal_cause(None) == "unknown cause"
    assert "unhealthy since" in repr(health)


def test_first_fatal_is_kept_last_is_updated() -> None:
    health = WorkerHealth()
    health.record_fatal("first", rule="r1", category="c", unix_time=1.0)
    health.record_fatal("second", rule="r2", category="c", unix_time=2.0)
    snap = health.snapshot()
    assert snap.first_fatal is not None and snap.first_fatal.error == "first"
    assert snap.last_fatal is not None and snap.last_fatal.error == "second"
    assert snap.fatal_count == 2
    health.reset()
    assert health.healthy and health.snapshot().fatal_count == 0


def test_record_says_whether_it_made_the_worker_unhealthy() -> None:
    health = WorkerHealth()
    first = health.record(make_engine_dead_error())
    assert first.fatal and first.first and first.rule == first.verdict.rule
    again = health.record(make_engine_dead_error())
    assert again.fatal and not again.first
    local = health.record(ValueError("corrupt"))
    assert not local.fatal and not local.first
    snap = health.snapshot()
    assert snap.first_fatal is not None
    assert snap.first_fatal.exception_type == "vllm.v1.engine.exceptions.EngineDeadError"


def _serving(health: WorkerHealth) -> None:
    health.set_service(
        version="3.4.4",
        protocol_version=2,
        max_concurrent_requests=3,
        processing_window_size=64,
        task_retention_seconds=86400,
        task_cleanup_interval_seconds=300,
    )
    health.set_tasks(1, 2, 3, 4)
    health.loop_tick()


def test_answers_are_mineru_bodies_plus_our_fields() -> None:
    health = WorkerHealth()
    status, _ = health.answer("/health")
    assert status == 503  # starting
    _serving(health)
    assert health.snapshot().phase == HealthPhase.HEALTHY
    body = health.body("/health")
    assert body["status"] == "healthy"
    assert (
        body["queued_tasks"],
        body["processing_tasks"],
        body["completed_tasks"],
        body["failed_tasks"],
    ) == (1, 2, 3, 4)
    assert body["max_concurrent_requests"] == 3 and body["loop_hung"] is False
    assert body["engine_calls_in_flight"] == 0 and body["engine_dead"] is False
    health.record(make_engine_dead_error())
    assert health.answer("/livez")[0] == 503
    hidden = health.body("/health")
    shown = health.body("/health", expose_errors=True)
    assert "EngineCore" not in hidden["error"] and "EngineCore" in shown["error"]


def test_endpoint_serves_the_same_answer_off_the_loop() -> None:
    health = WorkerHealth()
    _serving(health)
    with HealthEndpoint.start(health, port=0) as endpoint:
        assert endpoint.port > 0 and endpoint.url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(f"{endpoint.url}/health", timeout=10) as response:
            assert response.status == 200
            assert json.loads(response.read())["status"] == "healthy"
        with pytest.raises(HealthEndpointError, match=str(endpoint.port)):
            HealthEndpoint.start(WorkerHealth(), port=endpoint.port)
    with pytest.raises(HealthEndpointError, match="not an IPv4 or IPv6"):
        HealthEndpoint.start(health, bind="localhost")


def test_lone_surrogates_are_stored_as_valid_text() -> None:
    health = WorkerHealth()
    health.record_fatal("bad \udcff text", rule="r", category="c")
    first = health.snapshot().first_fatal
    assert first is not None
    first.error.encode("utf-8")


def test_describe_exception_is_short_and_safe() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError

    assert describe_exception(Unprintable()).startswith("Unprintable: <unprintable")
    assert len(describe_exception(ValueError("x" * 100_000))) <= 2000
    assert describe_exception(KeyError()) == "KeyError"


def test_wait_until_unhealthy_times_out_then_wakes() -> None:
    health = WorkerHealth()
    assert health.wait_until_unhealthy(0.01) is False
    assert health.wait_until_unhealthy(-1) is False
    results: list[bool] = []
    ready = threading.Barrier(5)

    def waiter() -> None:
        ready.wait(10)
        results.append(health.wait_until_unhealthy(30))

    threads = [threading.Thread(target=waiter) for _ in range(4)]
    for t in threads:
        t.start()
    ready.wait(10)
    health.record(make_engine_dead_error())
    for t in threads:
        t.join(30)
    assert results == [True] * 4
    assert health.wait_until_unhealthy(0) is True


def test_concurrent_records() -> None:
    health = WorkerHealth()

    def work() -> None:
        for _ in range(100):
            health.record(ValueError("x"))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert health.snapshot().task_local_count == 400


def test_two_runtimes_in_one_process_share_nothing() -> None:
    """Nothing holds a runtime at module level: each app's hooks read their own."""
    from mineru_health.demo.faults import make_engine_dead_error
    from mineru_health.runtime.settings import WorkerSettings
    from mineru_health.runtime.worker import judge
    from mineru_health.runtime.worker.worker_runtime import WorkerRuntime

    one = WorkerRuntime(WorkerSettings.from_env({"MINERU_HEALTH_STALL_S": "7"}))
    other = WorkerRuntime(WorkerSettings.from_env({}))
    for runtime in (one, other):
        assert runtime.verifier.timeout_s == runtime.settings.verify_s
        assert runtime.rules is not None and runtime.store is None  # opened when serving
    assert one.health is not other.health and one.verifier is not other.verifier
    assert one.settings.stall_s == 7 and other.settings.stall_s != 7
    outcome = judge.judge(one, make_engine_dead_error(), remote_engine=False)
    assert outcome.fatal and not one.health.healthy
    assert other.health.healthy and other.health.snapshot().fatal_count == 0


def test_remote_engine_failures_never_make_the_worker_unhealthy() -> None:
    cls = type(
        "ServerError", (RuntimeError,), {"__module__": "mineru_vl_utils.vlm_client.base_client"}
    )
    health = WorkerHealth()
    verdict = health.record(
        cls("Unexpected status code: [500], response body: EngineCore encountered an issue."),
        remote_engine=True,
    )
    assert not verdict.fatal
    text_only = health.record(RuntimeError("EngineCore encountered an issue."), remote_engine=True)
    assert not text_only.fatal and text_only.verdict.remote_engine
    assert health.healthy and health.snapshot().task_local_count == 2

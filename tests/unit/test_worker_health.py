"""WorkerHealth: recording, snapshots, reset and waiting across threads."""

from __future__ import annotations

import threading
from datetime import datetime

from mineru_health.testing.faults import make_engine_dead_error
from mineru_health.worker import WorkerHealth, describe_exception, worker_health


def test_starts_healthy() -> None:
    health = WorkerHealth()
    assert health.healthy
    snap = health.snapshot()
    assert snap.healthy and snap.fatal_count == 0 and snap.first_fatal is None
    assert "healthy" in repr(health)


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
    assert first.since == "2023-11-14T22:13:20+00:00"
    assert datetime.fromisoformat(first.since).tzinfo is not None
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


def test_record_a_verdict_directly() -> None:
    health = WorkerHealth()
    verdict = health.record(make_engine_dead_error())
    other = WorkerHealth()
    other.record(verdict, error="given text")
    first = other.snapshot().first_fatal
    assert first is not None and first.error == "given text"


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


def test_process_wide_instance() -> None:
    assert worker_health() is worker_health()


def test_remote_engine_failures_never_make_the_worker_unhealthy() -> None:
    cls = type("ServerError", (RuntimeError,),
               {"__module__": "mineru_vl_utils.vlm_client.base_client"})
    health = WorkerHealth()
    verdict = health.record(cls("Unexpected status code: [500], response body: EngineCore "
                                "encountered an issue."), remote_engine=True)
    assert not verdict.fatal
    text_only = health.record(RuntimeError("EngineCore encountered an issue."),
                              remote_engine=True)
    assert not text_only.fatal and text_only.remote_engine
    assert health.healthy and health.snapshot().task_local_count == 2

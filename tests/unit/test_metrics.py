"""mineru_health.metrics (worker and router sides): scrape the text exposition, check names."""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fake_fleet import FakeMember
from mineru_health import _native, metrics
from mineru_health.metrics import router, worker
from mineru_health.runtime.router.fleet import Fleet, expectations
from mineru_health.runtime.settings import HealthSettings
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fresh_registry() -> Iterator[None]:
    metrics._registry.reset()
    yield
    metrics._registry.reset()


def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the current exposition, keyed by (name, sorted labels)."""
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def family_names() -> set[str]:
    return {f.name for f in text_string_to_metric_families(metrics.exposition().decode())}


def value(name: str, **labels: str) -> float | None:
    return scrape().get((name, tuple(sorted(labels.items()))))


def exposed_name(name: str) -> str:
    # The parser reports counter families without their _total suffix.
    return name.removesuffix("_total")


# --- names and conventions ----------------------------------------------------


def test_documented_names_follow_conventions() -> None:
    modules = {"worker": worker, "router": router}
    for role, names in metrics.METRIC_NAMES.items():
        for name in names:
            assert name.startswith(f"mineru_{role}_"), name
            assert name == name.lower()
            doc = modules[role].__doc__ or ""
            assert name in doc, f"{name} missing from the {role} module docstring"


def test_every_documented_name_is_in_operations_doc() -> None:
    if not (REPO / "docs").is_dir():
        pytest.skip("docs/ is not next to the tests")
    doc = REPO / "docs" / "operations.md"
    text = doc.read_text()
    for names in metrics.METRIC_NAMES.values():
        for name in names:
            assert name in text, f"{name} missing from docs/operations.md"


def test_worker_side_exposes_only_worker_families() -> None:
    worker.ensure_families()
    names = family_names()
    for name in metrics.METRIC_NAMES["worker"]:
        assert exposed_name(name) in names
    assert not any(n.startswith("mineru_router_") for n in names)
    assert "process_start_time_seconds" in names or "python_info" in names


def test_router_side_exposes_only_router_families() -> None:
    router.bind_worker_statuses(
        lambda: [
            counted(
                "local-gpu-0",
                latencies=[0.01],
                audits={"ejected": 1, "auto_restart_success": 1, "auto_restart_gave_up": 1},
                ejections={"timeout": 1},
            )
        ]
    )
    names = family_names()
    for name in metrics.METRIC_NAMES["router"]:
        assert exposed_name(name) in names, name
    assert not any(n.startswith("mineru_worker_") for n in names)


# --- worker side --------------------------------------------------------------


def _bound_health() -> Any:
    from mineru_health.runtime.worker.health import WorkerHealth

    health = WorkerHealth()
    metrics.bind_worker_healthy(lambda: health.healthy)
    metrics.bind_worker_snapshot(health.snapshot)
    return health


def test_worker_starts_healthy_and_every_fatal_record_is_counted() -> None:
    """Issue 25: a stall, a hung-task death and a verified death never reached the counter,
    which was pushed from the classifier's call sites; it is the native state's count now."""
    from mineru_health.demo.faults import make_engine_dead_error

    health = _bound_health()
    assert value("mineru_worker_healthy") == 1
    assert health.record(make_engine_dead_error()).fatal
    assert health.record(make_engine_dead_error()).fatal
    health.record_fatal(
        "the engine check failed", rule="verify.vllm", category="engine_check_failed"
    )
    assert value("mineru_worker_healthy") == 0
    assert (
        value("mineru_worker_fatal_errors_total", rule="vllm.engine_dead", category="engine_dead")
        == 2
    )
    assert (
        value(
            "mineru_worker_fatal_errors_total", rule="verify.vllm", category="engine_check_failed"
        )
        == 1
    )


def test_a_stall_is_counted_as_a_fatal_error() -> None:
    """The watchdogs' own records (a stall here; every task hung, the error budget: the
    native tests) are counted as any other: the counter reads the native state."""
    from mineru_health.runtime.worker.health import WorkerHealth

    stalled = WorkerHealth(stall_s=0.001)
    metrics.bind_worker_snapshot(stalled.snapshot)
    stalled.engine_call_started()
    assert stalled.wait_until_unhealthy(5.0)  # a native wait, not a poll
    assert (
        value(
            "mineru_worker_fatal_errors_total",
            rule="watchdog.engine_stalled",
            category="engine_stalled",
        )
        == 1
    )


def test_task_local_and_remote_engine_failures_do_not_touch_health() -> None:
    health = _bound_health()
    health.record(ValueError("corrupt page"))
    # A remote engine's death, as its server reports it: task-local here, counted apart.
    health.record(
        RuntimeError("EngineCore encountered an issue. See stack trace (above)"), remote_engine=True
    )
    assert value("mineru_worker_task_local_failures_total") == 2
    assert value("mineru_worker_remote_engine_failures_total") == 1
    assert value("mineru_worker_healthy") == 1


def test_engine_and_loop_gauges_read_the_native_state_at_scrape_time() -> None:
    from mineru_health.runtime.worker.health import WorkerHealth

    health = WorkerHealth()
    worker.bind_worker_snapshot(health.snapshot)
    assert value("mineru_worker_engine_calls_in_flight") == 0
    assert value("mineru_worker_loop_lag_seconds") is None  # the loop never ticked
    assert value("mineru_worker_seconds_since_progress") is None  # nothing in flight
    health.loop_tick()
    health.engine_call_started()
    assert value("mineru_worker_engine_calls_in_flight") == 1
    lag = value("mineru_worker_loop_lag_seconds")
    assert lag is not None and lag >= 0
    assert value("mineru_worker_seconds_since_progress") is not None
    worker.bind_worker_snapshot(None)
    assert value("mineru_worker_engine_calls_in_flight") is None


def test_bound_callable_is_read_at_scrape_time() -> None:
    healthy = [True]
    metrics.bind_worker_healthy(lambda: healthy[0])
    assert value("mineru_worker_healthy") == 1
    healthy[0] = False
    assert value("mineru_worker_healthy") == 0


def test_empty_rule_and_category_are_labelled_unknown() -> None:
    health = _bound_health()
    health.record_fatal("x", rule="", category="")
    assert value("mineru_worker_fatal_errors_total", rule="unknown", category="unknown") == 1


# --- router side: state read from the poller at scrape time ---------------------------


def states_of(worker: str) -> dict[str, float]:
    return {
        state: value("mineru_router_worker_state", worker=worker, state=state) or 0.0
        for state in router.WORKER_STATES
    }


def status(worker: str, phase: Any, failures: int = 0) -> SimpleNamespace:
    return SimpleNamespace(id=worker, phase=phase, consecutive_failures=failures)


def counted(
    worker: str,
    *,
    latencies: Sequence[float] = (),
    statuses: Sequence[str] = (),
    audits: dict[str, int] | None = None,
    ejections: dict[str, int] | None = None,
    last: float | None = None,
) -> SimpleNamespace:
    """A status whose ``counters`` are what the poller counts (``WorkerCounters``):
    one probe per latency (its status from ``statuses``, else healthy)."""
    bounds = _native.WorkerCounters.latency_bounds()
    buckets = [0] * (len(bounds) + 1)
    probes: dict[str, int] = {}
    for n, latency in enumerate(latencies):
        buckets[bisect.bisect_left(bounds, max(0.0, latency))] += 1
        name = statuses[n] if n < len(statuses) else "healthy"
        probes[name] = probes.get(name, 0) + 1
    counters = SimpleNamespace(
        probes=probes,
        audits=audits or {},
        ejections=ejections or {},
        latency_counts=buckets,
        latency_sum_s=sum(max(0.0, x) for x in latencies),
        last_probe_unix_time=last if last is not None else (1.0 if latencies else None),
    )
    return SimpleNamespace(
        id=worker, phase=_native.WorkerPhase.HEALTHY, consecutive_failures=0, counters=counters
    )


def test_names_come_from_the_native_enums() -> None:
    assert router.WORKER_STATES == tuple(_native.to_string(p) for p in _native.WorkerPhase)
    assert "restart_scheduled" in router.WORKER_STATES
    assert router.AUDIT_ACTIONS == tuple(_native.to_string(a) for a in _native.AuditAction)
    assert "auto_restart_success" in router.AUDIT_ACTIONS
    assert {"engine_dead", "timeout", "process_exit", "passive_failure", "other"} <= set(
        router.EJECTION_REASONS
    )
    assert "healthy" not in router.EJECTION_REASONS


def test_state_is_read_at_scrape_time_and_one_hot() -> None:
    fleet = [status("w1", _native.WorkerPhase.HEALTHY)]
    router.bind_worker_statuses(lambda: fleet)
    assert states_of("w1") == {s: (1.0 if s == "healthy" else 0.0) for s in router.WORKER_STATES}
    assert value("mineru_router_worker_consecutive_failures", worker="w1") == 0
    # Nothing is pushed: the next scrape sees whatever the source says now.
    fleet[0] = status("w1", _native.WorkerPhase.RESTART_SCHEDULED, 3)
    got = states_of("w1")
    assert got["restart_scheduled"] == 1 and sum(got.values()) == 1
    assert value("mineru_router_worker_consecutive_failures", worker="w1") == 3
    # Every phase series exists, so "== 0" queries work too.
    assert all(
        ("mineru_router_worker_state", (("state", s), ("worker", "w1"))) in scrape()
        for s in router.WORKER_STATES
    )
    # A worker that left the source leaves the exposition with it.
    fleet.clear()
    assert not any(("worker", "w1") in labels for _, labels in scrape())


def test_unbound_state_families_exist_without_samples() -> None:
    router.ensure_families()
    assert {"mineru_router_worker_state", "mineru_router_worker_consecutive_failures"} <= (
        family_names()
    )
    assert not [key for key in scrape() if key[0] == "mineru_router_worker_state"]


def test_rebinding_replaces_the_source() -> None:
    router.bind_worker_statuses(lambda: [status("old", _native.WorkerPhase.HEALTHY)])
    router.bind_worker_statuses(lambda: [status("new", _native.WorkerPhase.GAVE_UP)])
    assert states_of("new")["gave_up"] == 1
    assert not any(("worker", "old") in labels for _, labels in scrape())
    router.bind_worker_statuses(None)
    assert not any(("worker", "new") in labels for _, labels in scrape())


def test_a_broken_source_never_breaks_the_scrape(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> list[Any]:
        raise RuntimeError("poller gone")

    router.bind_worker_statuses(broken)
    worker.ensure_families()
    assert value("mineru_worker_healthy") == 1  # the rest of the scrape is intact
    assert "reading worker statuses" in caplog.text
    router.bind_worker_statuses(lambda: [object(), status("ok", _native.WorkerPhase.FAILED)])
    assert states_of("ok")["failed"] == 1  # a malformed entry is left out, not fatal


def test_state_follows_a_real_poller_without_any_push() -> None:
    settings = HealthSettings.preset("fast")
    # The fleet binds the state gauges to its poller itself.
    monitor = Fleet(settings, expectations(settings), client=None, native_probes=False)
    monitor.add(FakeMember("local-gpu-0", local=True))  # never launched: no URL, never probed
    assert states_of("local-gpu-0")["starting"] == 1
    monitor.report_exit("local-gpu-0", "worker process 1 exited with code 1")
    native = monitor.status("local-gpu-0")
    assert native is not None
    assert states_of("local-gpu-0")[_native.to_string(native.phase)] == 1
    assert states_of("local-gpu-0")["starting"] == 0
    assert value("mineru_router_worker_consecutive_failures", worker="local-gpu-0") == float(
        native.consecutive_failures
    )
    # Its policy events, as the poller counted them when it made them (no event drained).
    audits = dict(native.counters.audits)
    assert audits, "the exit made no audit event"
    for action, count in audits.items():
        assert (
            value("mineru_router_audit_events_total", worker="local-gpu-0", action=action) == count
        )
    monitor.close_files()


# --- router side: events ------------------------------------------------------


def test_probe_histogram_and_status_counter() -> None:
    router.bind_worker_statuses(
        lambda: [
            counted(
                "w",
                latencies=[0.004, 1.5, 0.01],
                statuses=["healthy", "timeout", "some free text from a bad caller"],
                last=1004.0,
            )
        ]
    )
    assert value("mineru_router_probe_duration_seconds_count", worker="w") == 3
    assert value("mineru_router_probe_duration_seconds_sum", worker="w") == pytest.approx(1.514)
    assert value("mineru_router_probe_duration_seconds_bucket", worker="w", le="0.005") == 1
    assert value("mineru_router_probes_total", worker="w", status="healthy") == 1
    assert value("mineru_router_probes_total", worker="w", status="timeout") == 1
    assert value("mineru_router_probes_total", worker="w", status="other") == 1
    assert value("mineru_router_last_probe_timestamp_seconds", worker="w") == 1004.0


def test_audit_actions_feed_their_counters() -> None:
    audits = {
        "health_failed": 1,
        "auto_restart_scheduled": 2,
        "auto_restart_failed": 1,
        "auto_restart_success": 1,
        "auto_restart_gave_up": 1,
        "ejected": 2,
        "not an action": 2,
    }
    router.bind_worker_statuses(
        lambda: [
            counted("w", audits=audits, ejections={"engine_dead": 1, "a long free-text reason": 1})
        ]
    )
    assert value("mineru_router_restarts_total", worker="w", outcome="succeeded") == 1
    assert value("mineru_router_restarts_total", worker="w", outcome="failed") == 1
    assert value("mineru_router_gave_up_total", worker="w") == 1
    assert value("mineru_router_ejections_total", worker="w", reason="engine_dead") == 1
    assert value("mineru_router_ejections_total", worker="w", reason="other") == 1
    assert (
        value("mineru_router_audit_events_total", worker="w", action="auto_restart_scheduled") == 2
    )
    assert value("mineru_router_audit_events_total", worker="w", action="ejected") == 2
    assert value("mineru_router_audit_events_total", worker="w", action="other") == 2


def test_a_worker_that_left_the_pool_takes_its_series_with_it() -> None:
    workers = [
        counted("gone", latencies=[0.01], audits={"ejected": 1}, ejections={"timeout": 1}),
        counted("kept", latencies=[0.01]),
    ]
    router.bind_worker_statuses(lambda: list(workers))
    assert any(("worker", "gone") in labels for _, labels in scrape())
    workers.pop(0)  # the fleet removed it: the poller has no status for it
    remaining = scrape()
    assert not any(("worker", "gone") in labels for _, labels in remaining)
    assert any(("worker", "kept") in labels for _, labels in remaining)


# --- HTTP ---------------------------------------------------------------------


@pytest.mark.parametrize("role", ["worker", "router"])
def test_mount_metrics_serves_the_text_format(role: str) -> None:
    fastapi = pytest.importorskip("fastapi")
    testclient = pytest.importorskip("fastapi.testclient")
    app = fastapi.FastAPI()
    metrics.mount_metrics(app, role)  # type: ignore[arg-type]
    with testclient.TestClient(app) as client:
        response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    names = {f.name for f in text_string_to_metric_families(response.text)}
    # Families exist from the first scrape, before anything was recorded.
    if role == "worker":
        assert {"mineru_worker_healthy", "mineru_worker_fatal_errors"} <= names
    else:
        assert "mineru_router_probe_duration_seconds" in names
    assert "/metrics" not in app.openapi()["paths"]


def test_mount_metrics_refuses_an_unknown_role() -> None:
    fastapi = pytest.importorskip("fastapi")
    with pytest.raises(ValueError, match="role"):
        metrics.mount_metrics(fastapi.FastAPI(), "bogus")  # type: ignore[arg-type]


def test_every_resubmission_reason_and_refusal_cause_has_its_series() -> None:
    """Issue 25: hung resubmissions were counted as "other"; the label values now come
    from the policy's enums, so a new reason cannot be."""
    from mineru_health.runtime.router.policy import Refusal, ResubmitReason

    for reason in ResubmitReason:
        router.record_resubmission(reason.value)
    for cause in Refusal:
        router.record_resubmission_refused(cause.value)
    samples = scrape()
    for reason in ResubmitReason:
        key = ("mineru_router_task_resubmissions_total", (("reason", reason.value),))
        assert samples.get(key) == 1.0, (reason, sorted(k for k in samples if "resub" in k[0]))
    for cause in Refusal:
        key = ("mineru_router_task_resubmissions_refused_total", (("cause", cause.value),))
        assert samples.get(key) == 1.0, cause
    assert not any(
        dict(labels).get("reason") == "other" or dict(labels).get("cause") == "other"
        for _, labels in samples
    )

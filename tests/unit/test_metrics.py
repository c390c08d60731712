"""mineru_health.metrics: scrape the text exposition and check the documented names."""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from mineru_health import metrics
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fresh_registry() -> Iterator[None]:
    metrics.reset_for_tests()
    yield
    metrics.reset_for_tests()


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
    for role, names in metrics.METRIC_NAMES.items():
        for name in names:
            assert name.startswith(f"mineru_{role}_"), name
            assert name == name.lower()
            assert name in (metrics.__doc__ or ""), f"{name} missing from the module docstring"


def test_every_documented_name_is_in_operations_doc() -> None:
    if not (REPO / "docs").is_dir():
        pytest.skip("docs/ is not next to the tests")
    doc = REPO / "docs" / "operations.md"
    text = doc.read_text()
    for names in metrics.METRIC_NAMES.values():
        for name in names:
            assert name in text, f"{name} missing from docs/operations.md"


def test_worker_side_exposes_only_worker_families() -> None:
    metrics.set_worker_healthy(True)
    names = family_names()
    for name in metrics.METRIC_NAMES["worker"]:
        assert exposed_name(name) in names
    assert not any(n.startswith("mineru_router_") for n in names)
    assert "process_start_time_seconds" in names or "python_info" in names


def test_router_side_exposes_only_router_families() -> None:
    metrics.set_worker_state("local-gpu-0", "starting")
    metrics.observe_probe("local-gpu-0", 0.01, "healthy")
    metrics.record_audit("local-gpu-0", "ejected", reason_kind="timeout")
    metrics.record_audit("local-gpu-0", "auto_restart_success")
    metrics.record_audit("local-gpu-0", "auto_restart_gave_up")
    names = family_names()
    for name in metrics.METRIC_NAMES["router"]:
        assert exposed_name(name) in names, name
    assert not any(n.startswith("mineru_worker_") for n in names)


# --- worker side --------------------------------------------------------------


def test_worker_starts_healthy_and_a_fatal_error_flips_it() -> None:
    metrics.set_worker_healthy(True)
    assert value("mineru_worker_healthy") == 1
    metrics.record_worker_fatal("vllm-engine-dead", "engine_dead")
    metrics.record_worker_fatal("vllm-engine-dead", "engine_dead")
    assert value("mineru_worker_healthy") == 0
    assert (
        value("mineru_worker_fatal_errors_total", rule="vllm-engine-dead", category="engine_dead")
        == 2
    )


def test_task_local_failures_do_not_touch_health() -> None:
    metrics.record_worker_task_local()
    metrics.record_worker_task_local()
    assert value("mineru_worker_task_local_failures_total") == 2
    assert value("mineru_worker_healthy") == 1


def test_bound_callable_is_read_at_scrape_time() -> None:
    healthy = [True]
    metrics.bind_worker_healthy(lambda: healthy[0])
    assert value("mineru_worker_healthy") == 1
    healthy[0] = False
    assert value("mineru_worker_healthy") == 0
    # A bound gauge stays the source of truth: counting must not overwrite it.
    healthy[0] = True
    metrics.record_worker_fatal("r", "c")
    assert value("mineru_worker_healthy") == 1


def test_empty_rule_and_category_are_labelled_unknown() -> None:
    metrics.record_worker_fatal("", "")
    assert value("mineru_worker_fatal_errors_total", rule="unknown", category="unknown") == 1


# --- router side --------------------------------------------------------------


def states_of(worker: str) -> dict[str, float]:
    return {
        state: value("mineru_router_worker_state", worker=worker, state=state) or 0.0
        for state in metrics.WORKER_STATES
    }


def test_worker_state_is_one_hot() -> None:
    metrics.set_worker_state("w1", "healthy", consecutive_failures=0)
    assert states_of("w1") == {s: (1.0 if s == "healthy" else 0.0) for s in metrics.WORKER_STATES}
    metrics.set_worker_state("w1", "restart_scheduled", consecutive_failures=3)
    got = states_of("w1")
    assert got["restart_scheduled"] == 1 and sum(got.values()) == 1
    assert value("mineru_router_worker_consecutive_failures", worker="w1") == 3
    # Every phase series exists, so "== 0" queries work too.
    assert all(
        ("mineru_router_worker_state", (("state", s), ("worker", "w1"))) in scrape()
        for s in metrics.WORKER_STATES
    )


class FakePhase(enum.Enum):
    kRestartScheduled = 4
    kGaveUp = 6


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("gave_up", "gave_up"),
        (FakePhase.kRestartScheduled, "restart_scheduled"),
        (FakePhase.kGaveUp, "gave_up"),
        ("RESTARTING", "restarting"),
    ],
)
def test_state_accepts_names_and_enum_members(given: object, expected: str) -> None:
    metrics.set_worker_state("w", given)
    assert states_of("w")[expected] == 1


def test_unknown_state_is_ignored() -> None:
    metrics.set_worker_state("w", "healthy")
    metrics.set_worker_state("w", "exploded")
    assert states_of("w")["healthy"] == 1


@dataclass
class Status:
    id: str
    phase: str
    consecutive_failures: int


def test_update_worker_status_takes_a_status_object() -> None:
    metrics.update_worker_status(Status("remote-1", "unhealthy", 2))
    assert states_of("remote-1")["unhealthy"] == 1
    assert value("mineru_router_worker_consecutive_failures", worker="remote-1") == 2


def test_probe_histogram_and_status_counter() -> None:
    metrics.observe_probe("w", 0.004, "healthy", unix_time=1000.0)
    metrics.observe_probe("w", 1.5, "timeout", unix_time=1002.0)
    metrics.observe_probe("w", 0.01, "some free text from a bad caller", unix_time=1004.0)
    assert value("mineru_router_probe_duration_seconds_count", worker="w") == 3
    assert value("mineru_router_probe_duration_seconds_sum", worker="w") == pytest.approx(1.514)
    assert value("mineru_router_probe_duration_seconds_bucket", worker="w", le="0.005") == 1
    assert value("mineru_router_probes_total", worker="w", status="healthy") == 1
    assert value("mineru_router_probes_total", worker="w", status="timeout") == 1
    assert value("mineru_router_probes_total", worker="w", status="other") == 1
    assert value("mineru_router_last_probe_timestamp_seconds", worker="w") == 1004.0


def test_negative_latency_is_clamped() -> None:
    metrics.observe_probe("w", -1.0)
    assert value("mineru_router_probe_duration_seconds_sum", worker="w") == 0


def test_audit_actions_feed_their_counters() -> None:
    for action in (
        "health_failed",
        "auto_restart_scheduled",
        "auto_restart_failed",
        "auto_restart_scheduled",
        "auto_restart_success",
        "auto_restart_gave_up",
    ):
        metrics.record_audit("w", action)
    metrics.record_audit("w", "ejected", reason_kind="engine_dead")
    metrics.record_audit("w", "ejected", reason_kind="a long free-text reason")
    assert value("mineru_router_restarts_total", worker="w", outcome="succeeded") == 1
    assert value("mineru_router_restarts_total", worker="w", outcome="failed") == 1
    assert value("mineru_router_gave_up_total", worker="w") == 1
    assert value("mineru_router_ejections_total", worker="w", reason="engine_dead") == 1
    assert value("mineru_router_ejections_total", worker="w", reason="other") == 1
    assert (
        value("mineru_router_audit_events_total", worker="w", action="auto_restart_scheduled") == 2
    )
    assert value("mineru_router_audit_events_total", worker="w", action="ejected") == 2


class FakeAction(enum.Enum):
    kRestartSucceeded = 2
    kGaveUp = 4


def test_audit_accepts_native_enum_members() -> None:
    metrics.record_audit("w", FakeAction.kRestartSucceeded)
    metrics.record_audit("w", FakeAction.kGaveUp)
    assert value("mineru_router_restarts_total", worker="w", outcome="succeeded") == 1
    assert value("mineru_router_gave_up_total", worker="w") == 1
    metrics.record_audit("w", "not an action")
    assert value("mineru_router_audit_events_total", worker="w", action="other") == 1


def test_forget_worker_drops_its_series() -> None:
    metrics.set_worker_state("gone", "healthy", 0)
    metrics.observe_probe("gone", 0.01)
    metrics.record_audit("gone", "ejected", reason_kind="timeout")
    metrics.set_worker_state("kept", "healthy", 0)
    metrics.forget_worker("gone")
    remaining = scrape()
    assert not any(("worker", "gone") in labels for _, labels in remaining)
    assert any(("worker", "kept") in labels for _, labels in remaining)
    metrics.forget_worker("never-seen")  # no error


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

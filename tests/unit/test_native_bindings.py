"""Round trips through the private extension: types convert, nothing is lost or invented."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from mineru_health import _native


def test_frame_round_trip_str_and_bytes() -> None:
    frame = _native.Frame(
        "vllm.v1.engine.exceptions",
        b"EngineDeadError",
        ["Exception", b"X"],
        "boom",
        b"vllm.v1.engine.async_llm",
        _native.Via.CONTEXT,
        2,
    )
    assert frame.module == "vllm.v1.engine.exceptions"
    assert frame.raised_in == "vllm.v1.engine.async_llm"
    assert (frame.via, frame.depth) == (_native.Via.CONTEXT, 2)
    assert frame.type_name == "EngineDeadError"
    assert frame.bases == ["Exception", "X"]
    assert frame.message == "boom"
    frame.message = b"changed"
    assert frame.message == "changed"


def test_frame_keeps_invalid_bytes() -> None:
    frame = _native.Frame(
        b"m\xff", b"T", [], "\udcff".encode("utf-8", "surrogatepass"), b"", _native.Via.ROOT, 0
    )
    # Decoded with surrogateescape: every byte survives the round trip.
    assert frame.module.encode("utf-8", "surrogateescape") == b"m\xff"
    assert frame.message.encode("utf-8", "surrogateescape") == b"\xed\xb3\xbf"


def test_rule_kind_is_a_python_enum() -> None:
    import enum

    assert issubclass(_native.RuleKind, enum.Enum)
    assert _native.rule_kind_name(_native.RuleKind.FATAL) == "fatal"
    assert _native.rule_kind_name(_native.RuleKind.TASK_LOCAL) == "task_local"
    assert _native.strength_name(_native.RuleKind.FATAL) == "definitive"
    assert [_native.rule_kind_name(k) for k in _native.RuleKind] == [
        "fatal",
        "task_local",
        "heuristic",
        "ambiguous",
        "generic",
    ]


def test_rule_round_trip() -> None:
    rule = _native.Rule(
        id="a.b",
        kind=_native.RuleKind.TASK_LOCAL,
        category="cat",
        pattern="x+y",
        target=_native.RuleTarget.TYPE,
        scope=_native.RuleScope.ENGINE,
        from_operator=True,
    )
    assert (
        rule.id,
        rule.kind,
        rule.category,
        rule.pattern,
        rule.target,
        rule.scope,
        rule.from_operator,
    ) == (
        "a.b",
        _native.RuleKind.TASK_LOCAL,
        "cat",
        "x+y",
        _native.RuleTarget.TYPE,
        _native.RuleScope.ENGINE,
        True,
    )


def test_compile_ok_and_rules_are_copies() -> None:
    rule_set, errors = _native.RuleSet.compile(
        [
            _native.Rule(
                "one",
                _native.RuleKind.FATAL,
                "c",
                "engine",
                _native.RuleTarget.FRAME,
                _native.RuleScope.ANY,
                False,
            )
        ],
        "<test>",
        _native.RuleSetLimits(),
    )
    assert errors == []
    assert rule_set is not None
    rules = rule_set.rules
    with pytest.raises(AttributeError):
        rules[0].pattern = "changed"  # type: ignore[misc]
    assert rule_set.rules[0].pattern == "engine"  # the compiled set stays immutable
    assert rules == rule_set.rules and rules[0] is not rule_set.rules[0]


def test_compile_error_is_a_value() -> None:
    rule_set, errors = _native.RuleSet.compile(
        [
            _native.Rule(
                "bad",
                _native.RuleKind.FATAL,
                "c",
                "(",
                _native.RuleTarget.FRAME,
                _native.RuleScope.ANY,
                False,
            )
        ],
        "<test>",
        _native.RuleSetLimits(),
    )
    assert rule_set is None
    assert len(errors) == 1
    assert errors[0].rule_id == "bad"
    assert errors[0].source == "<test>"
    assert "bad" in errors[0].to_string()


def test_classifier_requires_a_rule_set() -> None:
    with pytest.raises(TypeError):
        _native.Classifier(None, _native.ClassifierLimits())  # type: ignore[arg-type]


def test_classifier_limits_defaults_match_cpp() -> None:
    limits = _native.ClassifierLimits()
    assert limits.max_frames == 64
    assert limits.max_message_bytes == 64 << 10
    assert limits.max_total_message_bytes == 256 << 10
    assert limits.excerpt_bytes == 200
    set_limits = _native.RuleSetLimits()
    assert (set_limits.max_class_run, set_limits.max_program_size) == (8, 2000)
    assert _native.MAX_RULES_FILE_BYTES == 1 << 20
    assert _native.MAX_RULES_FILE_RULES == 2000


def test_classify_verdict_fields() -> None:
    rule_set, _ = _native.RuleSet.compile(
        _native.builtin_rules(), "<builtin>", _native.RuleSetLimits()
    )
    assert rule_set is not None
    classifier = _native.Classifier(rule_set, _native.ClassifierLimits())
    frames = [
        _native.Frame(
            "builtins",
            "RuntimeError",
            ["Exception", "BaseException"],
            "wrapper",
            "mineru.backend.vlm.vlm_analyze",
            _native.Via.ROOT,
            0,
        ),
        _native.Frame(
            "vllm.v1.engine.exceptions",
            "EngineDeadError",
            ["Exception", "BaseException"],
            "EngineCore encountered an issue.",
            "vllm.v1.engine.async_llm",
            _native.Via.CAUSE,
            1,
        ),
    ]
    options = _native.ClassifyOptions()
    verdict = classifier.classify(frames, options)
    assert verdict.fatal and verdict.matched and not verdict.ambiguous
    assert verdict.rule_kind == _native.RuleKind.FATAL and not verdict.remote_engine
    assert verdict.kind == "fatal" and verdict.strength == "definitive"
    assert verdict.frame_index == 1
    assert verdict.rule
    assert verdict.category
    assert isinstance(verdict.excerpt, str)
    empty = classifier.classify([], options)
    assert not empty.fatal and not empty.matched and empty.frame_index == -1


def test_merge_rules_replaces_in_place() -> None:
    def rule(rule_id: str, kind: _native.RuleKind, pattern: str) -> _native.Rule:
        return _native.Rule(
            rule_id, kind, "c", pattern, _native.RuleTarget.FRAME, _native.RuleScope.ANY, False
        )

    base = [rule("a", _native.RuleKind.FATAL, "1"), rule("b", _native.RuleKind.FATAL, "2")]
    merged = _native.merge_rules(
        base,
        [rule("a", _native.RuleKind.TASK_LOCAL, "3"), rule("n", _native.RuleKind.FATAL, "4")],
        [],
    )
    assert [(r.id, r.pattern) for r in merged] == [("a", "3"), ("b", "2"), ("n", "4")]
    assert [r.id for r in _native.merge_rules(base, [], ["a"])] == ["b"]


def test_read_rules_file_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "rules.fifo"
    os.mkfifo(fifo)
    rules, disabled, errors = _native.read_rules_file(str(fifo))
    assert rules == [] and disabled == []
    assert "a FIFO" in errors[0].message


def test_worker_state_round_trip() -> None:
    state = _native.WorkerState()
    assert state.healthy()
    state.record_task_local()
    state.record_fatal(_native.FatalRecord("E: x", "rule", "cat", 12.5))
    state.record_fatal(_native.FatalRecord("E: y", "rule2", "cat2", 13.0))
    snap = state.snapshot()
    assert not snap.healthy
    assert (snap.fatal_count, snap.task_local_count) == (2, 1)
    assert snap.first_fatal is not None and snap.last_fatal is not None
    assert (
        snap.first_fatal.error,
        snap.first_fatal.rule,
        snap.first_fatal.category,
        snap.first_fatal.unix_time,
    ) == ("E: x", "rule", "cat", 12.5)
    assert snap.last_fatal.error == "E: y"
    state.reset()
    snap = state.snapshot()
    assert snap.healthy and snap.first_fatal is None and snap.fatal_count == 0


def test_wait_until_unhealthy_releases_the_gil() -> None:
    state = _native.WorkerState()
    assert state.wait_until_unhealthy(0.01) is False
    waiter_result: list[bool] = []
    started = threading.Event()

    def waiter() -> None:
        started.set()
        waiter_result.append(state.wait_until_unhealthy(30.0))

    thread = threading.Thread(target=waiter)
    thread.start()
    assert started.wait(10)
    # This thread keeps running Python while the other blocks in C++.
    state.record_fatal(_native.FatalRecord("dead", "r", "c", 1.0))
    thread.join(30)
    assert not thread.is_alive()
    assert waiter_result == [True]


def test_router_core_bindings() -> None:
    # Enum names come from the native to_string.
    assert _native.to_string(_native.ProbeStatus.LOOP_HUNG) == "loop_hung"
    assert _native.to_string(_native.ProbeEndpoint.NATIVE) == "native"
    assert _native.to_string(_native.AuditAction.ADMITTED) == "admitted"
    assert _native.to_string(_native.AuditAction.EJECTION_SUPPRESSED) == "ejection_suppressed"
    assert _native.to_string(_native.PollerEventKind.ERROR) == "error"
    causes = _native.failure_cause_names()
    assert {"loop_hung", "process_exit", "passive_failure", "boot_timeout"} <= set(causes)

    config = _native.HealthConfig()
    assert (config.main_port_timeout_s, config.stable_window_s) == (60.0, 600.0)
    assert config.max_ejection_percent == 50

    body = (
        b'{"status":"unhealthy","endpoint":"native","loop_hung":true,"loop_lag_s":75.5,'
        b'"engine_calls_in_flight":1,"seconds_since_progress":null,"rule":"r","category":"c"}'
    )
    result = _native.classify_health_response(503, body, False, _native.ProbeExpectations())
    assert result.status == _native.ProbeStatus.LOOP_HUNG and result.definitive
    assert (result.loop_lag_s, result.engine_calls_in_flight) == (75.5, 1)
    assert result.seconds_since_progress is None and result.native_health_port is None
    assert (result.rule, result.category, result.endpoint) == ("r", "c", _native.ProbeEndpoint.MAIN)

    target = _native.Target("w", "http://127.0.0.1:1", True, "http://127.0.0.1:2/health")
    assert target.health_url == "http://127.0.0.1:2/health"
    poller = _native.Poller(config, _native.ProbeExpectations(), 1)
    poller.add_worker(target)
    poller.report_process_exit("w", "exit code 75", 75)
    (status,) = poller.statuses()
    assert status.last_exit_code == 75 and status.last_cause == "process_exit"
    one = poller.status("w")
    assert one is not None and (one.id, one.last_exit_code) == ("w", 75)
    assert poller.status("nobody") is None
    assert status.probe_url == "http://127.0.0.1:2/health"
    assert status.endpoint == _native.ProbeEndpoint.NATIVE
    poller.set_url("w", "http://127.0.0.1:3")
    (status,) = poller.statuses()
    assert status.probe_url == "http://127.0.0.1:3/health" and status.health_url == ""
    stats = poller.stats()
    assert stats.workers == 1 and stats.dropped_events == 0 and not stats.io_failing
    events = poller.drain_events()
    # An event carries the rotation, not a copy of the status (poller.status() has it).
    assert events and all(e.worker_id == "w" and not e.in_rotation for e in events)
    assert not hasattr(events[0], "worker")

    limit = _native.raise_fd_limit(0)  # nothing to raise
    assert not limit.raised and limit.error == "" and limit.soft == limit.soft_before

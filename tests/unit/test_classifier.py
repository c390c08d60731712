"""classify() on real exception objects; rules loading from MINERU_HEALTH_RULES."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from mineru_health import classifier
from mineru_health.classifier import (
    Rule,
    RuleKind,
    Rules,
    Verdict,
    classify,
    classify_text,
    load_rules,
    reload_rules,
)
from mineru_health.errors import ConfigError, RulesError
from mineru_health.testing.faults import ENGINE_DEAD_MESSAGE, make_engine_dead_error


def _vllm_class(name: str, base: type[Exception] = Exception) -> type[Exception]:
    cls = type(name, (base,), {})
    cls.__module__ = "vllm.v1.engine.exceptions"
    return cls


@pytest.fixture(autouse=True)
def _no_rules_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MINERU_HEALTH_RULES", raising=False)


def test_engine_dead_error_is_fatal() -> None:
    verdict = classify(_vllm_class("EngineDeadError")(ENGINE_DEAD_MESSAGE))
    assert isinstance(verdict, Verdict)
    assert verdict.fatal and verdict.matched and verdict.kind == "fatal"
    assert verdict.category
    assert verdict.frame is not None and verdict.frame.type_name == "EngineDeadError"
    assert "EngineDeadError" in repr(verdict)


def test_fault_injector_error_is_fatal() -> None:
    exc = make_engine_dead_error()
    assert type(exc).__module__ == "vllm.v1.engine.exceptions"
    assert type(exc).__name__ == "EngineDeadError"
    assert type(exc).__mro__[1] is Exception
    assert str(exc) == ENGINE_DEAD_MESSAGE
    assert classify(exc).fatal


def test_engine_generate_error_is_task_local() -> None:
    verdict = classify(_vllm_class("EngineGenerateError")("one request failed"))
    assert not verdict.fatal


def test_plain_errors_are_task_local() -> None:
    verdict = classify(ValueError("Failed to open PDF: data format error"))
    assert not verdict.fatal
    assert verdict.kind == "task_local"


def test_fatal_cause_deep_in_the_chain() -> None:
    dead = _vllm_class("EngineDeadError")(ENGINE_DEAD_MESSAGE)
    outer: BaseException = dead
    for i in range(5):
        wrapper = RuntimeError(f"layer {i}")
        wrapper.__cause__ = outer
        outer = wrapper
    verdict = classify(outer)
    assert verdict.fatal
    assert verdict.frame_index == 5


def test_fatal_member_of_a_group() -> None:
    group = ExceptionGroup("tasks", [ValueError("x"), _vllm_class("EngineDeadError")("dead")])
    verdict = classify(group)
    assert verdict.fatal
    assert verdict.frame is not None and verdict.frame.type_name == "EngineDeadError"


def test_cyclic_chain() -> None:
    a = RuntimeError("a")
    b = _vllm_class("EngineDeadError")(ENGINE_DEAD_MESSAGE)
    a.__cause__ = b
    b.__context__ = a
    assert classify(a).fatal


def test_ten_thousand_deep_chain() -> None:
    exc: BaseException = ValueError("bottom")
    for _ in range(10_000):
        wrapper = RuntimeError("w")
        wrapper.__cause__ = exc
        exc = wrapper
    assert not classify(exc).fatal


def test_raising_str_and_huge_and_surrogate_messages() -> None:
    class Weird(Exception):
        def __str__(self) -> str:
            raise ValueError("nope")

    assert not classify(Weird()).fatal
    huge = _vllm_class("EngineDeadError")("x" * 10_000_000 + ENGINE_DEAD_MESSAGE)
    assert classify(huge).fatal
    surrogate = classify(RuntimeError("bad \udcff text, engine core died \ud800"))
    assert isinstance(surrogate.excerpt, str)
    surrogate.excerpt.encode("utf-8")  # valid UTF-8, whatever came in


def test_classify_text() -> None:
    assert classify_text(
        "vllm.v1.engine.exceptions.EngineDeadError: " + ENGINE_DEAD_MESSAGE).fatal
    assert not classify_text("ValueError: not a pdf").fatal


def test_default_rules_are_shared_and_reloadable(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    first = classifier.default_rules()
    assert classifier.default_rules() is first
    assert first.sources == ("<builtin>",)
    rules_file = tmp_path / "rules.txt"
    rules_file.write_text("site.corrupt task_local bad_input corrupt\\s+widget\n",
                          encoding="utf-8")
    monkeypatch.setenv("MINERU_HEALTH_RULES", str(rules_file))
    try:
        fresh = reload_rules()
        assert classifier.default_rules() is fresh
        assert fresh.sources == ("<builtin>", str(rules_file))
        verdict = classify(RuntimeError("a corrupt   widget"))
        assert verdict.matched and verdict.rule == "site.corrupt" and not verdict.fatal
    finally:
        monkeypatch.delenv("MINERU_HEALTH_RULES")
        reload_rules()


def test_rules_file_overrides_builtin_by_id(tmp_path: Path) -> None:
    builtin = {r.id: r for r in load_rules().rules}
    some_fatal = next(r for r in builtin.values() if r.kind == RuleKind.FATAL)
    rules_file = tmp_path / "override.rules"
    rules_file.write_text(f"# carve out\n{some_fatal.id} task_local relaxed zzzz-never\n",
                          encoding="utf-8")
    merged = load_rules(rules_file)
    assert len(merged) == len(builtin)
    replaced = next(r for r in merged.rules if r.id == some_fatal.id)
    assert replaced.kind == RuleKind.TASK_LOCAL and replaced.kind_name == "task_local"


def test_task_local_rule_wins(tmp_path: Path) -> None:
    rules_file = tmp_path / "r.rules"
    rules_file.write_text("ops.known task_local known_issue known\\s+harmless\n",
                          encoding="utf-8")
    rules = load_rules(rules_file)
    exc = _vllm_class("EngineDeadError")("known harmless " + ENGINE_DEAD_MESSAGE)
    assert not classify(exc, rules=rules).fatal


def test_bad_rules_file_names_file_line_rule_and_error(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    rules_file = tmp_path / "bad.rules"
    rules_file.write_text("# ok\ngood.one fatal c fine\nbroken.rule fatal c unclosed(\n",
                          encoding="utf-8")
    monkeypatch.setenv("MINERU_HEALTH_RULES", str(rules_file))
    with pytest.raises(RulesError) as info:
        load_rules()
    error = info.value
    assert isinstance(error, ConfigError)
    assert error.variable == "MINERU_HEALTH_RULES"
    text = str(error)
    assert str(rules_file) in text and ":3" in text and "broken.rule" in text
    assert "missing )" in text  # RE2's own words
    assert len(error.errors) == 1


def test_unreadable_rules_file(tmp_path: Path) -> None:
    with pytest.raises(RulesError, match="cannot read rules file"):
        load_rules(tmp_path / "missing.rules")


def test_failed_reload_keeps_the_old_rules(tmp_path: Path) -> None:
    before = classifier.default_rules()
    bad = tmp_path / "bad.rules"
    bad.write_text("x fatal c (\n", encoding="utf-8")
    with pytest.raises(RulesError):
        reload_rules(bad)
    assert classifier.default_rules() is before


def test_explicit_rules_and_compile_errors() -> None:
    rules = Rules([Rule("only", RuleKind.FATAL, "test", "kaboom")], source="<test>")
    assert len(rules) == 1 and "1 rules" in repr(rules)
    assert classify(RuntimeError("KABOOM now"), rules=rules).fatal
    with pytest.raises(RulesError) as info:
        Rules([Rule("bad", RuleKind.FATAL, "c", "(")], source="<test>")
    assert "bad" in str(info.value)


def test_classify_from_many_threads() -> None:
    exc = _vllm_class("EngineDeadError")(ENGINE_DEAD_MESSAGE)
    results: list[bool] = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(200):
            fatal = classify(exc).fatal
            with lock:
                results.append(fatal)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 800 and all(results)

"""classify() on real exception objects; rules loading from MINERU_HEALTH_RULES."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from pathlib import Path

import pytest
from conftest import exception_groups as groups
from mineru_health import classifier
from mineru_health.classifier import (
    Classification,
    Rule,
    RuleKind,
    Rules,
    RuleScope,
    RuleTarget,
    classify,
    load_rules,
    reload_rules,
)
from mineru_health.demo.faults import ENGINE_DEAD_MESSAGE, make_engine_dead_error
from mineru_health.errors import ConfigError, RulesError
from mineru_health.frames import Via, frames_from_exception
from mineru_health.tracebacks import classify_text


def _vllm_class(name: str, base: type[Exception] = Exception) -> type[Exception]:
    cls = type(name, (base,), {})
    cls.__module__ = "vllm.v1.engine.exceptions"
    return cls


@pytest.fixture(autouse=True)
def _no_rules_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MINERU_HEALTH_RULES", raising=False)


def test_engine_dead_error_is_fatal() -> None:
    exc = _vllm_class("EngineDeadError")(ENGINE_DEAD_MESSAGE)
    verdict = classify(exc)
    assert isinstance(verdict, Classification)
    assert verdict.fatal and verdict.matched and verdict.kind == "fatal"
    assert verdict.category
    assert frames_from_exception(exc)[verdict.frame_index].type_name == "EngineDeadError"
    assert "EngineDeadError" in repr(verdict)
    assert verdict == classify(exc) and verdict != classify(ValueError("x"))


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
    group = groups.ExceptionGroup(
        "tasks", [ValueError("x"), _vllm_class("EngineDeadError")("dead")]
    )
    verdict = classify(group)
    assert verdict.fatal
    assert frames_from_exception(group)[verdict.frame_index].type_name == "EngineDeadError"


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
    assert classify_text("vllm.v1.engine.exceptions.EngineDeadError: " + ENGINE_DEAD_MESSAGE).fatal
    assert not classify_text("ValueError: not a pdf").fatal


def test_default_rules_are_shared_and_reloadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = classifier.default_rules()
    assert classifier.default_rules() is first
    assert first.sources == ("<builtin>",)
    rules_file = tmp_path / "rules.txt"
    rules_file.write_text("site.corrupt task_local bad_input corrupt\\s+widget\n", encoding="utf-8")
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
    rules_file.write_text(
        f"# carve out\n{some_fatal.id} task_local relaxed zzzz-never\n", encoding="utf-8"
    )
    merged = load_rules(rules_file)
    assert len(merged) == len(builtin)
    replaced = next(r for r in merged.rules if r.id == some_fatal.id)
    assert replaced.kind == RuleKind.TASK_LOCAL and replaced.kind_name == "task_local"


def test_task_local_rule_wins(tmp_path: Path) -> None:
    rules_file = tmp_path / "r.rules"
    rules_file.write_text("ops.known task_local known_issue known\\s+harmless\n", encoding="utf-8")
    rules = load_rules(rules_file)
    exc = _vllm_class("EngineDeadError")("known harmless " + ENGINE_DEAD_MESSAGE)
    assert not classify(exc, rules=rules).fatal


def test_bad_rules_file_names_file_line_rule_and_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rules_file = tmp_path / "bad.rules"
    rules_file.write_text(
        "# ok\ngood.one fatal c fine\nbroken.rule fatal c unclosed(\n", encoding="utf-8"
    )
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


# --- precedence on real exception objects (docs/rules.md, "Deciding") ----------------------


def _raise_in(module: str, statement: str, **names: object) -> BaseException:
    """Raises ``statement`` from code whose module is ``module``; returns the exception."""
    scope: dict[str, object] = {"__name__": module, **names}
    code = compile(f"def boom():\n    {statement}\n", f"/site-packages/{module}.py", "exec")
    exec(code, scope)  # noqa: S102 - code whose module is `module`, as if raised there
    try:
        scope["boom"]()  # type: ignore[operator]
    except BaseException as error:  # noqa: BLE001 - whatever the statement raised
        return error
    raise AssertionError("did not raise")


def test_v1_abort_engine_dead_while_handling_cancelled() -> None:
    # AsyncLLM.generate() aborts a cancelled request; abort() finds the engine
    # dead and raises EngineDeadError while handling the CancelledError.
    dead = _vllm_class("EngineDeadError")

    def generate() -> None:
        try:
            raise asyncio.CancelledError()
        except asyncio.CancelledError:
            raise dead(ENGINE_DEAD_MESSAGE)

    with pytest.raises(Exception) as info:
        generate()
    assert isinstance(info.value.__context__, asyncio.CancelledError)
    verdict = classify(info.value)
    assert verdict.fatal and verdict.rule == "vllm.engine_dead" and verdict.strength == "definitive"


def test_v0_engine_death_raised_from_the_timeout_that_killed_the_loop() -> None:
    cls = type(
        "AsyncEngineDeadError", (RuntimeError,), {"__module__": "vllm.engine.async_llm_engine"}
    )
    try:
        try:
            raise TimeoutError()
        except TimeoutError as timeout:
            raise cls("Task finished unexpectedly.") from timeout
    except RuntimeError as exc:
        verdict = classify(exc)
    assert verdict.fatal and verdict.rule == "vllm.v0.engine_dead"


def test_task_group_of_engine_deaths_and_cancelled_siblings() -> None:
    dead = _vllm_class("EngineDeadError")
    group = groups.BaseExceptionGroup(
        "unhandled errors in a TaskGroup",
        [asyncio.CancelledError(), dead(ENGINE_DEAD_MESSAGE), asyncio.CancelledError()],
    )
    verdict = classify(group)
    frame = frames_from_exception(group)[verdict.frame_index]
    assert verdict.fatal
    assert frame.via == Via.GROUP and frame.type_name == "EngineDeadError"


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.TaskGroup is new in 3.11")
def test_real_task_group() -> None:
    dead = _vllm_class("EngineDeadError")

    async def failing() -> None:
        await asyncio.sleep(0)
        raise dead(ENGINE_DEAD_MESSAGE)

    async def main() -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(asyncio.sleep(10))
            group.create_task(failing())

    with pytest.raises(groups.BaseExceptionGroup) as info:
        asyncio.run(main())
    assert classify(info.value).fatal


def test_real_anyio_task_group() -> None:
    # anyio's task groups (MinerU's, through Starlette) raise the backport's
    # exception groups on Python 3.10 and the builtin ones from 3.11.
    anyio = pytest.importorskip("anyio")
    dead = _vllm_class("EngineDeadError")

    async def failing() -> None:
        await anyio.sleep(0)
        raise dead(ENGINE_DEAD_MESSAGE)

    async def main() -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(anyio.sleep, 10)
            group.start_soon(failing)

    with pytest.raises(groups.BaseExceptionGroup) as info:
        anyio.run(main)
    verdict = classify(info.value)
    assert verdict.fatal and verdict.frame_index >= 0
    frame = frames_from_exception(info.value)[verdict.frame_index]
    assert frame.via == Via.GROUP and frame.type_name == "EngineDeadError"


def test_timeout_alone_is_generic_task_local() -> None:
    verdict = classify(_raise_in("asyncio.timeouts", "raise TimeoutError()"))
    assert not verdict.fatal and verdict.strength == "generic" and verdict.kind == "task_local"


# --- untrusted text never decides ------------------------------------------------------------


def test_crafted_docx_tag_named_engine_dead_error() -> None:
    lxml_etree = pytest.importorskip("lxml.etree")
    with pytest.raises(Exception) as info:
        lxml_etree.fromstring(
            b'<w:document xmlns:w="urn:w"><EngineDeadError>EngineCore encountered an issue. '
            b"CUDA error: an illegal memory access was encountered</w:body></w:document>"
        )
    verdict = classify(info.value)
    assert not verdict.fatal
    assert verdict.category == "bad_input"


@pytest.mark.parametrize(
    ("module", "fatal"),
    [
        ("torch.cuda", True),
        ("vllm.v1.worker.gpu_model_runner", True),
        ("torch_npu.npu.utils", True),
        ("mineru.backend.office.docx_analyze", False),
        ("mineru.utils.pdf_reader", False),
        ("pypdfium2._helpers.document", False),
        ("docx.oxml.parser", False),
        ("myapp.handlers", False),
    ],
)
def test_message_rules_decide_only_for_runtime_raise_sites(module: str, fatal: bool) -> None:
    exc = _raise_in(
        module, "raise RuntimeError('CUDA error: an illegal memory access was encountered')"
    )
    frames = frames_from_exception(exc)
    assert frames[0].raised_in == module
    assert classify(exc).fatal is fatal


def test_message_naming_engine_dead_error_is_not_one() -> None:
    exc = _raise_in("vllm.entrypoints.llm", "raise RuntimeError('EngineDeadError')")
    assert not classify(exc).matched


# --- remote engines and ambiguous errors ----------------------------------------------------


def _server_error(message: str) -> BaseException:
    cls = type(
        "ServerError", (RuntimeError,), {"__module__": "mineru_vl_utils.vlm_client.base_client"}
    )
    return _raise_in(
        "mineru_vl_utils.vlm_client.http_client",
        "raise ServerError(text)",
        ServerError=cls,
        text=message,
    )


def test_remote_engine_death_text_is_task_local() -> None:
    exc = _server_error(
        'Unexpected status code: [500], response body: {"message": '
        '"EngineCore encountered an issue. See stack trace (above)"}'
    )
    verdict = classify(exc, remote_engine=True)
    assert not verdict.fatal and verdict.remote_engine and verdict.category == "remote_engine"
    assert not classify(exc).fatal  # an HTTP client never speaks for a local engine either


def test_remote_engine_keeps_local_device_faults_fatal() -> None:
    exc = _raise_in("torch.cuda", "raise RuntimeError('CUDA error: unspecified launch failure')")
    verdict = classify(exc, remote_engine=True)
    assert verdict.fatal and not verdict.remote_engine


def test_remote_engine_downgrades_text_without_origin() -> None:
    verdict = classify_text("EngineCore encountered an issue.", remote_engine=True)
    assert not verdict.fatal and verdict.remote_engine and verdict.rule == "vllm.engine_core_issue"


def test_standalone_out_of_memory_is_ambiguous() -> None:
    oom = type("OutOfMemoryError", (RuntimeError,), {"__module__": "torch"})
    exc = _raise_in(
        "torch.nn.modules.conv",
        "raise OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')",
        OutOfMemoryError=oom,
    )
    verdict = classify(exc)
    assert verdict.ambiguous and not verdict.fatal and verdict.kind == "ambiguous"
    assert verdict.strength == "ambiguous" and verdict.category == "out_of_memory"
    inside_engine = _raise_in(
        "vllm.v1.worker.gpu_model_runner", "raise OutOfMemoryError('x')", OutOfMemoryError=oom
    )
    assert classify(inside_engine).fatal


# --- operator rules ---------------------------------------------------------------------------


def test_operator_rule_beats_builtins_and_off_disables(tmp_path: Path) -> None:
    rules_file = tmp_path / "ops.rules"
    rules_file.write_text(
        "site.oom fatal device target=message origin=engine out of memory\n"
        "cuda.launch_failure off\n",
        encoding="utf-8",
    )
    rules = load_rules(rules_file)
    assert "cuda.launch_failure" not in {r.id for r in rules.rules}
    site = next(r for r in rules.rules if r.id == "site.oom")
    assert site.from_operator and site.target == RuleTarget.MESSAGE
    assert site.scope == RuleScope.ENGINE
    assert "target=message origin=engine" in site.to_line()
    oom = _raise_in("torch.cuda", "raise RuntimeError('CUDA out of memory')")
    assert classify(oom, rules=rules).rule == "site.oom"
    launch = _raise_in("torch.cuda", "raise RuntimeError('unspecified launch failure')")
    assert not classify(launch, rules=rules).matched


# --- bounded rules files (issue 10) -------------------------------------------------------


def test_rules_file_that_is_not_a_small_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big.rules"
    big.write_bytes(b"#" * (classifier.MAX_RULES_FILE_BYTES + 1))
    for path, words in (
        (fifo, "a FIFO"),
        (Path("/dev/zero"), "a character device"),
        (tmp_path, "a directory"),
        (big, "larger than the limit"),
    ):
        with pytest.raises(RulesError, match=words):
            load_rules(path)


def test_rules_file_with_too_many_or_too_costly_rules(tmp_path: Path) -> None:
    many = tmp_path / "many.rules"
    many.write_text(
        "".join(
            f"site.r{i} fatal x literal{i}\n" for i in range(classifier.MAX_RULES_FILE_RULES + 1)
        )
    )
    with pytest.raises(RulesError, match="more than 2000 rules"):
        load_rules(many)
    evil = tmp_path / "evil.rules"
    evil.write_text("".join(f"evil.{i} fatal x a[ab]{{14,19}}c{i}q\n" for i in range(40)))
    with pytest.raises(RulesError) as info:
        load_rules(evil)
    assert "evil.0" in str(info.value) and "too costly" in str(info.value)
    assert len(info.value.errors) == 40


def test_adversarial_inputs_stay_bounded(tmp_path: Path) -> None:
    """Issue 10: a 100,000-rule file, and the heaviest accepted rules on a 64 x 1 MB chain."""
    import time

    huge = tmp_path / "huge.rules"
    huge.write_text("".join(f"site.r{i} fatal x a[ab]+c{i}q\n" for i in range(100_000)))
    start = time.perf_counter()
    with pytest.raises(RulesError, match="larger than the limit"):
        load_rules(huge)
    assert time.perf_counter() - start < 2.0

    # The costly pattern's accepted cousin (a run of 8 classes), 40 times.
    heavy = tmp_path / "heavy.rules"
    heavy.write_text("".join(f"heavy.{i} fatal x a[ab]{{1,6}}c{i}q\n" for i in range(40)))
    rules = load_rules(heavy)
    chain: BaseException = RuntimeError("ab" * (1 << 19))
    for _ in range(63):
        outer = RuntimeError("ab" * (1 << 19))
        outer.__cause__ = chain
        chain = outer
    for rule_set in (rules, classifier.default_rules()):
        start = time.perf_counter()
        verdict = rule_set.classify(chain)
        assert time.perf_counter() - start < 2.0
        assert not verdict.fatal
    one_mb = RuntimeError("ab" * (1 << 19) + "ab1q")
    start = time.perf_counter()
    rules.classify(one_mb)
    assert time.perf_counter() - start < 2.0


# MinerU 4.0's llama.cpp client (mineru_vl_utils' LlamaCppEngineVlmClient) catches the binding's
# EngineError and raises its own ServerError while handling it: the engine's error is the
# ServerError's __context__, raised in mineru_llama_cpp.engine.
_LLAMA_ENGINE = """
class MineruLlamaCppError(Exception):
    pass

class EngineError(MineruLlamaCppError):
    pass

def generate(message):
    raise EngineError(message)
"""
_LLAMA_CLIENT = """
class ServerError(RuntimeError):
    pass

def predict(generate, message):
    try:
        generate(message)
    except Exception as e:
        raise ServerError(str(e))
"""


def _module_namespace(name: str, source: str, class_module: str) -> dict[str, object]:
    namespace: dict[str, object] = {"__name__": name}
    exec(compile(source, f"<{name}>", "exec"), namespace)  # noqa: S102 - fixed test source
    for value in namespace.values():
        if isinstance(value, type):
            value.__module__ = class_module
    return namespace


def _llama_client_failure(message: str) -> BaseException:
    engine = _module_namespace(
        "mineru_llama_cpp.engine", _LLAMA_ENGINE, "mineru_llama_cpp.exceptions"
    )
    client = _module_namespace(
        "mineru_vl_utils.vlm_client.llama_cpp_engine_client",
        _LLAMA_CLIENT,
        "mineru_vl_utils.vlm_client.base_client",
    )
    try:
        client["predict"](engine["generate"], message)  # type: ignore[operator]
    except Exception as exc:  # noqa: BLE001 - the exception under test
        return exc
    raise AssertionError("predict did not raise")


@pytest.mark.parametrize(
    ("message", "kind", "rule"),
    [
        ("no result (stopped)", "fatal", "llama.engine_stopped"),
        ("decode() failed: vk::Queue::submit: ErrorDeviceLost", "fatal", "vulkan.device_lost"),
        ("Compute error.", "ambiguous", "llama.compute_error"),
        ("Context size has been exceeded.", "task_local", "llama.context_exceeded_message"),
        ("Invalid input batch.", "task_local", "llama.invalid_batch"),
    ],
)
def test_llama_cpp_error_behind_minerus_server_error(message: str, kind: str, rule: str) -> None:
    exc = _llama_client_failure(message)
    frames = frames_from_exception(exc)
    assert [(f.type_name, f.raised_in, f.via) for f in frames] == [
        ("ServerError", "mineru_vl_utils.vlm_client.llama_cpp_engine_client", Via.ROOT),
        ("EngineError", "mineru_llama_cpp.engine", Via.CONTEXT),
    ]
    verdict = classify(exc)
    assert (verdict.kind, verdict.rule, verdict.frame_index) == (kind, rule, 1), verdict
    assert not verdict.remote_engine


def test_llama_cpp_text_in_minerus_own_error_never_decides() -> None:
    client = _module_namespace(
        "mineru_vl_utils.vlm_client.llama_cpp_engine_client",
        _LLAMA_CLIENT,
        "mineru_vl_utils.vlm_client.base_client",
    )
    server_error = client["ServerError"]
    assert isinstance(server_error, type)
    verdict = classify(server_error("no result (stopped); Compute error."))
    assert not verdict.fatal and not verdict.ambiguous and not verdict.matched

"""frames_from_exception: order, chains, groups, cycles, bounds, raise sites."""

from __future__ import annotations

from conftest import exception_groups as groups
from mineru_health.frames import Via, frames_from_exception


def _raise_chain() -> BaseException:
    try:
        try:
            raise ValueError("root cause")
        except ValueError as inner:
            raise RuntimeError("wrapper") from inner
    except RuntimeError as outer:
        return outer
    raise AssertionError("unreachable")


def test_frame_fields_and_order() -> None:
    frames = frames_from_exception(_raise_chain())
    assert [f.type_name for f in frames] == ["RuntimeError", "ValueError"]
    assert frames[0].module == "builtins"
    assert frames[0].bases == ("Exception", "BaseException")
    assert frames[1].message == "root cause"
    assert str(frames[1]) == "ValueError: root cause"


def test_custom_module_and_bases() -> None:
    class Base(Exception):
        pass

    class EngineDeadError(Base):
        pass

    EngineDeadError.__module__ = "vllm.v1.engine.exceptions"
    frame = frames_from_exception(EngineDeadError("x"))[0]
    assert frame.qualified_name == "vllm.v1.engine.exceptions.EngineDeadError"
    assert frame.bases == ("Base", "Exception", "BaseException")


def test_context_followed_unless_suppressed() -> None:
    try:
        try:
            raise KeyError("k")
        except KeyError:
            raise TypeError("during handling")  # the implicit __context__ is the point
    except TypeError as exc:
        assert [f.type_name for f in frames_from_exception(exc)] == ["TypeError", "KeyError"]
        exc.__suppress_context__ = True
        assert [f.type_name for f in frames_from_exception(exc)] == ["TypeError"]


def test_exception_group_members() -> None:
    group = groups.ExceptionGroup(
        "many", [ValueError("a"), groups.BaseExceptionGroup("inner", [KeyError("b")])]
    )
    names = [f.type_name for f in frames_from_exception(group)]
    # BaseExceptionGroup of plain Exceptions is constructed as an ExceptionGroup.
    assert names == ["ExceptionGroup", "ValueError", "ExceptionGroup", "KeyError"]
    assert frames_from_exception(group)[2].message.startswith("inner")


def test_cycle_is_cut() -> None:
    first = ValueError("a")
    second = RuntimeError("b")
    first.__cause__ = second
    second.__cause__ = first
    assert [f.type_name for f in frames_from_exception(first)] == ["ValueError", "RuntimeError"]


def test_ten_thousand_deep_chain_is_bounded_and_iterative() -> None:
    exc: BaseException = ValueError("deepest")
    for i in range(10_000):
        wrapper = RuntimeError(f"level {i}")
        wrapper.__cause__ = exc
        exc = wrapper
    frames = frames_from_exception(exc)
    assert len(frames) == 64
    assert frames[0].message == "level 9999"
    assert len(frames_from_exception(exc, max_frames=3)) == 3
    assert frames_from_exception(exc, max_frames=0) == []


def test_raising_str_gives_a_placeholder() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    frame = frames_from_exception(Unprintable())[0]
    assert frame.message == "<unprintable Unprintable: RuntimeError in __str__>"


def test_huge_message_is_capped_head_and_tail() -> None:
    message = "H" * 5_000_000 + "MIDDLE" + "T" * 5_000_000
    frame = frames_from_exception(ValueError(message))[0]
    assert len(frame.message) < 2_000_000
    assert frame.message.startswith("HHH") and frame.message.endswith("TTT")
    small = frames_from_exception(ValueError(message), max_message_chars=100)[0]
    assert len(small.message) < 200


def _raise_in(module: str, statement: str) -> BaseException:
    scope: dict[str, object] = {"__name__": module}
    exec(compile(f"def boom():\n    {statement}\n", "x.py", "exec"), scope)  # noqa: S102
    try:
        scope["boom"]()  # type: ignore[operator]
    except BaseException as error:  # noqa: BLE001
        return error
    raise AssertionError("did not raise")


def test_raise_site_via_and_depth_from_objects() -> None:
    exc = _raise_in("torch.cuda", "raise RuntimeError('outer') from ValueError('made here')")
    frames = frames_from_exception(exc)
    assert [(f.raised_in, f.via, f.depth) for f in frames] == [
        ("torch.cuda", Via.ROOT, 0),
        ("torch.cuda", Via.CAUSE, 1),
    ]  # never raised: inherits
    try:
        try:
            raise _raise_in("lxml.etree", "raise ValueError('doc')")
        except ValueError:
            raise KeyError("k")
    except KeyError as outer:
        frames = frames_from_exception(outer)
    assert [(f.type_name, f.via, f.raised_in) for f in frames] == [
        ("KeyError", Via.ROOT, __name__),
        ("ValueError", Via.CONTEXT, "lxml.etree"),
    ]

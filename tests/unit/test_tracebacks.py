"""frames_from_text: printed tracebacks (chains, groups, log prefixes, raise sites) and messages."""

from __future__ import annotations

import traceback

import pytest
from conftest import exception_groups as groups
from mineru_health.frames import Frame, Via
from mineru_health.tracebacks import frames_from_text


def test_traceback_text_chain_is_outermost_first() -> None:
    try:
        raise RuntimeError("wrapper") from ValueError("root cause")
    except RuntimeError as outer:
        text = "".join(traceback.format_exception(outer))
    frames = frames_from_text(text)
    assert [(f.module, f.type_name, f.message) for f in frames] == [
        ("", "RuntimeError", "wrapper"),
        ("", "ValueError", "root cause"),
    ]


def test_traceback_text_during_handling_and_qualified_names() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "a.py", line 1, in <module>\n'
        "    x()\n"
        "zmq.error.ZMQError: Socket closed\n"
        "\n"
        "During handling of the above exception, another exception occurred:\n"
        "\n"
        "Traceback (most recent call last):\n"
        '  File "b.py", line 2, in f\n'
        "    raise EngineDeadError()\n"
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n"
        "second line of the message\n"
    )
    frames = frames_from_text(text)
    assert frames[0] == Frame(
        "vllm.v1.engine.exceptions",
        "EngineDeadError",
        (),
        "EngineCore encountered an issue.\nsecond line of the message",
    )
    assert (frames[1].module, frames[1].type_name) == ("zmq.error", "ZMQError")


def test_traceback_text_exception_group() -> None:
    group = groups.ExceptionGroup("eg", [ValueError("one"), TypeError("two")])
    text = "".join(traceback.format_exception(group))
    names = [f.type_name for f in frames_from_text(text)]
    assert names == ["ExceptionGroup", "ValueError", "TypeError"]
    try:
        raise group
    except groups.ExceptionGroup as raised:
        text = "".join(traceback.format_exception(raised))
    frames = frames_from_text(text)
    assert [f.type_name for f in frames] == ["ExceptionGroup", "ValueError", "TypeError"]
    assert frames[1].message == "one"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("EngineCore encountered an issue.", Frame("", "", (), "EngineCore encountered an issue.")),
        ("ValueError: bad pdf", Frame("", "ValueError", (), "bad pdf")),
        ("torch.OutOfMemoryError", Frame("torch", "OutOfMemoryError", (), "")),
        ("Timeout", Frame("", "", (), "Timeout")),
        # "Name: text" is an exception line only when Name looks like a class.
        (
            "Failed: Cuda error x.cuh:455 'invalid argument'",
            Frame("", "", (), "Failed: Cuda error x.cuh:455 'invalid argument'"),
        ),
        ("EI0009: Transport init error.", Frame("", "", (), "EI0009: Transport init error.")),
        ("KeyboardInterrupt: ", Frame("", "KeyboardInterrupt", (), "")),
        (
            "vllm.v1.engine.exceptions.EngineDeadError: x",
            Frame("vllm.v1.engine.exceptions", "EngineDeadError", (), "x"),
        ),
    ],
)
def test_plain_messages(text: str, expected: Frame) -> None:
    assert frames_from_text(text) == [expected]


def test_raise_site_and_links_from_text() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3.12/asyncio/tasks.py", line 1, in f\n'
        "asyncio.exceptions.CancelledError\n"
        "\n"
        "During handling of the above exception, another exception occurred:\n"
        "\n"
        "(APIServer pid=12) ERROR 01-30 12:21:32 [async_llm.py:480] Traceback (most recent "
        "call last):\n"
        '(APIServer pid=12) ERROR 01-30 12:21:32 [async_llm.py:480]   File "/opt/venv/lib/'
        'python3.12/site-packages/vllm/v1/engine/async_llm.py", line 2, in abort\n'
        "(APIServer pid=12) ERROR 01-30 12:21:32 [async_llm.py:480] vllm.v1.engine.exceptions."
        "EngineDeadError: EngineCore encountered an issue.\n"
    )
    frames = frames_from_text(text)
    assert [(f.type_name, f.raised_in, f.via, f.depth) for f in frames] == [
        ("EngineDeadError", "vllm.v1.engine.async_llm", Via.ROOT, 0),
        ("CancelledError", "asyncio.tasks", Via.CONTEXT, 1),
    ]


def test_cython_and_checkout_paths() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "src/lxml/etree.pyx", line 3541, in lxml.etree.XML\n'
        "lxml.etree.XMLSyntaxError: tag mismatch\n"
    )
    assert frames_from_text(text)[0].raised_in == "lxml.etree"
    checkout = (
        "Traceback (most recent call last):\n"
        '  File "/vllm-workspace/vllm/vllm/v1/engine/core_client.py", line 9, in get\n'
        "RuntimeError: x\n"
    )
    assert frames_from_text(checkout)[0].raised_in == "vllm.v1.engine.core_client"

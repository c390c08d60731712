"""``mineru-health probe`` (cli.probe_urls) against loopback fake workers."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import pytest
from fake_fleet import HOSTILE_ERROR, Fleet
from mineru_health.cli import probe_urls
from mineru_health.errors import ConfigError
from mineru_health.runtime.settings import HealthSettings
from mineru_health.safe_text import printable


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    with Fleet() as running:
        yield running


def test_probe_urls_table_and_exit_codes(fleet: Fleet) -> None:
    out = io.StringIO()
    settings = HealthSettings()
    code = probe_urls([fleet.url("healthy")], timeout_s=1.0, settings=settings, out=out)
    assert code == 0
    header, row = out.getvalue().splitlines()
    assert header.split()[:4] == ["URL", "STATUS", "HTTP", "LATENCY_MS"]
    assert row.startswith(fleet.url("healthy")) and " healthy " in row

    out = io.StringIO()
    code = probe_urls(
        [fleet.url("healthy"), fleet.url("engine_dead"), fleet.refused_url],
        timeout_s=1.0,
        settings=settings,
        out=out,
    )
    assert code == 1
    assert "engine_dead" in out.getvalue() and "connect_error" in out.getvalue()


def test_probe_urls_json(fleet: Fleet) -> None:
    out = io.StringIO()
    code = probe_urls(
        [fleet.url("healthy") + "/health", fleet.url("hang")],
        timeout_s=0.3,
        as_json=True,
        settings=HealthSettings(),
        out=out,
    )
    rows = json.loads(out.getvalue())
    assert code == 1
    assert [r["status"] for r in rows] == ["healthy", "timeout"]
    assert rows[0]["healthy"] is True and rows[0]["http_status"] == 200
    assert set(rows[1]) == {"url", "healthy", "status", "http_status", "latency_ms", "detail"}


def test_probe_urls_expected_status_for_other_engines(fleet: Fleet) -> None:
    # {"status": "starting"} with load fields is healthy once "starting" is what is expected.
    out = io.StringIO()
    code = probe_urls(
        [fleet.url("bad_status")], expected_status="starting", settings=HealthSettings(), out=out
    )
    assert code == 0


def test_probe_urls_bad_timeout_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        probe_urls(["http://127.0.0.1:9"], timeout_s=0, settings=HealthSettings())


def test_probe_urls_no_urls_is_unhealthy() -> None:
    assert probe_urls([], settings=HealthSettings(), out=io.StringIO()) == 1


# --- text from workers never reaches the terminal raw (issue 10, item 7) -------------------


def _raw_controls(text: str) -> set[str]:
    return {
        c
        for c in text
        if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F or c in "\u202e\u2028"
    }


def test_table_escapes_control_characters_from_workers(fleet: Fleet) -> None:
    fleet.set("hostile", "hostile")
    out = io.StringIO()
    code = probe_urls([fleet.url("hostile")], timeout_s=1.0, settings=HealthSettings(), out=out)
    assert code == 1
    text = out.getvalue()
    assert not _raw_controls(text), _raw_controls(text)
    lines = text.splitlines()
    assert len(lines) == 2, lines  # the header and one row: no forged line
    assert "\\x0a2026-01-01 INFO all good" in lines[1]
    assert "\\x1b[31mred\\x1b[0m\\x1b[2J\\u202eevil\\x0d" in lines[1]


def test_json_keeps_the_worker_text_as_it_is(fleet: Fleet) -> None:
    fleet.set("hostile", "hostile")
    out = io.StringIO()
    probe_urls(
        [fleet.url("hostile")], timeout_s=1.0, as_json=True, settings=HealthSettings(), out=out
    )
    assert "\x1b" not in out.getvalue()  # json.dumps escapes it
    (row,) = json.loads(out.getvalue())
    assert HOSTILE_ERROR in row["detail"]


def test_urls_are_escaped_too() -> None:
    out = io.StringIO()
    probe_urls(["http://127.0.0.1:9/\x1b[2J"], timeout_s=0.2, settings=HealthSettings(), out=out)
    assert "\x1b" not in out.getvalue() and "\\x1b[2J" in out.getvalue()


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain text, ünïcödé, 中文", "plain text, ünïcödé, 中文"),
        ("a\nb\r\tc", "a\\x0ab\\x0d\\x09c"),
        ("\x1b[31mred", "\\x1b[31mred"),
        ("\x9b31m", "\\x9b31m"),  # the one-byte CSI
        ("\x7f", "\\x7f"),
        ("left\u202eright\u2066x\u2069", "left\\u202eright\\u2066x\\u2069"),
        ("line\u2028sep", "line\\u2028sep"),
        ("bad byte \udcff", "bad byte \\udcff"),
    ],
)
def test_printable(raw: str, shown: str) -> None:
    assert printable(raw) == shown

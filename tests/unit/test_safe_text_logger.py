"""Every log line of ours goes through the printable filter (issue 17: an ESC in an upload name)."""

from __future__ import annotations

import logging

import pytest
from mineru_health import safe_text


def test_a_log_line_cannot_be_forged_or_rewritten(caplog: pytest.LogCaptureFixture) -> None:
    log = safe_text.logger("mineru_health.router.tasks")
    assert safe_text.logger("mineru_health.router.tasks") is log
    assert len(log.filters) == 1  # added once
    with caplog.at_level(logging.INFO, logger="mineru_health.router.tasks"):
        log.warning("task %s: failed (%s)", "t1", "doc\x1b[2J.pdf\nINFO forged line")
    (record,) = caplog.records
    assert record.getMessage() == "task t1: failed (doc\\x1b[2J.pdf\\x0aINFO forged line)"
    assert "\n" not in caplog.text.rstrip("\n") and "\x1b" not in caplog.text

"""How the router words what happens to a worker: one bounded line per reason, one log
line per audit record, one base URL per worker whatever form an operator gave it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from mineru_health import safe_text
from mineru_health._names import enum_name

__all__ = ["REASON_CHARS", "base_url_of", "log_audit", "probe_reason", "short_reason"]

_log = safe_text.logger("mineru_health.router")

# A reason longer than this is cut in audit reasons, last_error and logs.
REASON_CHARS = 300


def short_reason(text: str) -> str:
    """One line, at most REASON_CHARS characters."""
    text = " ".join(text.split())
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 3] + "..."


def log_audit(record: Mapping[str, Any], *, in_rotation: bool) -> None:
    """One plain-text log line per audit record; the reason can quote a worker's answer,
    so it is escaped (a newline or an ANSI escape never forges or repaints a line)."""
    _log.log(
        logging.INFO if in_rotation else logging.WARNING,
        "worker %s: %s (%s)",
        record["worker_id"],
        record["action"],
        safe_text.printable(str(record["reason"])),
    )


def probe_reason(probe: Any) -> str:
    """A failed probe's classification, as ``last_error`` shows it."""
    return short_reason(f"{enum_name(probe.status)}: {probe.detail}")


def base_url_of(url: str) -> str:
    """A worker's base URL from a URL an operator gave (``/health`` and trailing ``/`` cut)."""
    return url.strip().rstrip("/").removesuffix("/health")

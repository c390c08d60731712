"""The worker runtime's log line, through MinerU's own logger (loguru) when it has one."""

from __future__ import annotations

import sys

from ...safe_text import printable

__all__ = ["log"]


def log(level: str, message: str) -> None:
    # Messages quote exceptions and task texts: escaped for the plain-text log.
    message = printable(message)
    try:
        from loguru import logger

        logger.opt(depth=1).log(level, "mineru-health: {}", message)
    except Exception:  # noqa: BLE001 - loguru missing or misconfigured: stderr still works
        print(f"mineru-health {level}: {message}", file=sys.stderr, flush=True)

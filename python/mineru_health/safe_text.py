"""Text from workers and exceptions made safe for a terminal or a plain-text log line.

A worker's ``/health`` error text or an exception message can carry newlines
(forged log lines), ANSI escape sequences (a rewritten terminal) or bidi
controls (text that reads differently than it is). ``printable`` replaces each
such character with a visible escape; JSON output needs none of this
(``json.dumps`` escapes control characters itself)::

    >>> printable("engine died\\n\\x1b[32mINFO all good")
    'engine died\\\\x0a\\\\x1b[32mINFO all good'
"""

from __future__ import annotations

import logging
import re

__all__ = ["logger", "printable"]

# C0 and C1 controls and DEL; line/paragraph separators; bidi marks, embeddings,
# overrides and isolates; lone surrogates (undecodable bytes kept by
# surrogateescape, which a UTF-8 stream cannot even encode).
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
    "\ud800-\udfff]"
)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every control, bidi or surrogate character shown as an escape."""
    return _UNSAFE.sub(_escape, text)


class _PrintableFilter(logging.Filter):
    """Escapes a record's formatted message: its arguments may quote a worker or a user."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        safe = printable(message)
        if safe != message:
            record.msg, record.args = safe, None
        return True


_FILTER = _PrintableFilter()


def logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)`` whose every line goes through :func:`printable`.

    An uploaded file name or a worker's answer with a newline or an ESC
    sequence in it then cannot forge or rewrite a line of the log. The
    exception text a ``logger.exception`` adds is the traceback Python
    formats; handlers print it on lines of its own.
    """
    log = logging.getLogger(name)
    if _FILTER not in log.filters:
        log.addFilter(_FILTER)
    return log

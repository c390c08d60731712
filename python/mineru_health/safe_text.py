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

__all__ = [
    "MAX_ERROR_CHARS",
    "describe_exception",
    "exception_type_name",
    "logger",
    "printable",
    "valid_utf8",
]

#: Cap on the error text kept natively; the full traceback goes to the log.
MAX_ERROR_CHARS = 2000

# C0 and C1 controls and DEL; line/paragraph separators; bidi marks, embeddings,
# overrides and isolates; lone surrogates (undecodable bytes kept by
# surrogateescape, which a UTF-8 stream cannot even encode).
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
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


def describe_exception(exc: BaseException) -> str:
    """``"TypeName: message"``, short and safe to put in a JSON body."""
    try:
        message = str(exc)
    except Exception as error:  # noqa: BLE001 - a broken __str__ must not hide the failure
        message = f"<unprintable: {type(error).__name__} in __str__>"
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 3] + "..."
    return valid_utf8(text)


def exception_type_name(exc: BaseException) -> str:
    """``module.Type`` of ``exc`` (just ``Type`` for builtins): safe to publish."""
    cls = type(exc)
    module = getattr(cls, "__module__", "") or ""
    name = getattr(cls, "__qualname__", cls.__name__)
    return name if module in ("", "builtins") else f"{module}.{name}"


def valid_utf8(text: str) -> str:
    """``text`` with lone surrogates as U+FFFD: JSON and the native side want valid UTF-8."""
    return text.encode("utf-8", "replace").decode("utf-8")

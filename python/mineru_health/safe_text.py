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

import re

__all__ = ["printable"]

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

"""Turn an exception (or a printed traceback) into classifier frames.

A *frame* is one exception of a failure chain: its module, class name, base
class names and message. Frames are listed outermost first: the exception that
was caught, then what it wraps (``__cause__``, else ``__context__`` unless
suppressed) and the members of exception groups.

    >>> try:
    ...     raise RuntimeError("wrapper") from ValueError("root")
    ... except RuntimeError as exc:
    ...     [f.type_name for f in frames_from_exception(exc)]
    ['RuntimeError', 'ValueError']

Everything here is iterative and bounded: a 10,000-deep chain, a cycle, a
``__str__`` that raises or a 10 MB message all give a result in linear time.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

__all__ = [
    "DEFAULT_MAX_FRAMES",
    "DEFAULT_MAX_MESSAGE_CHARS",
    "Frame",
    "frames_from_exception",
    "frames_from_text",
]

#: Frames beyond this are dropped; the classifier looks at no more either.
DEFAULT_MAX_FRAMES = 64
#: Longer messages keep their head and tail. The native classifier bounds
#: bytes too; cutting here first keeps the UTF-8 encoding step small.
DEFAULT_MAX_MESSAGE_CHARS = 1 << 20

_ELISION = "\n[... message truncated by mineru-health ...]\n"


@dataclass(frozen=True, slots=True)
class Frame:
    """One exception of a failure chain."""

    module: str
    type_name: str
    bases: tuple[str, ...] = ()
    message: str = ""

    @property
    def qualified_name(self) -> str:
        """``module.TypeName``, or just the type name when the module is unknown or builtins."""
        if self.module and self.module != "builtins":
            return f"{self.module}.{self.type_name}"
        return self.type_name

    def __str__(self) -> str:
        name = self.qualified_name
        if not name:
            return self.message
        return f"{name}: {self.message}" if self.message else name


def _cap(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    half = max(max_chars // 2, 1)
    return text[:half] + _ELISION + text[-half:]


def _safe_message(exc: BaseException, max_chars: int) -> str:
    try:
        text = str(exc)
    except Exception as error:  # noqa: BLE001 - a broken __str__ must not hide the failure
        return f"<unprintable {type(exc).__name__}: {type(error).__name__} in __str__>"
    return _cap(text, max_chars)


@functools.lru_cache(maxsize=1024)
def _class_names(cls: type) -> tuple[str, str, tuple[str, ...]]:
    # A class's names never change; failures repeat the same few classes.
    module = getattr(cls, "__module__", None)
    bases = tuple(
        getattr(base, "__name__", "?") for base in cls.__mro__[1:] if base is not object
    )
    return (module if isinstance(module, str) else "", cls.__name__, bases)


def _frame_of(exc: BaseException, max_chars: int) -> Frame:
    module, type_name, bases = _class_names(type(exc))  # type: ignore[arg-type]
    return Frame(module, type_name, bases, _safe_message(exc, max_chars))


def frames_from_exception(
    exc: BaseException,
    *,
    max_frames: int = DEFAULT_MAX_FRAMES,
    max_message_chars: int = DEFAULT_MAX_MESSAGE_CHARS,
) -> list[Frame]:
    """Frames of ``exc`` and everything it wraps, outermost first, depth first.

    Each exception appears once (cycles are cut by identity); at most
    ``max_frames`` frames are returned.
    """
    if max_frames <= 0:
        return []
    frames: list[Frame] = []
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    while stack and len(frames) < max_frames:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        frames.append(_frame_of(current, max_message_chars))

        children: list[BaseException] = []
        cause = current.__cause__
        if isinstance(cause, BaseException):
            children.append(cause)
        elif not current.__suppress_context__ and isinstance(
            current.__context__, BaseException
        ):
            children.append(current.__context__)
        if isinstance(current, BaseExceptionGroup):
            children.extend(e for e in current.exceptions if isinstance(e, BaseException))
        # Pushed in reverse so the first child is visited next (pre-order).
        stack.extend(reversed(children))
    return frames


# --- traceback text -------------------------------------------------------------------------

_CHAIN_SEPARATORS = (
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)
_TRACEBACK_HEADER = re.compile(r"^(?:Exception Group )?Traceback \(most recent call last\):")
_GROUP_RULE = re.compile(r"^\s*\+[-+]")
_GROUP_PREFIX = re.compile(r"^\s*[|+] ?")
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::(?: (.*))?)?$")


@dataclass(slots=True)
class _Pending:
    name: str
    lines: list[str]


def _split_name(name: str) -> tuple[str, str]:
    module, dot, type_name = name.rpartition(".")
    return (module, type_name) if dot else ("", name)


def _frames_of_block(lines: list[str], max_chars: int) -> list[Frame]:
    """Exception lines of one traceback block (a group prints several)."""
    found: list[_Pending] = []
    current: _Pending | None = None
    for line in lines:
        if _TRACEBACK_HEADER.match(line) or _GROUP_RULE.match(line):
            current = None
            continue
        if not line.strip():
            continue
        if line[0].isspace():
            # Traceback body (File ... / source line); ends any message.
            current = None
            continue
        if current is not None:
            current.lines.append(line)  # a multi-line message or a note
            continue
        match = _EXCEPTION_LINE.match(line)
        if match:
            current = _Pending(match.group(1), [match.group(2) or ""])
        else:
            current = _Pending("", [line])
        found.append(current)
    frames = []
    for pending in found:
        module, type_name = _split_name(pending.name)
        message = _cap("\n".join(pending.lines).strip("\n"), max_chars)
        frames.append(Frame(module=module, type_name=type_name, message=message))
    return frames


def frames_from_text(
    text: str,
    *,
    max_frames: int = DEFAULT_MAX_FRAMES,
    max_message_chars: int = DEFAULT_MAX_MESSAGE_CHARS,
) -> list[Frame]:
    """Frames from a printed Python traceback (or a bare error message), outermost first.

    Understands the ``Traceback (most recent call last):`` blocks Python prints,
    the two chain separators ("direct cause" / "during handling") and the
    ``| ``-prefixed layout of exception groups. Text that is not a traceback
    becomes a single frame: ``module.Type: message`` when the first line looks
    like that, otherwise the whole text as the message.
    """
    if max_frames <= 0:
        return []
    raw_lines = text.splitlines()
    grouped = any(
        "Exception Group Traceback" in line or _GROUP_RULE.match(line) for line in raw_lines
    )
    blocks: list[list[str]] = [[]]
    for raw in raw_lines:
        line = raw
        if grouped and not _GROUP_RULE.match(raw):
            line = _GROUP_PREFIX.sub("", raw, count=1) if raw.lstrip()[:1] in ("|", "+") else raw
        if line.strip() in _CHAIN_SEPARATORS:
            blocks.append([])
            continue
        blocks[-1].append(line)

    has_traceback = grouped or any(
        _TRACEBACK_HEADER.match(line) for block in blocks for line in block
    )
    if not has_traceback:
        stripped = text.strip()
        first, _, rest = stripped.partition("\n")
        match = _EXCEPTION_LINE.match(first)
        if match and ("." in match.group(1) or match.group(2) is not None):
            module, type_name = _split_name(match.group(1))
            message = (match.group(2) or "") + ("\n" + rest if rest else "")
            return [Frame(module, type_name, (), _cap(message, max_message_chars))]
        return [Frame("", "", (), _cap(stripped, max_message_chars))]

    frames: list[Frame] = []
    # Python prints the innermost exception first; frames are outermost first.
    for block in reversed(blocks):
        frames.extend(_frames_of_block(block, max_message_chars))
        if len(frames) >= max_frames:
            break
    return frames[:max_frames]

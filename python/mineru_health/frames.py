"""Turn an exception into classifier frames (printed tracebacks: :mod:`.tracebacks`).

A *frame* is one exception of a failure chain: its module, class name, base
class names, message, where it was raised (``raised_in``: the module of the
innermost traceback entry) and how it was reached (``via``: the exception
caught, a ``__cause__``, a ``__context__`` or an exception-group member) at
which ``depth``. Frames are listed in pre-order: a frame, then what it wraps.

    >>> try:
    ...     raise RuntimeError("wrapper") from ValueError("root")
    ... except RuntimeError as exc:
    ...     [(f.type_name, f.via.name, f.depth) for f in frames_from_exception(exc)]
    [('RuntimeError', 'ROOT', 0), ('ValueError', 'CAUSE', 1)]

Everything here is iterative and bounded: a 10,000-deep chain, a cycle, a
``__str__`` that raises or a 10 MB message all give a result in linear time.
"""

from __future__ import annotations

import builtins
import functools
import sys
from dataclasses import dataclass
from types import TracebackType

from ._native import Via

__all__ = [
    "DEFAULT_MAX_FRAMES",
    "DEFAULT_MAX_MESSAGE_CHARS",
    "Frame",
    "Via",
    "frames_from_exception",
]

#: Frames beyond this are dropped; the classifier looks at no more either.
DEFAULT_MAX_FRAMES = 64
#: Longer messages keep their head and tail. The native classifier bounds
#: bytes too (64 KiB a frame); cutting here first keeps the encoding step small.
DEFAULT_MAX_MESSAGE_CHARS = 64 << 10
#: Traceback entries walked to find where an exception was raised.
MAX_TRACEBACK_ENTRIES = 10_000

_ELISION = "\n[... message truncated by mineru-health ...]\n"


@dataclass(frozen=True, slots=True)
class Frame:
    """One exception of a failure chain."""

    module: str
    type_name: str
    bases: tuple[str, ...] = ()
    message: str = ""
    raised_in: str = ""
    via: Via = Via.ROOT
    depth: int = 0

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


def cap_message(text: str, max_chars: int) -> str:
    """``text``, or its head and tail around an elision mark when longer than ``max_chars``."""
    if len(text) <= max_chars:
        return text
    half = max(max_chars // 2, 1)
    return text[:half] + _ELISION + text[-half:]


def _safe_message(exc: BaseException, max_chars: int) -> str:
    try:
        text = str(exc)
    except Exception as error:  # noqa: BLE001 - a broken __str__ must not hide the failure
        return f"<unprintable {type(exc).__name__}: {type(error).__name__} in __str__>"
    return cap_message(text, max_chars)


@functools.lru_cache(maxsize=1024)
def _class_names(cls: type) -> tuple[str, str, tuple[str, ...]]:
    # A class's names never change; failures repeat the same few classes.
    module = getattr(cls, "__module__", None)
    bases = tuple(getattr(base, "__name__", "?") for base in cls.__mro__[1:] if base is not object)
    return (module if isinstance(module, str) else "", cls.__name__, bases)


def _raise_site(exc: BaseException) -> str:
    """Module of the innermost traceback entry of ``exc``, "" if it was never raised."""
    tb: TracebackType | None = exc.__traceback__
    last: TracebackType | None = None
    for _ in range(MAX_TRACEBACK_ENTRIES):
        if tb is None:
            break
        last = tb
        tb = tb.tb_next
    if last is None:
        return ""
    try:
        name = last.tb_frame.f_globals.get("__name__")
    except Exception:  # noqa: BLE001 - a hostile globals mapping must not hide the failure
        return ""
    return name if isinstance(name, str) else ""


def _group_classes() -> tuple[type, ...]:
    """Exception-group classes: the builtin one (3.11+) and, on 3.10, the
    ``exceptiongroup`` backport's (anyio and pytest use it there). A group of
    the backport can only exist once its module is loaded, so it is looked up,
    never imported."""
    backport = sys.modules.get("exceptiongroup")
    found = (
        getattr(builtins, "BaseExceptionGroup", None),
        getattr(backport, "BaseExceptionGroup", None),
    )
    return tuple(c for c in found if isinstance(c, type))


def frames_from_exception(
    exc: BaseException,
    *,
    max_frames: int = DEFAULT_MAX_FRAMES,
    max_message_chars: int = DEFAULT_MAX_MESSAGE_CHARS,
) -> list[Frame]:
    """Frames of ``exc`` and everything it wraps, in pre-order.

    Each exception appears once (cycles are cut by identity); at most
    ``max_frames`` frames are returned. An exception that was never raised
    itself (a cause built in place, a group member) takes the raise site of
    the exception that wraps it: it was made there.
    """
    if max_frames <= 0:
        return []
    frames: list[Frame] = []
    seen: set[int] = set()
    # (exception, how it was reached, depth, the wrapper's raise site)
    stack: list[tuple[BaseException, Via, int, str]] = [(exc, Via.ROOT, 0, "")]
    groups = _group_classes()
    while stack and len(frames) < max_frames:
        current, via, depth, parent_site = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        module, type_name, bases = _class_names(type(current))  # type: ignore[arg-type]
        site = _raise_site(current) or parent_site
        frames.append(
            Frame(
                module,
                type_name,
                bases,
                _safe_message(current, max_message_chars),
                site,
                via,
                depth,
            )
        )

        children: list[tuple[BaseException, Via, int, str]] = []
        cause = current.__cause__
        if isinstance(cause, BaseException):
            children.append((cause, Via.CAUSE, depth + 1, site))
        elif not current.__suppress_context__ and isinstance(current.__context__, BaseException):
            children.append((current.__context__, Via.CONTEXT, depth + 1, site))
        if isinstance(current, groups):
            children.extend(
                (member, Via.GROUP, depth + 1, site)
                for member in getattr(current, "exceptions", ())
                if isinstance(member, BaseException)
            )
        # Pushed in reverse so the first child is visited next (pre-order).
        stack.extend(reversed(children))
    return frames

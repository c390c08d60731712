"""Printed Python tracebacks (a log, a pasted report) turned into classifier frames.

What ``mineru-health classify`` reads (:func:`classify_text`), and the form
of the test corpus (``tests/data/errors``); a worker classifies live
exceptions (:func:`~mineru_health.frames.frames_from_exception`) and never
imports this.

    >>> frame, = frames_from_text("vllm.v1.engine.exceptions.EngineDeadError: gone")
    >>> frame.module, frame.type_name, frame.message
    ('vllm.v1.engine.exceptions', 'EngineDeadError', 'gone')

Bounded like :mod:`.frames`: at most ``max_frames`` frames, messages capped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from .classifier import Classification, Rules, default_rules
from .frames import DEFAULT_MAX_FRAMES, DEFAULT_MAX_MESSAGE_CHARS, Frame, Via, cap_message

__all__ = ["classify_text", "frames_from_text"]


def classify_text(
    text: str,
    *,
    rules: Rules | None = None,
    remote_engine: bool = False,
    trust_unknown_origin: bool = True,
) -> Classification:
    """Classifies a printed traceback or a bare error message.

    Text carries no class objects: a frame without a traceback line
    (``trust_unknown_origin``) is trusted as much as whoever wrote the
    text. Turn it off for text from untrusted sources.
    """
    return (rules if rules is not None else default_rules()).classify_frames(
        frames_from_text(text),
        remote_engine=remote_engine,
        trust_unknown_origin=trust_unknown_origin,
    )


_CAUSE_SEPARATOR = "The above exception was the direct cause of the following exception:"
_CONTEXT_SEPARATOR = "During handling of the above exception, another exception occurred:"
_TRACEBACK_HEADER = re.compile(
    r"^(?:\+ )?(?:Exception Group )?Traceback \(most recent call last\):"
)
_GROUP_SEPARATOR = re.compile(r"^\+(?:-\+)?-+(?: *(\d+|\.\.\.) *-+)?$")
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::(?: (.*))?)?$")
# A bare "Name: text" line is an exception only when Name looks like a class
# (dotted, or named like one); "Failed: ..." or "EI0009: ..." are just text.
_DOTTED_CLASS = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*\.[A-Z]\w*$")
_CLASS_LIKE = re.compile(
    r"(?:^|\.)[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Warning|Iteration|Group|Dead)$"
)


def _looks_like_class(name: str) -> bool:
    return bool(_DOTTED_CLASS.search(name) or _CLASS_LIKE.search(name))


_FILE_LINE = re.compile(r'^\s*File "([^"]*)", line \d+(?:, in (\S+))?')
# Log prefixes vLLM and friends put in front of each traceback line, e.g.
# "(EngineCore_DP0 pid=54) ERROR 10-28 23:01:07 [core.py:708] ".
_LOG_PREFIX = re.compile(
    r"^\((?:[\w.-]+ )?pid=\d+\) (?:(?:ERROR|WARNING|INFO|DEBUG|CRITICAL) "
    r"\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] ?)?"
)
_SITE_DIRS = ("site-packages/", "dist-packages/")
# Packages whose files may be found outside site-packages (source checkouts).
_KNOWN_ROOTS = frozenset(
    {
        "vllm",
        "vllm_ascend",
        "lmdeploy",
        "sglang",
        "torch",
        "torch_npu",
        "mlx",
        "mlx_vlm",
        "mlx_lm",
        "transformers",
        "ray",
        "mineru",
        "mineru_vl_utils",
        "triton",
    }
)


def _module_of_path(path: str, function: str | None) -> str:
    """The module a traceback ``File "<path>"`` line names, or "" when it cannot tell."""
    path = path.replace("\\", "/")
    for marker in _SITE_DIRS:
        index = path.rfind(marker)
        if index >= 0:
            return _dotted(path[index + len(marker) :])
    if path.endswith((".pyx", ".pxi")) and function and "." in function:
        # Cython frames name their module in the function ("lxml.etree.XML").
        return function.rpartition(".")[0]
    parts = path.split("/")
    for index in range(len(parts) - 2, -1, -1):
        if parts[index] in _KNOWN_ROOTS:
            return _dotted("/".join(parts[index:]))
    stdlib = re.search(r"/lib/python\d+(?:\.\d+)?/(.+)$", path)
    return _dotted(stdlib.group(1)) if stdlib else ""


def _dotted(relative: str) -> str:
    stem = re.sub(r"\.(?:py|pyx|pxi|pyc)$", "", relative)
    parts = [part for part in stem.split("/") if part]
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@dataclass(slots=True)
class _Pending:
    name: str
    lines: list[str]
    raised_in: str


def _split_name(name: str) -> tuple[str, str]:
    module, dot, type_name = name.rpartition(".")
    return (module, type_name) if dot else ("", name)


def _block_frames(lines: list[str], max_chars: int) -> list[Frame]:
    """The exception line(s) of one traceback block, with the block's raise site."""
    found: list[_Pending] = []
    current: _Pending | None = None
    site = ""
    for line in lines:
        if _TRACEBACK_HEADER.match(line.strip()):
            current = None
            continue
        if not line.strip():
            continue
        if line[0].isspace():
            # Traceback body (File ... / source line); ends any message.
            file_line = _FILE_LINE.match(line)
            if file_line:
                site = _module_of_path(file_line.group(1), file_line.group(2))
            current = None
            continue
        if current is not None:
            current.lines.append(line)  # a multi-line message or a note
            continue
        match = _EXCEPTION_LINE.match(line)
        if match:
            current = _Pending(match.group(1), [match.group(2) or ""], site)
        else:
            current = _Pending("", [line], site)
        found.append(current)
    frames = []
    for pending in found:
        module, type_name = _split_name(pending.name)
        message = cap_message("\n".join(pending.lines).strip("\n"), max_chars)
        frames.append(Frame(module, type_name, (), message, pending.raised_in))
    return frames


def _marker_column(line: str) -> int:
    """Column of a group-layout marker ('|' or '+') that starts ``line``, or -1."""
    stripped = line.lstrip(" ")
    return len(line) - len(stripped) if stripped[:1] in ("|", "+") else -1


def _strip_marker(line: str, column: int) -> str:
    """``line`` without the "| " (or "+ ") marker at ``column``."""
    if len(line) > column and line[column] in "|+" and not line[:column].strip():
        rest = line[column + 1 :]
        return rest[1:] if rest[:1] == " " else rest
    return line


def _is_group_layout(lines: list[str]) -> bool:
    return any(
        "Exception Group Traceback" in line
        or (_marker_column(line) >= 0 and _GROUP_SEPARATOR.match(line.strip()) is not None)
        for line in lines
    )


def _unmarked(lines: list[str]) -> list[str]:
    columns = [column for column in map(_marker_column, lines) if column >= 0]
    if not columns:
        return lines
    column = min(columns)
    return [_strip_marker(line, column) for line in lines]


def _group_frames(
    lines: list[str], depth: int, via: Via, max_chars: int, budget: int
) -> list[Frame]:
    """One exception group's block: the group's own frame, then its members."""
    column = min(column for column in map(_marker_column, lines) if column >= 0)
    own: list[str] = []
    members: list[list[str]] = []
    member: list[str] | None = None
    for line in lines:
        stripped = line.strip()
        separator = _GROUP_SEPARATOR.match(stripped)
        at = _marker_column(line)
        # This group's member rules: the first ("+-+--- 1 ---") at the group's
        # column, the others ("+--- 2 ---" and the closing "+------") one level
        # in; a nested group's first rule ("+-+") one level in is content.
        ours = separator is not None and (
            (at == column and stripped.startswith("+-+"))
            or (at == column + 2 and not stripped.startswith("+-+"))
        )
        if ours:
            if separator is not None and separator.group(1) is not None:
                member = []
                members.append(member)
            else:
                member = None
            continue
        if member is not None:
            prefix = line[: column + 2]
            member.append(line[column + 2 :] if not prefix.strip() else line.lstrip())
        else:
            own.append(_strip_marker(line, column))
    frames = [
        replace(frame, via=via if index == 0 else Via.CAUSE, depth=depth + index)
        for index, frame in enumerate(_block_frames(own, max_chars)[:1])
    ]
    if not frames:
        frames = [Frame("", "", (), "", "", via, depth)]
    for lines_of_member in members:
        if len(frames) >= budget:
            break
        frames.extend(
            _text_frames(lines_of_member, depth + 1, Via.GROUP, max_chars, budget - len(frames))
        )
    return frames


def _text_frames(
    lines: list[str], depth: int, via: Via, max_chars: int, budget: int
) -> list[Frame]:
    """Frames of printed traceback lines in pre-order, exception groups included."""
    if not _is_group_layout(lines):
        lines = _unmarked(lines)  # a group member's own chain
    blocks: list[list[str]] = [[]]
    links: list[Via] = []  # links[i] joins blocks[i] (inner) to blocks[i + 1]
    for line in lines:
        stripped = line.strip()
        if stripped in (_CAUSE_SEPARATOR, _CONTEXT_SEPARATOR) and _marker_column(line) < 0:
            links.append(Via.CAUSE if stripped == _CAUSE_SEPARATOR else Via.CONTEXT)
            blocks.append([])
            continue
        blocks[-1].append(line)
    frames: list[Frame] = []
    level = depth
    how = via
    # Python prints the innermost exception first; frames are outermost first.
    for index in range(len(blocks) - 1, -1, -1):
        if len(frames) >= budget:
            break
        block = blocks[index]
        if _is_group_layout(block):
            part = _group_frames(block, level, how, max_chars, budget - len(frames))
            step = 1
        else:
            part = [
                replace(frame, via=how if offset == 0 else Via.CAUSE, depth=level + offset)
                for offset, frame in enumerate(_block_frames(_unmarked(block), max_chars))
            ]
            step = len(part)
        frames.extend(part)
        level += step
        if part and index > 0:
            how = links[index - 1]
    return frames


def frames_from_text(
    text: str,
    *,
    max_frames: int = DEFAULT_MAX_FRAMES,
    max_message_chars: int = DEFAULT_MAX_MESSAGE_CHARS,
) -> list[Frame]:
    """Frames from a printed Python traceback (or a bare error message), in pre-order.

    Understands the ``Traceback (most recent call last):`` blocks Python prints,
    the two chain separators ("direct cause" / "during handling", which give
    ``via``), the ``|``-prefixed layout of exception groups (members become
    ``Via.GROUP`` frames), and vLLM-style ``(Proc pid=N) ERROR ...`` log
    prefixes. ``raised_in`` is read from the last ``File "..."`` line of each
    block. Text that is not a traceback becomes a single frame:
    ``module.Type: message`` when the first line looks like that, otherwise the
    whole text as the message.
    """
    if max_frames <= 0:
        return []
    lines = [_LOG_PREFIX.sub("", raw, count=1) for raw in text.splitlines()]
    has_traceback = _is_group_layout(lines) or any(
        _TRACEBACK_HEADER.match(line.strip()) for line in lines
    )
    if not has_traceback:
        stripped = "\n".join(lines).strip()
        first, _, rest = stripped.partition("\n")
        match = _EXCEPTION_LINE.match(first)
        if match and _looks_like_class(match.group(1)):
            module, type_name = _split_name(match.group(1))
            message = (match.group(2) or "") + ("\n" + rest if rest else "")
            return [Frame(module, type_name, (), cap_message(message, max_message_chars))]
        return [Frame("", "", (), cap_message(stripped, max_message_chars))]
    return _text_frames(lines, 0, Via.ROOT, max_message_chars, max_frames)[:max_frames]

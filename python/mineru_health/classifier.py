"""Decide whether a task failure killed the inference engine (fatal) or only the task.

    >>> from mineru_health import classify
    >>> verdict = classify(exc)          # any exception object
    >>> verdict.fatal, verdict.rule, verdict.category

The rules are the built-in ones (vLLM, SGLang, lmdeploy, CUDA, NCCL) merged
with the operator's file named by ``MINERU_HEALTH_RULES`` (same id replaces a
built-in rule). The default rule set is compiled once, lazily, and shared by
every thread; :func:`reload_rules` swaps in a new one atomically.

Thread-safety: every function here may be called from any thread at once.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from . import _native
from ._native import RuleKind
from .errors import RulesError
from .frames import Frame, frames_from_exception, frames_from_text

__all__ = [
    "RULES_ENV",
    "Rule",
    "RuleKind",
    "Rules",
    "Verdict",
    "builtin_rules",
    "classify",
    "classify_frames",
    "classify_text",
    "default_rules",
    "load_rules",
    "parse_rules_file",
    "reload_rules",
]

RULES_ENV = "MINERU_HEALTH_RULES"


def _b(text: str) -> bytes:
    # surrogatepass lets lone surrogates (seen in badly decoded messages) reach
    # the native side, which replaces whatever is not valid UTF-8.
    return text.encode("utf-8", "surrogatepass")


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule: ``pattern`` (RE2, case-insensitive) classifies a failure as ``kind``."""

    id: str
    kind: RuleKind
    category: str
    pattern: str

    @classmethod
    def _from_native(cls, rule: _native.Rule) -> Rule:
        return cls(rule.id, rule.kind, rule.category, rule.pattern)

    def _to_native(self) -> _native.Rule:
        return _native.Rule(
            id=_b(self.id), kind=self.kind, category=_b(self.category), pattern=_b(self.pattern)
        )

    @property
    def kind_name(self) -> str:
        """``"fatal"`` or ``"task_local"``, as written in rules files."""
        return _native.rule_kind_name(self.kind)


@dataclass(frozen=True, slots=True)
class Verdict:
    """The decision on one failure.

    ``matched`` is false when no rule matched: the failure then counts as
    task-local. ``frame_index`` points into the frames classified (outermost
    first) and ``frame`` is that frame.
    """

    fatal: bool
    matched: bool
    rule: str
    category: str
    frame_index: int
    excerpt: str
    frame: Frame | None
    ambiguous: bool = False

    @property
    def kind(self) -> Literal["fatal", "task_local"]:
        return "fatal" if self.fatal else "task_local"

    def __repr__(self) -> str:
        if not self.matched:
            return "Verdict(task_local, no rule matched)"
        where = self.frame.qualified_name if self.frame is not None else "?"
        return (
            f"Verdict({self.kind}, rule={self.rule!r}, category={self.category!r}, "
            f"frame={self.frame_index}:{where}, excerpt={self.excerpt!r})"
        )


def _rule_errors(errors: Sequence[_native.RuleError]) -> list[str]:
    return [error.to_string() for error in errors]


def _raise_rule_errors(errors: Sequence[_native.RuleError], what: str) -> None:
    messages = _rule_errors(errors)
    first = messages[0] if messages else "unknown error"
    more = f" (and {len(messages) - 1} more)" if len(messages) > 1 else ""
    raise RulesError(f"invalid {what}: {first}{more}", errors=messages)


def builtin_rules() -> list[Rule]:
    """The rules that ship with the package."""
    return [Rule._from_native(rule) for rule in _native.builtin_rules()]


def parse_rules_file(path: str | os.PathLike[str]) -> list[Rule]:
    """Parses an operator rules file; raises :class:`RulesError` naming file, line and rule."""
    source = os.fspath(path)
    try:
        data = Path(source).read_bytes()
    except OSError as error:
        raise RulesError(
            f"cannot read rules file {source}: {error.strerror or error}",
            errors=[f"{source}: {error}"],
        ) from error
    rules, errors = _native.parse_rules_text(data, source)
    if errors:
        _raise_rule_errors(errors, f"rules file {source}")
    return [Rule._from_native(rule) for rule in rules]


class Rules:
    """An immutable, compiled rule set with its classifier.

    Build one with :func:`load_rules` (built-ins plus a file) or from explicit
    rules with ``Rules(rules, source=...)``.
    """

    __slots__ = ("_classifier", "_rule_set", "_rules", "_sources")

    def __init__(self, rules: Iterable[Rule], *, source: str = "<builtin>",
                 sources: Sequence[str] | None = None) -> None:
        native_rules = [rule._to_native() for rule in rules]
        rule_set, errors = _native.RuleSet.compile(native_rules, _b(source))
        if rule_set is None:
            _raise_rule_errors(errors, f"rules from {source}")
        assert rule_set is not None
        self._rule_set = rule_set
        self._classifier = _native.Classifier(rule_set)
        self._rules = tuple(Rule._from_native(rule) for rule in rule_set.rules)
        self._sources = tuple(sources) if sources is not None else (source,)

    @property
    def rules(self) -> tuple[Rule, ...]:
        return self._rules

    @property
    def sources(self) -> tuple[str, ...]:
        """Where the rules came from: ``"<builtin>"`` and any file paths."""
        return self._sources

    def __len__(self) -> int:
        return len(self._rules)

    def __repr__(self) -> str:
        fatal = sum(1 for rule in self._rules if rule.kind == RuleKind.FATAL)
        return (
            f"Rules({len(self._rules)} rules: {fatal} fatal, "
            f"{len(self._rules) - fatal} task_local; from {', '.join(self._sources)})"
        )

    def classify_frames(self, frames: Sequence[Frame]) -> Verdict:
        result = self._classifier.classify_tuples(
            [(_b(f.module), _b(f.type_name), [_b(b) for b in f.bases], _b(f.message))
             for f in frames]
        )
        index = result.frame_index
        frame = frames[index] if 0 <= index < len(frames) else None
        return Verdict(
            fatal=result.fatal,
            matched=result.matched,
            rule=result.rule_id,
            category=result.category,
            frame_index=index,
            excerpt=result.excerpt,
            frame=frame,
        )

    def classify(self, exc: BaseException) -> Verdict:
        return self.classify_frames(frames_from_exception(exc))

    def classify_text(self, text: str) -> Verdict:
        return self.classify_frames(frames_from_text(text))


def load_rules(path: str | os.PathLike[str] | None = None) -> Rules:
    """Built-in rules merged with ``path`` (default: the file named by ``MINERU_HEALTH_RULES``).

    Raises :class:`RulesError` (with every problem in ``errors``) when the file
    cannot be read, parsed or compiled.
    """
    if path is None:
        env_path = os.environ.get(RULES_ENV, "").strip()
        path = env_path or None
    base = _native.builtin_rules()
    if path is None:
        return Rules((Rule._from_native(r) for r in base), source="<builtin>")
    source = os.fspath(path)
    overrides = [rule._to_native() for rule in parse_rules_file(source)]
    merged = _native.merge_rules(base, overrides)
    return Rules((Rule._from_native(r) for r in merged), source=source,
                 sources=("<builtin>", source))


_lock = threading.Lock()
_default: Rules | None = None


def default_rules() -> Rules:
    """The process-wide rule set, loaded on first use (see :func:`load_rules`)."""
    current = _default
    if current is not None:
        return current
    return _load_default()


def _load_default() -> Rules:
    global _default
    with _lock:
        if _default is None:
            _default = load_rules()
        return _default


def reload_rules(path: str | os.PathLike[str] | None = None) -> Rules:
    """Loads a fresh rule set and makes it the default; the old one stays valid if this raises."""
    global _default
    fresh = load_rules(path)
    with _lock:
        _default = fresh
    return fresh


def classify(exc: BaseException, *, rules: Rules | None = None,
             remote_engine: bool = False) -> Verdict:
    """Classifies ``exc`` and its whole chain (causes, contexts, group members)."""
    return (rules if rules is not None else default_rules()).classify(exc)


def classify_text(text: str, *, rules: Rules | None = None) -> Verdict:
    """Classifies a printed traceback or a bare error message."""
    return (rules if rules is not None else default_rules()).classify_text(text)


def classify_frames(frames: Sequence[Frame], *, rules: Rules | None = None) -> Verdict:
    return (rules if rules is not None else default_rules()).classify_frames(frames)

"""Decides whether a task failure killed the inference engine (fatal), only the task, or neither.

    >>> from mineru_health import classify
    >>> verdict = classify(exc)                       # any exception object
    >>> verdict.fatal, verdict.rule, verdict.category, verdict.strength
    >>> classify(exc, remote_engine=True)             # an http-client backend's task

The rules are the built-in ones (every engine and device MinerU drives)
merged with the operator's file named by ``MINERU_HEALTH_RULES`` (same id
replaces a built-in rule, ``<id> off`` disables one; operator rules are
consulted first). How a verdict is decided is documented in docs/rules.md.
The default rule set is compiled once, lazily, and shared by every thread;
:func:`reload_rules` swaps in a new one atomically. Matching runs in native
code without the GIL.

Thread-safety: every function here may be called from any thread at once.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from . import _native
from ._native import RuleKind, RuleScope, RuleTarget
from .errors import RulesError
from .frames import Frame, frames_from_exception

__all__ = [
    "MAX_RULES_FILE_BYTES",
    "MAX_RULES_FILE_RULES",
    "RULES_ENV",
    "Classification",
    "ParsedRules",
    "Rule",
    "RuleKind",
    "RuleScope",
    "RuleTarget",
    "Rules",
    "Verdict",
    "builtin_rules",
    "classify",
    "classify_frames",
    "default_rules",
    "load_rules",
    "parse_rules_file",
    "reload_rules",
]

RULES_ENV = "MINERU_HEALTH_RULES"
#: A rules file larger than this is refused before it is read.
MAX_RULES_FILE_BYTES: int = _native.MAX_RULES_FILE_BYTES
#: A rules file with more rule lines than this is refused.
MAX_RULES_FILE_RULES: int = _native.MAX_RULES_FILE_RULES


def _b(text: str) -> bytes:
    # surrogatepass lets lone surrogates (seen in badly decoded messages) reach
    # the native side, which replaces whatever is not valid UTF-8.
    return text.encode("utf-8", "surrogatepass")


#: One rule: ``pattern`` (RE2, case-insensitive) on ``target`` text classifies as ``kind``;
#: ``scope`` says which frames a message or frame rule may judge (``RuleScope.ENGINE``: only
#: those an engine or device runtime raised); ``from_operator`` marks rules from a rules file,
#: consulted first. Read-only; ``kind_name``, ``strength``, ``target_name``, ``scope_name``
#: and ``to_line()`` come from the native core.
Rule = _native.Rule

#: The decision on one failure: ``kind`` (``"fatal"``, ``"task_local"`` or ``"ambiguous"``),
#: ``fatal``, ``matched`` (false: no rule matched, the failure counts as task-local),
#: ``ambiguous`` (a device error that may or may not recur; the worker's error budget
#: decides), ``remote_engine`` (the failure belongs to a remote engine: never a reason to
#: restart this worker), ``rule``, ``category``, ``strength`` (the deciding rule's:
#: ``"definitive"``, ``"task_local"``, ``"heuristic"``, ``"ambiguous"``, ``"generic"``;
#: ``""`` when unmatched), ``rule_kind``, ``frame_index`` (into the frames classified:
#: ``frames_from_exception(exc)[verdict.frame_index]`` is the deciding frame) and ``excerpt``.
Classification = _native.Classification
#: The name ``Classification`` had before 0.5 (a "verdict" is now only the judge's
#: ``TaskVerdict`` on a task); kept so that code written against 0.4 still runs.
Verdict = Classification


def _rule_errors(errors: Sequence[_native.RuleError]) -> list[str]:
    return [error.to_string() for error in errors]


def _raise_rule_errors(errors: Sequence[_native.RuleError], what: str) -> None:
    messages = _rule_errors(errors)
    first = messages[0] if messages else "unknown error"
    more = f" (and {len(messages) - 1} more)" if len(messages) > 1 else ""
    raise RulesError(f"invalid {what}: {first}{more}", errors=messages)


def builtin_rules() -> list[Rule]:
    """The rules that ship with the package."""
    return _native.builtin_rules()


@dataclass(frozen=True, slots=True)
class ParsedRules:
    """An operator's rules file: its rules and the built-in ids it turns off."""

    rules: tuple[Rule, ...]
    disabled: tuple[str, ...]

    def warnings(self) -> list[str]:
        """Rules that text from a user's document could trigger (``origin=any`` on text).

        A message or frame rule with ``origin=any`` also judges exceptions
        raised by document libraries, whose messages quote the document: a
        crafted file could make the worker fatal (or hide a real death).
        """
        return [
            f"rule '{rule.id}': origin=any on {rule.target.name.lower()} text lets a user's "
            "document trigger it; use origin=engine (the default) unless the text can only "
            "come from an engine or device"
            for rule in self.rules
            if rule.scope is RuleScope.ANY and rule.target is not RuleTarget.TYPE
        ]


def parse_rules_file(path: str | os.PathLike[str]) -> ParsedRules:
    """Reads and parses an operator rules file.

    The file must be a regular file of at most :data:`MAX_RULES_FILE_BYTES`
    with at most :data:`MAX_RULES_FILE_RULES` rules (checked before reading:
    a FIFO, a device or a directory is refused at once). Raises
    :class:`RulesError` naming the file, line and rule.
    """
    source = os.fspath(path)
    rules, disabled, errors = _native.read_rules_file(_b(source))
    if len(errors) == 1 and errors[0].line == 0 and not errors[0].rule_id:
        # The file itself was refused (missing, not a regular file, too big).
        raise RulesError(
            f"cannot read rules file {source}: {errors[0].message}", errors=_rule_errors(errors)
        )
    if errors:
        _raise_rule_errors(errors, f"rules file {source}")
    return ParsedRules(tuple(rules), tuple(disabled))


class Rules:
    """An immutable, compiled rule set with its classifier.

    Build one with :func:`load_rules` (built-ins plus a file) or from explicit
    rules with ``Rules(rules, source=...)``.
    """

    __slots__ = ("_classifier", "_rule_set", "_rules", "_sources")

    def __init__(
        self,
        rules: Iterable[Rule],
        *,
        source: str = "<builtin>",
        sources: Sequence[str] | None = None,
    ) -> None:
        rule_set, errors = _native.RuleSet.compile(list(rules), _b(source), _native.RuleSetLimits())
        if rule_set is None:
            _raise_rule_errors(errors, f"rules from {source}")
        assert rule_set is not None
        self._rule_set = rule_set
        self._classifier = _native.Classifier(rule_set, _native.ClassifierLimits())
        self._rules = tuple(rule_set.rules)
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
        counts: dict[str, int] = {}
        for rule in self._rules:
            counts[rule.kind_name] = counts.get(rule.kind_name, 0) + 1
        summary = ", ".join(f"{count} {name}" for name, count in sorted(counts.items()))
        return f"Rules({len(self._rules)} rules: {summary}; from {', '.join(self._sources)})"

    def classify_frames(
        self,
        frames: Sequence[Frame],
        *,
        remote_engine: bool = False,
        trust_unknown_origin: bool = True,
    ) -> Classification:
        """Classifies frames (see :mod:`mineru_health.frames`)."""
        options = _native.ClassifyOptions()
        options.remote_engine = remote_engine
        options.trust_unknown_origin = trust_unknown_origin
        return self._classifier.classify_tuples(
            [
                (
                    _b(f.module),
                    _b(f.type_name),
                    [_b(b) for b in f.bases],
                    _b(f.message),
                    _b(f.raised_in),
                    f.via,
                    f.depth,
                )
                for f in frames
            ],
            options,
        )

    def classify(self, exc: BaseException, *, remote_engine: bool = False) -> Classification:
        """Classifies ``exc`` and its whole chain (causes, contexts, group members)."""
        return self.classify_frames(frames_from_exception(exc), remote_engine=remote_engine)


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
        return Rules(base, source="<builtin>")
    source = os.fspath(path)
    parsed = parse_rules_file(source)
    merged = _native.merge_rules(
        base, list(parsed.rules), [_b(rule_id) for rule_id in parsed.disabled]
    )
    return Rules(merged, source=source, sources=("<builtin>", source))


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


def classify(
    exc: BaseException, *, rules: Rules | None = None, remote_engine: bool = False
) -> Classification:
    """Classifies ``exc`` and its whole chain (causes, contexts, group members).

    ``remote_engine``: the task's engine is remote (an ``*-http-client``
    backend); failures that only a remote engine could cause become
    task-local with category ``remote_engine``.
    """
    return (rules if rules is not None else default_rules()).classify(
        exc, remote_engine=remote_engine
    )


def classify_frames(
    frames: Sequence[Frame],
    *,
    rules: Rules | None = None,
    remote_engine: bool = False,
    trust_unknown_origin: bool = True,
) -> Classification:
    """Classifies frames built by hand, by :mod:`mineru_health.frames` or :mod:`.tracebacks`."""
    return (rules if rules is not None else default_rules()).classify_frames(
        frames, remote_engine=remote_engine, trust_unknown_origin=trust_unknown_origin
    )

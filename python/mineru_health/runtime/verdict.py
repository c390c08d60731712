"""The worker's verdict on a failed task: the one message that crosses from worker to router.

Both halves import it and nothing else of each other (with ``REFUSAL_ERROR_PREFIX``,
the worker's verdict on a submission it refuses).

    >>> verdict = TaskVerdict.engine_dead(Role.TRIGGER, "vllm.engine_dead", "engine_dead")
    >>> wire = verdict.to_wire()           # the worker: into the task's status answer
    >>> TaskVerdict.from_wire(wire) == verdict   # the router: out of it
    True

Built by the worker's judge (:mod:`mineru_health.runtime.worker.judge`) on
both MinerU lines and read by the router's resubmission policy; nothing else
writes or reads its fields by name. The wire form carries ``version``; a
router reads a verdict of any version it knows and the fields it knows of a
newer one, so routers and workers of different releases mix during a rolling
upgrade. Version 1 also writes the 0.3 keys (``fatal``, ``engine_dead``,
``hung``), which is all a 0.3 router reads; a dict without ``version`` is a
0.3 worker's and is read from those keys. Version 2 adds ``restored``: the
verdict was given by an earlier instance of the worker and came back from
its task store (:meth:`TaskVerdict.restored_wire`); it says what happened
to that instance, nothing about the one answering now (read as false from
earlier versions).

Immutable; safe to share between threads.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "HUNG_CATEGORY",
    "HUNG_RULE",
    "REFUSAL_ERROR_PREFIX",
    "VERSION",
    "Kind",
    "Role",
    "TaskVerdict",
]

#: How the ``error`` of a dead worker's 503 refusal of a submission begins: its verdict
#: on a submission, before any task exists. MinerU's router reports a refused submission
#: as "503 <error>"; our router recognises the worker's own verdict by this prefix, never
#: by classifying text (the rest of the line names the category and rule).
REFUSAL_ERROR_PREFIX = "engine_unusable:"

#: The wire version this release writes.
VERSION = 2
#: The rule and category of a task the task watchdog failed: its parse made no progress.
HUNG_RULE = "watchdog.task_hung"
HUNG_CATEGORY = "task_hung"


class Kind(enum.Enum):
    """What happened to the task."""

    ENGINE_DEAD = "engine_dead"  # failed with its worker's engine: the worker is out
    HUNG = "hung"  # the task watchdog failed it (no progress); the worker may be fine
    TASK_LOCAL = "task_local"  # the task's own failure; the worker is fine


class Role(enum.Enum):
    """The task's part in its engine's death (``ENGINE_DEAD`` and ``HUNG``)."""

    TRIGGER = "trigger"  # its own failure was the death (counts against its document)
    COLLATERAL = "collateral"  # queued or running when another task found the engine dead


@dataclass(frozen=True, slots=True)
class TaskVerdict:
    """One verdict. ``remote_engine``: the task's engine is a server someone else runs.

    ``verification``: what checking the engine found, when no rule decided.
    ``restored``: given by an earlier instance of the worker (a task store
    brought it back): evidence about that instance, never the current one.
    """

    kind: Kind
    role: Role | None
    rule: str
    category: str
    ambiguous: bool = False
    remote_engine: bool = False
    restored: bool = False
    verification: Mapping[str, Any] | None = field(default=None, compare=False)

    @classmethod
    def engine_dead(cls, role: Role, rule: str, category: str, **extra: Any) -> TaskVerdict:
        return cls(Kind.ENGINE_DEAD, role, rule, category, **extra)

    @classmethod
    def hung(cls, *, remote_engine: bool = False) -> TaskVerdict:
        """A task its worker's watchdog failed for making no progress (its own fault)."""
        return cls(Kind.HUNG, Role.TRIGGER, HUNG_RULE, HUNG_CATEGORY, remote_engine=remote_engine)

    @property
    def counts_against_document(self) -> bool:
        """The poison guard's question: did this task's own document kill the engine?

        Only a trigger does, and never a hang on a remote engine: whoever names
        the server decides whether it answers, and must not get a document that
        someone else also sends quarantined.
        """
        if self.role is not Role.TRIGGER or self.kind is Kind.TASK_LOCAL:
            return False
        return not (self.kind is Kind.HUNG and self.remote_engine)

    def to_wire(self) -> dict[str, Any]:
        """The JSON object a status answer carries (and a task store keeps)."""
        wire: dict[str, Any] = {
            "version": VERSION,
            "kind": self.kind.value,
            "role": None if self.role is None else self.role.value,
            "rule": self.rule,
            "category": self.category,
            "ambiguous": self.ambiguous,
            "remote_engine": self.remote_engine,
            "restored": self.restored,
            # 0.3's keys, all a 0.3 router reads:
            "fatal": self.kind is Kind.ENGINE_DEAD and self.role is Role.TRIGGER,
            "engine_dead": self.kind is Kind.ENGINE_DEAD,
        }
        if self.kind is Kind.HUNG:
            wire["hung"] = True
        if self.verification is not None:
            wire["verification"] = dict(self.verification)
        return wire

    @classmethod
    def from_wire(cls, wire: object) -> TaskVerdict | None:
        """The verdict in a status answer's ``verdict`` (any release's), or None if it has none.

        Never raises: a worker's answer is untrusted input.
        """
        if not isinstance(wire, Mapping):
            return None
        kind = _enum(Kind, wire.get("kind"))
        if kind is None:  # a 0.3 worker's, or a newer kind this release does not know
            if wire.get("hung") is True:
                kind = Kind.HUNG
            elif wire.get("engine_dead") is True:
                kind = Kind.ENGINE_DEAD
            else:
                kind = Kind.TASK_LOCAL
        verification = wire.get("verification")
        return cls(
            kind,
            _enum(Role, wire.get("role")),
            _text(wire.get("rule")),
            _text(wire.get("category")),
            ambiguous=wire.get("ambiguous") is True,
            remote_engine=wire.get("remote_engine") is True,
            restored=wire.get("restored") is True,
            verification=verification if isinstance(verification, Mapping) else None,
        )

    @staticmethod
    def restored_wire(wire: Mapping[str, Any]) -> dict[str, Any]:
        """``wire`` as a restarted worker answers with it: marked ``restored``.

        The worker's task store keeps the wire form its instance wrote; the
        instance that loads it back marks it, whatever version wrote it, and
        keeps every other key as it was.
        """
        return {**wire, "restored": True}


def _enum(kind: type[enum.Enum], value: object) -> Any:
    try:
        return kind(value)
    except ValueError:
        return None


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""

"""Where every document the demo sent ended up, and the outcome that follows from it.

A document the demo sent is, at the end, exactly one of: completed; failed (the
line's failed, partial or canceled, with the reason its status gave); refused
by the router (its answer); queued (waiting for a slot, never started or
waiting again after a resubmission); running (started, within its bound); hung
(started and no result within its bound). The bound is the larger of
:data:`RESULT_BOUND_S` and :data:`BOUND_FACTOR` times the slowest document
this machine completed, so a slow machine's documents are not called hung for
being slow.

The outcome: ``pass`` only when the scenario's own condition held and every
document ended (completed, failed for a stated reason, or refused with an
answer); ``fail`` when the condition did not hold, a document hung, a
failure gave no reason, or documents waited while nothing ran or ended for a
bound (a stalled fleet is not a slow one); ``inconclusive`` when nothing of that failed but
documents were still queued or running at the end, or too few completed for
the fault to be injected at all: the machine was too slow for the scenario.
Pure: no processes, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .fleet import Outcome, Unfinished

__all__ = [
    "BOUND_FACTOR",
    "FAIL",
    "INCONCLUSIVE",
    "PASS",
    "RESULT_BOUND_S",
    "Tally",
    "account",
    "failure_reason",
    "result_bound",
    "run_outcome",
]

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
RESULT_BOUND_S = 60.0  # a started document without a result by then is hung (at the least)
BOUND_FACTOR = 3.0  # ... or by this many times the slowest completed document, if longer


def result_bound(ended: Iterable[Outcome]) -> float:
    """A started document's bound on this machine: see the module's text."""
    slowest = max((o.elapsed_s or 0.0 for o in ended if o.status == "completed"), default=0.0)
    return max(RESULT_BOUND_S, BOUND_FACTOR * slowest)


def failure_reason(outcome: Outcome) -> str:
    """What a document's end said about why it did not complete ("" when nothing).

    3.x: the task's ``error``; 4.0: the job's or its first file's ``error`` (its code and
    message); a refusal: the answer's body.
    """
    d = outcome.detail
    files = d.get("files") or [{}]
    first = files[0] if isinstance(files, list) and files and isinstance(files[0], dict) else {}
    error = d.get("error") or d.get("body") or first.get("error") or ""
    if isinstance(error, dict):  # 4.0: {"type", "code", "message"}
        error = f"{error.get('code') or error.get('type') or 'error'}: {error.get('message')}"
    return " ".join(str(error).split())


@dataclass
class Tally:
    """Every document the demo sent, by where it ended up (the summary's ``tasks``)."""

    submitted: int = 0
    completed: int = 0
    failed: int = 0
    rejected: int = 0  # refused by the router
    queued: int = 0
    running: int = 0
    hung: int = 0
    unexplained: int = 0  # failed or refused with no reason given
    bound_s: float = RESULT_BOUND_S
    idle_s: float = 0.0  # no document had ended for this long at the end
    failures: list[dict[str, Any]] = field(default_factory=list)  # number, status, reason
    stuck: list[dict[str, Any]] = field(default_factory=list)  # the unfinished, as last seen

    @property
    def ended(self) -> int:
        return self.completed + self.failed + self.rejected

    @property
    def unfinished(self) -> int:
        return self.queued + self.running + self.hung

    def as_dict(self) -> dict[str, Any]:
        return {
            "submitted": self.submitted,
            "completed": self.completed,
            "failed": self.failed,
            "rejected": self.rejected,
            "queued": self.queued,
            "running": self.running,
            "hung": self.hung,
            "failed_without_reason": self.unexplained,
            "result_bound_s": round(self.bound_s, 1),
            "failures": self.failures,
            "unfinished": self.stuck,
        }


def account(
    ended: Sequence[Outcome], unfinished: Sequence[Unfinished], idle_s: float = 0.0
) -> Tally:
    """Each document in exactly one place; ``submitted`` is their sum. ``idle_s``: how long
    no document had ended when the demo stopped looking."""
    tally = Tally(
        submitted=len(ended) + len(unfinished), bound_s=result_bound(ended), idle_s=idle_s
    )
    for outcome in ended:
        if outcome.status == "completed":
            tally.completed += 1
            continue
        reason = failure_reason(outcome)
        if outcome.status == "rejected":
            tally.rejected += 1
        else:  # failed, partial, canceled; "hung" only from a stream that timed it out itself
            tally.failed += 1
        tally.unexplained += not reason
        tally.failures.append(
            {"number": outcome.number, "status": outcome.status, "reason": reason[:300]}
        )
    for doc in unfinished:
        if doc.running_s is None:
            tally.queued += 1
            where = "queued"
        elif doc.running_s > tally.bound_s:
            tally.hung += 1
            where = "hung"
        else:
            tally.running += 1
            where = "running"
        tally.stuck.append(
            {
                "number": doc.number,
                "where": where,
                "status": doc.status,
                "waited_s": round(doc.waited_s, 1),
                "running_s": None if doc.running_s is None else round(doc.running_s, 1),
            }
        )
    return tally


def run_outcome(story: tuple[bool | None, str], tally: Tally, elapsed_s: float) -> tuple[str, str]:
    """(:data:`PASS`, :data:`FAIL` or :data:`INCONCLUSIVE`, its reason), from the scenario's
    own outcome (``story``: held, did not, or None: never got as far as its fault; and why)
    and where every document ended up."""
    held, why = story
    if held is False:
        return FAIL, why
    if tally.hung:
        return FAIL, (
            f"{tally.hung} document(s) hung: started, no result within {tally.bound_s:.0f}s ({why})"
        )
    if tally.unexplained:
        return FAIL, f"{tally.unexplained} document(s) failed without a stated reason ({why})"
    if tally.queued and not tally.running and tally.idle_s > tally.bound_s:
        return FAIL, (
            f"the fleet stalled: {tally.queued} document(s) queued, none running and "
            f"none ended in the last {tally.idle_s:.0f}s ({why})"
        )
    if held is None or tally.unfinished:
        others = tally.failed + tally.rejected
        return INCONCLUSIVE, (
            f"this machine completed {tally.completed} documents in {elapsed_s:.0f}s, too slow "
            f"for the scenario ({tally.queued} still queued, {tally.running} still running); "
            + (
                "nothing failed"
                if not others
                else f"{others} failed or refused, each for a stated reason"
            )
            + f" ({why})"
        )
    return PASS, why

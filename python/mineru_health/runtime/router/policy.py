"""What the router does with a task whose worker may have lost it -- pure decisions, no I/O.

    step = next_step(answer, worker)       # APPLY, ADOPT, RESUBMIT, WAIT or UPSTREAM_ERROR
    budget = RetryBudget(percent=20.0, minimum=3)
    budget.limit(tasks_in_flight=40)       # 8: max(3, 20% of 40)
    refusal = refuse_resubmission(submissions=1, task_retries=2, budget=budget,
                                  retries_in_flight=8, tasks_in_flight=40)  # Refusal.BUDGET

``answer`` is what the worker's *current* instance said about the upstream
task id (its status payload, "not found", or nothing); ``worker`` is the
health policy's view of that worker. The rules, in order:

- a status ``failed`` with ``"engine_dead": true`` (the worker's own
  verdict, never text matching): resubmit (the worker leaves rotation too,
  :func:`passive_reason`, unless the verdict is a previous instance's,
  restored from its task store);
- a status ``failed`` whose verdict says ``"hung": true`` (the worker's
  task watchdog: its parse made no progress): resubmit, and, like an engine
  death it triggered, count it against the document (poison guard);
- a task still pending or processing on an instance that a restart is
  stopping right now: resubmit (it will never finish there);
- any other status: apply it (adopt it when a restarted instance answered:
  the task store brought it back);
- "not found": the instance that answered does not know the task (it was
  restarted, or lost it): resubmit;
- no usable answer: resubmit when the worker was declared failed
  (threshold, definitive 503, process exit; restart scheduled, restarting
  or given up). Otherwise an unreachable worker is the health policy's to
  judge: wait (slow answers below the failure threshold never duplicate a
  task, and MinerU's three strikes would fail a task before the policy has
  seen a dead process); a worker in rotation that answers with an error
  gets MinerU's own count (three, then the task fails).

The retry budget follows Envoy's: resubmissions in flight may be at most
``percent`` of the tasks in flight, but ``minimum`` are always allowed.
Nothing here is thread-safe or needs to be: plain values in, values out.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..verdict import Kind, TaskVerdict

__all__ = [
    "Action",
    "Answer",
    "AnswerKind",
    "Refusal",
    "ResubmitReason",
    "RetryBudget",
    "Step",
    "WorkerView",
    "engine_dead_failure",
    "failure_text",
    "hung_failure",
    "next_step",
    "passive_reason",
    "refuse_resubmission",
    "trigger_rule",
]

# MinerU 3.x ends a task completed or failed; 4.0 a job also partial or canceled.
_TERMINAL = frozenset({"completed", "partial", "failed", "canceled"})


class AnswerKind(enum.Enum):
    STATUS = "status"  # 200 with a JSON status payload
    NOT_FOUND = "not_found"  # 404: the instance does not know the task id
    UNREACHABLE = "unreachable"  # no connection, or no answer in time
    BAD_ANSWER = "bad_answer"  # an answer, but 5xx or not a status payload


@dataclass(frozen=True, slots=True)
class Answer:
    """One answer about a task, its status payload read once, here, at the router's edge.

    ``payload`` stays as the worker sent it (the line applies it to MinerU's
    record); the policy reads only the fields parsed from it: ``status``,
    ``engine_dead`` (the worker's own flag, never text matching), ``verdict``
    and ``error``.
    """

    kind: AnswerKind
    payload: Mapping[str, Any] | None = None
    detail: str = ""
    from_store: bool = False  # read from a dead local worker's task store, not over HTTP
    status: str | None = field(init=False, default=None)
    engine_dead: bool = field(init=False, default=False)
    verdict: TaskVerdict | None = field(init=False, default=None)
    error: str = field(init=False, default="")

    def __post_init__(self) -> None:
        payload = self.payload or {}
        status = payload.get("status")
        object.__setattr__(self, "status", status if isinstance(status, str) else None)
        object.__setattr__(self, "engine_dead", payload.get("engine_dead") is True)
        object.__setattr__(self, "verdict", TaskVerdict.from_wire(payload.get("verdict")))
        object.__setattr__(self, "error", str(payload.get("error") or ""))

    @classmethod
    def of_status(cls, payload: Mapping[str, Any], **fields: Any) -> Answer:
        """A status payload (a worker's answer, or what its task store kept) as an answer."""
        return cls(AnswerKind.STATUS, payload=payload, **fields)


@dataclass(frozen=True, slots=True)
class WorkerView:
    """The health policy's view of the task's worker when the answer came."""

    in_rotation: bool
    declared_failed: bool  # failed, restart scheduled, restarting or gave up
    same_instance: bool  # the answer came from the instance the task was submitted to
    replaced: bool = False  # that instance is being stopped by a restart under way


class Action(enum.Enum):
    APPLY = "apply"  # take the status as MinerU would
    ADOPT = "adopt"  # a restarted instance knows the task: follow it there, then apply
    RESUBMIT = "resubmit"  # the upstream task is gone or died with its engine
    WAIT = "wait"  # change nothing; look again later
    UPSTREAM_ERROR = "upstream_error"  # MinerU's own count (fails the task at its threshold)


class ResubmitReason(enum.Enum):
    """Why a submission is sent again: the label values of the resubmissions metric."""

    ENGINE_DEAD = "engine_dead"  # its task failed with its worker's engine
    HUNG = "hung"  # the worker's task watchdog failed it
    LOST = "lost"  # the worker's instance does not know it (404)
    WORKER_FAILED = "worker_failed"  # its worker was declared failed or is being restarted
    ROUTER_RESTART = "router_restart"  # a new router resumed it from its store


@dataclass(frozen=True, slots=True)
class Step:
    action: Action
    reason: str = ""  # RESUBMIT: a ResubmitReason value
    detail: str = ""


def engine_dead_failure(answer: Answer) -> bool:
    """A status that says the task failed because its worker's engine died."""
    return answer.status == "failed" and answer.engine_dead


def hung_failure(answer: Answer) -> bool:
    """A status that says the worker's task watchdog failed the task: its parse hung.

    The worker itself may be fine (its other tasks progress): resubmit the
    task, never eject the worker for it.
    """
    verdict = answer.verdict
    return answer.status == "failed" and verdict is not None and verdict.kind is Kind.HUNG


def passive_reason(answer: Answer) -> str | None:
    """Why the worker of this failed status leaves rotation at once, or None.

    Only the worker's own verdict counts (``"engine_dead": true``), and only
    one its answering instance gave: a verdict ``restored`` from its task
    store is an earlier instance's, which is gone (issue 32: a router that
    read it ejected and restarted the healthy instance that restored it).
    The reason names its rule, never the task's error text, which may quote
    a user's document and reaches the audit log and ``/health``.
    """
    if not engine_dead_failure(answer):
        return None
    verdict = answer.verdict
    if verdict is not None and verdict.restored:
        return None
    rule = verdict.rule if verdict is not None else ""
    return f"a task failed with a fatal error (rule {rule or 'engine_dead'})"


def trigger_rule(answer: Answer) -> str | None:
    """The rule, when this failed task was the *trigger* of its engine's death; else None.

    Collateral failures (queued or running when another task found the
    engine dead, or failed by the stall watchdog) never count against a
    document, nor does a hung task whose engine is remote
    (:attr:`TaskVerdict.counts_against_document`).
    """
    verdict = answer.verdict
    if verdict is None or not verdict.counts_against_document:
        return None
    if not (engine_dead_failure(answer) or hung_failure(answer)):
        return None
    return verdict.rule or "unknown rule"


def next_step(answer: Answer, worker: WorkerView) -> Step:
    """What to do with one answer about a task that is not terminal in the router."""
    if answer.kind is AnswerKind.STATUS:
        if engine_dead_failure(answer):
            return Step(Action.RESUBMIT, ResubmitReason.ENGINE_DEAD.value, answer.error)
        if hung_failure(answer):
            return Step(Action.RESUBMIT, ResubmitReason.HUNG.value, answer.error)
        if worker.replaced and worker.same_instance and not is_terminal(answer.status):
            return Step(
                Action.RESUBMIT,
                ResubmitReason.WORKER_FAILED.value,
                "its instance is being restarted",
            )
        return Step(Action.APPLY if worker.same_instance else Action.ADOPT)
    if answer.kind is AnswerKind.NOT_FOUND:
        return Step(Action.RESUBMIT, ResubmitReason.LOST.value, answer.detail)
    if worker.declared_failed:
        return Step(Action.RESUBMIT, ResubmitReason.WORKER_FAILED.value, answer.detail)
    if worker.in_rotation and answer.kind is AnswerKind.BAD_ANSWER:
        return Step(Action.UPSTREAM_ERROR, "", answer.detail)
    return Step(Action.WAIT, "", answer.detail)


def is_terminal(status: object) -> bool:
    return status in _TERMINAL


@dataclass(frozen=True, slots=True)
class RetryBudget:
    """Envoy's retry budget: active retries <= max(minimum, percent% of active requests)."""

    percent: float
    minimum: int

    def limit(self, tasks_in_flight: int) -> int:
        share = math.floor(self.percent / 100.0 * max(0, tasks_in_flight) + 1e-9)
        return max(self.minimum, share)

    def allows(self, *, retries_in_flight: int, tasks_in_flight: int) -> bool:
        """True when one more resubmission keeps the retries in flight within the limit."""
        return retries_in_flight + 1 <= self.limit(tasks_in_flight)


class Refusal(enum.Enum):
    RETRIES = "retries"  # TASK_RETRIES resubmissions already made
    BUDGET = "budget"  # the fleet-wide retry budget is spent
    NO_WORKER = "no_worker"  # no healthy worker within the wait
    POISON = "poison"  # the document killed engines on two workers
    REJECTED = "rejected"  # a worker refused the resubmitted upload (4xx)


def refuse_resubmission(
    *,
    submissions: int,
    task_retries: int,
    budget: RetryBudget,
    retries_in_flight: int,
    tasks_in_flight: int,
) -> Refusal | None:
    """Why one more resubmission must not be made (None: it may).

    ``submissions`` counts the task's submissions so far (1 before any
    resubmission); ``retries_in_flight`` excludes this task.
    """
    if submissions - 1 >= task_retries:
        return Refusal.RETRIES
    if not budget.allows(retries_in_flight=retries_in_flight, tasks_in_flight=tasks_in_flight):
        return Refusal.BUDGET
    return None


def failure_text(error: str, note: str) -> str:
    """The task's error as the client sees it: the upstream error, then why it stays failed."""
    error = error.strip()
    return f"{error} [mineru-health: {note}]" if error else f"mineru-health: {note}"

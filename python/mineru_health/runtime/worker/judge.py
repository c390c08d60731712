"""The one judge of a failed task, for every MinerU line.

    >>> outcome = judge(health, exc, remote_engine=False)   # classify, verify, record
    >>> verdict = task_verdict(outcome)                     # what the router is told

An adapter hands the judge the exception and whether the task's engine is a
remote server; the judge classifies the whole exception chain, records the
outcome in the native worker state, and, when no rule decided and the engine
is local, verifies the engine (:func:`mineru_health.verification.confirm`).
The verdicts on tasks failed with the engine (collateral of a death) are
built here too; a hung task's is :meth:`TaskVerdict.hung`.

Stalls, "every task hung", the error budget and the liveness check are
decided in the native state itself (they need no exception); each makes a
fatal record there, which the adapters act on like the judge's.

Thread-safety: every function may be called from any thread.
"""

from __future__ import annotations

import asyncio
import threading

from ... import verification
from ...worker import FatalInfo, Recorded, WorkerHealth
from ..verdict import Kind, Role, TaskVerdict
from . import engine_calls
from .context import log

__all__ = ["collateral_verdict", "judge", "log_outcome", "task_verdict",
           "trigger_or_collateral"]


def judge(health: WorkerHealth, failure: BaseException, *, remote_engine: bool) -> Recorded:
    """Classifies ``failure``, records the outcome, and verifies the engine when undecided.

    Verification blocks up to the verifier's bound. On the event loop it must
    not: there it runs on a thread of its own and this returns the undecided
    outcome (a dead engine it finds is recorded natively, and the worker's
    watcher acts on it). A failure that escaped a call into a local engine is
    verified as a local one even when the task's backend is remote.
    """
    outcome = health.record(failure, remote_engine=remote_engine)
    remote = remote_engine and not engine_calls.raised_by_local_engine(failure)
    if not verification.needs_verification(outcome, remote_engine=remote):
        return outcome
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return verification.confirm(health, outcome, failure, remote_engine=remote)
    threading.Thread(target=verification.confirm, args=(health, outcome, failure),
                     kwargs={"remote_engine": remote}, name="mineru-health-verify",
                     daemon=True).start()
    return outcome


def task_verdict(outcome: Recorded) -> TaskVerdict:
    """The verdict on the task whose own failure ``outcome`` judged."""
    checked = outcome.verification.to_json() if outcome.verification is not None else None
    if not outcome.fatal:
        return TaskVerdict(Kind.TASK_LOCAL, None, outcome.rule, outcome.category,
                           ambiguous=outcome.verdict.ambiguous,
                           remote_engine=outcome.verdict.remote_engine, verification=checked)
    return TaskVerdict.engine_dead(
        Role.TRIGGER if outcome.first else Role.COLLATERAL, outcome.rule, outcome.category,
        ambiguous=outcome.verdict.ambiguous, remote_engine=outcome.verdict.remote_engine,
        verification=checked)


def collateral_verdict(first: FatalInfo | None) -> TaskVerdict:
    """The verdict on a task failed because another failure (or a watchdog) found the engine dead."""
    return TaskVerdict.engine_dead(Role.COLLATERAL, first.rule if first else "",
                                   first.category if first else "")


def trigger_or_collateral(first: FatalInfo, trigger: bool) -> TaskVerdict:
    """The verdict on a task failed with its engine, whose part is known from elsewhere."""
    return TaskVerdict.engine_dead(Role.TRIGGER if trigger else Role.COLLATERAL, first.rule,
                                   first.category)


def log_outcome(task_id: object, outcome: Recorded) -> None:
    """One log line for a judged failure: task-local, or the first fatal one and why."""
    verdict = outcome.verdict
    checked = outcome.verification
    if not outcome.fatal:
        found = f"; engine check {checked.outcome}: {checked.detail}" if checked else ""
        log("INFO", f"task {task_id} failed task-locally "
                    f"({verdict.rule or 'no rule matched'}, {verdict.category or '-'}{found})")
    elif outcome.first and checked is not None:
        log("ERROR", f"fatal failure in task {task_id}: no rule decided it and the engine "
                     f"check failed: {checked.detail}")
    elif outcome.first:
        log("ERROR", f"fatal failure in task {task_id}: rule {outcome.rule} "
                     f"({outcome.category}) matched {verdict.excerpt!r}")

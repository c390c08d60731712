"""The one judge of a failed task, for every MinerU line.

    >>> outcome = judge(health, exc, remote_engine=False)   # classify, verify, record
    >>> verdict = task_verdict(outcome)                     # what the router is told

An adapter hands the judge the exception and whether the task's engine is a
remote server; the judge classifies the whole exception chain, records the
outcome in the native worker state, and, when no rule decided and the engine
is local, has the runtime's verifier check the engine (:func:`confirm`).
The verdicts on tasks failed with the engine (collateral of a death) are
built here too; a hung task's is :meth:`TaskVerdict.hung`.

Stalls, "every task hung", the error budget and the liveness check are
decided in the native state itself (they need no exception); each makes a
fatal record there, which the adapters act on like the judge's.

Thread-safety: every function may be called from any thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading

from ...safe_text import describe_exception, exception_type_name
from ...verification import CATEGORY, Verifier
from ...worker import FatalInfo, Recorded, WorkerHealth
from ..verdict import Kind, Role, TaskVerdict
from . import engine_calls
from .context import runtime
from .log import log

__all__ = ["collateral_verdict", "confirm", "judge", "log_outcome", "needs_verification",
           "task_verdict", "trigger_or_collateral"]


def judge(health: WorkerHealth, failure: BaseException, *, remote_engine: bool) -> Recorded:
    """Classifies ``failure``, records the outcome, and verifies the engine when undecided.

    Verification blocks up to the verifier's bound. On the event loop it must
    not: there it runs on a thread of its own and this returns the undecided
    outcome (a dead engine it finds is recorded natively, and the worker's
    watcher acts on it). A failure that escaped a call into a local engine is
    verified as a local one even when the task's backend is remote.
    """
    outcome = health.record(failure, rules=runtime.rules, remote_engine=remote_engine)
    remote = remote_engine and not engine_calls.raised_by_local_engine(failure)
    if not needs_verification(outcome, remote_engine=remote):
        return outcome
    verifier = runtime.verifier
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return confirm(health, outcome, failure, verifier, remote_engine=remote)
    threading.Thread(target=confirm, args=(health, outcome, failure, verifier),
                     kwargs={"remote_engine": remote}, name="mineru-health-verify",
                     daemon=True).start()
    return outcome


def needs_verification(outcome: Recorded, *, remote_engine: bool = False) -> bool:
    """True when no rule decided ``outcome`` and its engine is local.

    Undecided: no rule matched, or only a generic (timeout, cancellation)
    rule; and ambiguous device errors that did not exhaust the error budget.
    A fatal outcome (definitive or heuristic) and a task-local rule's match
    are decisions already.
    """
    verdict = outcome.verdict
    if outcome.fatal or remote_engine or verdict.remote_engine:
        return False
    return not verdict.matched or verdict.ambiguous or verdict.strength == "generic"


def confirm(health: WorkerHealth, outcome: Recorded, failure: BaseException, verifier: Verifier,
            *, remote_engine: bool = False) -> Recorded:
    """Has ``verifier`` check the engines when ``outcome`` is undecided (:func:`needs_verification`).

    Blocks the calling thread up to the verifier's bound: call it off the
    event loop. Returns ``outcome`` itself when nothing needed checking;
    otherwise a copy carrying the :class:`~mineru_health.verification.Verification`,
    made fatal (rule ``verify.<verifier>``, category ``engine_check_failed``,
    recorded in ``health``) when the check found a dead engine. Never raises.
    """
    if verifier.timeout_s <= 0 or not needs_verification(outcome, remote_engine=remote_engine):
        return outcome
    result = verifier.verify(busy=lambda: health.snapshot().engine_calls_in_flight > 0)
    if not result.dead:
        return dataclasses.replace(outcome, verification=result)
    first = health.record_fatal(describe_exception(failure), rule=result.rule, category=CATEGORY,
                                exception_type=exception_type_name(failure))
    return dataclasses.replace(outcome, fatal=True, first=first, rule=result.rule,
                               category=CATEGORY, verification=result)


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

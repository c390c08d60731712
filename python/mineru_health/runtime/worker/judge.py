"""The one judge of a failed task, for every MinerU line.

    >>> outcome = judge(runtime, exc, remote_engine=False)  # classify, verify, record
    >>> verdict = task_verdict(outcome)                     # what the router is told

An adapter hands the judge the exception, whether the task's engine is a
remote server, the failing item's id and, where its MinerU has one, MinerU's
own opinion (:class:`Opinion`); the judge classifies the whole exception
chain, records the outcome in the runtime's native health record, when no
rule decided and the engine is local has the runtime's verifier check the
engine (:func:`confirm`), then asks MinerU's opinion, and records which item
triggered the death (:func:`note_trigger`): once, here, for both lines. A
remote task on the worker's own engine server (``own_server``: the one the
operator configured, not a tenant's ``server_url``) has that server checked
instead (:mod:`.dependency`): down, it is the worker's death too. The
verdicts on tasks failed with the engine (collateral of a death) are built
here too; a hung task's is :meth:`TaskVerdict.hung`.

Stalls, "every task hung", the error budget and the liveness check are
decided in the native state itself (they need no exception); each makes a
fatal record there, which the runtime's watcher acts on like the judge's
(:func:`~mineru_health.runtime.worker.line.act_on_fatal`).

Thread-safety: every function may be called from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import Callable

from ...safe_text import describe_exception, exception_type_name
from ..verdict import Kind, Role, TaskVerdict
from . import dependency, engine_calls
from .health import FatalInfo, Recorded, WorkerHealth
from .log import log
from .verification import CATEGORY, Verifier
from .worker_runtime import WorkerRuntime

__all__ = [
    "Opinion",
    "collateral_verdict",
    "confirm",
    "is_trigger",
    "judge",
    "log_outcome",
    "needs_verification",
    "note_trigger",
    "task_verdict",
    "trigger_or_collateral",
]

#: The category of a death MinerU's own check saw.
ENGINE_DEAD = "engine_dead"
#: Set on the exception whose outcome was the worker's first fatal record.
_FIRST_ATTR = "__mineru_health_first_fatal__"


@dataclasses.dataclass(frozen=True, slots=True)
class Opinion:
    """MinerU's own answer to "is this failure fatal?", where a line has one (4.0's
    ``is_fatal_engine_error``): an input to the judge, never a second judge."""

    rule: str  # the rule a death only MinerU saw is recorded under
    fatal: Callable[[BaseException], bool]


def judge(
    runtime: WorkerRuntime,
    failure: BaseException,
    *,
    remote_engine: bool,
    item_id: str = "",
    opinion: Opinion | None = None,
    own_server: str = "",
) -> Recorded:
    """Classifies ``failure`` with ``runtime``'s rules, records the outcome in its health
    record, has its verifier check the engine when undecided, and records the trigger.

    Verification blocks up to the verifier's bound. On the event loop it must
    not: there it runs on a thread of its own and this returns the undecided
    outcome (a dead engine it finds is recorded natively, and the worker's
    watcher acts on it). A failure that escaped a call into a local engine is
    verified as a local one even when the task's backend is remote.

    ``opinion``: MinerU's own, asked when the outcome is not fatal and the engine
    is local; a death it alone sees is recorded here too (never narrower than
    MinerU). ``item_id``: the task or job whose failure this is ("" when none is
    known yet); the one whose failure made the first fatal record is the trigger
    (:func:`note_trigger`). ``own_server``: host:port of the remote engine server
    the operator configured for this worker, when the task ran on it ("" else).
    """
    outcome = _judged(runtime, failure, remote_engine=remote_engine)
    if own_server and remote_engine and not engine_calls.raised_by_local_engine(failure):
        outcome = _own_server_checked(runtime, outcome, failure, own_server)
    if not outcome.fatal and opinion is not None and not remote_engine and opinion.fatal(failure):
        outcome = _mineru_says_fatal(runtime.health, outcome, failure, opinion.rule)
    if outcome.first:
        with contextlib.suppress(Exception):  # an exception refusing attributes names no trigger
            setattr(failure, _FIRST_ATTR, True)
    note_trigger(runtime, failure, item_id)
    return outcome


def note_trigger(runtime: WorkerRuntime, failure: BaseException, item_id: str) -> None:
    """Records ``item_id`` as the trigger when ``failure`` made the worker's first fatal record.

    The one place the trigger is recorded, for both lines. A failure may be
    judged first with no item known (4.0 asks on an engine's parse thread) and
    be seen again in its item's context (4.0's ``_run_job`` asks again): the
    mark on the exception carries over.
    """
    if item_id and not runtime.trigger_task and getattr(failure, _FIRST_ATTR, False) is True:
        runtime.trigger_task = item_id


def is_trigger(runtime: WorkerRuntime, item_id: object) -> bool:
    """Whether ``item_id``'s own failure was the worker's first fatal one."""
    return bool(runtime.trigger_task) and runtime.trigger_task == item_id


def _mineru_says_fatal(
    health: WorkerHealth, outcome: Recorded, failure: BaseException, rule: str
) -> Recorded:
    """MinerU knows a death our rules do not: its verdict kept, recorded natively."""
    first = health.record_fatal(
        describe_exception(failure),
        rule=rule,
        category=ENGINE_DEAD,
        exception_type=exception_type_name(failure),
    )
    if first:
        log("ERROR", f"fatal engine error (MinerU's own check): {describe_exception(failure)}")
    return dataclasses.replace(outcome, fatal=True, first=first, rule=rule, category=ENGINE_DEAD)


def _judged(runtime: WorkerRuntime, failure: BaseException, *, remote_engine: bool) -> Recorded:
    health = runtime.health
    outcome = health.record(failure, rules=runtime.rules, remote_engine=remote_engine)
    remote = remote_engine and not engine_calls.raised_by_local_engine(failure)
    if not needs_verification(outcome, remote_engine=remote):
        return outcome
    verifier = runtime.verifier
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return confirm(health, outcome, failure, verifier, remote_engine=remote)
    threading.Thread(
        target=confirm,
        args=(health, outcome, failure, verifier),
        kwargs={"remote_engine": remote},
        name="mineru-health-verify",
        daemon=True,
    ).start()
    return outcome


def _own_server_checked(
    runtime: WorkerRuntime, outcome: Recorded, failure: BaseException, server: str
) -> Recorded:
    """``outcome``, made fatal when the worker's own engine server is down; checked on a
    thread of its own from an event loop (the record made there is acted on by the
    worker's watcher), as :func:`confirm` is."""
    if outcome.fatal or runtime.verifier.timeout_s <= 0 or not runtime.health.healthy:
        return outcome  # decided, checks off, or already dead: nothing to ask the server
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return check_own_server(runtime.health, outcome, failure, server, runtime.verifier)
    threading.Thread(
        target=check_own_server,
        args=(runtime.health, outcome, failure, server, runtime.verifier),
        name="mineru-health-dependency",
        daemon=True,
    ).start()
    return outcome


def check_own_server(
    health: WorkerHealth,
    outcome: Recorded,
    failure: BaseException,
    server: str,
    verifier: Verifier,
) -> Recorded:
    """Asks ``server`` whether it answers (bounded by the verifier's timeout); down, the
    failure is recorded fatal in ``health`` (rule and category :mod:`.dependency`'s,
    the server named) and the copy of ``outcome`` returned says so. Never raises."""
    why = dependency.check(server, verifier.timeout_s)
    if not why:
        return outcome
    text = dependency.describe_down(server, why, failure)
    first = health.record_fatal(
        text,
        rule=dependency.RULE,
        category=dependency.CATEGORY,
        exception_type=exception_type_name(failure),
    )
    if first:
        log("ERROR", f"fatal: {text}")
    return dataclasses.replace(
        outcome, fatal=True, first=first, rule=dependency.RULE, category=dependency.CATEGORY
    )


def needs_verification(outcome: Recorded, *, remote_engine: bool = False) -> bool:
    """True when no rule decided ``outcome`` and its engine is local.

    Undecided: no rule matched, or only a generic (timeout, cancellation)
    rule; and ambiguous device errors that did not exhaust the error budget.
    A fatal outcome (definitive or heuristic) and a task-local rule's match
    are decisions already.
    """
    classified = outcome.verdict  # the classifier's, not a task's verdict
    if outcome.fatal or remote_engine or classified.remote_engine:
        return False
    return not classified.matched or classified.ambiguous or classified.strength == "generic"


def confirm(
    health: WorkerHealth,
    outcome: Recorded,
    failure: BaseException,
    verifier: Verifier,
    *,
    remote_engine: bool = False,
) -> Recorded:
    """Has ``verifier`` check the engines when ``outcome`` is undecided
    (:func:`needs_verification`).

    Blocks the calling thread up to the verifier's bound: call it off the
    event loop. Returns ``outcome`` itself when nothing needed checking;
    otherwise a copy carrying the :class:`~mineru_health.runtime.worker.verification.Verification`,
    made fatal (rule ``verify.<verifier>``, category ``engine_check_failed``,
    recorded in ``health``) when the check found a dead engine. Never raises.
    """
    if verifier.timeout_s <= 0 or not needs_verification(outcome, remote_engine=remote_engine):
        return outcome
    result = verifier.verify(busy=lambda: health.snapshot().engine_calls_in_flight > 0)
    if not result.dead:
        return dataclasses.replace(outcome, verification=result)
    first = health.record_fatal(
        describe_exception(failure),
        rule=result.rule,
        category=CATEGORY,
        exception_type=exception_type_name(failure),
    )
    return dataclasses.replace(
        outcome, fatal=True, first=first, rule=result.rule, category=CATEGORY, verification=result
    )


def task_verdict(outcome: Recorded) -> TaskVerdict:
    """The verdict on the task whose own failure ``outcome`` judged."""
    checked = outcome.verification.to_json() if outcome.verification is not None else None
    if not outcome.fatal:
        return TaskVerdict(
            Kind.TASK_LOCAL,
            None,
            outcome.rule,
            outcome.category,
            ambiguous=outcome.verdict.ambiguous,
            remote_engine=outcome.verdict.remote_engine,
            verification=checked,
        )
    return TaskVerdict.engine_dead(
        Role.TRIGGER if outcome.first else Role.COLLATERAL,
        outcome.rule,
        outcome.category,
        ambiguous=outcome.verdict.ambiguous,
        remote_engine=outcome.verdict.remote_engine,
        verification=checked,
    )


def collateral_verdict(first: FatalInfo | None) -> TaskVerdict:
    """The verdict on a task failed because another failure (or a watchdog) found it dead."""
    return TaskVerdict.engine_dead(
        Role.COLLATERAL, first.rule if first else "", first.category if first else ""
    )


def trigger_or_collateral(first: FatalInfo, trigger: bool) -> TaskVerdict:
    """The verdict on a task failed with its engine, whose part is known from elsewhere."""
    return TaskVerdict.engine_dead(
        Role.TRIGGER if trigger else Role.COLLATERAL, first.rule, first.category
    )


def log_outcome(task_id: object, outcome: Recorded) -> None:
    """One log line for a judged failure: task-local, or the first fatal one and why."""
    classified = outcome.verdict
    checked = outcome.verification
    if not outcome.fatal:
        found = f"; engine check {checked.outcome}: {checked.detail}" if checked else ""
        log(
            "INFO",
            f"task {task_id} failed task-locally "
            f"({classified.rule or 'no rule matched'}, {classified.category or '-'}{found})",
        )
    elif outcome.first and checked is not None:
        log(
            "ERROR",
            f"fatal failure in task {task_id}: no rule decided it and the engine "
            f"check failed: {checked.detail}",
        )
    elif outcome.first:
        log(
            "ERROR",
            f"fatal failure in task {task_id}: rule {outcome.rule} "
            f"({outcome.category}) matched {classified.excerpt!r}",
        )

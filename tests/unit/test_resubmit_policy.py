"""Pure parts of task resubmission: eligibility, the retry budget, the poison guard."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mineru_health.runtime.router.poison import PoisonGuard, content_digest
from mineru_health.runtime.router.policy import (
    Action,
    Answer,
    AnswerKind,
    Refusal,
    RetryBudget,
    WorkerView,
    engine_dead_failure,
    failure_text,
    next_step,
    refuse_resubmission,
    trigger_rule,
)


def verdict(role: str | None, rule: str = "vllm.engine_dead") -> dict[str, Any]:
    return {
        "fatal": role == "trigger",
        "engine_dead": role is not None,
        "role": role,
        "rule": rule,
        "category": "engine_dead",
        "ambiguous": False,
        "remote_engine": False,
    }


DEAD_TRIGGER = {
    "status": "failed",
    "error": "EngineDeadError",
    "engine_dead": True,
    "verdict": verdict("trigger"),
}
DEAD_COLLATERAL = {
    "status": "failed",
    "error": "engine unusable",
    "engine_dead": True,
    "verdict": verdict("collateral"),
}
LOCAL_FAILURE = {
    "status": "failed",
    "error": "corrupt PDF",
    "engine_dead": False,
    "verdict": {**verdict(None), "engine_dead": False},
}

IN_ROTATION = WorkerView(in_rotation=True, declared_failed=False, same_instance=True)
EJECTED = WorkerView(in_rotation=False, declared_failed=False, same_instance=True)
FAILED = WorkerView(in_rotation=False, declared_failed=True, same_instance=True)
RESTARTED = WorkerView(in_rotation=True, declared_failed=False, same_instance=False)
RESTARTING = WorkerView(in_rotation=False, declared_failed=True, same_instance=False)
BEING_STOPPED = WorkerView(
    in_rotation=False, declared_failed=True, same_instance=True, replaced=True
)


def status(payload: dict[str, Any]) -> Answer:
    return Answer(AnswerKind.STATUS, payload=payload)


NOT_FOUND = Answer(AnswerKind.NOT_FOUND, detail="404")
UNREACHABLE = Answer(AnswerKind.UNREACHABLE, detail="ConnectError")
BAD_ANSWER = Answer(AnswerKind.BAD_ANSWER, detail="500 from http://w0")


@pytest.mark.parametrize(
    ("answer", "worker", "action", "reason"),
    [
        # The worker's verdict: the engine died under the task, trigger or collateral.
        (status(DEAD_TRIGGER), IN_ROTATION, Action.RESUBMIT, "engine_dead"),
        (status(DEAD_COLLATERAL), FAILED, Action.RESUBMIT, "engine_dead"),
        # Never text matching: an EngineDeadError text without the flag is the task's own failure.
        (
            status({"status": "failed", "error": "EngineDeadError: EngineCore"}),
            IN_ROTATION,
            Action.APPLY,
            "",
        ),
        (status(LOCAL_FAILURE), FAILED, Action.APPLY, ""),
        (status({"status": "processing"}), IN_ROTATION, Action.APPLY, ""),
        (status({"status": "processing"}), FAILED, Action.APPLY, ""),  # the restart decides
        (status({"status": "completed"}), IN_ROTATION, Action.APPLY, ""),
        # The restart is stopping the instance that still holds it: it will never finish.
        (status({"status": "processing"}), BEING_STOPPED, Action.RESUBMIT, "worker_failed"),
        (status({"status": "completed"}), BEING_STOPPED, Action.APPLY, ""),
        # A restarted instance that restored the task from its store: followed, not duplicated.
        (status({"status": "completed"}), RESTARTED, Action.ADOPT, ""),
        (status({"status": "pending"}), RESTARTED, Action.ADOPT, ""),
        (status(DEAD_TRIGGER), RESTARTED, Action.RESUBMIT, "engine_dead"),
        # The current instance does not know it: lost, whatever the worker's state.
        (NOT_FOUND, RESTARTED, Action.RESUBMIT, "lost"),
        (NOT_FOUND, IN_ROTATION, Action.RESUBMIT, "lost"),
        # No answer: only a worker declared failed loses its tasks; a slow one is waited for,
        # and reachability is the health policy's to judge (never MinerU's three strikes).
        (UNREACHABLE, FAILED, Action.RESUBMIT, "worker_failed"),
        (UNREACHABLE, RESTARTING, Action.RESUBMIT, "worker_failed"),
        (UNREACHABLE, EJECTED, Action.WAIT, ""),
        (UNREACHABLE, IN_ROTATION, Action.WAIT, ""),
        # An answer, but an error: MinerU's own count while the worker is in rotation.
        (BAD_ANSWER, IN_ROTATION, Action.UPSTREAM_ERROR, ""),
        (BAD_ANSWER, EJECTED, Action.WAIT, ""),
        (BAD_ANSWER, FAILED, Action.RESUBMIT, "worker_failed"),
    ],
)
def test_next_step(answer: Answer, worker: WorkerView, action: Action, reason: str) -> None:
    step = next_step(answer, worker)
    assert (step.action, step.reason) == (action, reason)


def test_only_a_trigger_counts_against_a_document() -> None:
    assert trigger_rule(status(DEAD_TRIGGER)) == "vllm.engine_dead"
    assert trigger_rule(status(DEAD_COLLATERAL)) is None
    assert trigger_rule(status(LOCAL_FAILURE)) is None
    assert trigger_rule(status({"status": "completed", "verdict": verdict("trigger")})) is None
    assert trigger_rule(status({**DEAD_TRIGGER, "verdict": "trigger"})) is None
    assert engine_dead_failure(status(DEAD_COLLATERAL))
    assert not engine_dead_failure(status({"status": "failed", "engine_dead": "true"}))


@pytest.mark.parametrize(
    ("percent", "minimum", "tasks", "limit"),
    [
        (20, 3, 0, 3),
        (20, 3, 10, 3),  # 2 < the floor
        (20, 3, 20, 4),
        (20, 3, 40, 8),
        (20, 3, 44, 8),  # 8.8 rounds down, as Envoy's integer arithmetic does
        (20, 0, 4, 0),
        (100, 0, 7, 7),
        (0, 5, 1000, 5),
        (12.5, 0, 80, 10),
    ],
)
def test_retry_budget_limit(percent: float, minimum: int, tasks: int, limit: int) -> None:
    budget = RetryBudget(percent, minimum)
    assert budget.limit(tasks) == limit
    if limit:
        assert budget.allows(retries_in_flight=limit - 1, tasks_in_flight=tasks)
    assert not budget.allows(retries_in_flight=limit, tasks_in_flight=tasks)


@pytest.mark.parametrize(
    ("submissions", "retries", "in_flight", "tasks", "refusal"),
    [
        (1, 2, 0, 10, None),
        (2, 2, 0, 10, None),
        (3, 2, 0, 10, Refusal.RETRIES),  # two resubmissions made already
        (1, 0, 0, 10, Refusal.RETRIES),  # 0 never resubmits
        (1, 2, 2, 10, None),  # limit max(3, 2) = 3: the third one fits
        (1, 2, 3, 10, Refusal.BUDGET),
        (1, 2, 7, 40, None),  # limit 8
        (1, 2, 8, 40, Refusal.BUDGET),
    ],
)
def test_refuse_resubmission(
    submissions: int, retries: int, in_flight: int, tasks: int, refusal: Refusal | None
) -> None:
    assert (
        refuse_resubmission(
            submissions=submissions,
            task_retries=retries,
            budget=RetryBudget(20, 3),
            retries_in_flight=in_flight,
            tasks_in_flight=tasks,
        )
        == refusal
    )


def test_failure_text_keeps_the_error_first() -> None:
    assert failure_text("EngineDeadError", "retry budget spent") == (
        "EngineDeadError [mineru-health: retry budget spent]"
    )
    assert failure_text("  ", "no healthy worker") == "mineru-health: no healthy worker"


# --- the poison guard --------------------------------------------------------------------


def test_two_trigger_deaths_on_two_workers_quarantine() -> None:
    guard = PoisonGuard()
    assert guard.record_trigger("doc", "w0", "vllm.engine_dead") is None
    assert guard.quarantined("doc") is None
    # The same worker again (restarted, same document): still one worker.
    assert guard.record_trigger("doc", "w0", "vllm.engine_dead") is None
    quarantine = guard.record_trigger("doc", "w1", "cuda.illegal_address")
    assert quarantine is not None
    assert quarantine.workers == ["w0", "w1"]
    assert quarantine.rules == ["cuda.illegal_address", "vllm.engine_dead"]
    message = quarantine.message(["report.pdf"])
    assert "report.pdf" in message and "w0 (vllm.engine_dead)" in message
    assert "w1 (cuda.illegal_address)" in message
    assert guard.quarantined("doc") == quarantine
    # Reported once; later deaths change nothing.
    assert guard.record_trigger("doc", "w2", "x") is None
    assert guard.quarantined("doc") == quarantine
    assert guard.quarantined("other") is None


def test_guard_memory_is_bounded() -> None:
    guard = PoisonGuard(capacity=2)
    guard.record_trigger("a", "w0", "r")
    guard.record_trigger("b", "w0", "r")
    guard.record_trigger("c", "w0", "r")  # "a" is the least recently touched: forgotten
    assert guard.suspects() == 2
    assert guard.record_trigger("a", "w1", "r") is None  # starts over
    assert guard.record_trigger("c", "w1", "r") is not None
    with pytest.raises(ValueError):
        PoisonGuard(workers_needed=0)


def test_content_digest_depends_on_bytes_and_order_not_names(tmp_path: Path) -> None:
    one, two, same = tmp_path / "one.pdf", tmp_path / "two.pdf", tmp_path / "renamed.pdf"
    one.write_bytes(b"%PDF-1 first")
    two.write_bytes(b"%PDF-1 second")
    same.write_bytes(b"%PDF-1 first")
    assert content_digest([str(one)]) == content_digest([str(same)])
    assert content_digest([str(one)]) != content_digest([str(two)])
    assert content_digest([str(one), str(two)]) != content_digest([str(two), str(one)])


HUNG = {
    "status": "failed",
    "error": "mineru-health: the parse made no progress",
    "engine_dead": False,
    "verdict": {
        **verdict(None),
        "engine_dead": False,
        "role": "trigger",
        "rule": "watchdog.task_hung",
        "category": "task_hung",
        "hung": True,
    },
}


def test_a_hung_task_is_resubmitted_and_counts_against_its_document() -> None:
    """Issue 17: the worker's task watchdog failed it; the worker itself is not ejected."""
    step = next_step(Answer(AnswerKind.STATUS, HUNG), IN_ROTATION)
    assert (step.action, step.reason) == (Action.RESUBMIT, "hung")
    assert not engine_dead_failure(status(HUNG))  # no passive ejection for one hung task
    assert trigger_rule(status(HUNG)) == "watchdog.task_hung"
    guard = PoisonGuard()
    assert guard.record_trigger("doc", "w1", "watchdog.task_hung") is None
    assert guard.record_trigger("doc", "w2", "watchdog.task_hung") is not None  # a 2nd worker


def test_a_hung_task_of_a_remote_engine_never_counts_against_its_document() -> None:
    """Issue 24: whoever names the server decides whether it answers."""
    remote = {**HUNG, "verdict": {**HUNG["verdict"], "remote_engine": True}}
    step = next_step(Answer(AnswerKind.STATUS, remote), IN_ROTATION)
    assert (step.action, step.reason) == (Action.RESUBMIT, "hung")
    assert trigger_rule(status(remote)) is None
    # A death of the worker's own engine counts, whatever the task's backend.
    dead_remote_backend = {
        **DEAD_TRIGGER,
        "verdict": {**DEAD_TRIGGER["verdict"], "remote_engine": True},
    }
    assert trigger_rule(status(dead_remote_backend)) == "vllm.engine_dead"

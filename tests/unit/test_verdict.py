"""The typed verdict: built in one place, read in one place, readable across releases."""

from __future__ import annotations

from typing import Any

import pytest
from mineru_health.runtime.router import policy
from mineru_health.runtime.verdict import HUNG_RULE, VERSION, Kind, Role, TaskVerdict

EVERY_VERDICT = [
    TaskVerdict.engine_dead(Role.TRIGGER, "vllm.engine_dead", "engine_dead"),
    TaskVerdict.engine_dead(Role.COLLATERAL, "watchdog.engine_stalled", "engine_stalled"),
    TaskVerdict.engine_dead(
        Role.TRIGGER,
        "verify.vllm",
        "engine_check_failed",
        verification={"outcome": "dead", "detail": "errored"},
    ),
    TaskVerdict.hung(),
    TaskVerdict.hung(remote_engine=True),
    TaskVerdict(Kind.TASK_LOCAL, None, "pdf.corrupt", "document", ambiguous=False),
    TaskVerdict(Kind.TASK_LOCAL, None, "", "", ambiguous=True, remote_engine=True),
    TaskVerdict.engine_dead(Role.TRIGGER, "vllm.engine_dead", "engine_dead", restored=True),
]


@pytest.mark.parametrize("verdict", EVERY_VERDICT)
def test_a_verdict_survives_the_wire(verdict: TaskVerdict) -> None:
    wire = verdict.to_wire()
    assert wire["version"] == VERSION
    back = TaskVerdict.from_wire(wire)
    assert back == verdict
    assert back is not None and back.verification == verdict.verification


@pytest.mark.parametrize("verdict", EVERY_VERDICT)
def test_a_0_3_router_reads_the_keys_it_knows(verdict: TaskVerdict) -> None:
    """0.3's routers read ``engine_dead``, ``hung``, ``role``, ``rule``, ``remote_engine``."""
    wire = verdict.to_wire()
    assert wire["engine_dead"] is (verdict.kind is Kind.ENGINE_DEAD)
    assert wire.get("hung", False) is (verdict.kind is Kind.HUNG)
    assert wire["role"] == (verdict.role.value if verdict.role else None)
    assert wire["rule"] == verdict.rule and wire["remote_engine"] is verdict.remote_engine


@pytest.mark.parametrize(
    ("wire", "kind", "role"),
    [
        (
            {
                "fatal": True,
                "engine_dead": True,
                "role": "trigger",
                "rule": "r",
                "category": "c",
                "ambiguous": False,
                "remote_engine": False,
            },
            Kind.ENGINE_DEAD,
            Role.TRIGGER,
        ),
        (
            {
                "fatal": False,
                "engine_dead": True,
                "role": "collateral",
                "rule": "r",
                "category": "c",
            },
            Kind.ENGINE_DEAD,
            Role.COLLATERAL,
        ),
        (
            {
                "fatal": False,
                "engine_dead": False,
                "role": "trigger",
                "rule": HUNG_RULE,
                "category": "task_hung",
                "hung": True,
            },
            Kind.HUNG,
            Role.TRIGGER,
        ),
        (
            {"fatal": False, "engine_dead": False, "role": None, "rule": "", "category": ""},
            Kind.TASK_LOCAL,
            None,
        ),
    ],
)
def test_a_0_3_workers_verdict_is_read(wire: dict[str, Any], kind: Kind, role: Role | None) -> None:
    verdict = TaskVerdict.from_wire(wire)
    assert verdict is not None and (verdict.kind, verdict.role) == (kind, role)


def test_a_newer_release_is_read_by_the_fields_this_one_knows() -> None:
    wire = {
        "version": 7,
        "kind": "evicted_by_the_moon",
        "role": "trigger",
        "rule": "r",
        "category": "c",
        "engine_dead": True,
        "fatal": True,
        "colour": "blue",
    }
    verdict = TaskVerdict.from_wire(wire)
    assert verdict is not None and verdict.kind is Kind.ENGINE_DEAD and verdict.rule == "r"


@pytest.mark.parametrize(
    "wire", [None, "engine_dead", 3, [], {"kind": 5, "role": ["x"], "rule": {"a": 1}}]
)
def test_a_hostile_verdict_is_never_an_error(wire: object) -> None:
    verdict = TaskVerdict.from_wire(wire)
    assert verdict is None or (verdict.rule == "" and verdict.role is None)


@pytest.mark.parametrize("verdict", EVERY_VERDICT)
def test_the_policy_reads_every_verdict_through_the_type(verdict: TaskVerdict) -> None:
    payload = {
        "status": "failed",
        "engine_dead": verdict.kind is Kind.ENGINE_DEAD,
        "verdict": verdict.to_wire(),
    }
    assert policy.hung_failure(policy.Answer.of_status(payload)) is (verdict.kind is Kind.HUNG)
    counted = policy.trigger_rule(policy.Answer.of_status(payload))
    assert (counted is not None) is verdict.counts_against_document
    assert verdict.counts_against_document is (
        verdict.role is Role.TRIGGER
        and verdict.kind is not Kind.TASK_LOCAL
        and not (verdict.kind is Kind.HUNG and verdict.remote_engine)
    )


@pytest.mark.parametrize(
    "wire",
    [
        TaskVerdict.engine_dead(Role.TRIGGER, "vllm.engine_dead", "engine_dead").to_wire(),
        {
            "fatal": True,
            "engine_dead": True,
            "role": "trigger",
            "rule": "vllm.engine_dead",
            "category": "engine_dead",
        },  # a 0.3 worker's row in the task store
        {**TaskVerdict.hung().to_wire(), "version": 1},  # 0.4's
    ],
)
def test_a_restored_verdict_is_an_earlier_instances_and_ejects_nothing(
    wire: dict[str, Any],
) -> None:
    """Issue 32: the worker marks what its task store brought back; the router reads the
    mark and leaves the current instance alone, yet the task is sent again and a trigger
    still counts against its document."""
    assert TaskVerdict.from_wire(wire) is not None
    assert not TaskVerdict.from_wire(wire).restored  # type: ignore[union-attr]
    restored = TaskVerdict.restored_wire(wire)
    assert restored == {**wire, "restored": True}  # the rest as written
    verdict = TaskVerdict.from_wire(restored)
    assert verdict is not None and verdict.restored
    dead = verdict.kind is Kind.ENGINE_DEAD
    payload = {"status": "failed", "engine_dead": dead, "verdict": wire}
    again = {**payload, "verdict": restored}
    assert (policy.passive_reason(policy.Answer.of_status(payload)) is not None) is dead
    assert policy.passive_reason(policy.Answer.of_status(again)) is None
    assert policy.trigger_rule(policy.Answer.of_status(again)) == policy.trigger_rule(
        policy.Answer.of_status(payload)
    )
    worker = policy.WorkerView(in_rotation=True, declared_failed=False, same_instance=False)
    step = policy.next_step(policy.Answer(policy.AnswerKind.STATUS, payload=again), worker)
    assert step == policy.next_step(
        policy.Answer(policy.AnswerKind.STATUS, payload=payload), worker
    )
    assert step.action is policy.Action.RESUBMIT


def test_an_old_router_reads_a_restored_verdict_as_before() -> None:
    """0.3's routers read the keys they know; an unknown ``restored`` changes nothing."""
    wire = TaskVerdict.restored_wire(
        TaskVerdict.engine_dead(Role.TRIGGER, "vllm.engine_dead", "engine_dead").to_wire()
    )
    assert wire["engine_dead"] is True and wire["fatal"] is True and wire["role"] == "trigger"

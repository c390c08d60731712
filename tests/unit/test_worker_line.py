"""The worker runtime's one algorithm on a line (``runtime/worker/line.py``) and the judge's
trigger, against a line of the test's own (no MinerU)."""

from __future__ import annotations

import types
from typing import Any

import pytest
from mineru_health.demo.faults import make_engine_dead_error
from mineru_health.runtime.verdict import Kind, Role, TaskVerdict
from mineru_health.runtime.worker import judge, line
from mineru_health.runtime.worker.health import FatalInfo
from mineru_health.runtime.worker.worker_runtime import WorkerRuntime


class _Line:
    """A line whose unfinished items are ``unfinished``; it records what it was asked."""

    item = "task"

    def __init__(
        self,
        unfinished: set[str],
        *,
        fails_remote_waits: bool = True,
        remote: frozenset[str] = frozenset(),
    ) -> None:
        self.unfinished = unfinished
        self.fails_remote_waits = fails_remote_waits
        self.remote = remote
        self.failed: list[tuple[str, str, TaskVerdict]] = []
        self.engine_deaths: list[FatalInfo | None] = []

    def started(self) -> None:
        pass

    def report(self) -> None:
        pass

    def remote_engine(self, item_id: str) -> bool:
        return item_id in self.remote

    def fail(self, item_id: str, text: str, verdict: TaskVerdict) -> bool:
        if item_id not in self.unfinished:
            return False
        self.unfinished.discard(item_id)
        self.failed.append((item_id, text, verdict))
        return True

    def fail_with_engine(self, first: FatalInfo | None) -> str:
        self.engine_deaths.append(first)
        return f"failed {len(self.unfinished)} other task(s)"


class _Health:
    """The runtime's health record, with the watchdogs' findings of the test's own."""

    def __init__(self, real: Any, hung: list[str], expired: list[Any]) -> None:
        self.real, self.hung, self.expired = real, hung, expired
        self.taken = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def take_hung_tasks(self) -> list[str]:
        hung, self.hung = self.hung, []
        return hung

    def take_expired_remote_waits(self) -> list[Any]:
        self.taken += 1
        expired, self.expired = self.expired, []
        return expired


def test_hung_items_fail_with_a_hung_verdict_then_the_death_is_acted_on_once(
    runtime: WorkerRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _Line({"a", "c"}, remote=frozenset({"c"}))
    monkeypatch.setattr(runtime, "health", _Health(runtime.health, ["c", "b", "a"], []))
    line.act(runtime, fake)
    assert [item for item, _, _ in fake.failed] == ["a", "c"]  # b is not unfinished here
    for item, text, verdict in fake.failed:
        assert "made no progress" in text and verdict.kind is Kind.HUNG
        assert verdict.remote_engine is (item == "c")
    assert fake.engine_deaths == []  # healthy: nothing to act on

    runtime.health.record(make_engine_dead_error())
    line.act(runtime, fake)
    line.act_on_fatal(runtime, fake)  # a failure hook too: still once per fatal record
    assert len(fake.engine_deaths) == 1
    first = fake.engine_deaths[0]
    assert first is not None and first.rule == "vllm.engine_dead"


def test_remote_waits_are_failed_only_for_a_line_that_asks(
    runtime: WorkerRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    status = types.SimpleNamespace(task_id="a", server="vlm:8000", reason="silent")
    health = _Health(runtime.health, [], [status])
    monkeypatch.setattr(runtime, "health", health)
    monkeypatch.setattr(line.remote_waits, "describe", lambda s, **_: f"{s.server} sent nothing")
    mine = _Line({"a"}, fails_remote_waits=False)
    assert line.fail_remote_waits(runtime, mine) == 0 and health.taken == 0  # left where they are
    theirs = _Line({"a"})
    assert line.fail_remote_waits(runtime, theirs) == 1
    item, text, verdict = theirs.failed[0]
    assert (item, text) == ("a", "vlm:8000 sent nothing")
    assert verdict == line.remote_wait_verdict() and verdict.kind is Kind.TASK_LOCAL


def test_the_judge_records_the_trigger_once(runtime: WorkerRuntime) -> None:
    first = make_engine_dead_error()
    assert judge.judge(runtime, first, remote_engine=False).first  # no item known yet
    assert runtime.trigger_task == ""
    judge.note_trigger(runtime, first, "a")  # the same failure, seen in its item's context
    later = judge.judge(runtime, make_engine_dead_error(), remote_engine=False, item_id="b")
    assert later.fatal and not later.first
    assert runtime.trigger_task == "a"
    assert judge.is_trigger(runtime, "a") and not judge.is_trigger(runtime, "b")
    assert (
        judge.trigger_or_collateral(
            runtime.health.snapshot().first_fatal,  # type: ignore[arg-type]
            judge.is_trigger(runtime, "b"),
        ).role
        is Role.COLLATERAL
    )


class _OnlyMinerUKnows(Exception):
    pass


def test_mineru_s_opinion_is_an_input_to_the_judge(runtime: WorkerRuntime) -> None:
    runtime.verifier.timeout_s = 0  # nothing to verify here
    asked: list[BaseException] = []

    def mineru_says(error: BaseException) -> bool:
        asked.append(error)
        return isinstance(error, _OnlyMinerUKnows)

    opinion = judge.Opinion("mineru.own_check", mineru_says)
    remote = judge.judge(runtime, _OnlyMinerUKnows("dead"), remote_engine=True, opinion=opinion)
    assert not remote.fatal and not asked  # a remote engine never condemns the worker
    assert not judge.judge(
        runtime, ValueError("corrupt page"), remote_engine=False, opinion=opinion
    ).fatal
    error = _OnlyMinerUKnows("dead")
    outcome = judge.judge(runtime, error, remote_engine=False, item_id="a", opinion=opinion)
    assert outcome.fatal and outcome.first and outcome.rule == "mineru.own_check"
    assert runtime.trigger_task == "a"
    first = runtime.health.snapshot().first_fatal
    assert first is not None and first.rule == "mineru.own_check"

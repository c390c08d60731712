"""The demo's scenarios: one fault each, and one outcome object that judges what followed.

    scenario = SCENARIOS["engine-death"]
    await inject(ctx)                         # writes the victim's fault plan
    verdict = await scenario.outcome.judge(ctx)

An outcome waits (bounded by ``scenario.observe_s``) for the marks the
watchers set, may act once more (crash-loop breaks the rules file so every
restart fails), and returns a ``Verdict``. Used on the demo's event loop only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar, Protocol

from .context import DemoContext, SetupError, port_of
from .watchers import OUT_OF_ROTATION, RESTART_ACTIONS

__all__ = [
    "SCENARIOS",
    "GaveUp",
    "NoRestart",
    "Outcome",
    "Recovered",
    "Scenario",
    "Verdict",
    "inject",
]

RULES_COMMENT = "# mineru-health demo: extra classifier rules (none)\n"
# A rule line without a pattern: the worker refuses to start (RulesError).
BROKEN_RULES = "# mineru-health demo (crash-loop): a broken rule\nbroken.rule fatal\n"


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str


class Outcome(Protocol):
    """What a scenario expects, and how to tell whether it happened."""

    expect: ClassVar[str]  # "recovered", "gave_up" or "no_restart"

    async def judge(self, ctx: DemoContext) -> Verdict: ...


class Recovered:
    """The victim was restarted, is back in rotation and completes tasks again."""

    expect: ClassVar[str] = "recovered"

    async def judge(self, ctx: DemoContext) -> Verdict:
        limit = ctx.scenario.observe_s
        ok = await ctx.wait_for(
            f"{ctx.victim} to be restarted and back in rotation",
            limit,
            lambda: ctx.marks.back_in_rotation_at is not None,
        )
        if not ok:
            return Verdict(False, f"{ctx.victim} did not come back within {limit:.0f}s")
        # Let the restarted worker show that it serves again.
        await ctx.wait_for(
            f"{ctx.victim} to complete tasks again", 20, lambda: ctx.victim_completed() > 0
        )
        ctx.timeline.add(
            "router", f"{ctx.victim} completed {ctx.victim_completed()} task(s) since restart"
        )
        return Verdict(True, "restarted and back in rotation")


class GaveUp:
    """Once the victim is out, every restart fails at start-up until the router gives up."""

    expect: ClassVar[str] = "gave_up"

    async def judge(self, ctx: DemoContext) -> Verdict:
        m = ctx.marks
        limit = ctx.scenario.observe_s
        broke = await ctx.wait_for(
            f"the router to take {ctx.victim} out of rotation",
            60,
            lambda: m.out_of_rotation_at is not None,
        )
        if broke:
            assert ctx.tmp is not None
            (ctx.tmp / "rules.txt").write_text(BROKEN_RULES)
            ctx.timeline.add("demo", "broke the rules file: every new worker now refuses to start")
        ok = broke and await ctx.wait_for(
            f"the router to give up on {ctx.victim}", limit, lambda: m.gave_up_at is not None
        )
        if not ok:
            return Verdict(False, f"no auto_restart_gave_up for {ctx.victim} within {limit:.0f}s")
        ctx.timeline.add(
            "demo",
            f"{ctx.victim} stays out of rotation until a person fixes the cause; "
            f"{ctx.other} keeps serving",
        )
        return Verdict(True, f"gave up after {m.failed_restarts} failed restart(s)")


class NoRestart:
    """One task fails; the router leaves the worker in rotation and restarts nothing."""

    expect: ClassVar[str] = "no_restart"

    def __init__(self, settle_s: float = 8.0) -> None:
        # A few probe intervals after the failure: a wrong decision would show by then.
        self.settle_s = settle_s

    async def judge(self, ctx: DemoContext) -> Verdict:
        m = ctx.marks
        limit = ctx.scenario.observe_s
        failed = await ctx.wait_for(
            "a task to fail task-locally", limit, lambda: m.first_failed_task_at is not None
        )
        if failed:
            settle = time.monotonic() + self.settle_s
            await ctx.wait_for(
                f"the router to leave the worker alone ({self.settle_s:.0f}s)",
                self.settle_s + 1,
                lambda: time.monotonic() > settle,
            )
        restarted = [a for a in m.victim_actions if a in OUT_OF_ROTATION + RESTART_ACTIONS]
        in_rotation = bool(ctx.servers.get(ctx.victim, {}).get("healthy"))
        if not failed:
            return Verdict(False, f"no task failed within {limit:.0f}s")
        if restarted:
            return Verdict(False, f"the router acted on a task-local failure: {restarted}")
        if not in_rotation:
            return Verdict(False, f"{ctx.victim} is not in rotation")
        ctx.timeline.add("router", f"{ctx.victim} still in rotation; no audit event for it")
        return Verdict(True, "one task failed; the worker stayed in rotation, no restart")


@dataclass(frozen=True)
class Scenario:
    """One fault and the outcome that proves the health loop handled it."""

    name: str
    plan: str  # the fault plan word written for the victim
    summary: str
    observe_s: float  # how long after the fault the outcome may take
    outcome: Outcome
    break_restarts: bool = False

    @property
    def expect(self) -> str:
        return self.outcome.expect


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "engine-death",
            "engine_dead",
            "the worker's inference engine dies (vLLM EngineDeadError) on its next task",
            observe_s=120,
            outcome=Recovered(),
        ),
        Scenario(
            "hung-worker",
            "hang",
            "the worker's event loop stops for good: its main port answers nothing, its native "
            "endpoint says loop_hung once the loop has been blocked past the hang limit",
            observe_s=120,
            outcome=Recovered(),
        ),
        Scenario(
            "crash-loop",
            "engine_dead",
            "the engine dies and every restart fails at start-up (a broken rules file)",
            observe_s=240,
            outcome=GaveUp(),
            break_restarts=True,
        ),
        Scenario(
            "task-local",
            "task_local",
            "one document is corrupt: its task fails, the worker stays in rotation",
            observe_s=60,
            outcome=NoRestart(),
        ),
    )
}


async def inject(ctx: DemoContext) -> None:
    """Writes the scenario's fault plan for the victim (the plan path names its port)."""
    assert ctx.tmp is not None
    from mineru_health.testing.faults import write_plan

    port = port_of(ctx.victim_url)
    if port is None:
        raise SetupError(f"cannot tell the port of {ctx.victim_url!r}")
    plan = ctx.scenario.plan
    write_plan(ctx.tmp / f"plan-{port}", plan)
    ctx.marks.fault_at = ctx.timeline.add(
        "demo", f"FAULT: wrote plan {plan!r} for {ctx.victim} (port {port})"
    )

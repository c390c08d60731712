"""The end-of-demo summary: one dict (what ``--json`` prints) and the table made from it."""

from __future__ import annotations

from typing import Any

from .context import DemoContext
from .timeline import since

__all__ = ["build_summary", "render_summary", "scrape_router_metrics"]

_VICTIM_COUNTERS = (
    "mineru_router_restarts_total",
    "mineru_router_gave_up_total",
    "mineru_router_ejections_total",
)


async def scrape_router_metrics(ctx: DemoContext) -> dict[str, float]:
    """The victim's restart, gave-up and ejection counters from the router's ``/metrics``."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, float] = {}
    try:
        response = await ctx.client.get(f"{ctx.router_url}/metrics", timeout=3.0)
    except Exception:  # noqa: BLE001 - the summary just lacks metrics then
        return found
    if response.status_code != 200:
        return found
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name in _VICTIM_COUNTERS and sample.labels.get("worker") == ctx.victim:
                labels = ",".join(
                    f'{k}="{v}"' for k, v in sorted(sample.labels.items()) if k != "worker"
                )
                key = f"{sample.name}{{{labels}}}" if labels else sample.name
                found[key] = sample.value
    return found


def build_summary(
    ctx: DemoContext, *, code: int, reason: str, router_metrics: dict[str, float]
) -> dict[str, Any]:
    m = ctx.marks
    s = ctx.stats
    return {
        "scenario": ctx.scenario.name,
        "expected": ctx.scenario.expect,
        "outcome": "pass" if code == 0 else "fail",
        "reason": reason,
        "exit_code": code,
        "victim": ctx.victim,
        "times_s": {
            name: None if value is None else round(value, 2)
            for name, value in (
                ("fault_injected", m.fault_at),
                ("first_failed_task", m.first_failed_task_at),
                ("worker_unhealthy", m.worker_unhealthy_at),
                ("out_of_rotation", m.out_of_rotation_at),
                ("restart_scheduled", m.restart_scheduled_at),
                ("back_in_rotation", m.back_in_rotation_at),
                ("gave_up", m.gave_up_at),
            )
        },
        "detection_s": since(m.out_of_rotation_at, m.fault_at),
        "recovery_s": since(m.back_in_rotation_at, m.fault_at),
        "restart_attempts": m.restart_attempts,
        "failed_restarts": m.failed_restarts,
        "tasks": {
            "submitted": s.submitted,
            "completed": s.completed,
            "failed": s.failed,
            "hung": s.hung,
            "rejected": s.rejected,
            "completed_while_victim_out": s.completed_during_outage,
        },
        "router_metrics": router_metrics,
        "timeline": [e.__dict__ for e in sorted(ctx.timeline.events, key=lambda e: e.t)],
    }


def _fmt_s(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}s"


def render_summary(summary: dict[str, Any]) -> str:
    """The end-of-demo table, from the same dict --json prints."""
    t = summary["tasks"]
    rows = [
        ("scenario", summary["scenario"]),
        ("victim worker", summary["victim"] or "-"),
        ("expected outcome", summary["expected"].replace("_", " ")),
        ("detection (fault -> out of rotation)", _fmt_s(summary["detection_s"])),
        ("time to recovery (fault -> back in rotation)", _fmt_s(summary["recovery_s"])),
        (
            "restarts scheduled / failed",
            f"{summary['restart_attempts']} / {summary['failed_restarts']}",
        ),
        ("tasks submitted", str(t["submitted"])),
        (
            "tasks completed",
            f"{t['completed']} ({t['completed_while_victim_out']} while the victim was out)",
        ),
        ("tasks failed", str(t["failed"])),
        ("tasks hung (no result in 60s)", str(t["hung"])),
        ("tasks refused by the router", str(t["rejected"])),
    ]
    rows += [
        (f"router metric {name}", f"{value:g}") for name, value in summary["router_metrics"].items()
    ]
    verdict = "PASS" if summary["outcome"] == "pass" else "FAIL"
    rows.append(("result", f"{verdict}: {summary['reason']}"))
    width = max(len(name) for name, _ in rows)
    rule = "-" * (width + 2 + max(len(value) for _, value in rows))
    lines = ["", "Summary", rule]
    lines += [f"{name:<{width}}  {value}" for name, value in rows]
    lines.append(rule)
    return "\n".join(lines)

"""What the demo watches while it runs: the router's /health, its audit file, the victim's /health.

Each watcher is a coroutine that loops until cancelled, adds what changed to
the timeline and sets the marks the outcome and the summary read. Used on
the demo's event loop only.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from pathlib import Path

from .context import DemoContext

__all__ = ["OUT_OF_ROTATION", "RESTART_ACTIONS", "progress", "watch_audit", "watch_router",
           "watch_victim"]

OUT_OF_ROTATION = ("ejected", "health_failed")
RESTART_ACTIONS = ("auto_restart_scheduled", "auto_restart_requested", "auto_restart_success",
                   "auto_restart_failed")
#: Back in rotation: "admitted" after a restart (the restart itself counts as a
#: success only after the stability window), "recovered" otherwise.
BACK_IN_ROTATION = ("admitted", "recovered")


async def watch_router(ctx: DemoContext) -> None:
    """Router /health every 0.5 s: restarts on a new URL, per-worker completed tasks."""
    assert ctx.router is not None
    while True:
        payload = await ctx.get_json(f"{ctx.router_url}/health", timeout=2.0)
        servers = payload.get("servers") if isinstance(payload, dict) else None
        for entry in servers if isinstance(servers, list) else []:
            sid = str(entry.get("server_id"))
            old = ctx.servers.get(sid, {})
            url = str(entry.get("base_url") or "")
            if url and old.get("base_url") and url != old.get("base_url"):
                ctx.timeline.add("router", f"{sid} now runs on {url} (new process)")
                if sid == ctx.victim:
                    ctx.victim_url = url
            if old.get("healthy") and not entry.get("healthy"):
                ctx.timeline.add("router", f"{sid} out of rotation ({entry.get('state', '?')})")
            elif not old.get("healthy") and entry.get("healthy"):
                ctx.timeline.add("router", f"{sid} back in rotation")
            ctx.servers[sid] = dict(entry)
        ctx.processes.record_descendants(ctx.router)
        await asyncio.sleep(0.5)


def _read_from(path: Path, offset: int) -> tuple[str, int]:
    """What was appended to ``path`` since ``offset``, and the new offset."""
    try:
        with open(path, encoding="utf-8") as handle:
            handle.seek(offset)
            return handle.read(), handle.tell()
    except FileNotFoundError:
        return "", offset


async def watch_audit(ctx: DemoContext) -> None:
    """Tails the router's audit JSON lines."""
    assert ctx.tmp is not None
    path = ctx.tmp / "audit.jsonl"
    offset = 0
    pending = ""
    while True:
        chunk, offset = await asyncio.to_thread(_read_from, path, offset)
        pending += chunk
        *lines, pending = pending.split("\n")
        for line in lines:
            if line.strip():
                on_audit_line(ctx, line)
        await asyncio.sleep(0.2)


def on_audit_line(ctx: DemoContext, line: str) -> None:
    """One audit record: a timeline line, and the victim's marks once the fault is in."""
    try:
        record = json.loads(line)
        when = datetime.fromisoformat(str(record["time"])).timestamp()
    except (ValueError, KeyError, TypeError):
        ctx.timeline.add("audit", line[:160])
        return
    t = ctx.timeline.at(when)
    worker = str(record.get("worker_id", "?"))
    action = str(record.get("action", "?"))
    reason = " ".join(str(record.get("reason", "")).split())
    attempt = record.get("attempt", 0)
    ctx.timeline.add(
        "audit",
        f"{worker}: {action} [{record.get('from')} -> {record.get('to')}, attempt {attempt}]"
        + (f" {reason[:110]}" if reason else ""),
        t=t,
    )
    m = ctx.marks
    if worker != ctx.victim or m.fault_at is None or t < m.fault_at - 0.5:
        return
    m.victim_actions.append(action)
    if action in OUT_OF_ROTATION and m.out_of_rotation_at is None:
        m.out_of_rotation_at = t
    elif action == "auto_restart_scheduled":
        m.restart_attempts += 1
        if m.restart_scheduled_at is None:
            m.restart_scheduled_at = t
    elif action == "auto_restart_failed":
        m.failed_restarts += 1
    elif action in BACK_IN_ROTATION and m.back_in_rotation_at is None:
        if m.out_of_rotation_at is not None:
            m.back_in_rotation_at = t
            ctx.timeline.add(
                "task",
                f"{ctx.stats.completed_during_outage} task(s) completed on the other "
                "worker(s) while the victim was out",
            )
    elif action == "auto_restart_gave_up" and m.gave_up_at is None:
        m.gave_up_at = t


async def watch_victim(ctx: DemoContext) -> None:
    """The victim's own /health, every 0.25 s (its URL changes when it is restarted)."""
    import httpx

    while True:
        url = ctx.victim_url
        if url:
            try:
                response = await ctx.client.get(f"{url}/health", timeout=1.0)
                if response.status_code == 200:
                    state = "200 healthy"
                else:
                    body = response.json() if response.content else {}
                    if isinstance(body, dict) and body.get("engine_dead"):
                        state = (
                            f"{response.status_code} engine dead "
                            f"(rule {body.get('rule')}, {str(body.get('error'))[:60]})"
                        )
                    else:
                        state = f"{response.status_code} unhealthy"
            except httpx.TimeoutException:
                state = "no answer within 1s"
            except httpx.HTTPError as exc:
                state = f"unreachable ({type(exc).__name__})"
            except ValueError:
                state = "answer is not JSON"
            if state != ctx.victim_health:
                ctx.victim_health = state
                t = ctx.timeline.add("worker", f"{ctx.victim} {url}/health: {state}")
                m = ctx.marks
                faulted = m.fault_at is not None and m.worker_unhealthy_at is None
                if faulted and not state.startswith("200"):
                    m.worker_unhealthy_at = t
        await asyncio.sleep(0.25)


async def progress(ctx: DemoContext) -> None:
    """A progress line during long waits (see ``Timeline.maybe_progress``)."""
    while True:
        ctx.timeline.maybe_progress()
        await asyncio.sleep(1.0)

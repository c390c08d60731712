"""A router's store deleted, then truncated, under it mid-stream; then ``kill -9`` and a new router.

    run = vanish_and_restart(first, start_second, client_for, document, state)
    run.records      # the first router's state_file_vanished records: deleted, truncated
    run.deleted_at   # tasks accepted when the store was deleted
    run.ids          # every task the first router accepted
    run.not_found    # those the second router answered 404 for
    run.lost         # those it did not end completed: {task id: status}
    nothing_lost(run, state)   # the assertions both lines' tests make

One thread submits ``document(n)`` every ``every_s`` (``router_restart``'s
feed); once 3 are accepted the store file is deleted, once 3 more are and
the router audited it, it is truncated to 0 bytes; 3 more, audited, then the
stream stops, the router is killed with ``SIGKILL`` and ``start_second()``
starts a new one on the same state directory, through which every accepted
task is followed to its end. Every wait is bounded; nothing is timed.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mineru_health.demo.fleet import Client, Router
from mineru_health.demo.sandbox import SandboxError, wait_until
from mineru_health.runtime.router.store import DB_NAME
from router_restart import _Feed, _status

__all__ = ["VanishRun", "nothing_lost", "vanish_and_restart"]


@dataclass
class VanishRun:
    second: Router
    records: list[dict[str, Any]]
    deleted_at: int
    ids: list[str]
    not_found: list[str] = field(default_factory=list)
    lost: dict[str, str] = field(default_factory=dict)


def vanish_and_restart(
    first: Router,
    start_second: Callable[[], Router],
    client_for: Callable[[Router], Client],
    document: Callable[[int], tuple[str, bytes]],
    state: Path,
    *,
    every_s: float = 0.2,
    task_timeout_s: float = 180.0,
) -> VanishRun:
    feed = _Feed(client_for(first), document, every_s)

    def vanished() -> list[dict[str, Any]]:
        return [r for r in first.audit_records() if r["action"] == "state_file_vanished"]

    def accepted(count: int, records: int) -> None:
        if not wait_until(lambda: feed.count() >= count and len(vanished()) >= records, 60.0, 0.05):
            raise SandboxError(
                f"{feed.count()} accepted, {len(vanished())} audited:\n{first.proc.log_tail()}"
            )

    try:
        accepted(3, 0)
        (state / DB_NAME).unlink()
        deleted_at = feed.count()
        accepted(deleted_at + 3, 1)
        os.truncate(state / DB_NAME, 0)
        accepted(feed.count() + 3, 2)
    finally:
        feed.stop()
    records = vanished()
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait(30.0)

    second = start_second()
    new = client_for(second)
    run = VanishRun(second, records, deleted_at, [task_id for _, task_id in feed.ids()])
    run.not_found = [t for t in run.ids if _status(new, t)[0] == 404]
    for task_id in run.ids:
        if task_id in run.not_found:
            run.lost[task_id] = "not found"
            continue
        outcome = new.wait(task_id, timeout_s=task_timeout_s)
        if outcome.status != "completed":
            run.lost[task_id] = outcome.status
    return run


def nothing_lost(run: VanishRun, state: Path) -> None:
    """Both audited, with what they kept; nothing accepted lost; the new router found it whole."""
    log = run.second.proc.log_tail(6000)
    deleted, truncated = run.records
    assert "was deleted" in deleted["reason"] and deleted["set_aside"] is None, deleted
    assert "was truncated" in truncated["reason"] and truncated["unreadable"] == 0, truncated
    assert Path(truncated["set_aside"]).parent == state, truncated
    assert truncated["rows"] >= run.deleted_at + 3, (truncated, run.deleted_at)
    assert run.not_found == [], (run.not_found, len(run.ids), log)
    assert run.lost == {}, (run.lost, log)
    assert not [r for r in run.second.audit_records() if r["action"].startswith("state_file")]

"""The router's store writes run on a thread (issue 35): the event loop serves meanwhile.

A store whose ``save`` blocks until the test lets it go (a ``threading.Event``) stands for
a PostgreSQL round trip, or a database out of reach for ``WRITE_WAIT_S``. No processes,
no sleeps: each wait is an event, bounded.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from mineru_health.runtime.router.admission import STORAGE, STORE_DOWN, Refused
from mineru_health.runtime.router.line import Kept, Snapshot
from mineru_health.runtime.router.store import Saved
from mineru_health.runtime.router.supervisor import Supervisor
from mineru_health.runtime.settings import HealthSettings
from test_task_supervisor import Fleet

WAIT_S = 5.0  # bound of every wait here; none is reached when the writes leave the loop


class BlockingStore:
    """A store whose writes wait for ``go``; ``written`` says what it committed."""

    recall = None
    router_id = ""
    unreachable: str | None = None

    def __init__(self, path: Path, *, writes: bool = True) -> None:
        self.path = path
        self.writes = writes  # False: every write fails (a full disk, a database away)
        self.entered = threading.Event()
        self.go = threading.Event()
        self.written: dict[str, str] = {}
        self.closed = False

    def save(self, saved: Saved) -> bool:
        self.entered.set()
        if not self.go.wait(WAIT_S):
            return False
        assert not self.closed, "written after the store was closed"
        if self.writes:
            self.written[saved.key] = saved.state
        return self.writes

    def check(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True


class TerseLine:
    """A line reduced to what keeping and writing a submission calls."""

    def __init__(self) -> None:
        self.released: list[str] = []

    def snapshot(self, kept: Kept) -> Snapshot:
        return Snapshot(state=kept.item.state, upstream_id="up-1", source="", record={})

    def release(self, kept: Kept) -> None:
        self.released.append(kept.key)


def supervisor_on(store: BlockingStore) -> tuple[Supervisor, TerseLine]:
    line = TerseLine()
    settings = HealthSettings.preset("fast")
    return Supervisor(Fleet(), line, settings, store=store), line  # type: ignore[arg-type]


def keep(supervisor: Supervisor, key: str = "t1") -> Kept:
    item = SimpleNamespace(state="running")
    return supervisor.keep(key, item, "w0", "http://w0:1", save=False)


async def when_written(store: BlockingStore, then: Any) -> Any:
    """Once the store's write is under way on its thread: ``then()``, then the write ends.
    On a blocked event loop this never runs before the write gave up (``WAIT_S``)."""
    assert await asyncio.to_thread(store.entered.wait, WAIT_S)
    try:
        return then()
    finally:
        store.go.set()


def test_the_loop_serves_while_a_submissions_row_is_written(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = BlockingStore(tmp_path / "router.sqlite3")
        supervisor, _ = supervisor_on(store)
        kept = keep(supervisor)
        commit = asyncio.create_task(supervisor.commit_off_loop(kept))
        # Another request's work runs while the write waits: the loop is not held.
        seen = await asyncio.wait_for(
            when_written(store, lambda: (commit.done(), kept.busy, dict(store.written))), 2 * WAIT_S
        )
        assert seen == (False, True, {})  # its client not answered yet, nothing checks it
        await asyncio.wait_for(commit, WAIT_S)  # written: now its client hears of it
        assert store.written == {"t1": "running"} and not kept.busy
        assert supervisor.find("t1") is kept
        await supervisor.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("unreachable", "status", "reason"),
    [(None, 507, STORAGE), ("the router's store cannot be reached", 503, STORE_DOWN)],
)
def test_a_row_not_written_on_its_thread_is_refused_as_before(
    tmp_path: Path, unreachable: str | None, status: int, reason: str
) -> None:
    async def scenario() -> None:
        store = BlockingStore(tmp_path / "router.sqlite3", writes=False)
        store.unreachable = unreachable
        store.go.set()
        supervisor, line = supervisor_on(store)
        kept = keep(supervisor)
        with pytest.raises(Refused) as refused:
            await supervisor.commit_off_loop(kept)
        assert (refused.value.status, refused.value.reason) == (status, reason)
        assert supervisor.find("t1") is None and line.released == ["t1"]  # not kept
        assert supervisor.refusal_counts()[reason] == 1
        await supervisor.close()

    asyncio.run(scenario())


def test_close_waits_for_a_write_under_way_before_it_closes_the_store(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = BlockingStore(tmp_path / "router.sqlite3")
        supervisor, _ = supervisor_on(store)
        kept = keep(supervisor)
        kept.item.state = "completed"
        ending = asyncio.create_task(supervisor.release_off_loop(kept))
        assert await asyncio.to_thread(store.entered.wait, WAIT_S)
        closing = asyncio.create_task(supervisor.close())
        ending.cancel()  # the router shuts down: its task goes, its write still ends
        for _ in range(20):  # turns of the loop: close gets as far as it can
            await asyncio.sleep(0)
        assert not closing.done() and not store.closed  # the write is under way: kept open
        store.go.set()
        await asyncio.wait_for(closing, WAIT_S)
        assert store.closed and store.written == {"t1": "completed"}

    asyncio.run(scenario())


def test_a_store_set_again_is_the_one_every_part_writes_to(tmp_path: Path) -> None:
    """Tests put their own backend under a built supervisor: its parts follow it."""

    async def scenario() -> None:
        first, second = BlockingStore(tmp_path / "a.sqlite3"), BlockingStore(tmp_path / "b")
        supervisor, _ = supervisor_on(first)
        supervisor.store = second  # type: ignore[assignment]
        second.go.set()
        await supervisor.commit_off_loop(keep(supervisor))
        assert second.written == {"t1": "running"} and first.written == {}
        assert supervisor.resending.store is second
        assert supervisor.resuming is not None and supervisor.resuming.store is second
        await supervisor.close()
        assert second.closed and not first.closed

    asyncio.run(scenario())

"""The runtime's task store, line-agnostic: rows, reads from another process, attach, keep."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mineru_health.runtime.settings import WorkerSettings
from mineru_health.runtime.worker import store
from mineru_health.runtime.worker.worker_runtime import WorkerRuntime


@pytest.fixture
def opened(runtime: WorkerRuntime, tmp_path: Path) -> Iterator[store.Store]:
    settings = WorkerSettings.from_env({"MINERU_HEALTH_STATE_DIR": str(tmp_path / "state")})
    runtime.defer_store(settings, store.state_dir(settings, "unused"))
    current = runtime.open_store()
    assert current is not None and current.path == tmp_path / "state" / store.DB_NAME
    yield current
    current.close()


def test_rows_round_trip_oldest_first_and_unreadable_ones_go(
    opened: store.Store, tmp_path: Path
) -> None:
    opened.save("a", {"status": "completed", "names": ["ü.pdf"]}, {"engine_dead": False})
    opened.save("b", {"status": "failed"})
    opened.save("a", {"status": "completed", "names": ["ü.pdf"]}, {"engine_dead": True})
    with contextlib.closing(sqlite3.connect(opened.path)) as db, db:
        db.executemany(
            "INSERT INTO finished VALUES (?, ?, ?, 0)",
            [
                ("bad-json", "{not json", None),
                ("a-list", "[1]", None),
                ("bad-verdict", "{}", "[]"),
                ("a-number", 7, None),
            ],
        )
    assert store.read(opened.path.parent, "a-list") is None  # the router skips them too
    assert opened.count() == 6
    assert opened.rows() == [
        ("b", {"status": "failed"}, None),
        ("a", {"status": "completed", "names": ["ü.pdf"]}, {"engine_dead": True}),
    ]
    assert opened.count() == 2  # the unreadable rows were deleted
    opened.delete(["b", "unknown"])
    assert [row[0] for row in opened.rows()] == ["a"]
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / store.DB_NAME).write_bytes(b"not a database" * 100)
    assert store.read(damaged, "a") is None


def test_configure_opens_once_per_process_and_leaves_older_files_alone(
    runtime: WorkerRuntime, opened: store.Store, tmp_path: Path
) -> None:
    old = opened.path.parent / "mineru-health-tasks.sqlite3"  # the previous release's file
    with contextlib.closing(sqlite3.connect(old)) as db, db:
        db.execute("CREATE TABLE tasks (task_id TEXT PRIMARY KEY, task TEXT)")
    other = WorkerSettings.from_env({"MINERU_HEALTH_STATE_DIR": str(tmp_path / "other")})
    runtime.defer_store(other, tmp_path / "other")
    assert runtime.open_store() is opened
    assert not (tmp_path / "other").exists()
    with contextlib.closing(sqlite3.connect(old)) as db:
        assert db.execute("SELECT name FROM sqlite_master").fetchall() == [
            ("tasks",),
            ("sqlite_autoindex_tasks_1",),
        ]


class Owner:
    """A stand-in for MinerU's task manager or job store: a finish and an expiry method."""

    def __init__(self) -> None:
        self.items: dict[str, str] = {}

    def finish(self, key: str) -> str:
        return f"finished {key}"

    def expire(self) -> int:
        gone = [k for k in self.items if k.startswith("old")]
        for key in gone:
            del self.items[key]
        return len(gone)


def _attach(current: store.Store, owner: Owner, put_back: store.PutBack) -> int:
    def row_of(key: str) -> store.Row | None:
        status = owner.items.get(key)
        return (key, {"status": status}, None) if status in ("completed", "failed") else None

    return store.attach(
        current,
        owner,
        put_back,
        finish="finish",
        row_of=row_of,
        expire="expire",
        live=lambda: owner.items,
    )


def test_attach_puts_rows_back_then_keeps_what_finishes_and_forgets_what_expires(
    opened: store.Store,
) -> None:
    for key in ("back", "gone", "left", "broken"):
        opened.save(key, {"status": "completed"})
    owner = Owner()
    seen: list[str] = []

    def put_back(key: str, record: dict[str, Any], verdict: dict[str, Any] | None) -> bool | None:
        seen.append(key)
        if key == "broken":
            raise TypeError("a row of another MinerU version")
        if key == "back":
            owner.items[key] = record["status"]
        return {"back": True, "gone": False, "left": None}[key]

    assert _attach(opened, owner, put_back) == 1
    assert seen == ["back", "gone", "left", "broken"]
    assert sorted(row[0] for row in opened.rows()) == ["back", "left"]  # dropped: gone, broken
    assert _attach(opened, owner, put_back) == 0 and len(seen) == 4  # once per owner

    owner.items.update({"old-1": "completed", "new-1": "failed", "running": "processing"})
    assert [owner.finish(k) for k in ("old-1", "new-1", "running")] == [
        "finished old-1",
        "finished new-1",
        "finished running",
    ]  # MinerU's results kept
    assert sorted(row[0] for row in opened.rows()) == ["back", "left", "new-1", "old-1"]
    assert owner.expire() == 1
    assert sorted(row[0] for row in opened.rows()) == ["back", "left", "new-1"]


def test_keeping_never_raises(opened: store.Store) -> None:
    def row_of(key: str) -> store.Row | None:
        if key == "bug":
            raise KeyError(key)
        return key, {"status": "completed"}, None

    store.keep(opened, row_of, "bug")
    opened.close()  # every later write raises inside the store
    store.keep(opened, row_of, "t1")


def test_one_connection_serves_many_threads(opened: store.Store) -> None:
    def write(thread: int) -> None:
        for index in range(50):
            opened.save(f"{thread}-{index}", {"status": "completed"})

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30.0)
    assert opened.count() == 400

"""The worker's task store with a stand-in for MinerU's AsyncTaskManager (no processes)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from mineru_health.errors import ConfigError
from mineru_health.mineru3.worker import task_store
from mineru_health.runtime.settings import WorkerSettings
from mineru_health.runtime.worker import store
from mineru_health.runtime.worker.worker_runtime import WorkerRuntime

TASK_COMPLETED = "completed"
TASK_FAILED = "failed"
VERDICT_ATTR = "_mineru_health_verdict"


@dataclasses.dataclass
class AsyncParseTask:
    """The fields of MinerU 3.4.4's task that matter here (the store keeps them all)."""

    task_id: str
    status: str
    output_dir: str
    file_names: list[str]
    return_md: bool = True
    submit_order: int = 0
    completed_at: str | None = None
    error: str | None = None


class FakeTaskManager:
    """Looks up AsyncParseTask and the status names in its module, as the store does."""

    def __init__(self) -> None:
        self.tasks: dict[str, AsyncParseTask] = {}
        self.task_events: dict[str, asyncio.Event] = {}
        self.signalled: list[str] = []
        self.expire: set[str] = set()

    def _signal_task_event(self, task_id: str) -> None:
        self.signalled.append(task_id)

    def cleanup_expired_tasks(self) -> int:
        for task_id in self.expire:
            self.tasks.pop(task_id, None)
        return len(self.expire)


def configure(runtime: WorkerRuntime, settings: WorkerSettings) -> store.Store | None:
    """What the 3.x install does, then its gate once serving."""
    runtime.defer_store(settings, task_store.state_dir(settings))
    return runtime.open_store()


@pytest.fixture
def state(runtime: WorkerRuntime, tmp_path: Path) -> Iterator[Path]:
    settings = WorkerSettings.from_env({"MINERU_HEALTH_STATE_DIR": str(tmp_path / "state")})
    assert configure(runtime, settings) is not None
    yield tmp_path / "state"
    current = runtime.store
    if current is not None:
        current.close()


def finished(tmp_path: Path, task_id: str, status: str = TASK_COMPLETED) -> AsyncParseTask:
    output = tmp_path / "out" / task_id
    output.mkdir(parents=True)
    return AsyncParseTask(task_id, status, str(output), [task_id], completed_at="2026-01-01T00:00Z")


def test_finished_tasks_survive_a_restart(
    runtime: WorkerRuntime, state: Path, tmp_path: Path
) -> None:
    before = FakeTaskManager()
    assert task_store.attach(runtime.store, before) == 0
    done = finished(tmp_path, "done")
    dead = finished(tmp_path, "dead", TASK_FAILED)
    gone = finished(tmp_path, "gone")
    running = AsyncParseTask("running", "processing", str(tmp_path), ["running"])
    verdict = {"engine_dead": True, "role": "trigger", "rule": "vllm.engine_dead"}
    setattr(dead, VERDICT_ATTR, verdict)
    for task in (done, dead, gone, running):
        before.tasks[task.task_id] = task
        before._signal_task_event(task.task_id)  # MinerU's own call, wrapped
    assert before.signalled == ["done", "dead", "gone", "running"]  # MinerU's behaviour kept
    collateral = finished(tmp_path, "collateral", TASK_FAILED)
    before.tasks["collateral"] = collateral
    task_store.record(runtime.store, before, collateral)  # failed by our hook, never signalled
    current = runtime.store
    assert current is not None and current.count() == 4  # never the running one
    assert (state / store.DB_NAME).is_file()

    Path(gone.output_dir).rmdir()  # its output is gone: it cannot be served
    after = FakeTaskManager()  # the restarted worker
    assert task_store.attach(runtime.store, after) == 3
    assert set(after.tasks) == {"done", "dead", "collateral"}
    assert after.tasks["done"] == done
    assert after.tasks["done"].submit_order == 0
    # Back marked: an earlier instance's verdict, never this one's (issue 32).
    assert getattr(after.tasks["dead"], VERDICT_ATTR) == {**verdict, "restored": True}
    assert all(event.is_set() for event in after.task_events.values())
    assert current.count() == 3  # the stale row was dropped
    assert task_store.attach(runtime.store, after) == 0  # once per manager


def test_rows_go_with_expired_tasks(runtime: WorkerRuntime, state: Path, tmp_path: Path) -> None:
    manager = FakeTaskManager()
    task_store.attach(runtime.store, manager)
    for task_id in ("old", "new"):
        manager.tasks[task_id] = finished(tmp_path, task_id)
        manager._signal_task_event(task_id)
    manager.expire = {"old"}
    assert manager.cleanup_expired_tasks() == 1
    current = runtime.store
    assert current is not None
    assert [row[0] for row in current.rows()] == ["new"]


def test_store_is_sqlite_in_wal_mode(runtime: WorkerRuntime, state: Path, tmp_path: Path) -> None:
    manager = FakeTaskManager()
    task_store.attach(runtime.store, manager)
    manager.tasks["t"] = finished(tmp_path, "t")
    manager._signal_task_event("t")
    # closing(): a connection's own `with` commits but does not close it (3.13 warns).
    with contextlib.closing(sqlite3.connect(state / store.DB_NAME)) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        rows = db.execute("SELECT key, json_extract(record, '$.status') FROM finished")
        assert rows.fetchall() == [("t", "completed")]


def test_unreadable_rows_are_dropped(runtime: WorkerRuntime, state: Path) -> None:
    with contextlib.closing(sqlite3.connect(state / store.DB_NAME)) as db, db:
        db.execute("INSERT INTO finished VALUES ('bad', '{not json', NULL, 0)")
    manager = FakeTaskManager()
    assert task_store.attach(runtime.store, manager) == 0
    current = runtime.store
    assert current is not None and current.count() == 0


def test_off_switch_and_bad_directory(runtime: WorkerRuntime, tmp_path: Path) -> None:
    off = WorkerSettings.from_env(
        {"MINERU_HEALTH_TASK_STORE": "0", "MINERU_HEALTH_STATE_DIR": str(tmp_path)}
    )
    assert configure(runtime, off) is None
    assert task_store.attach(runtime.store, FakeTaskManager()) == 0
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    bad = WorkerSettings.from_env({"MINERU_HEALTH_STATE_DIR": str(blocker / "state")})
    with pytest.raises(ConfigError) as raised:
        configure(runtime, bad)
    assert raised.value.variable == "MINERU_HEALTH_STATE_DIR"
    assert str(blocker) in str(raised.value)


def test_default_directory_is_mineru_output_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MINERU_API_OUTPUT_ROOT", str(tmp_path / "output"))
    assert task_store.state_dir(WorkerSettings.from_env({})) == tmp_path / "output"
    explicit = WorkerSettings.from_env({"MINERU_HEALTH_STATE_DIR": str(tmp_path / "s")})
    assert task_store.state_dir(explicit) == tmp_path / "s"


def test_a_failing_disk_never_fails_the_task(
    runtime: WorkerRuntime, state: Path, tmp_path: Path
) -> None:
    manager = FakeTaskManager()
    task_store.attach(runtime.store, manager)
    current = runtime.store
    assert current is not None
    current.close()  # every later write raises inside the store
    manager.tasks["t"] = finished(tmp_path, "t")
    manager._signal_task_event("t")
    assert manager.signalled == ["t"]


def test_the_router_reads_a_dead_workers_store(
    runtime: WorkerRuntime, state: Path, tmp_path: Path
) -> None:
    manager = FakeTaskManager()
    task_store.attach(runtime.store, manager)
    done = finished(tmp_path, "done")
    setattr(done, VERDICT_ATTR, {"engine_dead": False})
    manager.tasks["done"] = done
    manager._signal_task_event("done")
    fields, verdict = store.read(state, "done") or ({}, None)
    assert fields["status"] == "completed" and verdict == {"engine_dead": False}
    assert store.read(state, "unknown") is None
    assert store.read(tmp_path / "nowhere", "done") is None


@pytest.mark.parametrize("damage", [b"garbage, not a database" * 100, b""])
def test_a_damaged_file_is_set_aside_and_a_fresh_store_started(
    runtime: WorkerRuntime, tmp_path: Path, damage: bytes
) -> None:
    """Issue 17: a store overwritten with garbage made the worker (and the router) exit."""
    directory = tmp_path / "state"
    directory.mkdir()
    (directory / store.DB_NAME).write_bytes(damage or b"SQLite format 3\0" + b"\xff" * 200)
    settings = WorkerSettings.from_env({"MINERU_HEALTH_STATE_DIR": str(directory)})
    current = configure(runtime, settings)
    assert current is not None and current.count() == 0
    kept = [p for p in directory.iterdir() if ".damaged-" in p.name]
    assert len(kept) == 1 and kept[0].read_bytes()[:16] == (damage or b"SQLite format 3\0")[:16]
    current.save("t1", {"task_id": "t1"})
    assert current.count() == 1
    current.close()


def test_a_sealed_store_writes_nothing_more(state: Path) -> None:
    """Sealed once the router that launched the worker is gone: the parses its own processes'
    end fails are not the documents' failures, and the next instance must not serve them."""
    kept = store.Store(state / store.DB_NAME)
    kept.save("done", {"status": "completed"})
    kept.seal()
    kept.save("broken", {"status": "failed", "error": "process pool terminated abruptly"})
    kept.save("done", {"status": "failed"})
    assert [(key, record["status"]) for key, record, _ in kept.rows()] == [("done", "completed")]
    kept.close()
    WorkerRuntime().seal_store()  # no store opened: nothing to seal

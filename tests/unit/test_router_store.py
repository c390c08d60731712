"""The router's store (issue 24): rows, the poison guard's memory, a damaged file, a full disk.

The store's contract (rows, the poison guard's memory, unreadable rows) is tested on both
backends: SQLite's file, and PostgreSQL (a real server, ``conftest.postgres``; skipped
where none is installed). What is about SQLite's file is tested on it alone.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from harness.postgres import PostgresServer
from mineru_health.runtime import state_dirs
from mineru_health.runtime.router.poison import Death, PoisonGuard
from mineru_health.runtime.router.store import DB_NAME, KEPT_NAME, RouterStore, Saved
from mineru_health.runtime.router.stores import Store


class Audit:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def write_record(self, action: str, **fields: Any) -> dict[str, Any]:
        self.records.append({"action": action, **fields})
        return self.records[-1]


def saved(key: str, state: str = "pending", **fields: Any) -> Saved:
    values: dict[str, Any] = {
        "worker": "w0",
        "upstream_id": f"up-{key}",
        "instance": "http://w0:1",
        "workers": ["w0"],
        "source": f"/state/kept/{key}",
        "digest": None,
        "record": {"task": {"task_id": key, "file_names": ["ü.pdf"]}},
    }
    values.update(fields)
    return Saved(key, state, **values)


class Backend:
    """Opens stores on one database, as a router (re)started with the same identity would;
    ``insert_raw`` writes rows as something other than a router would."""

    def __init__(self, name: str, tmp_path: Path, postgres: PostgresServer | None) -> None:
        self.name = name
        self.opened: list[Store] = []
        self._kept = tmp_path / KEPT_NAME
        if postgres is None:
            self._open: Callable[[], Store] = lambda: RouterStore(tmp_path / DB_NAME)
            self._path = tmp_path / DB_NAME
        else:
            from mineru_health.runtime.router.pg_store import PostgresStore

            self.url = postgres.new_database()
            self._open = lambda: PostgresStore(self.url, router_id="router-0", kept_dir=self._kept)

    def open(self) -> Store:
        self.opened.append(self._open())
        return self.opened[-1]

    def insert_raw(self, rows: list[tuple[str, str, str]]) -> None:
        """(key, workers, record) rows with this JSON text, owned by the router."""
        if self.name == "sqlite":
            with contextlib.closing(sqlite3.connect(self._path)) as db, db:
                db.executemany(
                    "INSERT INTO submissions VALUES (?, 's', 'w', 'u', 'i', ?, '', NULL, ?, 0, 0)",
                    rows,
                )
            return
        import psycopg

        with psycopg.connect(self.url) as conn:
            conn.cursor().executemany(
                "INSERT INTO submissions (key, owner, version, state, worker, upstream_id, "
                "instance, workers, source, record, accepted_at) VALUES "
                "(%s, 'router-0', 1, 's', 'w', 'u', 'i', %s, '', %s, 0)",
                rows,
            )


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    server = request.getfixturevalue("postgres") if request.param == "postgresql" else None
    opened = Backend(request.param, tmp_path, server)
    yield opened
    for store in opened.opened:
        store.close()


def test_rows_round_trip_oldest_first_and_a_row_is_replaced(
    backend: Backend, tmp_path: Path
) -> None:
    store = backend.open()
    store.save(saved("a", accepted_at=10.0))
    store.save(saved("b", accepted_at=5.0))
    store.save(saved("a", "completed", workers=["w0", "w1"], source="", accepted_at=10.0))
    store.close()

    again = backend.open()  # a new router on the same directory (database, router id)
    rows = again.rows()
    assert [r.key for r in rows] == ["b", "a"]
    assert rows[1] == saved("a", "completed", workers=["w0", "w1"], source="", accepted_at=10.0)
    assert rows[1].attempts == 2 and rows[0].record["task"]["file_names"] == ["ü.pdf"]
    again.forget(["b", "unknown"])
    assert [r.key for r in again.rows()] == ["a"] and again.count() == 1
    assert again.kept_dir == tmp_path / KEPT_NAME


def test_rows_that_are_not_what_the_router_writes_are_dropped(backend: Backend) -> None:
    store = backend.open()
    store.save(saved("good"))
    backend.insert_raw(
        [("bad-json", "[]", "{not json"), ("a-list", "[]", "[1]"), ("bad-workers", "{}", "{}")]
    )
    assert [r.key for r in store.rows()] == ["good"]
    assert store.count() == 1


def test_the_poison_guards_memory_survives_the_router(backend: Backend) -> None:
    store = backend.open()
    assert store.add_poison_death("d1", "w0", "vllm.engine_dead") == [("w0", "vllm.engine_dead")]
    assert store.add_poison_death("d1", "w0", "other.rule") == [("w0", "vllm.engine_dead")]
    store.add_poison_death("d1", "w1", "cuda.sticky")
    guard = PoisonGuard()
    for digest, deaths in backend.open().poison():
        guard.load(digest, [Death(w, r) for w, r in deaths])
    quarantine = guard.quarantined("d1")
    assert quarantine is not None and quarantine.workers == ["w0", "w1"]
    assert guard.suspects() == 1


def test_a_damaged_file_is_set_aside_audited_and_a_fresh_one_started(tmp_path: Path) -> None:
    (tmp_path / DB_NAME).write_bytes(b"overwritten with garbage\n" * 64)
    audit = Audit()
    store = RouterStore.open(tmp_path, audit)
    assert store is not None and store.count() == 0
    (record,) = audit.records
    aside = Path(record["path"])
    assert record["action"] == "state_file_set_aside" and record["worker_id"] == "router"
    assert aside.parent == tmp_path and aside.name.startswith(f"{DB_NAME}.damaged-")
    assert aside.read_bytes().startswith(b"overwritten with garbage")
    store.save(saved("a"))
    assert [r.key for r in store.rows()] == ["a"]


def test_a_file_that_cannot_be_opened_leaves_the_router_without_a_store(tmp_path: Path) -> None:
    (tmp_path / DB_NAME).mkdir()  # not a file at all: nothing to set aside
    audit = Audit()
    assert RouterStore.open(tmp_path, audit) is None and audit.records == []


def test_a_failed_write_is_logged_once_and_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = RouterStore(tmp_path / DB_NAME)
    store._db.execute("PRAGMA query_only=ON")  # as a full disk would fail every write
    with caplog.at_level(logging.ERROR, logger="mineru_health.router.store"):
        assert store.save(saved("a")) is False
        assert store.save(saved("b")) is False
        store.forget(["a"])
    assert len(caplog.records) == 1 and "will not survive a restart" in caplog.text


def test_memory_store_for_benchmarks(tmp_path: Path) -> None:
    store = RouterStore(":memory:")
    store.save(saved("a"))
    assert store.count() == 1 and store.kept_dir is None and store.path is None


def test_open_database_raises_what_a_fresh_file_would_hit_too(tmp_path: Path) -> None:
    with pytest.raises(sqlite3.OperationalError):
        state_dirs.open_database(tmp_path / "missing" / "x.sqlite3", "", check="SELECT 1")
    assert not list(tmp_path.iterdir())

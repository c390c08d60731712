"""A router store that vanishes is noticed (issue 31): deleted, replaced, truncated, its log lost.

Real SQLite files in a temporary directory. What a router killed with
``kill -9`` leaves is what its files hold (every write is in the OS's page
cache): ``after_kill`` copies the database and its ``-wal`` as they are and
opens the copy as a new router would.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from mineru_health.runtime.router import store as store_module
from mineru_health.runtime.router.store import DB_NAME, KEPT_NAME, RouterStore, Saved


class Audit:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def write_record(self, action: str, **fields: Any) -> dict[str, Any]:
        self.records.append({"action": action, **fields})
        return self.records[-1]

    def actions(self) -> list[str]:
        return [r["action"] for r in self.records]


def saved(key: str, state: str = "pending") -> Saved:
    return Saved(
        key,
        state,
        "w0",
        f"up-{key}",
        "http://w0:1",
        ["w0"],
        "",
        None,
        {"task": {"task_id": key, "padding": "x" * 600}},
    )


def fill(store: RouterStore, prefix: str, count: int) -> list[str]:
    keys = [f"{prefix}{n:04d}" for n in range(count)]
    for key in keys:
        assert store.save(saved(key))
    return keys


def after_kill(path: Path, scratch: Path) -> set[str]:
    """The keys a new router finds after this one is killed now."""
    scratch.mkdir()
    for suffix in ("", "-wal"):
        if Path(f"{path}{suffix}").exists():
            shutil.copy(f"{path}{suffix}", scratch / f"{DB_NAME}{suffix}")
    copy = RouterStore(scratch / DB_NAME)
    try:
        return {row.key for row in copy.rows()}
    finally:
        copy.close()


@pytest.fixture
def live(tmp_path: Path) -> tuple[RouterStore, Audit, list[str]]:
    audit = Audit()
    store = RouterStore.open(tmp_path, audit)
    assert store is not None
    return store, audit, fill(store, "before-", 40)


def replace_with_another_database(path: Path) -> None:
    other = path.with_name("other.sqlite3")
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE unrelated (x)")
    db.close()
    os.replace(other, path)


@pytest.mark.parametrize(
    "how",
    [
        "deleted",
        "directory deleted",
        "replaced",
        "truncated to 0",
        "truncated to half",
        "-wal deleted",
        "-wal truncated",
    ],
)
def test_a_vanished_file_is_audited_and_a_fresh_one_holds_every_row(
    live: tuple[RouterStore, Audit, list[str]],
    tmp_path: Path,
    how: str,
) -> None:
    store, audit, before = live
    path = tmp_path / DB_NAME
    if how == "deleted":
        path.unlink()
    elif how == "directory deleted":
        shutil.rmtree(tmp_path)
    elif how == "replaced":
        replace_with_another_database(path)
    elif how.startswith("truncated"):
        os.truncate(path, 0 if how.endswith("0") else path.stat().st_size // 2)
    else:
        target = tmp_path / f"{DB_NAME}-wal"
        target.unlink() if how.endswith("deleted") else os.truncate(target, 0)
    assert audit.records == []
    after = fill(store, "after-", 10)  # each acknowledged: in the file at the path

    (record,) = audit.records
    assert record["action"] == "state_file_vanished" and record["worker_id"] == "router"
    assert record["path"] == str(path) and record["rows"] == 40 and record["unreadable"] == 0
    word = how.split()[-2] if how.startswith("truncated") else how.split()[-1]
    assert word.rstrip("0") in record["reason"], record["reason"]
    assert after_kill(path, tmp_path / "killed") == set(before + after)
    assert store.count() == 50
    aside = record["set_aside"]
    if how in ("deleted", "directory deleted", "-wal deleted", "-wal truncated"):
        assert aside is None  # nothing at the path that was not the store's own, whole
    else:  # what was found at the path is kept for the operator
        assert Path(aside).parent == tmp_path and Path(aside).name.startswith(DB_NAME)
    if how == "replaced":
        with sqlite3.connect(aside) as db:
            assert db.execute("SELECT name FROM sqlite_master").fetchall() == [("unrelated",)]
        db.close()


def test_a_deleted_shm_loses_nothing_and_is_not_news(
    live: tuple[RouterStore, Audit, list[str]],
    tmp_path: Path,
) -> None:
    # The -shm is an index of the log that SQLite rebuilds from it: nothing is lost.
    store, audit, before = live
    (tmp_path / f"{DB_NAME}-shm").unlink()
    after = fill(store, "after-", 10)
    assert audit.records == []
    assert after_kill(tmp_path / DB_NAME, tmp_path / "killed") == set(before + after)


def test_a_file_whose_pages_are_gone_keeps_what_can_be_read_and_what_the_router_recalls(
    tmp_path: Path,
) -> None:
    audit = Audit()
    first = RouterStore.open(tmp_path, audit)
    assert first is not None
    before = fill(first, "before-", 3000)
    first.close()
    store = RouterStore.open(tmp_path, audit)
    assert store is not None
    store._db.execute("PRAGMA cache_size=16")  # a store many times larger than its cache
    unfinished = [saved(f"unfinished-{n}", "processing") for n in range(5)]
    store.recall = lambda: unfinished  # what the supervisor still keeps
    fill(store, "between-", 5)
    path = tmp_path / DB_NAME
    os.truncate(path, path.stat().st_size // 2)
    after = fill(store, "after-", 5)

    # Rows whose pages are gone cannot be copied (how many depends on which pages held the
    # table's interior nodes): the record says so, with their count where it is known.
    (record,) = audit.records
    assert record["action"] == "state_file_vanished"
    assert record["rows"] < len(before) and record["unreadable"] != 0, record
    assert "could not be read" in record["reason"], record
    found = after_kill(path, tmp_path / "killed")
    assert set(after) | {s.key for s in unfinished} <= found
    assert len(found & set(before)) >= record["rows"] - 5


def test_until_a_fresh_file_is_written_nothing_is_acknowledged(
    live: tuple[RouterStore, Audit, list[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, audit, before = live

    def full_disk(*_args: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store_module, "_copy", full_disk)
    monkeypatch.setattr(store_module, "_RETRY_FRESH_S", 0.0)
    (tmp_path / DB_NAME).unlink()
    assert store.save(saved("refused")) is False
    assert store.save(saved("refused-too")) is False
    assert store.check() is not None and audit.records == []
    monkeypatch.undo()
    store._next_try = 0.0  # the second between two tries has passed
    assert store.save(saved("kept")) is True
    assert audit.actions() == ["state_file_vanished"]
    # The refused ones were written nowhere: they must not come back after a restart.
    assert after_kill(tmp_path / DB_NAME, tmp_path / "killed") == set(before) | {"kept"}
    assert store.check() is None


def test_a_whole_file_is_not_news_and_memory_stores_are_not_checked(
    live: tuple[RouterStore, Audit, list[str]],
    tmp_path: Path,
) -> None:
    store, audit, _before = live
    store.forget(["before-0000"])
    store.add_poison_death("d1", "w0", "vllm.engine_dead")
    assert store.check() is None and audit.records == [] and store.count() == 39
    memory = RouterStore(":memory:")
    assert memory.save(saved("a")) and memory.check() is None


# -- a new router on what a vanished store left ---------------------------------------------


def test_a_new_router_on_an_emptied_file_says_what_it_cannot_resume(tmp_path: Path) -> None:
    (tmp_path / DB_NAME).write_bytes(b"")
    for name in ("mineru-router-request-a", "mineru-router-request-b"):  # 3.x kept uploads
        (tmp_path / KEPT_NAME / name).mkdir(parents=True)
    audit = Audit()
    store = RouterStore.open(tmp_path, audit)
    assert store is not None and store.count() == 0
    (record,) = audit.records
    assert record["action"] == "state_file_vanished" and record["unreadable"] == 2
    assert "empty (0 bytes)" in record["reason"] and "up to 2 unfinished" in record["reason"]


def test_a_new_router_on_a_deleted_file_says_so_where_kept_uploads_show_it(
    tmp_path: Path,
) -> None:
    store = RouterStore.open(tmp_path, Audit())  # the first start: nothing to say
    assert store is not None
    row = saved("kept-row")
    row.source = str(tmp_path / KEPT_NAME / "mineru-router-request-kept")
    store.save(row)
    store.close()
    for name in ("mineru-router-request-kept", "mineru-router-request-lost"):
        (tmp_path / KEPT_NAME / name).mkdir(parents=True)
    audit = Audit()
    again = RouterStore.open(tmp_path, audit)
    assert again is not None and audit.records == []  # each kept upload has its row
    again.close()

    for suffix in ("", "-wal", "-shm"):
        Path(f"{tmp_path / DB_NAME}{suffix}").unlink(missing_ok=True)
    audit = Audit()
    assert RouterStore.open(tmp_path, audit) is not None
    (record,) = audit.records
    assert "missing" in record["reason"] and record["unreadable"] == 2, record


def test_a_new_router_on_a_damaged_file_resumes_what_it_can_read(tmp_path: Path) -> None:
    store = RouterStore(tmp_path / DB_NAME)
    keys = fill(store, "k", 2000)
    store.close()  # checkpointed: every row in the file
    path = tmp_path / DB_NAME
    os.truncate(path, path.stat().st_size // 2)
    audit = Audit()
    again = RouterStore.open(tmp_path, audit)
    assert again is not None
    (record,) = audit.records
    assert record["action"] == "state_file_set_aside" and Path(record["path"]).exists()
    resumed = {row.key for row in again.rows()}
    assert 0 < len(resumed) < len(keys) and resumed <= set(keys)
    assert record["rows"] == len(resumed) and "are resumed" in record["reason"], record

# ruff: noqa: F811 - the PostgreSQL fixtures are imported from test_router_store_pg
"""Kept uploads in the store several routers share (issue 35): ``kept_uploads.py``.

Against a real PostgreSQL (``conftest.postgres``, one new database per test; skipped where
none is installed): a router keeps a submission's uploads with its row; the node is lost
(its state directory removed); a survivor takes the row over, reads the uploads back into
a directory of its own and revives the submission from there (MinerU 3.x's real task
line and records, the fake workers of ``test_task_supervisor``); the row's paths are
rebased by one rule that knows no line (4.0's row shape too).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from mineru_health.runtime.router import kept_uploads
from mineru_health.runtime.router.admission import Refused
from mineru_health.runtime.router.store import KEPT_NAME, Saved
from test_router_resume import registry, router, submit
from test_router_store_pg import expire, stores, url  # noqa: F401 - fixtures, one PostgreSQL each
from test_task_supervisor import Fleet, settle

psycopg = pytest.importorskip(
    "psycopg", reason="psycopg is not installed (pip install 'mineru-health[postgres]')"
)
pg_store = pytest.importorskip("mineru_health.runtime.router.pg_store")
PostgresStore = pg_store.PostgresStore


@pytest.mark.parametrize(
    ("value", "rebased"),
    [
        ("/a/kept/req-1", "/new/0/req-1"),  # the path itself
        ("/a/kept/req-1/doc.pdf", "/new/0/req-1/doc.pdf"),  # under it
        ("/a/kept/req-10/doc.pdf", "/a/kept/req-10/doc.pdf"),  # a sibling that shares a prefix
        ("/s/uploads/f1", "/new/1/f1"),
        ("req-1", "req-1"),  # not a path under one
        (
            {"uploads": [{"path": "/a/kept/req-1/x.pdf", "name": "x.pdf"}], "n": 3, "z": None},
            {"uploads": [{"path": "/new/0/req-1/x.pdf", "name": "x.pdf"}], "n": 3, "z": None},
        ),
    ],
)
def test_paths_under_an_old_source_path_move_to_the_new_one(value: Any, rebased: Any) -> None:
    moves = {"/a/kept/req-1": "/new/0/req-1", "/s/uploads/f1": "/new/1/f1"}
    assert kept_uploads.rebase(value, moves) == rebased


def test_a_4_0_rows_input_files_come_back_on_another_node_under_new_paths(
    stores: dict[str, Any], url: str, tmp_path: Path
) -> None:
    """4.0's shape: ``source`` is its inputs' files, one a line; its record names each."""
    dead, survivor = stores["router-a"], stores["router-b"]
    node = tmp_path / "node-a" / "sources" / "uploads"
    node.mkdir(parents=True)
    documents = {"f1": b"%PDF-1.7 one", "f2": bytes(range(256)) * 9000}  # 2 MiB and a bit
    for name, data in documents.items():
        (node / name).write_bytes(data)
    record = {
        "route": {"public_id": "job_1", "worker_id": "remote-1"},
        "sources": {
            f"file_{name}": {"path": str(node / name), "bytes": len(data), "name": f"{name}.pdf"}
            for name, data in documents.items()
        },
        "body": {"files": [{"source": {"type": "file_id", "file_id": "file_f1"}}]},
    }
    row = Saved(
        "job_1", "running", "remote-1", "up-1", "http://w:1", ["remote-1"], "", None, record
    )
    row = dataclasses.replace(row, source=f"{node / 'f1'}\n{node / 'f2'}")
    dead.renew(10)
    assert dead.save(row) and kept_uploads.keep(dead, row)
    assert dead.upload_names("job_1") == ["0/f1", "1/f2"]
    assert kept_uploads.restore(dead, row, tmp_path) is row  # its files are here: as it is

    shutil.rmtree(tmp_path / "node-a")  # the node is lost
    expire(url, "router-a")
    taken = survivor.take_over()
    assert taken is not None
    (back,) = taken[1]
    into = tmp_path / "node-b"
    into.mkdir()
    restored = kept_uploads.restore(survivor, back, into)
    (directory,) = into.iterdir()
    new = {name: directory / index / name for index, name in (("0", "f1"), ("1", "f2"))}
    assert restored.source == f"{new['f1']}\n{new['f2']}"
    for name, data in documents.items():
        assert restored.record["sources"][f"file_{name}"]["path"] == str(new[name])
        assert new[name].read_bytes() == data
    assert restored.record["body"] == record["body"] and restored.record["route"] == record["route"]

    kept_uploads.drop(survivor, "job_1")  # it ended
    assert survivor.upload_names("job_1") == []


def test_uploads_neither_here_nor_in_the_store_leave_the_row_as_it_is(
    stores: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = stores["router-a"]
    row = Saved("t1", "pending", "w0", "up", "http://w:1", ["w0"], str(tmp_path / "gone"), None, {})
    assert store.save(row)
    with caplog.at_level(logging.WARNING, logger="mineru_health.router.store"):
        assert kept_uploads.restore(store, row, tmp_path) is row
    assert "the store keeps none: it cannot be sent again" in caplog.text
    assert list(tmp_path.iterdir()) == []  # no directory made for nothing


def test_an_upload_the_database_refuses_refuses_the_submission_and_forgets_its_row(
    stores: dict[str, Any], url: str, tmp_path: Path
) -> None:
    """A database that refuses the bytes (here a constraint; a full disk alike) keeps
    nothing of the submission: its row goes, with what was kept of its uploads."""
    store = stores["router-a"]  # the schema made
    with psycopg.connect(url) as conn:
        conn.execute("ALTER TABLE uploads ADD CONSTRAINT small CHECK (octet_length(bytes) < 64)")
    staged = tmp_path / "req-1"
    staged.mkdir()
    (staged / "a.pdf").write_bytes(b"small")
    (staged / "b.pdf").write_bytes(b"x" * 100)
    row = Saved("t1", "pending", "w0", "up", "http://w:1", ["w0"], str(staged), None, {})
    assert store.save(row)
    assert kept_uploads.keep(store, row) is False
    assert store.row("t1") is None and store.upload_names("t1") == []


def test_a_3x_task_taken_over_on_another_node_is_sent_again_from_its_kept_upload(
    stores: dict[str, Any], url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Router A keeps a task (its upload in its state directory and in the database) and
    dies with its node; router B takes its row over, its worker's new instance does not
    know the task: B sends it again from the upload read back into its own scratch."""
    state_a = tmp_path / "state-a"

    def on_postgres(line: Any, router_id: str, state: Path) -> Any:
        line.supervisor.store.close()  # the SQLite file router() opened: not this test's
        store = stores[router_id]
        store._kept_dir = state / KEPT_NAME
        line.supervisor.store = store
        return line

    async def router_a() -> tuple[Any, bytes]:
        line = on_postgres(router(Fleet(), state_a), "router-a", state_a)
        line.supervisor.store.renew(10)
        record, payload = await submit(line, registry(), tmp_path, "lost", "processing")
        assert Path(payload.temp_dir).parent == state_a / KEPT_NAME
        await settle(line)
        return record, Path(payload.uploads[0].path).read_bytes()  # killed: no close

    record, document = asyncio.run(router_a())
    assert stores["router-a"].upload_names(record.task_id) == [
        "0/mineru-router-request-lost/lost.pdf"
    ]
    shutil.rmtree(state_a)  # the node is lost, and its disk
    expire(url, "router-a")
    scratch = tmp_path / "scratch-b"  # router B's own scratch (tempfile's directory there)
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))

    async def router_b() -> None:
        fleet = Fleet()
        sent: list[bytes] = []
        submit_to_worker = fleet.submit

        async def reads_the_upload(base_url: str, payload: Any) -> dict[str, Any]:
            sent.append(Path(payload.uploads[0].path).read_bytes())
            return await submit_to_worker(base_url, payload)

        fleet.submit = reads_the_upload  # type: ignore[method-assign]
        fleet.answers[f"http://w0:1/tasks/{record.upstream_task_id}"] = 404  # w0 restarted
        state_b = tmp_path / "state-b"
        line = on_postgres(router(fleet, state_b), "router-b", state_b)
        tasks = registry()
        line.resume(tasks)
        store = line.supervisor.store
        taken = store.take_over()
        assert taken is not None
        line.supervisor.take_over(*taken)
        await settle(line)
        assert sent == [document]  # sent again, with the bytes the client uploaded
        kept = line.supervisor.find(record.task_id)
        assert kept is not None and Path(kept.item.payload.temp_dir).is_relative_to(scratch)
        row = store.row(record.task_id)[1]
        assert row.source == kept.item.payload.temp_dir  # the new owner's path from now on
        assert row.record["uploads"][0]["path"] == kept.item.payload.uploads[0].path

        fleet.answers["http://w0:1/tasks/up-1"] = {"status": "completed", "error": None}
        await line.refresh(await tasks.get(record.task_id))
        await settle(line)
        assert (await tasks.get(record.task_id)).status == "completed"
        assert store.upload_names(record.task_id) == []  # ended: nothing to send again
        assert not Path(kept.item.payload.temp_dir).exists()
        await line.supervisor.close()

    asyncio.run(router_b())


def test_a_submission_whose_upload_cannot_be_kept_is_refused_and_not_kept(
    stores: dict[str, Any], url: str, tmp_path: Path
) -> None:
    """The supervisor's commit: the upload refused, the submission is refused (507) as
    one whose row could not be written, and nothing of it is left in the database."""
    store = stores["router-a"]  # the schema made
    with psycopg.connect(url) as conn:
        conn.execute("ALTER TABLE uploads ADD CONSTRAINT none CHECK (false)")
    state = tmp_path / "state"

    async def scenario() -> None:
        line = router(Fleet(), state)
        line.supervisor.store.close()
        store._kept_dir = state / KEPT_NAME
        line.supervisor.store = store
        tasks = registry()
        with pytest.raises(Refused) as refused:
            await submit(line, tasks, tmp_path, "refused", "pending")
        assert refused.value.status == 507
        assert tasks._tasks == {} and line.supervisor.in_flight == 0
        assert store.count() == 0
        await line.supervisor.close()

    asyncio.run(scenario())


def test_the_sqlite_store_keeps_no_upload_and_restores_nothing(tmp_path: Path) -> None:
    from mineru_health.runtime.router.store import DB_NAME, RouterStore

    store = RouterStore(tmp_path / DB_NAME)
    row = Saved("t1", "pending", "w0", "up", "http://w:1", ["w0"], str(tmp_path / "x"), None, {})
    assert kept_uploads.keep(store, row) and kept_uploads.restore(store, row) is row
    kept_uploads.drop(store, "t1")
    store.close()


def test_a_4_0_job_taken_over_on_another_node_is_revived_resendable_from_its_kept_inputs(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MinerU 4.0's job line (its registry and source store reduced as in
    ``test_router_resume4``): the job's input kept with its row comes back bound, pinned
    and resendable on the router that takes it over, from its own scratch."""

    from mineru_health.mineru4.router.jobs import JobLine
    from mineru_health.runtime.settings import HealthSettings
    from test_router_resume4 import job_on
    from test_router_resume4 import line_on as line_on4

    def line_on(state: Path, router_id: str) -> tuple[JobLine, Any, Any]:
        settings = HealthSettings.preset("fast").replace(store_url=url, router_id=router_id)
        return line_on4(state, settings)

    state_a = tmp_path / "state-a"

    async def router_a() -> None:
        line, registry, sources = line_on(state_a, "router-a")
        store = line.supervisor.store
        store.renew(10)  # type: ignore[union-attr]
        kept = job_on(line, registry, sources, state_a, 2, "running")
        assert store.upload_names("job_2") == ["0/task-2"]  # type: ignore[union-attr]
        assert kept.item.sources["file-in-2"][0].path.parent == state_a / "sources" / "uploads"
        store.close()  # type: ignore[union-attr]  # killed: the lease is left to expire

    asyncio.run(router_a())
    shutil.rmtree(state_a)
    expire(url, "router-a")
    scratch = tmp_path / "scratch-b"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))

    async def router_b() -> None:
        line, registry, sources = line_on(tmp_path / "state-b", "router-b")
        supervisor = line.supervisor
        taken = supervisor.store.take_over()  # type: ignore[union-attr]
        assert taken is not None
        assert supervisor.take_over(*taken) == (0, 1)
        kept = supervisor.find("job_2")
        assert kept is not None and kept.item.resendable
        stored, name = kept.item.sources["file-in-2"]
        assert name == "a.pdf"
        assert stored.path.is_relative_to(scratch) and stored.path.read_bytes() == b"%PDF-1.4 2"
        assert sources.files["file-in-2"] == stored and sources.pins[stored.path] == 1
        assert registry.find("job", "job_2") is kept.item.route
        await supervisor.close()  # before its reconciliation asks workers this test has not

    asyncio.run(router_b())

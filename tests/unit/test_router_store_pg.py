"""The router store in PostgreSQL (issue 35, item 2): fencing, leases, takeover, the setting.

Against a real server (``conftest.postgres``: Debian's PostgreSQL in a temporary
directory; skipped where none is installed), one new database per test. A lease expires
when the test writes its row into the past (what a router that stopped renewing leaves):
no test waits for time to pass.
"""

from __future__ import annotations

import io
import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from harness.postgres import PostgresServer
from mineru_health.errors import ConfigError
from mineru_health.runtime.router.store import KEPT_NAME, RouterStore, Saved
from mineru_health.runtime.router.stores import open_store
from mineru_health.runtime.settings import HealthSettings

psycopg = pytest.importorskip(
    "psycopg", reason="psycopg is not installed (pip install 'mineru-health[postgres]')"
)
pg_store = pytest.importorskip("mineru_health.runtime.router.pg_store")
PostgresStore = pg_store.PostgresStore


def saved(key: str, state: str = "pending", worker: str = "w0") -> Saved:
    return Saved(
        key,
        state,
        worker,
        f"up-{key}",
        "http://w0:1",
        [worker],
        "",
        "digest",
        {"task": {"task_id": key}},
        accepted_at=float(len(key)),
    )


@pytest.fixture
def url(postgres: PostgresServer) -> str:
    return postgres.new_database()


@pytest.fixture
def stores(url: str) -> Iterator[dict[str, Any]]:
    """``stores[router_id]``: that router's store on the test's database, closed at the end."""
    opened: dict[str, Any] = {}

    class Opener(dict[str, Any]):
        def __missing__(self, router_id: str) -> Any:
            opened[router_id] = self[router_id] = PostgresStore(url, router_id=router_id)
            return opened[router_id]

    yield Opener()
    for store in opened.values():
        store.close()


def expire(url: str, router_id: str) -> None:
    """What a router that stopped renewing leaves: its lease in the past."""
    with psycopg.connect(url) as conn:
        conn.execute(
            "UPDATE routers SET lease_until = now() - interval '1 second' WHERE router_id = %s",
            (router_id,),
        )


def row_of(url: str, key: str) -> tuple[Any, ...] | None:
    with psycopg.connect(url) as conn:
        found = conn.execute(
            "SELECT owner, version, state, worker FROM submissions WHERE key = %s", (key,)
        ).fetchone()
        return None if found is None else tuple(found)


def test_a_router_whose_rows_were_taken_over_writes_nothing(
    stores: dict[str, Any], url: str, caplog: pytest.LogCaptureFixture
) -> None:
    paused, survivor = stores["router-a"], stores["router-b"]
    assert paused.renew(10) is False  # a new lease
    assert paused.save(saved("t1")) and paused.save(saved("t2", "completed"))
    assert paused.save(saved("t1", "processing"))
    assert row_of(url, "t1") == ("router-a", 2, "processing", "w0")

    survivor.renew(10)
    assert survivor.take_over() is None  # router-a's lease holds
    expire(url, "router-a")
    dead, rows = survivor.take_over()
    assert dead == "router-a" and sorted(r.key for r in rows) == ["t1", "t2"]
    assert row_of(url, "t1") == ("router-b", 3, "processing", "w0")
    assert survivor.save(saved("t1", "processing", worker="w1"))

    with caplog.at_level(logging.WARNING, logger="mineru_health.router.store"):
        assert paused.save(saved("t1", "failed")) is False  # back from its pause: fenced
    assert paused.fenced == 1 and "owned by 'router-b' at version 4" in caplog.text
    paused.forget(["t1", "t2"])
    assert row_of(url, "t1") == ("router-b", 4, "processing", "w1")
    assert paused.count() == 0 and survivor.count() == 2
    assert paused.renew(10) is False  # it learns its lease had lapsed
    assert [r.key for r in paused.rows()] == []


def test_two_processes_under_one_router_id_are_fenced_on_the_version(
    stores: dict[str, Any], url: str
) -> None:
    first = stores["router-a"]
    assert first.save(saved("t1"))
    second = PostgresStore(url, router_id="router-a")  # the same name: a restart, or a mistake
    try:
        assert [r.key for r in second.rows()] == ["t1"]
        assert second.save(saved("t1", "processing"))
        assert first.save(saved("t1", "failed")) is False and first.fenced == 1
        assert row_of(url, "t1") == ("router-a", 2, "processing", "w0")
        assert second.save(saved("t3")) and first.save(saved("t3")) is False  # a key taken
    finally:
        second.close()


def test_one_survivor_takes_over_when_several_race(stores: dict[str, Any], url: str) -> None:
    dead = stores["router-dead"]
    dead.renew(10)
    for n in range(20):
        assert dead.save(saved(f"t{n:02d}"))
    survivors = [stores[f"router-{n}"] for n in range(4)]
    for survivor in survivors:
        survivor.renew(10)
    expire(url, "router-dead")
    start = threading.Barrier(len(survivors), timeout=10)
    taken: dict[str, Any] = {}

    def take(store: Any) -> None:
        start.wait()
        taken[store.router_id] = store.take_over()

    threads = [threading.Thread(target=take, args=(s,)) for s in survivors]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert len(taken) == len(survivors)
    (winner,) = [router for router, got in taken.items() if got is not None]
    assert taken[winner][0] == "router-dead" and len(taken[winner][1]) == 20
    assert stores[winner].count() == 20 and dead.count() == 0
    assert {row_of(url, f"t{n:02d}")[:2] for n in range(20)} == {(winner, 2)}
    assert all(s.take_over() is None for s in survivors)  # its lease row went with its rows


def test_a_takeover_in_flight_is_skipped_not_waited_for(stores: dict[str, Any], url: str) -> None:
    dead, survivor = stores["router-dead"], stores["router-b"]
    dead.renew(10)
    assert dead.save(saved("t1"))
    expire(url, "router-dead")
    with psycopg.connect(url) as other, other.transaction():  # another survivor, mid-takeover
        other.execute("SELECT 1 FROM routers WHERE router_id = 'router-dead' FOR UPDATE")
        result: list[Any] = []
        thread = threading.Thread(target=lambda: result.append(survivor.take_over()))
        thread.start()
        thread.join(timeout=10)
        assert not thread.is_alive() and result == [None]
    assert survivor.take_over()[0] == "router-dead"  # that one gave up: now it is taken


def test_a_released_lease_is_taken_over_at_once_and_renewals_keep_one(
    stores: dict[str, Any],
) -> None:
    leaving, survivor = stores["router-a"], stores["router-b"]
    assert leaving.renew(10) is False and leaving.renew(10) is True
    leaving.save(saved("t1"))
    assert survivor.take_over() is None
    leaving.release()
    assert survivor.take_over()[0] == "router-a"


def test_any_router_reads_the_row_that_names_a_file_id(stores: dict[str, Any]) -> None:
    job = saved("job-1", "completed")
    job.record = {"route": {"public_id": "job-1"}, "files": [{"public_id": "file-0a1b"}]}
    assert stores["a"].save(job) and stores["a"].save(saved("job-2"))
    owner, found = stores["b"].row_naming("file-0a1b")
    assert (owner, found.key, found.record) == ("a", "job-1", job.record)
    assert stores["b"].row_naming("file-0a1") is None  # a whole JSON string, not a prefix
    assert stores["b"].row_naming("file-none") is None


def test_the_poison_guards_memory_is_every_routers(stores: dict[str, Any]) -> None:
    a, b = stores["router-a"], stores["router-b"]
    assert a.add_poison_death("d1", "a/w0", "vllm.engine_dead") == [("a/w0", "vllm.engine_dead")]
    assert b.poison() == [("d1", [("a/w0", "vllm.engine_dead")])]
    # Router b saw the second death: it adds to a's, it does not write over it.
    both = [("a/w0", "vllm.engine_dead"), ("b/w0", "cuda.sticky")]
    assert b.add_poison_death("d1", "b/w0", "cuda.sticky") == both
    assert a.add_poison_death("d1", "b/w0", "other.rule") == both  # one per worker
    assert a.poison() == [("d1", both)]


def test_deaths_added_at_once_by_several_routers_are_all_kept(stores: dict[str, Any]) -> None:
    routers = [stores[f"router-{n}"] for n in range(4)]
    barrier = threading.Barrier(len(routers))

    def add(n: int) -> None:
        barrier.wait(10.0)
        routers[n].add_poison_death("d1", f"r{n}/w0", "rule")

    threads = [threading.Thread(target=add, args=(n,)) for n in range(len(routers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30.0)
    (held,) = routers[0].poison()
    assert sorted(w for w, _ in held[1]) == [f"r{n}/w0" for n in range(4)]


def test_a_database_that_refuses_writes_is_logged_once_and_never_raises(
    stores: dict[str, Any], url: str, postgres: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    store = stores["router-a"]
    assert store.save(saved("t1"))
    database = url.rsplit("/", 1)[1]
    with psycopg.connect(url, autocommit=True) as conn:  # as a failed-over, read-only primary
        conn.execute(f"ALTER DATABASE {database} SET default_transaction_read_only = on")
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (database,),
        )
    with caplog.at_level(logging.ERROR, logger="mineru_health.router.store"):
        assert store.save(saved("t2")) is False
        assert store.save(saved("t1", "failed")) is False
        store.forget(["t1"])
        assert store.add_poison_death("d1", "w0", "rule") is None
    assert len(caplog.records) == 1 and "not acknowledged" in caplog.text
    assert "password" not in caplog.text and url.split("@")[1] in caplog.text
    with psycopg.connect(postgres.url, autocommit=True) as conn:  # it is writable again
        conn.execute(f"ALTER DATABASE {database} SET default_transaction_read_only = off")
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (database,),
        )
    assert store.save(saved("t2")) and store.count() == 2


def fleet(tmp_path: Path, **settings: str) -> SimpleNamespace:
    return SimpleNamespace(
        settings=HealthSettings.preset("fast").replace(**settings),
        state_dirs=SimpleNamespace(router_dir=lambda: tmp_path),
        audit=None,
    )


def test_the_setting_chooses_the_backend(url: str, tmp_path: Path) -> None:
    sqlite = open_store(fleet(tmp_path))
    assert isinstance(sqlite, RouterStore) and sqlite.path is not None
    sqlite.close()
    shared = open_store(fleet(tmp_path, store_url=url, router_id="router-7"))
    try:
        assert isinstance(shared, PostgresStore) and shared.path is None
        assert shared.router_id == "router-7" and shared.kept_dir == tmp_path / KEPT_NAME
        assert shared.save(saved("t1")) and shared.check() is None
    finally:
        shared.close()
    unnamed = PostgresStore(url)
    assert unnamed.router_id == socket.gethostname()
    unnamed.close()


@pytest.mark.parametrize(
    "bad", ["mysql://u:secret@db/x", "postgresql://u:secret@db:notaport/x", "sqlite:///state/db"]
)
def test_a_url_that_is_not_postgresqls_is_refused_naming_the_variable(
    bad: str, tmp_path: Path
) -> None:
    settings = HealthSettings.from_env({"MINERU_ROUTER_HEALTH_STORE_URL": bad})
    with pytest.raises(ConfigError) as refused:
        open_store(SimpleNamespace(settings=settings, state_dirs=None, audit=None))
    assert refused.value.variable == "MINERU_ROUTER_HEALTH_STORE_URL"
    assert "MINERU_ROUTER_HEALTH_STORE_URL" in str(refused.value)
    assert "secret" not in str(refused.value)


def test_a_database_that_cannot_be_reached_stops_the_start_up_naming_it() -> None:
    with socket.socket() as unused:  # bound, never listening: connections are refused
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
        with pytest.raises(ConfigError) as refused:
            PostgresStore(f"postgresql://mineru:secret@127.0.0.1:{port}/routers")
    assert refused.value.variable == "MINERU_ROUTER_HEALTH_STORE_URL"
    assert f"postgresql://mineru@127.0.0.1:{port}/routers" in str(refused.value)
    assert "secret" not in str(refused.value)


def test_a_kept_upload_is_read_by_the_router_that_takes_its_row_over(
    stores: dict[str, Any], url: str
) -> None:
    dead, survivor = stores["router-a"], stores["router-b"]
    document = bytes(range(256)) * (3 * pg_store.UPLOAD_CHUNK // 256 + 7)  # 3 chunks and a bit
    dead.renew(10)
    assert dead.save(saved("t1"))
    assert dead.keep_upload("t1", "ü.pdf", io.BytesIO(document))
    assert dead.keep_upload("t1", "empty.pdf", io.BytesIO(b""))
    assert survivor.keep_upload("t1", "x.pdf", io.BytesIO(b"x")) is False  # not its row
    assert dead.keep_upload("unknown", "x.pdf", io.BytesIO(b"x")) is False
    expire(url, "router-a")
    survivor.take_over()

    into = io.BytesIO()
    assert survivor.read_upload("t1", "ü.pdf", into) == len(document)
    assert into.getvalue() == document
    assert survivor.read_upload("t1", "empty.pdf", io.BytesIO()) == 0
    assert survivor.read_upload("t1", "missing.pdf", io.BytesIO()) is None
    assert survivor.upload_names("t1") == ["empty.pdf", "ü.pdf"]
    dead.drop_uploads("t1")  # fenced: not its row any more
    assert survivor.upload_names("t1") == ["empty.pdf", "ü.pdf"]
    survivor.drop_uploads("t1")
    assert survivor.upload_names("t1") == []
    survivor.keep_upload("t1", "again.pdf", io.BytesIO(b"again"))
    survivor.forget(["t1"])  # the row's end takes its uploads with it
    assert survivor.upload_names("t1") == []

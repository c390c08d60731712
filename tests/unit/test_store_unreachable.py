"""A router store that cannot be reached refuses with 503 and Retry-After (issue 35).

The errors of a write are told apart (``pg_store.cannot_reach``: an outage is 503, a
database refusing the row is 507); a supervisor whose store is out of reach refuses at
admission, before anything is staged, and after the fact when the row's write is the one
that found it down, counting both; its router's health says so. Against a real
PostgreSQL of the test's own (stopped with ``pg_ctl stop -m fast`` and started again):
the first write that finds it down waits at most the pool's bound, the next ones do not
ask the pool at all, and once it answers the updates that failed meanwhile are written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mineru_health import metrics
from mineru_health.demo.sandbox import wait_until
from mineru_health.runtime.router.admission import STORE_DOWN, Refused
from mineru_health.runtime.router.store import Saved
from mineru_health.runtime.router.stores import add_store_field
from test_router_resume import registry, router, submit
from test_task_supervisor import Fleet

psycopg = pytest.importorskip(
    "psycopg", reason="psycopg is not installed (pip install 'mineru-health[postgres]')"
)
pg_store = pytest.importorskip("mineru_health.runtime.router.pg_store")
pool_errors = pytest.importorskip("psycopg_pool")

DOWN = "the router's store postgresql://mineru@db:5432/routers cannot be reached (refused)"


@pytest.mark.parametrize(
    ("error", "unreachable"),
    [
        (psycopg.OperationalError("connection refused"), True),  # no SQLSTATE: the client's
        (pool_errors.PoolTimeout("couldn't get a connection after 2.00 sec"), True),
        (psycopg.InterfaceError("the connection is closed"), True),
        (psycopg.errors.AdminShutdown("terminating connection"), True),  # pg_ctl stop
        (psycopg.errors.CannotConnectNow("the database system is starting up"), True),
        (psycopg.errors.TooManyConnections("too many clients"), True),
        (psycopg.errors.ConnectionFailure("connection failure"), True),  # class 08
        (psycopg.errors.DiskFull("could not extend file"), False),  # it refuses: 507
        (psycopg.errors.UniqueViolation("duplicate key"), False),
        (psycopg.errors.ReadOnlySqlTransaction("read-only"), False),
        (OSError(28, "No space left on device"), False),
        (ValueError("ours"), False),
    ],
)
def test_an_outage_is_told_from_a_refusal(error: Exception, unreachable: bool) -> None:
    assert pg_store.cannot_reach(error) is unreachable


def run(test: Any) -> None:
    async def main() -> None:
        await test(Fleet())

    asyncio.run(main())


def test_a_store_out_of_reach_refuses_with_503_at_admission_and_after_the_fact(
    tmp_path: Path,
) -> None:
    async def scenario(fleet: Fleet) -> None:
        line = router(fleet, tmp_path / "state")
        supervisor, store = line.supervisor, line.supervisor.store
        assert store is not None
        store.unreachable = DOWN  # type: ignore[misc]  # what a PostgresStore says then
        with pytest.raises(Refused) as refused:
            supervisor.admit(1024)
        assert (refused.value.status, refused.value.code) == (503, "store_unreachable")
        assert DOWN in refused.value.detail and refused.value.headers["Retry-After"]
        assert supervisor.admitted_bytes == 0  # nothing reserved, nothing to stage
        health: dict[str, Any] = {}
        add_store_field(health, store)
        assert health == {"store": {"reachable": False, "error": DOWN}}

        # The write that finds it down: 503 too (not 507), and undone as a full disk is.
        tasks = registry()
        store.unreachable = None  # type: ignore[misc]
        saves = store.save

        def save_finding_it_down(saved: Saved) -> bool:
            store.unreachable = DOWN  # type: ignore[misc,union-attr]
            return False

        store.save = save_finding_it_down  # type: ignore[method-assign]
        with pytest.raises(Refused) as refused:
            await submit(line, tasks, tmp_path, "down", "pending")
        assert (refused.value.status, refused.value.code) == (503, "store_unreachable")
        assert tasks._tasks == {} and supervisor.in_flight == 0  # never served as accepted
        assert supervisor.refusal_counts()[STORE_DOWN] == 2

        store.unreachable, store.save = None, saves  # type: ignore[method-assign,misc]
        record, _payload = await submit(line, tasks, tmp_path, "back", "pending")
        assert list(tasks._tasks) == [record.task_id] and store.count() == 1
        add_store_field(health, store)
        assert health == {"store": {"reachable": True}}
        metrics._registry.reset()
        try:
            metrics.router.bind_admission_refusals(supervisor.refusal_counts)
            text = metrics.exposition().decode()
            assert "mineru_router_store_unreachable_refusals_total 2.0" in text
        finally:
            metrics._registry.reset()
        await supervisor.close()

    run(scenario)


@pytest.fixture
def own_postgres() -> Iterator[Any]:
    """A PostgreSQL of this test's own: it is stopped and started again."""
    from harness.postgres import running

    with running() as server:
        yield server


def saved(key: str, state: str) -> Saved:
    return Saved(key, state, "w0", f"up-{key}", "http://w0:1", ["w0"], "", None, {}, 1.0)


def test_a_stopped_database_fails_writes_at_once_and_catches_up_when_back(
    own_postgres: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg_store, "CATCH_UP_ROWS", 1)  # one per write, the rest by check()
    url = own_postgres.new_database()
    store = pg_store.PostgresStore(url, router_id="router-0")

    def rows() -> dict[str, str]:
        with psycopg.connect(url) as conn:
            return dict(conn.execute("SELECT key, state FROM submissions").fetchall())

    try:
        assert store.save(saved("kept", "pending")) and store.save(saved("old", "completed"))
        assert store.save(saved("kept2", "pending"))
        assert store.unreachable is None
        own_postgres.pause()

        assert not store.save(saved("kept", "processing"))  # finds it down (bounded wait)
        assert store.unreachable is not None and store.where in store.unreachable
        asked = store._pool.get_stats().get("requests_num", 0)
        assert not store.save(saved("new", "pending"))  # a first row: never written later
        assert not store.save(saved("kept", "completed"))
        assert not store.save(saved("kept2", "completed"))
        store.forget(["old"])
        assert store._pool.get_stats().get("requests_num", 0) == asked  # the pool not asked
        assert not store.reach()  # what the probe does: its own connection says why
        assert "refused" in str(store.unreachable).lower(), store.unreachable

        own_postgres.resume()
        assert wait_until(lambda: store.unreachable is None, 30.0, 0.1), store.unreachable
        assert store.save(saved("other", "pending"))  # the next write catches up first
        assert sorted(rows().values()) == ["completed", "pending", "pending"], rows()
        assert "old" not in rows()
        store.check()  # the supervisor's sweep: the rest
        assert rows() == {"kept": "completed", "kept2": "completed", "other": "pending"}
    finally:
        store.close()


def test_4_0_health_says_whether_the_store_can_be_reached() -> None:
    from mineru_health.mineru4.router.health import StoreInHealth
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    class Store:
        unreachable: str | None = None

    store = Store()
    app = Starlette(
        routes=[
            Route("/v1/health", lambda request: JSONResponse({"status": "ok"})),
            Route("/v1/other", lambda request: PlainTextResponse("as it was")),
        ]
    )
    app.add_middleware(StoreInHealth, store_of=lambda: store)
    with TestClient(app) as client:
        assert client.get("/v1/health").json() == {"status": "ok", "store": {"reachable": True}}
        store.unreachable = DOWN
        answer = client.get("/v1/health")
        assert answer.status_code == 200 and int(answer.headers["content-length"]) == len(
            answer.content
        )
        assert answer.json() == {"status": "ok", "store": {"reachable": False, "error": DOWN}}
        assert client.get("/v1/other").text == "as it was"

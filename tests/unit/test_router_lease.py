"""A router's lease in a shared store (issue 35, item 2): renewed, taken over, fenced.

The :class:`Lease` against a fake store, on an injected clock, sleep and thread hop (no
test waits): its renewal every third of ``LEASE_S``, what it hands to the supervisor
after a renewal (an expired router's rows), and the stop of a router whose lease lapsed
and whose submissions another router took. Then two MinerU 3.x routers' task lines on a
real PostgreSQL (``conftest.postgres``; skipped without one): the second answers the
first's task from the shared row (read only), and once the first's lease expired takes
it over and resumes it on the path a restarted router resumes its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from mineru_health.runtime.router.leases import MAX_TAKEOVERS, Lease, shared
from mineru_health.runtime.router.store import RouterStore, Saved

LEASE_S = 3.0


def row(key: str) -> Saved:
    return Saved(key, "pending", "w0", f"up-{key}", "http://w0:1", ["w0"], "", None, {}, 1.0)


class Store:
    """The lease's side of a shared store: what it was asked, what it answers."""

    router_id = "router-a"

    def __init__(self) -> None:
        self.renewals: list[float] = []  # lease_s of each renewal
        self.held: list[bool] = []  # what the next renewals answer (default True)
        self.failing: Exception | None = None
        self.expired: list[tuple[str, list[Saved]]] = []  # what take_over hands out
        self.mine: list[Saved] = []
        self.released = 0
        self.fenced = 0  # writes refused (PostgresStore's count)

    def renew(self, lease_s: float) -> bool:
        if self.failing is not None:
            raise self.failing
        self.renewals.append(lease_s)
        return self.held.pop(0) if self.held else True

    def release(self) -> None:
        self.released += 1

    def take_over(self) -> tuple[str, list[Saved]] | None:
        return self.expired.pop(0) if self.expired else None

    def rows(self) -> list[Saved]:
        return list(self.mine)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


async def at_once(call: Callable[[], Any]) -> Any:
    return call()


class Router:
    """A lease and what it handed to its router."""

    def __init__(self, store: Store | None = None) -> None:
        self.store = store or Store()
        self.clock = Clock()
        self.taken: list[tuple[str, list[str]]] = []
        self.disowned: list[tuple[list[str], str]] = []
        self.kept: list[str] = []
        self.lease = Lease(
            self.store,
            LEASE_S,
            take_back=lambda owner, rows: self.taken.append((owner, [r.key for r in rows])),
            disown=lambda keys, why: self.disowned.append((keys, why)),
            kept=lambda: list(self.kept),
            clock=self.clock,
            sleep=self.clock.sleep,
            in_thread=at_once,
        )


def test_the_lease_is_renewed_every_third_of_it_and_held_a_lease_after_the_last() -> None:
    router = Router()
    assert not router.lease.holds()  # nothing sent before the first renewal
    router.lease.renew_now()
    assert router.lease.holds() and router.store.renewals == [LEASE_S]

    async def rounds(count: int) -> None:
        real_sleep = router.clock.sleep

        async def sleep(seconds: float) -> None:
            if len(router.clock.slept) == count:
                await router.lease.close()
            await real_sleep(seconds)

        router.lease._sleep = sleep
        await router.lease.run()

    asyncio.run(rounds(4))
    assert router.clock.slept[:4] == [LEASE_S / 3] * 4
    assert router.store.renewals == [LEASE_S] * 5  # the start-up's and one a round
    assert router.store.released == 1  # closed: a survivor may take over at once
    assert not router.lease.holds()


def test_a_lease_that_cannot_be_renewed_stops_holding_after_lease_s_and_takes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    router = Router()
    router.lease.renew_now()
    router.store.failing = OSError("connection refused")
    router.store.expired = [("router-b", [row("t1")])]
    with caplog.at_level(logging.ERROR, logger="mineru_health.router.lease"):
        for _ in range(3):
            router.clock.now += LEASE_S / 3
            asyncio.run(router.lease.tick())
    assert not router.lease.holds()  # LEASE_S since the last renewal it asked for
    assert router.taken == [] and router.store.expired  # a router that may be taken takes none
    assert sum("cannot renew its lease" in r.getMessage() for r in caplog.records) == 1
    router.store.failing = None
    asyncio.run(router.lease.tick())
    assert router.lease.holds() and router.taken == []  # its peers renew first (below)


def test_after_an_outage_a_router_takes_over_no_one_for_a_lease_then_a_peer_still_expired(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The database unreachable for longer than the lease: every router's lease lapsed in
    it. Back, a router renews first and finds its live peers expired too; it waits one
    lease (they renew within it), then takes over the one that did not: really gone."""
    router = Router()
    router.lease.renew_now()
    router.kept = ["t0"]
    router.store.failing = OSError("connection refused")
    for _ in range(20):  # 20 s down, a renewal every LEASE_S / 3
        router.clock.now += LEASE_S / 3
        asyncio.run(router.lease.tick())
    router.store.failing = None
    router.store.held = [False]  # its own lease lapsed meanwhile, nothing of it taken
    router.store.mine = [row("t0")]
    router.store.expired = [("router-b", [row("t1")])]  # expired: live, or dead?
    back = router.clock.now
    with caplog.at_level(logging.WARNING, logger="mineru_health.router.lease"):
        while router.clock.now < back + LEASE_S:
            asyncio.run(router.lease.tick())
            assert router.lease.holds() and router.taken == [], router.clock.now - back
            router.clock.now += LEASE_S / 3
    assert router.lease.lapses == 1 and router.disowned == []  # nothing of its own moved
    assert any("no other router had moved" in r.getMessage() for r in caplog.records)
    assert router.store.expired  # not even asked
    asyncio.run(router.lease.tick())  # a lease after: router-b has not renewed, it is gone
    assert router.taken == [("router-b", ["t1"])]


def test_without_an_outage_an_expired_peer_is_taken_over_at_the_first_renewal() -> None:
    router = Router()
    router.lease.renew_now()
    asyncio.run(router.lease.tick())
    router.store.expired = [("router-b", [row("t1")])]
    asyncio.run(router.lease.tick())
    assert router.taken == [("router-b", ["t1"])]


def test_an_expired_routers_rows_are_handed_over_after_a_renewal() -> None:
    router = Router()
    router.store.expired = [("router-b", [row("t1"), row("t2")]), ("router-c", [])]
    router.lease.renew_now()
    asyncio.run(router.lease.tick())
    assert router.taken == [("router-b", ["t1", "t2"]), ("router-c", [])]
    assert router.lease.taken_over == [("router-b", 2), ("router-c", 0)]
    # Many expired at once: MAX_TAKEOVERS a round, the rest at the next one.
    router.store.expired = [(f"r{n}", []) for n in range(MAX_TAKEOVERS + 2)]
    asyncio.run(router.lease.tick())
    assert len(router.taken) == 2 + MAX_TAKEOVERS and len(router.store.expired) == 2
    asyncio.run(router.lease.tick())
    assert not router.store.expired


def test_taken_over_rows_are_readied_in_the_takeovers_thread_before_they_are_taken_back() -> None:
    """``take_in`` (the supervisor's: kept uploads read back) runs in the call that leaves
    the event loop, and ``take_back`` gets what it made of the rows."""
    router = Router()
    threads: list[str] = []

    async def in_a_thread(call: Callable[[], Any]) -> Any:
        threads.append("in")
        try:
            return call()
        finally:
            threads.append("out")

    def take_in(rows: list[Saved]) -> list[Saved]:
        threads.append("take_in")
        return [dataclasses.replace(r, key=f"{r.key}-restored") for r in rows]

    router.lease._in_thread, router.lease._take_in = in_a_thread, take_in
    router.store.expired = [("router-b", [row("t1")])]
    router.lease.renew_now()
    asyncio.run(router.lease.take_over())
    assert router.taken == [("router-b", ["t1-restored"])]
    assert threads == ["in", "take_in", "out", "in", "out"]  # then one that finds none


def test_a_router_whose_lease_lapsed_lets_go_of_what_another_router_took() -> None:
    router = Router()
    router.lease.renew_now()
    router.kept = ["t1", "t2", "t3"]
    router.store.mine = [row("t2")]  # t1 and t3 were taken over while it was paused
    router.store.held = [True, False]
    asyncio.run(router.lease.tick())
    assert router.disowned == []  # held without a lapse: nobody could take anything
    asyncio.run(router.lease.tick())
    [(keys, why)] = router.disowned
    assert keys == ["t1", "t3"]
    assert "lease lapsed" in why and "MINERU_ROUTER_HEALTH_LEASE_S" in why
    assert router.lease.lapses == 1 and router.lease.holds()  # its new lease, for what is left


def test_a_first_lease_taken_anew_is_no_lapse() -> None:
    router = Router()
    router.store.held = [False]  # a router restarted after its lease expired
    router.kept = ["t1"]
    router.lease.renew_now()
    asyncio.run(router.lease.tick())
    assert router.disowned == [] and router.lease.holds()


def test_metrics_read_the_leases_counts_at_each_scrape() -> None:
    from mineru_health import metrics
    from prometheus_client.parser import text_string_to_metric_families

    names = {
        "mineru_router_store_fenced_writes_total",
        "mineru_router_lease_lapses_total",
        "mineru_router_takeovers_total",
    }

    def scraped() -> dict[str, float]:
        text = metrics.exposition().decode()
        return {
            s.name: s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name in names
        }

    metrics._registry.reset()
    router = Router()
    router.store.fenced = 2  # a PostgresStore counts the writes it refused
    router.store.expired = [("router-b", [row("t1")])]
    router.lease.renew_now()
    router.kept = ["t2"]
    router.store.held = [False]  # it was paused: t2 was taken meanwhile
    asyncio.run(router.lease.tick())

    async def started_then_closed() -> tuple[dict[str, float], float]:
        router.lease.start()  # binds its counts
        running = scraped()
        router.store.fenced = 3
        fenced = scraped()["mineru_router_store_fenced_writes_total"]  # read, not copied
        await router.lease.close()
        return running, fenced

    try:
        running, fenced = asyncio.run(started_then_closed())
        assert running == {
            "mineru_router_store_fenced_writes_total": 2.0,
            "mineru_router_lease_lapses_total": 1.0,
            "mineru_router_takeovers_total": 1.0,
        }
        assert fenced == 3.0
        assert scraped() == {}  # a closed lease unbinds: the families stay, empty
    finally:
        metrics._registry.reset()


def test_only_a_shared_store_has_a_lease(tmp_path: Path) -> None:
    assert shared(Store()) is not None
    sqlite = RouterStore(tmp_path / "router.sqlite3")
    try:
        assert shared(sqlite) is None
    finally:
        sqlite.close()


# -- two routers' task lines on a real PostgreSQL ------------------------------------------


@pytest.fixture
def pg_url(postgres: Any) -> str:
    pytest.importorskip("psycopg", reason="psycopg is not installed")
    return str(postgres.new_database())


@pytest.fixture
def expire(pg_url: str) -> Iterator[Callable[[str], None]]:
    import psycopg

    def expire(router_id: str) -> None:
        """What a router that stopped renewing leaves: its lease in the past."""
        with psycopg.connect(pg_url) as conn:
            conn.execute(
                "UPDATE routers SET lease_until = now() - interval '1 second' WHERE router_id = %s",
                (router_id,),
            )

    yield expire


def test_a_peers_task_is_answered_from_its_row_then_taken_over_and_resumed(
    tmp_path: Path, pg_url: str, expire: Callable[[str], None]
) -> None:
    from mineru_health.mineru3.router.tasks import TaskLine, workers_tried
    from mineru_health.runtime.router.pg_store import PostgresStore
    from mineru_health.runtime.router.supervisor import Supervisor
    from mineru_health.runtime.settings import HealthSettings
    from test_router_resume import namespace, registry, submit
    from test_task_supervisor import Fleet, settle

    def router(fleet: Fleet, router_id: str) -> TaskLine:
        """A router's task line and supervisor, as the pool builds them (the fake fleet is
        both MinerU's pool and the runtime's fleet)."""
        settings = HealthSettings.preset("fast").replace(
            interval_s=0.05, probe_timeout_s=0.02, connect_timeout_s=0.01, boot_timeout_s=1.0
        )
        line = TaskLine(fleet, namespace(fleet))
        state = tmp_path / router_id
        state.mkdir()
        store = PostgresStore(pg_url, router_id=router_id, kept_dir=state / "kept")
        fleet.supervisor = Supervisor(fleet, line, settings, store=store)  # type: ignore[attr-defined]
        return line

    async def both() -> None:
        fleet_a, fleet_b = Fleet(), Fleet()
        a, b = router(fleet_a, "router-a"), router(fleet_b, "router-b")
        tasks_a, tasks_b = registry(), registry()
        a.resume(tasks_a)
        b.resume(tasks_b)
        record, _ = await submit(a, tasks_a, tmp_path, "doc", "processing")

        # Router b answers a's task from its row, read only; the worker says how it runs.
        fleet_b.answers["http://w0:1/tasks/first-doc"] = {"status": "completed"}
        seen = await tasks_b.get(record.task_id)
        assert seen is not None and b.owner(seen) == "router-a"
        assert (await b.refresh_shared(seen)).status == "completed"
        # A failure on the worker is the owner's to judge (it may send the task again).
        fleet_b.answers["http://w0:1/tasks/first-doc"] = {"status": "failed", "engine_dead": True}
        seen = await tasks_b.get(record.task_id)
        assert (await b.refresh_shared(seen)).status == "processing"  # the row's
        assert b.supervisor.kept() == [] and fleet_b.submitted == []
        assert await tasks_b.get("no-such-task") is None

        # Router a is killed (no shutdown); once its lease expires, b takes its task over
        # and resumes it as a restarted router does: its worker lost it, sent again.
        fleet_b.answers["http://w0:1/tasks/first-doc"] = 404
        expire("router-a")
        assert b.supervisor.lease is not None
        await b.supervisor.lease.tick()
        await settle(b)
        assert b.supervisor.lease.taken_over == [("router-a", 1)]
        mine = await tasks_b.get(record.task_id)
        assert b.owner(mine) is None and b.tracks(mine)
        assert fleet_b.submitted == [("w0", "up-1")]
        assert workers_tried(mine) == ["w0", "w0"] and mine.upstream_task_id == "up-1"

        # Router a was only paused: its writes are refused, its renewal lets the task go,
        # under a client's question that waits on the worker meanwhile: that one is
        # answered from router b's row (it was a 500: its check cancelled under it).
        kept_a = a.supervisor.kept()[0]
        assert not a.supervisor.save(kept_a)
        worker_answers = asyncio.Event()

        async def slow_worker(url: str, timeout: float) -> httpx.Response:
            await worker_answers.wait()
            return httpx.Response(200, json={"status": "processing"})

        fleet_a.client = SimpleNamespace(get=slow_worker)
        asking = asyncio.create_task(a.refresh(await tasks_a.get(record.task_id)))
        for _ in range(100):  # until its check waits on the worker
            if kept_a.check is not None:
                break
            await asyncio.sleep(0)
        assert kept_a.check is not None and not kept_a.check.done()
        assert a.supervisor.lease is not None
        await a.supervisor.lease.tick()
        assert a.supervisor.kept() == []
        worker_answers.set()  # the shared row's answer asks the worker too (read only)
        answered = await asyncio.wait_for(asking, 10.0)
        assert a.owner(answered) == "router-b" and answered.status == "processing"
        assert a.owner(await tasks_a.get(record.task_id)) == "router-b"  # answered from its row
        assert any(r["action"] == "submissions_taken_over" for r in fleet_a.audit.records)
        for line in (a, b):
            await line.supervisor.close()

    asyncio.run(both())

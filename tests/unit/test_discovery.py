"""Workers found by DNS (runtime/router/discovery.py) without DNS: the pure reconcile and
schedule, the upstream setting, and the discovery over the runtime's fleet with a scripted
resolver (loopback fake workers, fake_fleet.py). The real lookup is the C++ resolver_test's
and the integration test's (dnsmasq).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from fake_fleet import (
    FakeMember,
    Fleet,
    Recorder,
    fast_settings,
    run_async,
    start_fleet,
    stop_fleet,
)
from mineru_health import _native
from mineru_health._native import ResolveOutcome, WorkerPhase
from mineru_health.errors import ConfigError
from mineru_health.metrics.router import DnsCollector
from mineru_health.runtime.router.discovery import (
    HURRY_GAP_S,
    Change,
    Discovery,
    DiscoveryStats,
    Schedule,
    Upstream,
    parse_upstream,
    reconcile,
)


@dataclass
class Answer:
    outcome: Any = ResolveOutcome.ADDRESSES
    addresses: list[str] = field(default_factory=list)
    error: str = ""
    truncated: bool = False


def addresses(*items: str) -> Answer:
    return Answer(addresses=list(items))


EMPTY = Answer(ResolveOutcome.EMPTY, [], "Domain name not found")
FAILED = Answer(ResolveOutcome.FAILED, [], "no answer within 2 s")


# --- reconcile: the last good set and an answer -> what changes ------------------------


@pytest.mark.parametrize(
    ("active", "draining", "answer", "expected"),
    [
        ((), (), addresses("a", "b"), Change(admit=("a", "b"))),
        (("a", "b"), (), addresses("a", "b"), Change()),
        (("a", "b"), (), addresses("b", "c", "d"), Change(admit=("c", "d"), drain=("a",))),
        (("a", "b", "c"), (), addresses("c"), Change(drain=("a", "b"))),
        (("c",), ("a",), addresses("a", "c"), Change(restore=("a",))),
        (("c",), ("a",), addresses("b"), Change(admit=("b",), drain=("c",))),
    ],
)
def test_reconcile_admits_new_addresses_and_drains_gone_ones(
    active: tuple[str, ...], draining: tuple[str, ...], answer: Answer, expected: Change
) -> None:
    assert reconcile(active, draining, answer) == expected


def test_reconcile_never_admits_an_address_the_router_has_as_a_worker_already() -> None:
    # .5 is an --upstream-url: in the answer, it is neither admitted nor, gone, drained.
    assert reconcile((), (), addresses("a", "s"), known={"s"}) == Change(admit=("a",))
    assert reconcile(("a",), (), addresses("s"), known={"s"}) == Change(drain=("a",))


@pytest.mark.parametrize("answer", [EMPTY, FAILED, Answer(ResolveOutcome.ADDRESSES, [])])
def test_an_empty_or_failed_answer_keeps_the_last_good_set(answer: Answer) -> None:
    change = reconcile(("a", "b"), ("c",), answer)
    assert not change and change.admit == change.drain == change.restore == ()
    assert change.kept.startswith(("empty", "failed", "addresses"))


# --- the schedule: injected clock, no sleeping ------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_schedule_looks_up_at_once_then_every_interval() -> None:
    clock = Clock()
    schedule = Schedule(10.0, clock)
    assert schedule.due_in() == 0.0
    schedule.looked_up()
    assert schedule.due_in() == 10.0
    clock.now += 4.0
    assert schedule.due_in() == 6.0
    clock.now += 6.0
    assert schedule.due_in() == 0.0


def test_a_failed_probe_hurries_the_next_lookup_but_not_below_the_gap() -> None:
    clock = Clock()
    schedule = Schedule(10.0, clock)
    schedule.looked_up()
    schedule.hurry()
    assert schedule.due_in() == HURRY_GAP_S  # right after a lookup: the gap
    clock.now += 5.0
    schedule.hurry()
    assert schedule.due_in() == 0.0
    schedule.looked_up()
    clock.now += 9.5
    schedule.hurry()
    assert schedule.due_in() == 0.0
    schedule.looked_up()
    assert schedule.due_in() == 10.0


# --- the setting --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("mineru-api.mineru.svc:8000", Upstream("mineru-api.mineru.svc", 8000)),
        ("http://workers.test:80/", Upstream("workers.test", 80)),
        ("https://workers.test:8443", Upstream("workers.test", 8443, "https")),
        ("  workers.test.:8000 ", Upstream("workers.test", 8000)),
    ],
)
def test_parse_upstream(text: str, expected: Upstream) -> None:
    assert parse_upstream(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "workers.test",
        "workers.test:0",
        "ftp://workers.test:21",
        "workers.test:8000/path",
        "workers.test:99999",
        "user@workers.test:80",
        ":8000",
    ],
)
def test_parse_upstream_refuses_naming_the_variable(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_upstream(text)
    assert caught.value.variable == "MINERU_ROUTER_HEALTH_UPSTREAM_DNS"


def test_no_upstream_is_none_and_urls_bracket_ipv6() -> None:
    assert parse_upstream("") is None
    upstream = Upstream("workers.test", 8000)
    assert upstream.url("127.0.0.2") == "http://127.0.0.2:8000"
    assert upstream.url("fd00::5") == "http://[fd00::5]:8000"


def test_the_resolver_refuses_a_bad_server_list() -> None:
    with pytest.raises(ValueError, match="host:port"):
        _native.Resolver(servers="not a list", timeout_s=1.0, max_addresses=4)


# --- the discovery over the runtime's fleet, answers scripted ---------------------------


class ScriptedResolver:
    def __init__(self) -> None:
        self.answer: Answer = EMPTY
        self.names: list[str] = []

    def resolve(self, name: str) -> Answer:
        self.names.append(name)
        return self.answer


class Pool:
    """The line's side: FakeMembers on the fake server (every address a healthy fake)."""

    def __init__(self, fake: Fleet) -> None:
        self.fake = fake
        self.removed: list[str] = []
        self.submitting: set[str] = set()  # MinerU's own count of work in flight
        self.copied: list[str] = []  # keep_results called for these, in order

    def add_remote(self, worker_id: str, url: str) -> FakeMember:
        self.fake.set(worker_id, "healthy")
        return FakeMember(worker_id, self.fake.url(worker_id))

    def remove_remote(self, worker_id: str) -> None:
        self.removed.append(worker_id)

    def in_flight(self, worker_id: str) -> bool:
        return worker_id in self.submitting

    async def keep_results(self, worker_id: str) -> str:
        self.copied.append(worker_id)
        return f"{len(self.copied)} finished result(s) copied"


@pytest.fixture
def fake() -> Iterator[Fleet]:
    with Fleet() as running:
        yield running


def _records(path: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@run_async
async def test_discovery_admits_drains_and_forgets_through_the_fleet(
    fake: Fleet, tmp_path: Any
) -> None:
    audit = tmp_path / "audit.jsonl"
    settings = fast_settings(upstream_dns="workers.test:8000", audit_path=str(audit))
    rec = Recorder()
    fleet = await start_fleet(settings, rec)
    resolver, pool = ScriptedResolver(), Pool(fake)
    busy: set[str] = set()
    discovery = Discovery(
        parse_upstream(settings.upstream_dns),
        fleet,
        pool,  # type: ignore[arg-type]
        kept_on=lambda: busy,
        resolver=resolver,
    )
    try:
        resolver.answer = addresses("127.0.0.2", "127.0.0.3")
        change = await discovery.look_up()
        assert change.admit == ("127.0.0.2", "127.0.0.3") and resolver.names == ["workers.test"]
        await rec.wait_for(
            lambda: all(
                fleet.status(w) is not None and fleet.status(w).in_rotation
                for w in ("dns-127.0.0.2", "dns-127.0.0.3")
            ),
            "admitted",
        )

        # A failed and an empty answer change nothing (one audit record for the run).
        for answer in (FAILED, FAILED, EMPTY):
            resolver.answer = answer
            assert not await discovery.look_up()
        assert discovery.active() == ["127.0.0.2", "127.0.0.3"]

        # Scaled to one: .2 is gone but runs a kept task, .3 holds nothing.
        busy.add("dns-127.0.0.2")
        resolver.answer = addresses("127.0.0.4")
        change = await discovery.look_up()
        assert change == Change(admit=("127.0.0.4",), drain=("127.0.0.2", "127.0.0.3"))
        await discovery.settled()
        # Its results copied first, then forgotten.
        assert pool.copied == pool.removed == ["dns-127.0.0.3"]
        assert fleet.member("dns-127.0.0.3") is None
        assert fleet.status("dns-127.0.0.3") is None
        assert fleet.draining("dns-127.0.0.2") and discovery.draining() == ["127.0.0.2"]
        # Draining is not ejection: the worker stays healthy and probed.
        assert fleet.status("dns-127.0.0.2").phase == WorkerPhase.HEALTHY

        # Back in the answer while draining: taken back; then gone and idle: forgotten.
        resolver.answer = addresses("127.0.0.2", "127.0.0.4")
        assert (await discovery.look_up()).restore == ("127.0.0.2",)
        assert not fleet.draining("dns-127.0.0.2")
        resolver.answer = addresses("127.0.0.4")
        await discovery.look_up()
        await discovery.settled()
        assert fleet.draining("dns-127.0.0.2")
        busy.clear()
        pool.submitting.add("dns-127.0.0.2")  # a submission is being made there still
        assert await discovery.forget_drained() == []
        pool.submitting.clear()
        assert await discovery.forget_drained() == ["dns-127.0.0.2"]
        assert pool.copied == ["dns-127.0.0.3", "dns-127.0.0.2"]
        assert discovery.active() == ["127.0.0.4"] and discovery.draining() == []
        stats = discovery.stats()
        assert (stats.active, stats.draining) == (1, 0)
        assert stats.lookups == {"addresses": 4, "empty": 1, "failed": 2}
        assert stats.changes == {"admitted": 3, "draining": 3, "restored": 1, "forgotten": 2}
    finally:
        await discovery.close()
        await stop_fleet(fleet)
    actions = [
        (r["action"], r["worker_id"])
        for r in _records(audit)
        if r["action"].startswith(("worker_", "dns_"))
    ]
    assert actions == [
        ("worker_admitted", "dns-127.0.0.2"),
        ("worker_admitted", "dns-127.0.0.3"),
        ("dns_answer_kept", "dns:workers.test"),
        ("dns_answer_kept", "dns:workers.test"),
        ("worker_admitted", "dns-127.0.0.4"),
        ("worker_draining", "dns-127.0.0.2"),
        ("worker_draining", "dns-127.0.0.3"),
        ("worker_forgotten", "dns-127.0.0.3"),
        ("worker_restored", "dns-127.0.0.2"),
        ("worker_draining", "dns-127.0.0.2"),
        ("worker_forgotten", "dns-127.0.0.2"),
    ]
    forgotten = [r["reason"] for r in _records(audit) if r["action"] == "worker_forgotten"]
    assert all("finished result(s) copied" in reason for reason in forgotten), forgotten


@run_async
async def test_an_address_that_is_an_upstream_url_already_is_not_a_second_worker(
    fake: Fleet,
) -> None:
    rec = Recorder()
    static = FakeMember("upstream-0", "http://127.0.0.5:8000/")  # --upstream-url
    fleet = await start_fleet(fast_settings(), rec, static)
    resolver, pool = ScriptedResolver(), Pool(fake)
    discovery = Discovery(
        Upstream("workers.test", 8000), fleet, pool, kept_on=set, resolver=resolver
    )
    try:
        assert fleet.member_at("http://127.0.0.5:8000") == "upstream-0"
        resolver.answer = addresses("127.0.0.2", "127.0.0.5")
        assert (await discovery.look_up()).admit == ("127.0.0.2",)
        assert fleet.member("dns-127.0.0.5") is None and discovery.active() == ["127.0.0.2"]
        # Gone from the answer, the DNS worker drains; the --upstream-url one stays as it is.
        resolver.answer = addresses("127.0.0.5")
        assert await discovery.look_up() == Change(drain=("127.0.0.2",))
        await discovery.settled()
        assert pool.removed == ["dns-127.0.0.2"] and discovery.active() == []
        assert fleet.member("upstream-0") is static and not fleet.draining("upstream-0")
    finally:
        await discovery.close()
        await stop_fleet(fleet)


@run_async
async def test_a_failed_probe_makes_the_running_loop_look_up_at_once(fake: Fleet) -> None:
    now = [1000.0]  # the discovery's clock: nothing waits for the hurry gap
    rec = Recorder()
    fleet = await start_fleet(fast_settings(dns_interval_s=3600.0), rec)
    resolver, pool = ScriptedResolver(), Pool(fake)
    discovery = Discovery(
        Upstream("workers.test", 8000),
        fleet,
        pool,
        kept_on=set,
        resolver=resolver,
        clock=lambda: now[0],
    )
    try:
        resolver.answer = addresses("127.0.0.2")
        discovery.start()
        await rec.wait_for(lambda: discovery.active() == ["127.0.0.2"], "the first lookup")
        assert resolver.names == ["workers.test"]
        now[0] += HURRY_GAP_S
        fake.set("dns-127.0.0.2", "http_503")
        await rec.wait_for(lambda: len(resolver.names) >= 2, "a lookup after the failed probe")
    finally:
        await discovery.close()
        await stop_fleet(fleet)


@run_async
async def test_a_failed_probe_of_a_found_worker_hurries_the_lookup(fake: Fleet) -> None:
    settings = fast_settings(dns_interval_s=3600.0)
    rec = Recorder()
    fleet = await start_fleet(settings, rec)
    resolver, pool = ScriptedResolver(), Pool(fake)
    discovery = Discovery(
        Upstream("workers.test", 8000), fleet, pool, kept_on=set, resolver=resolver
    )
    try:
        resolver.answer = addresses("127.0.0.2")
        await discovery.look_up()
        assert discovery.schedule.due_in() > 60
        fake.set("dns-127.0.0.2", "http_503")
        await rec.wait_for(lambda: discovery.schedule.due_in() <= HURRY_GAP_S, "a hurried lookup")
    finally:
        await discovery.close()
        await stop_fleet(fleet)


def test_the_dns_collector_reads_the_discovery_at_scrape_time() -> None:
    collector = DnsCollector()
    assert [family.samples for family in collector.collect()] == [[], [], []]  # unbound
    stats = DiscoveryStats(
        2,
        1,
        {"addresses": 4, "empty": 0, "failed": 1},
        {"admitted": 3, "draining": 1, "restored": 0, "forgotten": 0},
    )
    collector.bind(lambda: stats)
    samples = {
        (s.name, tuple(s.labels.values())): s.value
        for family in collector.collect()
        for s in family.samples
    }
    assert samples[("mineru_router_dns_workers", ("active",))] == 2
    assert samples[("mineru_router_dns_workers", ("draining",))] == 1
    assert samples[("mineru_router_dns_lookups_total", ("failed",))] == 1
    assert samples[("mineru_router_dns_worker_changes_total", ("admitted",))] == 3

"""Remote workers found by DNS: a name's addresses, looked up again and again.

``MINERU_ROUTER_HEALTH_UPSTREAM_DNS`` names a DNS name and port (a
Kubernetes headless Service, ``mineru-api.mineru.svc:8000``) whose A/AAAA
records are remote workers, beside or instead of fixed ``--upstream-url``s.
Every ``DNS_INTERVAL_S``, and soon after a failed probe of one of them, the
name is looked up (``_native.Resolver``: c-ares, in a thread of its own, within
``DNS_TIMEOUT_S`` and ``DNS_MAX_ADDRESSES``) and the answer reconciled with
the workers it gave before (:func:`reconcile`, pure):

- a new address is *admitted*: a remote worker the fleet probes at once and
  routes to once it is healthy, like any remote worker;
- an address gone from the answer is *drained*: the line's pool gives it no
  new submission, the supervisor follows what it runs to the end (sent
  elsewhere if it fails, as for any worker), and once the router keeps no
  unfinished submission on it, the finished results the router still lists
  on it are copied to the router (``Workers.keep_results``; they are served
  from there after, ``result_copies.py``) and it is *forgotten* (no longer
  probed, out of ``/health``);
- an address that comes back while draining is taken back;
- a failed lookup, or one that answers nothing, changes nothing: the fleet
  keeps the last good set (DNS trouble never empties it);
- an address that is already a worker of the router's (an ``--upstream-url``
  at the same scheme, address and port) is not added twice: that worker is it.

What a line does (make and remove MinerU's worker object) is the line's
:class:`Workers`; the fleet's ``admit``/``drain``/``forget`` are what an admin
API registering or draining remote workers would call as well. Each change
is an audit record (``worker_admitted``, ``worker_draining``,
``worker_restored``, ``worker_forgotten``, ``dns_answer_kept``).

    upstream = parse_upstream(settings.upstream_dns)     # ConfigError names the variable
    discovery = Discovery(upstream, fleet, pool_workers, kept_on=supervisor_kept)
    await discovery.first()        # before the fleet starts: the first answer's workers
    discovery.start()              # the loop; discovery.close() at shutdown
    await discovery.settled()      # (tests) the drained workers' copies and forgetting done

Runs on the router's event loop; not thread-safe (the lookup itself runs in
a thread of its own, one at a time, the GIL released).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from mineru_health import _native, metrics, safe_text
from mineru_health.errors import ConfigError

from .fleet import Fleet, Member, _refused, log_audit, short_reason

__all__ = [
    "Change",
    "Discovery",
    "DiscoveryStats",
    "Schedule",
    "Upstream",
    "Workers",
    "parse_upstream",
    "reconcile",
]

_log = safe_text.logger("mineru_health.router")

_VARIABLE = "MINERU_ROUTER_HEALTH_UPSTREAM_DNS"
_ADDRESSES = _native.ResolveOutcome.ADDRESSES
_EMPTY = _native.ResolveOutcome.EMPTY
_FAILED = _native.ResolveOutcome.FAILED
_PROBE = _native.PollerEventKind.PROBE

#: A failed probe asks for a lookup soon, but never sooner than this after the
#: last one: a fleet of failing workers does not flood the DNS server.
HURRY_GAP_S = 1.0


@dataclass(frozen=True, slots=True)
class Upstream:
    """Where the workers are: a DNS name, the port they listen on, and the scheme."""

    name: str
    port: int
    scheme: str = "http"

    def url(self, address: str) -> str:
        """A worker's base URL at ``address`` (an IPv6 one in brackets)."""
        host = f"[{address}]" if ":" in address else address
        return f"{self.scheme}://{host}:{self.port}"

    def worker_id(self, address: str) -> str:
        """The fleet's id of the worker at ``address``."""
        return f"dns-{address}"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.name}:{self.port}"


def parse_upstream(text: str) -> Upstream | None:
    """``name:port`` (``http://`` or ``https://`` before it allowed); None for "".

    Raises ``ConfigError`` naming the variable for anything else.
    """
    text = text.strip()
    if not text:
        return None
    parts = urlsplit(text if "://" in text else f"http://{text}")
    try:
        port = parts.port
    except ValueError:
        port = None
    name = parts.hostname or ""
    if (
        parts.scheme not in ("http", "https")
        or not name
        or port is None
        or port == 0
        or parts.path.strip("/")
        or parts.query
        or parts.username
        or parts.password
    ):
        raise ConfigError(
            f"{_VARIABLE}={text!r}: expected a DNS name and a port, "
            "e.g. mineru-api.mineru.svc:8000 (http:// or https:// before it "
            "at most)",
            variable=_VARIABLE,
        )
    return Upstream(name=name.rstrip("."), port=port, scheme=parts.scheme)


@dataclass(frozen=True, slots=True)
class DiscoveryStats:
    """The discovery's counts, as /metrics reads them (``metrics.router.DnsCollector``)."""

    active: int
    draining: int
    lookups: dict[str, int]  # by outcome: addresses, empty, failed
    changes: dict[str, int]  # admitted, draining, restored, forgotten


@dataclass(frozen=True, slots=True)
class Change:
    """What one answer changes: addresses to admit, to take back, to drain."""

    admit: tuple[str, ...] = ()
    restore: tuple[str, ...] = ()  # draining, and in the answer again
    drain: tuple[str, ...] = ()
    kept: str = ""  # why the answer changed nothing ("" when it was used)

    def __bool__(self) -> bool:
        return bool(self.admit or self.restore or self.drain)


def reconcile(
    active: Collection[str],
    draining: Collection[str],
    answer: Any,
    known: Collection[str] = (),
) -> Change:
    """The change from the addresses in use (``active``, ``draining``) to ``answer``.

    ``answer`` is a lookup's result (``outcome``, ``addresses``, ``error``).
    An answer with addresses is the new set; an empty or failed one keeps
    the last good set (``kept`` says why). ``known``: addresses that are
    workers of the router's otherwise (``--upstream-url``), never admitted.
    """
    if answer.outcome != _ADDRESSES or not answer.addresses:
        why = answer.error or "no address"
        return Change(kept=f"{_name(answer.outcome)}: {why}")
    new = set(answer.addresses)
    active, draining = set(active), set(draining)
    return Change(
        admit=tuple(sorted(new - active - draining - set(known))),
        restore=tuple(sorted(new & draining)),
        drain=tuple(sorted(active - new)),
    )


class Schedule:
    """When the next lookup is due: every ``interval_s``, sooner after a failed probe.

    Pure: the clock is injected; nothing sleeps here.
    """

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._last: float | None = None
        self._next = clock()  # the first lookup at once

    def due_in(self) -> float:
        """Seconds until the next lookup (0: now)."""
        return max(0.0, self._next - self._clock())

    def looked_up(self) -> None:
        """A lookup ended (whatever it answered): the next one an interval later."""
        self._last = self._clock()
        self._next = self._last + self._interval_s

    def hurry(self) -> None:
        """A worker found by DNS failed a probe: look again soon (HURRY_GAP_S after the last)."""
        soon = self._clock() if self._last is None else self._last + HURRY_GAP_S
        self._next = min(self._next, max(soon, self._clock()))


class Workers(Protocol):
    """What a MinerU line does when DNS adds or removes a worker (its pool)."""

    def add_remote(self, worker_id: str, url: str) -> Member:
        """Makes MinerU's object for a remote worker at ``url`` (not yet healthy)."""

    def remove_remote(self, worker_id: str) -> None:
        """Removes MinerU's object of a worker the fleet forgot."""

    def in_flight(self, worker_id: str) -> bool:
        """True while MinerU counts work on the worker (a submission being made, before
        the supervisor keeps it): it is not forgotten then."""

    async def keep_results(self, worker_id: str) -> str:
        """Copies the finished results the router still lists on a drained worker to where
        the router serves them, before it is forgotten; says what it copied."""


class Discovery:
    """Keeps the fleet's DNS-found workers in step with the name's answers."""

    def __init__(
        self,
        upstream: Upstream,
        fleet: Fleet,
        workers: Workers,
        *,
        kept_on: Callable[[], Collection[str]],
        resolver: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        s = fleet.settings
        self.upstream = upstream
        self.fleet = fleet
        self.workers = workers
        self._kept_on = kept_on  # the workers the router keeps unfinished submissions on
        self._resolver = resolver or _native.Resolver(
            servers=str(s.dns_servers),
            timeout_s=float(s.dns_timeout_s),
            max_addresses=int(s.dns_max_addresses),
        )
        self.schedule = Schedule(float(s.dns_interval_s), clock)
        self._addresses: dict[str, str] = {}  # address -> worker id, draining ones included
        # A thread of its own: asyncio's default pool also runs MinerU's submissions,
        # which a lookup must not queue behind (nor they behind it).
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mineru-health-dns")
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._forgetting: asyncio.Task[list[str]] | None = None
        self._same_as: dict[str, str] = {}  # address -> the --upstream-url worker it is
        self._last_kept = ""
        # Read by /metrics on the scraping thread: fixed keys, ints replaced whole.
        self._lookups = {_name(o): 0 for o in (_ADDRESSES, _EMPTY, _FAILED)}
        self._changes = dict.fromkeys(("admitted", "draining", "restored", "forgotten"), 0)
        self._counts = (0, 0)  # active, draining
        fleet.listen(self._on_event)
        metrics.router.bind_dns(self.stats)

    @classmethod
    def configured(
        cls, fleet: Fleet, workers: Workers, *, kept_on: Callable[[], Collection[str]]
    ) -> Discovery | None:
        """The discovery ``UPSTREAM_DNS`` asks for, or None; bad settings refuse the start."""
        try:
            upstream = parse_upstream(str(fleet.settings.upstream_dns))
            if upstream is None:
                return None
            try:
                return cls(upstream, fleet, workers, kept_on=kept_on)
            except ValueError as exc:  # the server list c-ares refuses
                raise ConfigError(
                    f"MINERU_ROUTER_HEALTH_DNS_SERVERS: {exc}",
                    variable="MINERU_ROUTER_HEALTH_DNS_SERVERS",
                ) from exc
        except ConfigError as exc:
            _refused(exc)
            raise

    # -- the addresses --------------------------------------------------------------------
    def active(self) -> list[str]:
        return sorted(a for a, w in self._addresses.items() if not self.fleet.draining(w))

    def draining(self) -> list[str]:
        return sorted(a for a, w in self._addresses.items() if self.fleet.draining(w))

    def stats(self) -> DiscoveryStats:
        """What /metrics shows (any thread)."""
        active, draining = self._counts
        return DiscoveryStats(active, draining, dict(self._lookups), dict(self._changes))

    # -- lookups --------------------------------------------------------------------------
    async def first(self) -> None:
        """One lookup now (the router's start: its first workers)."""
        await self.look_up()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="mineru-health-dns")

    async def close(self) -> None:
        metrics.router.bind_dns(None)
        # Python < 3.12's wait_for can swallow a cancel that meets the wake-up: the loop
        # also stops on the flag.
        self._closed = True
        self._wake.set()
        for task in (self._task, self._forgetting):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._forgetting = None
        # A lookup under way ends within DNS_TIMEOUT_S; nothing waits for it.
        self._thread.shutdown(wait=False, cancel_futures=True)

    async def _run(self) -> None:
        while not self._closed:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.schedule.due_in())
            self._wake.clear()
            if self._closed or self.schedule.due_in() > 0:
                continue  # woken early (a failed probe): wait for the hurried time
            try:
                await self.look_up()
            except Exception:  # noqa: BLE001 -- the loop must outlive one bad answer
                _log.exception("looking up %s failed", self.upstream)
                self.schedule.looked_up()

    async def look_up(self) -> Change:
        """Looks the name up (in the discovery's thread) and applies the answer; the change
        made."""
        answer = await asyncio.get_running_loop().run_in_executor(
            self._thread, self._resolver.resolve, self.upstream.name
        )
        outcome = _name(answer.outcome)
        self._lookups[outcome] = self._lookups.get(outcome, 0) + 1
        self.schedule.looked_up()
        return self.apply(answer)

    def apply(self, answer: Any) -> Change:
        """Admits, takes back and drains as ``answer`` says; then (a task of its own) forgets
        drained workers that hold nothing the router keeps, their results copied."""
        change = reconcile(self.active(), self.draining(), answer, self._known(answer))
        if change.kept:
            self._kept(change.kept)
        else:
            self._last_kept = ""
            if getattr(answer, "truncated", False):
                self._audit(
                    "dns_answer_cut",
                    f"dns:{self.upstream.name}",
                    f"{self.upstream} answered more than "
                    f"{self.fleet.settings.dns_max_addresses} addresses; the lowest "
                    "are used",
                )
        for address in change.admit:
            worker_id = self.upstream.worker_id(address)
            member = self.workers.add_remote(worker_id, self.upstream.url(address))
            self._addresses[address] = worker_id
            self.fleet.admit(member, f"{address} is in the answer for {self.upstream}")
        for address in change.restore:
            self.fleet.undrain(
                self._addresses[address], f"{address} is in the answer for {self.upstream} again"
            )
        for address in change.drain:
            self.fleet.drain(
                self._addresses[address],
                f"{address} is no longer in the answer for {self.upstream}",
            )
        for key, done in (
            ("admitted", change.admit),
            ("restored", change.restore),
            ("draining", change.drain),
        ):
            self._changes[key] += len(done)
        self._counts = (len(self.active()), len(self.draining()))
        if self.draining() and (self._forgetting is None or self._forgetting.done()):
            # Copies may take a while: the lookups go on meanwhile.
            self._forgetting = asyncio.get_running_loop().create_task(
                self.forget_drained(), name="mineru-health-dns-forget"
            )
        return change

    async def settled(self) -> None:
        """Waits for the forgetting under way, if any."""
        if self._forgetting is not None:
            await asyncio.shield(self._forgetting)

    def _idle(self, worker_id: str) -> bool:
        return worker_id not in set(self._kept_on()) and not self.workers.in_flight(worker_id)

    async def forget_drained(self) -> list[str]:
        """Forgets every draining worker the router keeps no unfinished submission on and
        MinerU counts no work on, once its finished results are copied to the router."""
        forgotten = []
        for address in self.draining():
            worker_id = self._addresses[address]
            if not self._idle(worker_id):
                continue
            try:
                kept = await self.workers.keep_results(worker_id)
            except Exception as exc:  # noqa: BLE001 -- a failed copy must not keep it forever
                _log.exception("copying the results of %s failed", worker_id)
                kept = f"its results not copied ({type(exc).__name__}: {exc})"
            # Taken back, or given work, while its results were copied: not forgotten.
            if self._addresses.get(address) != worker_id or not self.fleet.draining(worker_id):
                continue
            if not self._idle(worker_id):
                continue
            self.fleet.forget(
                worker_id,
                short_reason(f"drained: the router keeps no unfinished submission on it; {kept}"),
            )
            self.workers.remove_remote(worker_id)
            del self._addresses[address]
            forgotten.append(worker_id)
            self._changes["forgotten"] += 1
        self._counts = (len(self.active()), len(self.draining()))
        return forgotten

    def _known(self, answer: Any) -> set[str]:
        """The addresses in ``answer`` that are workers of the router's already, not found
        by DNS (an ``--upstream-url`` at that address): one worker is one member."""
        known = set()
        for address in getattr(answer, "addresses", None) or ():
            if address in self._addresses:
                continue
            worker_id = self.fleet.member_at(self.upstream.url(address))
            if worker_id is None:
                continue
            known.add(address)
            if self._same_as.get(address) != worker_id:  # said once per address
                self._same_as[address] = worker_id
                _log.info(
                    "%s in the answer for %s is worker %s already: not added twice",
                    address,
                    self.upstream,
                    worker_id,
                )
        return known

    def _kept(self, why: str) -> None:
        # One record per run of bad answers, not one per lookup.
        if why == self._last_kept:
            return
        self._last_kept = why
        self._audit(
            "dns_answer_kept",
            f"dns:{self.upstream.name}",
            short_reason(
                f"{self.upstream}: {why}; the last good set of "
                f"{len(self.active())} worker(s) is kept"
            ),
        )

    def _audit(self, action: str, worker_id: str, reason: str) -> None:
        record = self.fleet.audit.write_record(
            action, worker_id=worker_id, reason=reason, upstream=str(self.upstream)
        )
        log_audit(record, in_rotation=False)

    def _on_event(self, event: Any) -> None:
        if (
            event.kind == _PROBE
            and not event.probe.healthy
            and event.worker_id in self._addresses.values()
        ):
            self.schedule.hurry()
            self._wake.set()

    def __repr__(self) -> str:
        return (
            f"Discovery({self.upstream}, active={len(self.active())}, "
            f"draining={len(self.draining())})"
        )


def _name(outcome: Any) -> str:
    return str(getattr(outcome, "name", outcome)).lower()

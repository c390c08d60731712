"""A router's workers, probed by the native poller and restarted by the native policy.

MinerU's routers probe their workers one after another in a loop of their
own and await restarts inside it, so one slow worker or one restart delays
the supervision of all. A ``Fleet`` replaces that loop, for either MinerU
line:

- one native thread (``_native.Poller``) probes every worker concurrently,
  each on its own jittered schedule, and feeds each worker's restart policy;
  its events reach the router's event loop through an eventfd
  (``loop.add_reader``), so nothing polls in Python;
- its local workers' processes (launches, restarts, the process watch, the
  ending of every process of an instance) are ``local_workers.py``'s: the
  fleet asks, that part does it;
- every audit event is one JSON line (``AUDIT_PATH``, stderr by default) and
  one log line; ``/metrics`` reads the policy's statuses at scrape time.

The line's pool gives the fleet one :class:`Member` per worker (what it
needs of MinerU's worker object) and the probe expectations of its line;
listeners (the supervisor, the line's pool) get every event after the fleet
handled it. The fleet never knows which MinerU line it serves.

    fleet = Fleet(settings, expect, client=pool.client, native_probes=True)
    fleet.add(member)                 # every worker, before start()
    await fleet.start()               # launches local workers, waits for the first answers
    fleet.status("local-gpu-0")       # the policy's view of one worker
    await fleet.close()

Runs on the router's event loop; not thread-safe (the native poller is).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from mineru_health import _native, metrics, patching, safe_text
from mineru_health.errors import ConfigError
from mineru_health.runtime.router.audit import AuditLog
from mineru_health.runtime.settings import HealthSettings
from mineru_health.runtime.state_dirs import StateDirs

from .launch import PARENT_PID_ENV
from .local_workers import LocalWorkers
from .member import Member
from .reasons import REASON_CHARS, base_url_of, log_audit, probe_reason, short_reason

__all__ = [
    "DECLARED_FAILED",
    "REASON_CHARS",
    "Fleet",
    "Member",
    "base_url_of",
    "expectations",
    "log_audit",
    "probe_reason",
    "router_settings",
    "short_reason",
]

_log = safe_text.logger("mineru_health.router")

_P = _native.WorkerPhase
_PROBE = _native.PollerEventKind.PROBE
_AUDIT = _native.PollerEventKind.AUDIT
_RESTART = _native.PollerEventKind.RESTART_REQUESTED
_ERROR = _native.PollerEventKind.ERROR

#: Phases in which the worker is declared failed: what it runs will not finish
#: there, and a further failure signal changes nothing in the policy.
DECLARED_FAILED = frozenset({_P.FAILED, _P.RESTART_SCHEDULED, _P.RESTARTING, _P.GAVE_UP})


def router_settings() -> HealthSettings:
    """The router's configuration, checked before any worker process is spawned.

    Raises ``ConfigError`` naming the variable (logged: the router refuses
    to start). Local workers inherit ``MINERU_HEALTH_RULES``: a bad rules
    file stops the router here, not each worker it would spawn and restart
    in a loop.
    """
    from mineru_health.classifier import default_rules

    try:
        settings = HealthSettings.from_env()
        default_rules()
    except ConfigError as exc:
        _refused(exc)
        raise
    problem = patching.running_problem()
    if problem:
        _log.warning("this MinerU is not one mineru-health patched as a whole: %s", problem)
    return settings


def _refused(exc: ConfigError) -> None:
    _log.error("mineru-router refuses to start: %s (variable %s)", exc, exc.variable)


class _NoConfigTraceback(logging.Filter):
    """Drops the traceback from uvicorn's report of a start-up that a ``ConfigError``
    refused: the refusal itself was logged, naming the variable, and a traceback
    around it reads as a crash. Starlette hands uvicorn the traceback as the
    message of ``lifespan.startup.failed``; other paths log it as ``exc_info``."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith("Traceback"):
            last = record.msg.rstrip().rsplit("\n", 1)[-1]
            if last.startswith(f"{ConfigError.__module__}.{ConfigError.__name__}:"):
                record.msg, record.args = last, ()
            return True
        error = record.exc_info[1] if record.exc_info else None
        for _ in range(8):  # the chain, bounded
            if error is None or isinstance(error, ConfigError):
                break
            error = error.__cause__ or error.__context__
        if isinstance(error, ConfigError):
            record.exc_info, record.exc_text = None, None
        return True


_NO_CONFIG_TRACEBACK = _NoConfigTraceback()


def quiet_config_tracebacks() -> None:
    """Installs the filter on uvicorn's error logger (idempotent); the router adapters call
    it when they are installed."""
    logger = logging.getLogger("uvicorn.error")
    if _NO_CONFIG_TRACEBACK not in logger.filters:
        logger.addFilter(_NO_CONFIG_TRACEBACK)


def expectations(
    settings: HealthSettings,
    *,
    protocol_version: int | None = None,
    require_load_fields: bool = True,
    main_port_status: str = "",
) -> Any:
    """The probe expectations for ``settings`` and a MinerU line's ``/health`` answers.

    ``main_port_status``: the healthy ``status`` word of a worker's main port
    when it is not the native endpoint's (MinerU 4.0 says ``"ok"``).
    """
    expect = _native.ProbeExpectations()
    expect.expected_status = settings.expected_status
    expect.max_body_bytes = settings.max_body_bytes
    expect.protocol_version = protocol_version
    expect.require_load_fields = require_load_fields
    expect.main_port_status = main_port_status
    return expect


class Fleet:
    """Every worker of one router, supervised by the native poller and restart policy."""

    def __init__(
        self,
        settings: HealthSettings,
        expect: Any,
        *,
        client: Any,
        native_probes: bool,
        seed: int = 0,
    ) -> None:
        self.settings = settings
        self.client = client  # the router's HTTP client (MinerU's), for the supervisor
        self.audit = AuditLog(settings.audit_path)
        self.native_probes = native_probes
        self.state_dirs = StateDirs()
        self._poller = _native.Poller(settings.native, expect, seed)
        self._members: dict[str, Member] = {}
        # What routers that died left running is ended here, before any worker starts.
        self.local = LocalWorkers(
            settings,
            self._poller,
            self.audit,
            self.state_dirs,
            self._members,
            native_probes=native_probes,
            report_exit=self.report_exit,
        )
        self._draining: set[str] = set()  # remote workers given no new submission
        self._listeners: list[Callable[[Any], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._first_health: asyncio.Event | None = None
        self._ready: Callable[[Member, Any], bool] = lambda member, status: True
        # Workers launched from here die with this process, however it dies
        # (they inherit the environment; see parent_watch.h).
        os.environ[PARENT_PID_ENV] = str(os.getpid())
        # The state gauges read the poller at every scrape: they cannot drift.
        metrics.router.bind_worker_statuses(self.statuses)
        metrics.router.bind_poller_stats(self._poller.stats)
        # Every answer read from a worker through MinerU's client is bounded (issue 31).
        from .upstream_reads import install  # imports httpx: only where a router runs

        self.reads = install(client, settings)
        metrics.router.bind_upstream_reads(self.reads.broken if self.reads else None)

    @classmethod
    def refusing(cls, settings: HealthSettings, expect: Any, **kwargs: Any) -> Fleet:
        """A fleet; a state directory another live router holds refuses the start-up."""
        try:
            return cls(settings, expect, **kwargs)
        except ConfigError as exc:
            _refused(exc)
            raise

    # -- membership ---------------------------------------------------------------------
    def add(self, member: Member) -> None:
        """Adds a worker, probed once it has a URL (local ones: once launched)."""
        self._members[member.id] = member
        self._poller.add_worker(
            _native.Target(
                member.id,
                base_url_of(member.probe_base()),
                member.local,
                self.local.health_url(member),
            )
        )

    def member(self, worker_id: str) -> Member | None:
        return self._members.get(worker_id)

    def member_at(self, url: str) -> str | None:
        """The id of the worker at ``url`` (scheme, host and port as written), or None."""
        where = _origin(url)
        for member in self._members.values():
            if _origin(member.base_url()) == where:
                return member.id
        return None

    # -- remote workers that come and go (DNS, discovery.py; or an admin API) --------------
    def admit(self, member: Member, why: str) -> None:
        """Adds a remote worker while the fleet runs: probed at once, routed to once healthy."""
        self.add(member)
        self._record_membership("worker_admitted", member.id, why)

    def drain(self, worker_id: str, why: str) -> None:
        """No new submission goes to the worker (the line's pool asks ``draining``); it is
        probed and what it runs is followed to its end as before, until ``forget``."""
        if worker_id in self._members and worker_id not in self._draining:
            self._draining.add(worker_id)
            self._record_membership("worker_draining", worker_id, why)

    def undrain(self, worker_id: str, why: str) -> None:
        """Takes a draining worker back."""
        if worker_id in self._draining:
            self._draining.discard(worker_id)
            self._record_membership("worker_restored", worker_id, why)

    def draining(self, worker_id: str) -> bool:
        return worker_id in self._draining

    def forget(self, worker_id: str, why: str) -> Member | None:
        """Stops probing a remote worker and lets go of it (a drained one); what it was."""
        member = self._members.get(worker_id)
        if member is None or member.local:
            return None
        self._record_membership("worker_forgotten", worker_id, why)
        self._poller.remove_worker(worker_id)
        del self._members[worker_id]
        self._draining.discard(worker_id)  # its series went with its poller entry
        return member

    def _record_membership(self, action: str, worker_id: str, why: str) -> None:
        member = self._members.get(worker_id)
        record = self.audit.write_record(
            action, worker_id=worker_id, reason=why, url=member.base_url() if member else None
        )
        log_audit(record, in_rotation=action != "worker_draining")

    def listen(self, callback: Callable[[Any], None]) -> None:
        """Calls ``callback`` with every poller event, after the fleet handled it."""
        self._listeners.append(callback)

    def base_url(self, worker_id: str) -> str:
        """The worker's current base URL ("" while it has none, e.g. restarting)."""
        member = self._members.get(worker_id)
        return member.base_url() if member is not None else ""

    # -- the policy's view ----------------------------------------------------------------
    def status(self, worker_id: str) -> Any | None:
        """The policy's status of one worker (None for an unknown one)."""
        return self._poller.status(worker_id)

    def statuses(self) -> list[Any]:
        return list(self._poller.statuses())

    def stats(self) -> Any:
        """The poller's own counters (dropped events, I/O errors, suppressed ejections...)."""
        return self._poller.stats()

    @property
    def running(self) -> bool:
        """True while the poller thread runs (from ``start`` to ``close``)."""
        return bool(self._poller.running())

    # -- start and stop ------------------------------------------------------------------
    async def start(
        self, *, ready: Callable[[Member, Any], bool] | None = None, wait_s: float | None = None
    ) -> None:
        """Launches every local worker, starts probing, waits for the remote ones' answers.

        Returns once every remote worker had its first probes and
        ``ready(member, status)`` holds for the healthy ones (a line may need
        more than a probe, e.g. the worker's capabilities); at most ``wait_s``
        (default ``BOOT_TIMEOUT_S``). Local workers are launched, not waited
        for (issue 32): their boot takes 5-30 s, and a router that waited for
        it answered nothing meanwhile, not even about the jobs its store kept.
        Until one is in rotation the line holds submissions (``booting``).
        """
        if ready is not None:
            self._ready = ready
        locals_ = [m for m in self._members.values() if m.local]
        errors = await asyncio.gather(*(self.local.launch(m) for m in locals_))
        for member, error in zip(locals_, errors, strict=True):
            if error is not None:  # never came up: the policy schedules its restart
                self.report_exit(member.id, short_reason(f"failed to start: {error}"))
        self._first_health = asyncio.Event()
        self._attach(asyncio.get_running_loop())
        self._check_first_health()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(
                self._first_health.wait(),
                timeout=float(self.settings.boot_timeout_s if wait_s is None else wait_s),
            )
        self.local.watch()

    def first_answers(self) -> None:
        """Something a ``ready`` condition reads changed: check it again."""
        self._check_first_health()

    def _check_first_health(self) -> None:
        event = self._first_health
        if event is None or event.is_set():
            return
        need = self.settings.healthy_threshold
        for status in self._poller.statuses():
            member = self._members.get(status.id)
            if member is None:
                continue
            if status.in_rotation:
                if not self._ready(member, status):
                    return
            elif not member.local and status.probes < need:
                return
        event.set()

    def _attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Registers the poller's eventfd with ``loop`` and starts the poller thread.

        Raises the process's file-descriptor limit first, as far as this
        fleet needs (one descriptor per probe in flight; see poller.h).
        """
        limit = _native.raise_fd_limit(min(len(self._members), self.settings.concurrency))
        if limit.error:
            _log.warning(
                "file-descriptor limit not raised (%s): large fleets are probed in more rounds",
                limit.error,
            )
        loop.add_reader(self._poller.notify_fd(), self._dispatch)
        self._loop = loop
        self._poller.start()

    async def close(self) -> None:
        """Stops probing, restarts and the process watch, then ends every local worker's
        processes, all at once (before the pool stops its workers, which finds them gone)."""
        if self._loop is not None:
            self._loop.remove_reader(self._poller.notify_fd())
            self._loop = None
        await asyncio.to_thread(self._poller.stop)
        await self.local.close()

    def close_files(self) -> None:
        """Ends what is left of its workers' processes, removes their cgroups and the state
        directories it made, closes the audit file (after the workers)."""
        self.local.processes.close()
        self.state_dirs.close()
        self.audit.close()

    def report_exit(self, worker_id: str, reason: str, exit_code: int | None = None) -> None:
        self._poller.report_process_exit(worker_id, reason, exit_code)
        self._show_status(worker_id, reason)

    def report_passive(self, worker_id: str, reason: str) -> None:
        """A worker's own verdict seen in traffic: out of rotation before the next probe."""
        status = self.status(worker_id)
        if status is None or status.phase in DECLARED_FAILED:
            return  # already being handled: a burst of failures is one failure
        reason = short_reason(reason)
        self._poller.report_passive_failure(worker_id, reason)
        self._show_status(worker_id, reason)

    def _show_status(self, worker_id: str, reason: str) -> None:
        # The policy applied the report already: routing follows it at once.
        member, status = self._members.get(worker_id), self.status(worker_id)
        if member is not None and status is not None:
            member.show_rotation(bool(status.in_rotation), reason)

    # -- events from the poller ------------------------------------------------------------
    def _dispatch(self) -> None:
        for event in self._poller.drain_events():
            try:
                self._on_event(event)
            except Exception:  # noqa: BLE001 -- one bad event must not stop health handling
                _log.exception("handling a health event failed for %s", event.worker_id)

    def _on_event(self, event: Any) -> None:
        if event.kind == _ERROR:
            # The poller's own I/O failed (it keeps trying); never a worker's fault.
            _log.error("health poller: %s", safe_text.printable(event.error))
            return
        member = self._members.get(event.worker_id)
        if member is None:
            return
        member.show(event)
        if event.kind == _PROBE:
            probe = event.probe
            if not probe.healthy:
                self.local.check_process(member.id)
            else:
                self.local.probed_healthy(member.id)
        elif event.kind == _AUDIT:
            record = self.audit.write(event)
            log_audit(record, in_rotation=bool(event.in_rotation))
        elif event.kind == _RESTART:
            self.local.schedule_restart(member)
        for listener in self._listeners:
            listener(event)
        self._check_first_health()

    def __repr__(self) -> str:
        return f"Fleet(workers={len(self._members)}, native_probes={self.native_probes})"


def _origin(url: str) -> tuple[str, str, int | None, str]:
    parts = urlsplit(base_url_of(url))
    try:
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        port = None
    return parts.scheme, (parts.hostname or "").rstrip("."), port, parts.path.rstrip("/")

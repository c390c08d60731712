"""A router's workers, probed by the native poller and restarted by the native policy.

MinerU's routers probe their workers one after another in a loop of their
own and await restarts inside it, so one slow worker or one restart delays
the supervision of all. A ``Fleet`` replaces that loop, for either MinerU
line:

- one native thread (``_native.Poller``) probes every worker concurrently,
  each on its own jittered schedule, and feeds each worker's restart policy;
  its events reach the router's event loop through an eventfd
  (``loop.add_reader``), so nothing polls in Python;
- each restart of a local worker is an asyncio task of its own (stop the
  old process, launch the new one without waiting for health; the poller
  decides when it is healthy or that its boot deadline passed): probing,
  routing and other restarts never wait on it;
- each local worker launches with its own variables: its native health
  port and bind address, a state directory that outlives its restarts
  (``state_dirs.py``) and, when that one outlives the router too, the
  directory of its outputs in it; the router's pid (it dies with the router),
  and a tag that every process it starts inherits; it is kept in a cgroup of
  its own where the machine allows it (``processes.py``);
- whenever a local worker is replaced, restarted or lost, and when the
  router shuts down, all its processes are ended before anything takes its
  place, so no engine process keeps a GPU: a healthy shutdown or restart
  with SIGTERM, STOP_GRACE_S, SIGKILL; a worker condemned for a dead engine,
  a hung loop, a failed boot or its exit (``CONDEMNED_CAUSES``: nothing to
  drain) with SIGKILL at once, the new launch waiting for every process of
  the old to exit, not for a timer; each launch and each end is an audit
  record;
- a launched worker's process is polled every interval, so an exit is
  reported at once; a worker's own verdict seen in traffic is reported as a
  passive failure;
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
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from mineru_health import _native, metrics, patching, safe_text
from mineru_health._names import enum_name
from mineru_health.audit import AuditLog
from mineru_health.errors import ConfigError
from mineru_health.settings import HealthSettings
from mineru_health.state_dirs import OUTPUT_DIR_ENV, STATE_DIR_ENV, StateDirs

from .launch import HEALTH_BIND_ENV, HEALTH_PORT_ENV, PARENT_PID_ENV, PORTS
from .processes import Launch, WorkerProcesses

__all__ = [
    "DECLARED_FAILED",
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

#: Failure causes (restart_policy.h) that condemn a worker: its engine is dead (a probe's
#: or a request's definitive verdict), its loop hung, its boot failed or its process exited.
#: It has nothing left to drain, so its processes get no grace.
CONDEMNED_CAUSES = frozenset({"engine_dead", "loop_hung", "passive_failure", "boot_timeout",
                              "process_exit"})

# A reason longer than this is cut in audit reasons, last_error and logs.
REASON_CHARS = 300


def short_reason(text: str) -> str:
    """One line, at most REASON_CHARS characters."""
    text = " ".join(text.split())
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 3] + "..."


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


def expectations(settings: HealthSettings, *, protocol_version: int | None = None,
                 require_load_fields: bool = True, main_port_status: str = "") -> Any:
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


class Member(Protocol):
    """One worker as the line's pool holds it (MinerU's own worker object underneath)."""

    id: str
    local: bool  # launched, watched and restarted by this router

    def base_url(self) -> str:
        """The worker's base URL ("" while it has none, e.g. being restarted)."""

    def probe_base(self) -> str:
        """The URL the poller appends ``/health`` to ("" while the worker has none)."""

    def connect_host(self) -> str:
        """Where the router reaches a local worker (its native endpoint binds there)."""

    def process(self) -> Any:
        """A local worker's current process (``subprocess.Popen``), or None."""

    def show(self, event: Any) -> None:
        """Writes a poller event (rotation, probe, reason) onto MinerU's worker object."""

    def show_rotation(self, in_rotation: bool, reason: str | None = None) -> None:
        """Writes the policy's rotation (and why it left it) onto MinerU's worker object."""

    async def launch(self, env: Mapping[str, str]) -> None:
        """Starts a local worker's process with ``env`` added, without waiting for health."""

    async def stop(self) -> None:
        """Stops a local worker's process, keeping what the instance finished (a restart)."""


class Fleet:
    """Every worker of one router, supervised by the native poller and restart policy."""

    def __init__(self, settings: HealthSettings, expect: Any, *, client: Any,
                 native_probes: bool, seed: int = 0) -> None:
        self.settings = settings
        self.client = client  # the router's HTTP client (MinerU's), for the supervisor
        self.audit = AuditLog(settings.audit_path)
        self.native_probes = native_probes
        self.state_dirs = StateDirs()
        # What routers that died left running is ended before any worker starts.
        self.processes = WorkerProcesses(cgroups=bool(settings.worker_cgroups),
                                         grace_s=float(settings.stop_grace_s))
        self._audit_swept(self.processes.swept)
        _log.info("local workers' processes are kept in %s", self.processes.describe())
        self._launches: dict[str, Launch] = {}  # local worker -> its current launch
        self._scope_kinds: dict[str, str] = {}  # local worker -> how its last launch is kept
        self._endings: dict[str, asyncio.Task[None]] = {}
        self._poller = _native.Poller(settings.native, expect, seed)
        self._members: dict[str, Member] = {}
        self._listeners: list[Callable[[Any], None]] = []
        self._health_ports: dict[str, int] = {}
        self._restarts: dict[str, asyncio.Task[None]] = {}
        self._exit_reported: set[int] = set()
        self._launched: set[str] = set()  # local workers not probed healthy since their launch
        self._watch: asyncio.Task[None] | None = None
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
        self._poller.add_worker(_native.Target(member.id, base_url_of(member.probe_base()),
                                               member.local, self._health_url(member)))

    def member(self, worker_id: str) -> Member | None:
        return self._members.get(worker_id)

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

    def restarting(self, worker_id: str) -> bool:
        task = self._restarts.get(worker_id)
        return task is not None and not task.done()

    # -- start and stop ------------------------------------------------------------------
    async def start(self, *, ready: Callable[[Member, Any], bool] | None = None,
                    wait_s: float | None = None) -> None:
        """Launches every local worker, starts probing, waits for the first answers.

        Returns once every local worker left its first boot (healthy, or
        failed by its boot deadline) and every remote one had its first
        probes, and ``ready(member, status)`` holds for the healthy ones (a
        line may need more than a probe, e.g. the worker's capabilities); at
        most ``wait_s`` (default ``BOOT_TIMEOUT_S``).
        """
        if ready is not None:
            self._ready = ready
        locals_ = [m for m in self._members.values() if m.local]
        errors = await asyncio.gather(*(self._launch(m) for m in locals_))
        for member, error in zip(locals_, errors, strict=True):
            if error is not None:  # never came up: the policy schedules its restart
                self.report_exit(member.id, short_reason(f"failed to start: {error}"))
        self._first_health = asyncio.Event()
        self._attach(asyncio.get_running_loop())
        self._check_first_health()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._first_health.wait(), timeout=float(
                self.settings.boot_timeout_s if wait_s is None else wait_s))
        self._watch = asyncio.get_running_loop().create_task(
            self._watch_processes(), name="mineru-health-process-watch")

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
            elif (status.phase == _P.STARTING) if member.local else (status.probes < need):
                return
        event.set()

    def _attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Registers the poller's eventfd with ``loop`` and starts the poller thread.

        Raises the process's file-descriptor limit first, as far as this
        fleet needs (one descriptor per probe in flight; see poller.h).
        """
        limit = _native.raise_fd_limit(min(len(self._members), self.settings.concurrency))
        if limit.error:
            _log.warning("file-descriptor limit not raised (%s): large fleets are probed "
                         "in more rounds", limit.error)
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
        tasks = [t for t in (self._watch, *self._restarts.values()) if t is not None
                 and not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._restarts.clear()
        endings = [self._end_processes(worker_id, "shutdown") for worker_id in list(self._launches)]
        endings += [t for t in self._endings.values() if not t.done()]
        if endings:
            await asyncio.gather(*{t for t in endings if t is not None}, return_exceptions=True)

    def close_files(self) -> None:
        """Ends what is left of its workers' processes, removes their cgroups and the state
        directories it made, closes the audit file (after the workers)."""
        self.processes.close()
        self.state_dirs.close()
        self.audit.close()

    def process_scope(self, worker_id: str) -> str | None:
        """How a local worker's processes are kept: "cgroup" or "process_group" (None: never
        launched, or remote)."""
        return self._scope_kinds.get(worker_id)

    # -- launches ------------------------------------------------------------------------
    async def _launch(self, member: Member) -> str | None:
        """Starts a local worker's process (no health wait); why it could not, or None."""
        launch = self.processes.prepare(member.id)
        try:
            await member.launch({**self._launch_env(member), **launch.env})
        except Exception as exc:  # noqa: BLE001 -- any spawn failure is the policy's to handle
            self.processes.discard(launch)
            return str(exc) or type(exc).__name__
        # Nothing awaited since the spawn yielded to the loop: the worker is still
        # starting its interpreter and has started nothing of its own.
        process = member.process()
        if process is not None:
            self.processes.adopt(launch, process.pid)
            self._launches[member.id] = launch
            self._scope_kinds[member.id] = launch.kind
            self._audit_launch(launch)
        else:
            self.processes.discard(launch)
        self._poller.set_url(member.id, base_url_of(member.probe_base()), self._health_url(member))
        self._launched.add(member.id)
        return None

    def _launch_env(self, member: Member) -> dict[str, str]:
        """A local worker's variables for one launch: state directory, native port and bind."""
        # The same task store on every launch: results survive restarts.
        env = {STATE_DIR_ENV: str(self.state_dirs.state_dir(member.id))}
        outputs = self.state_dirs.outputs_dir(member.id)
        if outputs is not None:  # durable: the outputs outlive this router too
            outputs.mkdir(parents=True, exist_ok=True)
            env[OUTPUT_DIR_ENV] = str(outputs)
        if self.native_probes:
            # A fresh port per launch (the old process may still hold its own),
            # bound where the router connects (loopback for 0.0.0.0), so the
            # native endpoint is no more exposed than needed.
            host = member.connect_host()
            self._health_ports[member.id] = PORTS.take(host, f"{member.id} health")
            env.update({HEALTH_PORT_ENV: str(self._health_ports[member.id]),
                        HEALTH_BIND_ENV: host})
        return env

    def _health_url(self, member: Member) -> str:
        """Where to probe ``member``: its native endpoint, its main port, or "" (discover)."""
        if not self.native_probes:
            # An explicit URL: the poller neither discovers nor switches.
            base = base_url_of(member.probe_base())
            return f"{base}/health" if base else ""
        port = self._health_ports.get(member.id)
        if port is None or not member.local:
            return ""  # remote: probe the main port until it advertises its native one
        host = member.connect_host()
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}/health"

    # -- restarts ------------------------------------------------------------------------
    def _schedule_restart(self, member: Member) -> None:
        if not member.local or self.restarting(member.id):
            return
        self._restarts[member.id] = asyncio.get_running_loop().create_task(
            self._restart(member), name=f"mineru-health-restart-{member.id}")

    async def _restart(self, member: Member) -> None:
        # Stop probing the old process: its answers say nothing about the new one.
        self._poller.set_url(member.id, "", "")
        member.show_rotation(False)
        # Every process of the old instance is gone before the new one starts:
        # an engine process left behind would keep the GPU the new one needs.
        status = self.status(member.id)
        condemned = status is not None and status.last_cause in CONDEMNED_CAUSES
        ending = self._end_processes(member.id, "restart", condemned=condemned)
        if ending is not None:
            await asyncio.shield(ending)
        try:
            await member.stop()
        except Exception as exc:  # noqa: BLE001 -- a failed stop must not block the new start
            _log.warning("worker %s: stopping the old process failed: %s", member.id,
                         safe_text.printable(str(exc)))
        error = await self._launch(member)
        if error is not None:
            reason = short_reason(f"restart failed: {error}")
            member.show_rotation(False, reason)
            self._poller.report_restart_failed(member.id, reason)
            return
        _log.info("worker %s: restarted on %s", member.id, member.base_url())

    # -- processes -----------------------------------------------------------------------
    async def _watch_processes(self) -> None:
        # A cheap poll() per local worker: an exit must not wait for failed
        # probes to reach the threshold.
        while True:
            await asyncio.sleep(float(self.settings.interval_s))
            if self.processes.leftover:  # a dead router's cgroup the start-up could not remove
                self._audit_swept(await asyncio.to_thread(self.processes.sweep_again))
            for worker_id in list(self._members):
                self.check_process(worker_id)

    def check_process(self, worker_id: str) -> None:
        """Reports a local worker's exited process now, not at the next poll."""
        member = self._members.get(worker_id)
        if member is None or not member.local or self.restarting(worker_id):
            return
        process = member.process()
        if process is None:
            return
        code = process.poll()
        if code is None or process.pid in self._exit_reported:
            return
        self._exit_reported.add(process.pid)
        self.report_exit(worker_id, f"worker process {process.pid} exited with code {code}", code)
        # What it started may live on (its engine, in a session of its own): ended now, not
        # at the restart, which may be a backoff away or never come (gave_up).
        self._end_processes(worker_id, "exit", condemned=True)

    # -- a worker's processes -------------------------------------------------------------
    def _end_processes(self, worker_id: str, why: str, *,
                       condemned: bool = False) -> asyncio.Task[None] | None:
        """Ends every process of the worker's current launch, in a thread (``condemned``:
        SIGKILL at once, see ``WorkerProcesses.end``); the task doing it (the one already
        doing it, if any), or None when there is nothing to end."""
        running = self._endings.get(worker_id)
        if running is not None and not running.done():
            return running
        launch = self._launches.pop(worker_id, None)
        if launch is None:
            return None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous caller): end them here
            report = self.processes.end(launch, condemned=condemned)
            self._audit_end(launch, why, report, condemned)
            self.processes.release(launch)
            return None
        task = loop.create_task(self._end(launch, why, condemned),
                                name=f"mineru-health-end-{worker_id}")
        self._endings[worker_id] = task
        return task

    async def _end(self, launch: Launch, why: str, condemned: bool) -> None:
        report = await asyncio.to_thread(self.processes.end, launch, condemned=condemned)
        self._audit_end(launch, why, report, condemned)
        # Reaped by its owner's Popen (which keeps the exit code): a zombie
        # still holds its cgroup.
        member = self._members.get(launch.worker_id)
        process = member.process() if member is not None else None
        if process is not None and process.pid == launch.pid:
            process.poll()
        await asyncio.to_thread(self.processes.release, launch)

    def _audit_launch(self, launch: Launch) -> None:
        if launch.cgroup:
            reason = f"process {launch.pid} and all it starts kept in cgroup {launch.cgroup}"
        else:
            reason = (f"process {launch.pid} and all it starts kept by process group and tag "
                      f"(no cgroup: {launch.no_cgroup})")
        self.audit.write_record(
            "worker_processes", worker_id=launch.worker_id, reason=reason, pid=launch.pid,
            scope=launch.kind, cgroup=launch.cgroup or None, tag=launch.tag)
        _log.info("worker %s: %s", launch.worker_id, safe_text.printable(reason))

    def _audit_end(self, launch: Launch, why: str, report: Any, condemned: bool) -> None:
        if condemned:
            how = (f"{report.killed} process(es) of pid {launch.pid}'s "
                   f"{launch.kind.replace('_', ' ')} sent SIGKILL at once (nothing to drain)")
        else:
            how = (f"{report.terminated} process(es) of pid {launch.pid}'s "
                   f"{launch.kind.replace('_', ' ')} sent SIGTERM, {report.killed} SIGKILL "
                   f"after {self.processes.grace_s:g} s")
        left = f"{report.survivors} left of those {launch.found_by} finds"
        if launch.unseen:
            left += f"; others: {launch.unseen}"
        record = self.audit.write_record(
            "worker_processes_ended", worker_id=launch.worker_id, reason=f"{why}: {how}, {left}",
            pid=launch.pid, scope=launch.kind, after=why, condemned=condemned,
            terminated=report.terminated, killed=report.killed, survivors=report.survivors,
            survivors_found_by=launch.found_by, unseen=launch.unseen or None)
        log_audit(record, in_rotation=report.survivors == 0)

    def _audit_swept(self, swept: list[dict[str, Any]]) -> None:
        for found in swept:
            record = self.audit.write_record(
                "abandoned_processes_ended", worker_id=str(found["worker"]),
                reason=(f"a router that died (owner {found['owner']}) left {found['ended']} "
                        f"process(es) of this worker running; {found['killed']} needed "
                        f"SIGKILL, {found['survivors']} left"),
                **found)
            log_audit(record, in_rotation=False)

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
            metrics.router.observe_probe(member.id, probe.latency_s, probe.status,
                                         event.unix_time)
            if not probe.healthy:
                self.check_process(member.id)
            elif member.id in self._launched:
                self._launched.discard(member.id)
                self._audit_set_aside(member.id)
        elif event.kind == _AUDIT:
            record = self.audit.write(event)
            metrics.router.record_audit(member.id, event.audit.action, event.audit.cause)
            log_audit(record, in_rotation=bool(event.in_rotation))
        elif event.kind == _RESTART:
            self._schedule_restart(member)
        for listener in self._listeners:
            listener(event)
        self._check_first_health()

    def _audit_set_aside(self, worker_id: str) -> None:
        """Audits what the worker moved aside while it started (a store that was not a
        database): the worker has no audit log of its own, its state directory is ours."""
        for path in self.state_dirs.newly_set_aside(worker_id):
            record = self.audit.write_record(
                "state_file_set_aside", worker_id=worker_id, path=str(path),
                reason=f"{path.name}: could not be used; kept for the operator, a fresh one "
                       "started")
            log_audit(record, in_rotation=True)

    def __repr__(self) -> str:
        return f"Fleet(workers={len(self._members)}, native_probes={self.native_probes})"


def log_audit(record: Mapping[str, Any], *, in_rotation: bool) -> None:
    """One plain-text log line per audit record; the reason can quote a worker's answer,
    so it is escaped (a newline or an ANSI escape never forges or repaints a line)."""
    _log.log(logging.INFO if in_rotation else logging.WARNING, "worker %s: %s (%s)",
             record["worker_id"], record["action"], safe_text.printable(str(record["reason"])))


def probe_reason(probe: Any) -> str:
    """A failed probe's classification, as ``last_error`` shows it."""
    return short_reason(f"{enum_name(probe.status)}: {probe.detail}")


def base_url_of(url: str) -> str:
    """A worker's base URL from a URL an operator gave (``/health`` and trailing ``/`` cut)."""
    return url.strip().rstrip("/").removesuffix("/health")

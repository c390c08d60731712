"""A router's local workers as processes: launched, watched, restarted and ended.

The fleet (``fleet.py``) decides from probes and the native policy *that* a
worker must restart; this part does it, and owns everything a launch leaves
on the machine:

- each launch gets its own variables: its native health port and bind
  address, a state directory that outlives its restarts (``state_dirs.py``)
  and, when that one outlives the router too, the directory of its outputs
  in it; a tag that every process it starts inherits; it is kept in a
  cgroup of its own where the machine allows it (``processes.py``);
- each restart is an asyncio task of its own (stop the old process, launch
  the new one without waiting for health: the poller decides when it is
  healthy or that its boot deadline passed), so probing, routing and other
  restarts never wait on it;
- whenever a worker is replaced, restarted or lost, and when the router
  shuts down, all its processes are ended before anything takes its place,
  so no engine process keeps a GPU: a healthy shutdown or restart with
  SIGTERM, STOP_GRACE_S, SIGKILL; a worker condemned for a dead engine, a
  hung loop, a failed boot or its exit (``CONDEMNED_CAUSES``: nothing to
  drain) with SIGKILL at once, the new launch waiting for every process of
  the old to exit, not for a timer; each launch and each end is an audit
  record;
- a launched worker's process is polled every interval, so an exit is
  reported at once (``report_exit``, the fleet's), not after failed probes.

    local = LocalWorkers(settings, poller, audit, state_dirs, members,
                         native_probes=True, report_exit=fleet.report_exit)
    error = await local.launch(member)      # None, or why it could not start
    local.watch()                           # the process poll, once the loop runs
    local.schedule_restart(member)          # the policy asked for one
    await local.close()                     # every local worker's processes ended

Runs on the router's event loop; not thread-safe (blocking ends run in threads).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from mineru_health import safe_text
from mineru_health.runtime.router.audit import AuditLog
from mineru_health.runtime.settings import HealthSettings
from mineru_health.runtime.state_dirs import OUTPUT_DIR_ENV, STATE_DIR_ENV, StateDirs

from .launch import HEALTH_BIND_ENV, HEALTH_PORT_ENV, PORTS
from .member import Member
from .processes import Launch, WorkerProcesses
from .reasons import base_url_of, log_audit, short_reason

__all__ = ["CONDEMNED_CAUSES", "LocalWorkers"]

_log = safe_text.logger("mineru_health.router")

#: Failure causes (restart_policy.h) that condemn a worker: its engine is dead (a probe's
#: or a request's definitive verdict), its loop hung, its boot failed or its process exited.
#: It has nothing left to drain, so its processes get no grace.
CONDEMNED_CAUSES = frozenset(
    {"engine_dead", "loop_hung", "passive_failure", "boot_timeout", "process_exit"}
)


class LocalWorkers:
    """The processes of the workers this router launched (``Member.local``)."""

    def __init__(
        self,
        settings: HealthSettings,
        poller: Any,
        audit: AuditLog,
        state_dirs: StateDirs,
        members: Mapping[str, Member],
        *,
        native_probes: bool,
        report_exit: Callable[[str, str, int | None], None],
    ) -> None:
        self.settings = settings
        self.audit = audit
        self.state_dirs = state_dirs
        self.native_probes = native_probes
        self._poller = poller
        self._members = members  # the fleet's, read only
        self._report_exit = report_exit
        # What routers that died left running is ended before any worker starts.
        self.processes = WorkerProcesses(
            cgroups=bool(settings.worker_cgroups), grace_s=float(settings.stop_grace_s)
        )
        self._audit_swept(self.processes.swept)
        _log.info("local workers' processes are kept in %s", self.processes.describe())
        self._launches: dict[str, Launch] = {}  # local worker -> its current launch
        self._scope_kinds: dict[str, str] = {}  # local worker -> how its last launch is kept
        self._endings: dict[str, asyncio.Task[None]] = {}
        self._health_ports: dict[str, int] = {}
        self._restarts: dict[str, asyncio.Task[None]] = {}
        self._exit_reported: set[int] = set()
        self._launched: set[str] = set()  # local workers not probed healthy since their launch
        self._watch: asyncio.Task[None] | None = None

    def restarting(self, worker_id: str) -> bool:
        task = self._restarts.get(worker_id)
        return task is not None and not task.done()

    def process_scope(self, worker_id: str) -> str | None:
        """How a local worker's processes are kept: "cgroup" or "process_group" (None: never
        launched, or remote)."""
        return self._scope_kinds.get(worker_id)

    def health_url(self, member: Member) -> str:
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

    # -- launches ------------------------------------------------------------------------
    async def launch(self, member: Member) -> str | None:
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
        self._poller.set_url(member.id, base_url_of(member.probe_base()), self.health_url(member))
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
            env.update({HEALTH_PORT_ENV: str(self._health_ports[member.id]), HEALTH_BIND_ENV: host})
        return env

    def probed_healthy(self, worker_id: str) -> None:
        """A healthy probe of ``worker_id``: the first since its launch audits what its start
        set aside."""
        if worker_id in self._launched:
            self._launched.discard(worker_id)
            self._audit_set_aside(worker_id)

    # -- restarts ------------------------------------------------------------------------
    def schedule_restart(self, member: Member) -> None:
        if not member.local or self.restarting(member.id):
            return
        self._restarts[member.id] = asyncio.get_running_loop().create_task(
            self._restart(member), name=f"mineru-health-restart-{member.id}"
        )

    async def _restart(self, member: Member) -> None:
        # Stop probing the old process: its answers say nothing about the new one.
        self._poller.set_url(member.id, "", "")
        member.show_rotation(False)
        # Every process of the old instance is gone before the new one starts:
        # an engine process left behind would keep the GPU the new one needs.
        status = self._poller.status(member.id)
        condemned = status is not None and status.last_cause in CONDEMNED_CAUSES
        ending = self.end_processes(member.id, "restart", condemned=condemned)
        if ending is not None:
            await asyncio.shield(ending)
        try:
            await member.stop()
        except Exception as exc:  # noqa: BLE001 -- a failed stop must not block the new start
            _log.warning(
                "worker %s: stopping the old process failed: %s",
                member.id,
                safe_text.printable(str(exc)),
            )
        error = await self.launch(member)
        if error is not None:
            reason = short_reason(f"restart failed: {error}")
            member.show_rotation(False, reason)
            self._poller.report_restart_failed(member.id, reason)
            return
        _log.info("worker %s: restarted on %s", member.id, member.base_url())

    # -- processes -----------------------------------------------------------------------
    def watch(self) -> None:
        """Starts polling the local workers' processes (on the running loop)."""
        self._watch = asyncio.get_running_loop().create_task(
            self._watch_processes(), name="mineru-health-process-watch"
        )

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
        self._report_exit(worker_id, f"worker process {process.pid} exited with code {code}", code)
        # What it started may live on (its engine, in a session of its own): ended now, not
        # at the restart, which may be a backoff away or never come (gave_up).
        self.end_processes(worker_id, "exit", condemned=True)

    async def close(self) -> None:
        """Stops the process watch and the restarts, then ends every local worker's
        processes, all at once."""
        tasks = [
            t for t in (self._watch, *self._restarts.values()) if t is not None and not t.done()
        ]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._restarts.clear()
        endings = [self.end_processes(worker_id, "shutdown") for worker_id in list(self._launches)]
        endings += [t for t in self._endings.values() if not t.done()]
        if endings:
            await asyncio.gather(*{t for t in endings if t is not None}, return_exceptions=True)

    def end_processes(
        self, worker_id: str, why: str, *, condemned: bool = False
    ) -> asyncio.Task[None] | None:
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
        task = loop.create_task(
            self._end(launch, why, condemned), name=f"mineru-health-end-{worker_id}"
        )
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
            reason = (
                f"process {launch.pid} and all it starts kept by process group and tag "
                f"(no cgroup: {launch.no_cgroup})"
            )
        self.audit.write_record(
            "worker_processes",
            worker_id=launch.worker_id,
            reason=reason,
            pid=launch.pid,
            scope=launch.kind,
            cgroup=launch.cgroup or None,
            tag=launch.tag,
        )
        _log.info("worker %s: %s", launch.worker_id, safe_text.printable(reason))

    def _audit_end(self, launch: Launch, why: str, report: Any, condemned: bool) -> None:
        if condemned:
            how = (
                f"{report.killed} process(es) of pid {launch.pid}'s "
                f"{launch.kind.replace('_', ' ')} sent SIGKILL at once (nothing to drain)"
            )
        else:
            how = (
                f"{report.terminated} process(es) of pid {launch.pid}'s "
                f"{launch.kind.replace('_', ' ')} sent SIGTERM, {report.killed} SIGKILL "
                f"after {self.processes.grace_s:g} s"
            )
        left = f"{report.survivors} left of those {launch.found_by} finds"
        if launch.unseen:
            left += f"; others: {launch.unseen}"
        record = self.audit.write_record(
            "worker_processes_ended",
            worker_id=launch.worker_id,
            reason=f"{why}: {how}, {left}",
            pid=launch.pid,
            scope=launch.kind,
            after=why,
            condemned=condemned,
            terminated=report.terminated,
            killed=report.killed,
            survivors=report.survivors,
            survivors_found_by=launch.found_by,
            unseen=launch.unseen or None,
        )
        log_audit(record, in_rotation=report.survivors == 0)

    def _audit_set_aside(self, worker_id: str) -> None:
        """Audits what the worker moved aside while it started (a store that was not a
        database): the worker has no audit log of its own, its state directory is ours."""
        for path in self.state_dirs.newly_set_aside(worker_id):
            record = self.audit.write_record(
                "state_file_set_aside",
                worker_id=worker_id,
                path=str(path),
                reason=f"{path.name}: could not be used; kept for the operator, a fresh one "
                "started",
            )
            log_audit(record, in_rotation=True)

    def _audit_swept(self, swept: list[dict[str, Any]]) -> None:
        for found in swept:
            record = self.audit.write_record(
                "abandoned_processes_ended",
                worker_id=str(found["worker"]),
                reason=(
                    f"a router that died (owner {found['owner']}) left {found['ended']} "
                    f"process(es) of this worker running; {found['killed']} needed "
                    f"SIGKILL, {found['survivors']} left"
                ),
                **found,
            )
            log_audit(record, in_rotation=False)

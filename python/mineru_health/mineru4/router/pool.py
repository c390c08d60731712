"""MinerU 4.0's WorkerPool supervised by the fleet (native poller and restart policy).

``healing_pool_class(WorkerPool, globals())`` is the class ``workers.py``
uses after the patch. What it replaces of 4.0.12's pool:

- ``_monitor_loop``/``refresh_all``/``_refresh_worker``: one native thread
  probes every worker on its own schedule; poller events set
  ``WorkerState.healthy`` (the policy's "in rotation", nothing else is
  kept). A worker's tiers, models and features are read once per instance,
  when it first enters rotation, as a task of its own;
- restarts: each one is its own asyncio task; ``generation`` counts
  instances, as in 4.0, so late answers of an old one publish nothing;
- ``notify_engine_dead`` (a 503 ``engine_dead`` seen by 4.0's proxy) is a
  passive failure reported to the policy.

Local workers launch with the fleet's variables (native port and bind,
state directory, the router's pid). The upload directory of an instance a
restart replaces is kept (``retired.py``) so that its finished results stay
downloadable. With a durable state directory (the router's store), every
instance of a worker uses one upload directory in the worker's state
directory instead (``outputs_kept_class``): its finished jobs, in its task
store, outlive the router. Runs on the router's event loop; not
thread-safe, like the class it extends.
"""

from __future__ import annotations

import asyncio
import importlib.util
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from mineru_health import _native, safe_text
from mineru_health.runtime.router.fleet import expectations, probe_reason
from mineru_health.runtime.router.runtime import RouterRuntime, RuntimeParts, open_runtime
from mineru_health.runtime.state_dirs import OUTPUT_DIR_ENV

from .jobs import JobLine
from .retired import RetiredOutputs

__all__ = ["HealingPool", "Worker", "healing_pool_class", "outputs_kept_class"]

_log = safe_text.logger("mineru_health.router")
#: MinerU 4.0's main port says this when healthy (the native endpoint: "healthy").
MAIN_PORT_STATUS = "ok"
_PROBE = _native.PollerEventKind.PROBE


def healing_pool_class(base: type, namespace: Mapping[str, Any]) -> type:
    attrs = {
        "_ns": namespace,
        "_mineru_health": True,
        "__module__": namespace.get("__name__", __name__),
        "__doc__": HealingPool.__doc__,
    }
    return type(base.__name__, (HealingPool, base), attrs)


def outputs_kept_class(base: type) -> type:
    """4.0's local-worker class whose upload directory is the fleet's ``OUTPUT_DIR_ENV``
    when the launch gives one (a durable state directory), else 4.0's temporary one."""

    class OutputsKept(base):  # type: ignore[misc]
        launch_env: dict[str, str] | None

        def command(self, port: int, upload_dir: Path) -> list[str]:
            outputs = (self.launch_env or {}).get(OUTPUT_DIR_ENV)
            return super().command(port, Path(outputs) if outputs else upload_dir)  # type: ignore[no-any-return]

    OutputsKept.__name__ = OutputsKept.__qualname__ = base.__name__
    return OutputsKept


def _workers_serve_native() -> bool:
    """True when this MinerU's worker is patched, so a native port passed to it is served.

    An unpatched worker ignores ``MINERU_HEALTH_PORT``: probing that port
    would fail forever, so such workers are probed on their main port.
    """
    spec = importlib.util.find_spec("mineru.parser.api_server")
    origin = spec.origin if spec is not None else None
    try:
        return origin is not None and "mineru_health" in Path(origin).read_text(encoding="utf-8")
    except OSError:
        return False


class Worker:
    """One MinerU 4.0 ``WorkerState`` as the fleet sees it (a :class:`Member`)."""

    def __init__(self, state: Any, pool: HealingPool) -> None:
        self.state = state
        self.id: str = state.worker_id
        self.local = state.local_worker is not None
        self._pool = pool

    def base_url(self) -> str:
        return str(self.state.base_url or "")

    def probe_base(self) -> str:
        # The poller appends "/health": 4.0's is /v1/health.
        return f"{self.state.base_url}/v1" if self.state.base_url else ""

    def connect_host(self) -> str:
        return str(self._pool._ns["worker_connect_host"](self.state.local_worker.host))

    def process(self) -> Any:
        return self.state.local_worker.process

    def show(self, event: Any) -> None:
        self.state.healthy = bool(event.in_rotation) and bool(self.state.base_url)
        if event.kind == _PROBE:
            self.state.last_error = None if event.probe.healthy else probe_reason(event.probe)

    def show_rotation(self, in_rotation: bool, reason: str | None = None) -> None:
        self.state.healthy = in_rotation and bool(self.state.base_url)
        if reason:
            self.state.last_error = reason

    async def launch(self, env: Mapping[str, str]) -> None:
        local = self.state.local_worker
        local.launch_env = dict(env)
        await local.launch(self._pool.client)
        self.state.base_url = local.base_url
        self.state.generation = max(self.state.generation, 1)

    async def stop(self) -> None:
        state, local = self.state, self.state.local_worker
        state.healthy = False
        state.base_url = ""
        state.tier_metadata.clear()
        state.models.clear()
        state.features.clear()
        # Its finished outputs stay downloadable from the kept upload directory.
        temp_dir, local.temp_dir = local.temp_dir, None
        outputs = (local.launch_env or {}).get(OUTPUT_DIR_ENV)
        known = [(i, p) for i, p in self._pool.job_line.file_payloads(self.id) if p is not None]
        self._pool.retired.retire(temp_dir, known, uploads=Path(outputs) if outputs else None)
        # As 4.0: a new generation, so late answers of the old one publish nothing.
        state.generation += 1
        state.active_jobs = 0
        await local.stop()


class HealingPool(RuntimeParts[RetiredOutputs]):
    """Replaces MinerU 4.0's refresh loop with the fleet (the job supervisor: ``jobs.py``)."""

    _ns: ClassVar[Mapping[str, Any]] = {}

    # Attributes of MinerU's WorkerPool this class relies on (for type checkers).
    _workers: dict[str, Any]
    client: Any
    workers: list[Any]
    _build_workers: Any

    def __init__(
        self, settings: Any, *, transport: Any = None, on_local_worker_replaced: Any = None
    ) -> None:
        # 4.0's replacement hook fails the replaced worker's jobs and drops its
        # routes; the job supervisor and the retired outputs take its place.
        del on_local_worker_replaced

        def open_mineru() -> tuple[Any, RetiredOutputs]:
            super(HealingPool, self).__init__(settings, transport=transport)  # type: ignore[call-arg]
            import httpx

            retired = RetiredOutputs(
                retention_s=float(getattr(settings, "retention_seconds", 0) or 0)
            )
            # One client, as 4.0's, whose transport also answers for retired outputs.
            self.client = httpx.AsyncClient(
                timeout=httpx.Timeout(60.0, connect=10.0), transport=retired.transport(transport)
            )
            return self.client, retired

        #: The job side (``jobs.py``); ``install_app`` gives it 4.0's registry and sources.
        self.job_line = JobLine(self)
        self._capability_tasks: dict[str, asyncio.Task[None]] = {}
        self._capabilities_of: dict[str, int] = {}  # worker id -> generation read
        # A remote worker found by DNS that the fleet forgot stays known to ``get``
        # (4.0 fetches a finished job's files from its worker).
        self._forgotten: dict[str, Any] = {}
        # Settings, scratch, MinerU's pool, fleet, supervisor and store, discovery (runtime.py).
        self.runtime: RouterRuntime[RetiredOutputs] = open_runtime(
            self,
            self.job_line,
            open_mineru=open_mineru,
            expect=lambda health: expectations(
                health, require_load_fields=False, main_port_status=MAIN_PORT_STATUS
            ),
            native_probes=_workers_serve_native(),
        )
        self.fleet.listen(self._on_event)

    @property
    def health_settings(self) -> Any:
        return self.fleet.settings

    @staticmethod
    def keep_in_scratch(source_store: Any) -> None:
        """Moves 4.0's job-source store, made before this pool and still empty, into the
        router's scratch directory (``scratch.py``), so that a killed router's successor
        removes the sources it kept."""
        old = getattr(source_store, "_temp_dir", None)
        if (
            old is None
            or not hasattr(source_store, "_root")
            or getattr(source_store, "_uploads", None)
        ):
            _log.warning(
                "4.0's job-source store is not the one this adapter knows; its "
                "directory stays where 4.0 made it"
            )
            return
        source_store._temp_dir = tempfile.TemporaryDirectory(prefix="mineru-v1-router-sources-")
        source_store._root = Path(source_store._temp_dir.name)
        old.cleanup()

    async def start(self) -> None:
        self._build_workers()
        for state in self.workers:
            self.fleet.add(Worker(state, self))
        if self.discovery is not None:
            await self.discovery.first()
        # As 4.0's start: every worker routable (its capabilities read) or out of its boot.
        await self.fleet.start(
            ready=lambda member, status: (
                self._capabilities_of.get(member.id) == self._workers[member.id].generation
            )
        )
        self.job_line.resume()  # before 4.0's lifespan serves any request
        if self.discovery is not None:
            self.discovery.start()

    async def close(self) -> None:
        # 4.0's own close (it stops the current instances) in the runtime's order; what
        # 4.0 made in the scratch directory (its job sources, removed next) goes too.
        await self.runtime.close(self._close_mineru)

    async def _close_mineru(self) -> None:
        tasks = [t for t in self._capability_tasks.values() if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await super().close()  # type: ignore[misc]

    # 4.0's refresh is the poller's job now; callers still get a process check.
    async def refresh_all(self) -> None:
        for worker in self.workers:
            self.fleet.local.check_process(worker.worker_id)

    async def refresh(self, worker: Any) -> None:
        self.fleet.local.check_process(worker.worker_id)

    def notify_engine_dead(self, worker: Any) -> None:
        """4.0's proxy saw a 503 ``engine_dead`` from ``worker``."""
        self.fleet.report_passive(worker.worker_id, "a request was refused with 503 engine_dead")

    def routable(self) -> bool:
        """Some worker is healthy and its capabilities are read: 4.0 can give it a job."""
        return any(
            worker.healthy and self._capabilities_of.get(worker.worker_id) == worker.generation
            for worker in self.healthy_workers()
        )

    # -- workers found by DNS (discovery.Workers) ------------------------------------------
    def add_remote(self, worker_id: str, url: str) -> Worker:
        state = self._ns["WorkerState"](worker_id=worker_id, base_url=url, source="remote")
        self._forgotten.pop(worker_id, None)
        self._workers[worker_id] = state
        return Worker(state, self)

    def remove_remote(self, worker_id: str) -> None:
        state = self._workers.pop(worker_id, None)
        if state is not None:
            state.healthy = False
            self._forgotten[worker_id] = state
        self._capabilities_of.pop(worker_id, None)

    def in_flight(self, worker_id: str) -> bool:
        worker = self._workers.get(worker_id)
        return worker is not None and worker.active_jobs > 0

    async def keep_results(self, worker_id: str) -> str:
        """Copies the files the router still lists on a drained worker, so that they stay
        downloadable once it is gone; says what it copied."""
        from mineru_health.runtime.router.result_copies import room_for_copies

        state = self._workers.get(worker_id)
        if state is None or not state.base_url:
            return "no URL to copy its results from"
        report = await self.retired.copy_results(
            self.client,
            str(state.base_url),
            self.job_line.file_payloads(worker_id),
            max_bytes=room_for_copies(self.fleet.settings),
        )
        return str(report)

    def get(self, worker_id: str) -> Any:
        """4.0's lookup, forgotten workers included (their finished jobs' files)."""
        state = self._workers.get(worker_id) or self._forgotten.get(worker_id)
        if state is None:
            raise KeyError(worker_id)
        return state

    def healthy_workers(self) -> list[Any]:
        """4.0's routable workers, draining ones left out (no new job goes there)."""
        return [
            w
            for w in super().healthy_workers()  # type: ignore[misc]
            if not self.fleet.draining(w.worker_id)
        ]

    # -- tiers, models, features (once per instance) -----------------------------------
    def _on_event(self, event: Any) -> None:
        worker = self._workers.get(event.worker_id)
        if (
            worker is not None
            and worker.healthy
            and self._capabilities_of.get(worker.worker_id) != worker.generation
        ):
            task = self._capability_tasks.get(worker.worker_id)
            if task is None or task.done():
                self._capability_tasks[worker.worker_id] = asyncio.get_running_loop().create_task(
                    self._capabilities(worker),
                    name=f"mineru-health-capabilities-{worker.worker_id}",
                )

    async def _capabilities(self, worker: Any) -> None:
        generation, base = worker.generation, worker.base_url
        timeout = float(self.fleet.settings.main_port_timeout_s)
        try:
            health, tiers, models = await asyncio.gather(
                *(
                    self.client.get(f"{base}/v1/{what}", timeout=timeout)
                    for what in ("health", "tiers", "models")
                )
            )
            for response in (health, tiers, models):
                response.raise_for_status()
            features = dict(health.json().get("features") or {})
            tier_data = {
                str(item["id"]): dict(item)
                for item in tiers.json().get("data", [])
                if item.get("id")
            }
            model_data = [dict(item) for item in models.json().get("data", [])]
        except Exception as exc:  # noqa: BLE001 -- read again at the next healthy probe
            _log.info(
                "worker %s: reading tiers and models failed: %s",
                worker.worker_id,
                safe_text.printable(str(exc)),
            )
            return
        if worker.generation != generation or worker.base_url != base:
            return  # replaced meanwhile
        worker.features, worker.tier_metadata, worker.models = features, tier_data, model_data
        self._capabilities_of[worker.worker_id] = generation
        self.fleet.first_answers()

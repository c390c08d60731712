"""MinerU 4.0's job line and the router's store (issue 24): a job's row, and the job put back.

4.0 is not importable here (its own venv): its ``ResourceRegistry`` and
``SourceFileStore`` are reduced to what the line calls, with the same
semantics (routes registered by public id, bytes bound and pinned by public
file id). A job's snapshot goes through the real store and comes back in a
new line's registry: ended, answered from its stored payload; unfinished,
with its inputs' bytes bound and pinned again so it can be sent again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from mineru_health.mineru4.router.endpoints import install_endpoints
from mineru_health.mineru4.router.jobs import Job, JobLine
from mineru_health.runtime.router.line import Kept
from mineru_health.runtime.router.store import DB_NAME, RouterStore
from mineru_health.runtime.router.supervisor import Supervisor
from mineru_health.runtime.settings import HealthSettings


@dataclass
class ResourceRoute:
    kind: str
    public_id: str
    owner_scope: str
    worker_id: str
    upstream_id: str
    created_at: str = "2026-12-04T10:00:00Z"
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StoredSourceFile:  # looked up in this module, as the line looks it up in 4.0's
    path: Path
    bytes: int
    sha256sum: str
    mime_type: str


class ResourceRegistry:
    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], ResourceRoute] = {}

    def register(
        self,
        kind: str,
        *,
        owner_scope: str,
        worker_id: str,
        upstream_id: str,
        metadata: dict[str, Any] | None = None,
        public_id: str | None = None,
    ) -> ResourceRoute:
        route = ResourceRoute(
            kind,
            public_id or f"{kind}-{len(self.routes)}",
            owner_scope,
            worker_id,
            upstream_id,
            metadata=dict(metadata or {}),
        )
        self.routes[(kind, route.public_id)] = route
        return route

    def find(self, kind: str, public_id: str) -> ResourceRoute | None:
        return self.routes.get((kind, public_id))

    def list(self, kind: str, include_expired: bool = False) -> list[ResourceRoute]:
        return [r for (k, _), r in self.routes.items() if k == kind]

    def collect_expired(self, sources: Any) -> None:
        for key in [k for k, r in self.routes.items() if r.metadata.get("expired")]:
            del self.routes[key]


class SourceFileStore:
    def __init__(self, root: Path) -> None:
        self._root = root
        self.files: dict[str, StoredSourceFile] = {}
        self.pins: dict[Path, int] = {}

    def bind_source(self, file_id: str, stored: StoredSourceFile, *, owner_scope: str) -> None:
        self.files[file_id] = stored

    @contextlib.contextmanager
    def pin(self, stored: StoredSourceFile) -> Iterator[None]:
        self.pins[stored.path] = self.pins.get(stored.path, 0) + 1
        try:
            yield
        finally:
            self.pins[stored.path] -= 1


def line_on(
    state: Path, settings: HealthSettings | None = None
) -> tuple[JobLine, ResourceRegistry, SourceFileStore]:
    state.mkdir(exist_ok=True)
    settings = settings or HealthSettings.preset("fast")
    # The fleet as Supervisor.over reads it: its settings, its state directory, its events.
    fleet = SimpleNamespace(
        settings=settings,
        audit=None,
        listen=lambda callback: None,
        state_dirs=SimpleNamespace(router_dir=lambda: state),
    )
    # 4.0's pool: its one worker, whose count of the jobs sent to it a revived job joins.
    w0 = SimpleNamespace(worker_id="w0", active_jobs=0)
    pool = SimpleNamespace(fleet=fleet, workers=[w0])
    pool.mark_job_started = lambda worker_id: setattr(w0, "active_jobs", w0.active_jobs + 1)
    registry, sources = ResourceRegistry(), SourceFileStore(Path("/unused"))
    namespace = {
        "rewrite_job_payload": lambda payload, *rest: payload,
        "_mark_missing_job": lambda route, pool: {},
        "utc_now_iso": lambda: "2026-12-04T11:00:00Z",
    }
    line = JobLine(pool)
    pool.supervisor = Supervisor.over(fleet, line)  # type: ignore[arg-type]
    line.install(registry, sources, namespace)
    install_endpoints(line, namespace)
    return line, registry, sources


def job_on(
    line: JobLine,
    registry: ResourceRegistry,
    sources: SourceFileStore,
    state: Path,
    number: int,
    status: str,
) -> Kept:
    """A job submitted to w0 as ``submit_job`` and ``track`` leave it, payload read."""
    data = state / "sources" / "uploads" / f"task-{number}"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_bytes(b"%PDF-1.4 " + str(number).encode())
    stored = StoredSourceFile(data, data.stat().st_size, "ab" * 32, "application/pdf")
    scope = "auth:caller"
    registry.register(
        "file",
        owner_scope=scope,
        worker_id="w0",
        upstream_id=f"up-in-{number}",
        public_id=f"file-in-{number}",
        metadata={"payload": {"id": f"file-in-{number}", "filename": "a.pdf"}},
    )
    registry.register(
        "file",
        owner_scope=scope,
        worker_id="w0",
        upstream_id=f"up-md-{number}",
        public_id=f"file-md-{number}",
    )
    route = registry.register(
        "job",
        owner_scope=scope,
        worker_id="w0",
        upstream_id=f"up-job-{number}",
        public_id=f"job_{number}",
    )
    route.metadata.update(
        input_aliases={f"up-in-{number}": f"file-in-{number}"},
        payload={
            "job_id": f"job_{number}",
            "status": status,
            "files": [
                {
                    "file_id": f"file-in-{number}",
                    "status": status,
                    "output_files": {"markdown": {"file_id": f"file-md-{number}"}},
                }
            ],
        },
    )
    sources.bind_source(f"file-in-{number}", stored, owner_scope=scope)
    pins = ExitStack()
    pins.enter_context(sources.pin(stored))
    job = Job(
        route=route,
        body={"files": [{"source": {"type": "file_id", "file_id": f"file-in-{number}"}}]},
        sources={f"file-in-{number}": (stored, "a.pdf")},
        pins=pins,
        headers={"authorization": "Bearer t"},
        resendable=True,
        saved=True,
    )
    return line.supervisor.keep(route.public_id, job, "w0", "http://w0:1")


def test_a_jobs_row_brings_back_its_routes_and_its_inputs(tmp_path: Path) -> None:
    import asyncio

    state = tmp_path / "state"

    async def first_router() -> None:
        line, registry, sources = line_on(state)
        assert sources._root == state / "sources"  # inputs land in the state directory
        done = job_on(line, registry, sources, state, 1, "running")
        job_on(line, registry, sources, state, 2, "running")
        done.item.route.metadata["payload"]["status"] = "completed"
        line.supervisor.release(done)

    asyncio.run(first_router())
    rows = {r.key: r for r in RouterStore(state / DB_NAME).rows()}
    assert rows["job_1"].state == "completed" and rows["job_1"].source == ""
    assert rows["job_2"].state == "running" and rows["job_2"].source.endswith("task-2")
    assert rows["job_2"].record["route"]["headers"] == {"authorization": "Bearer t"}

    line, registry, sources = line_on(state)
    assert line.revive(rows["job_1"]) is None
    ended = registry.find("job", "job_1")
    assert ended is not None and ended.metadata["upstream_lost"]  # answered from its payload
    assert ended.metadata["payload"]["status"] == "completed"
    assert ended.metadata["finalized_at"] == "2026-12-04T11:00:00Z"
    output = registry.find("file", "file-md-1")
    assert output is not None and (output.worker_id, output.upstream_id) == ("w0", "up-md-1")

    revived = line.revive(rows["job_2"])
    assert revived is not None and revived.workers == ["w0"]
    job = revived.item
    route = registry.find("job", "job_2")
    assert job.route is route and route is not None and route.upstream_id == "up-job-2"
    assert route.metadata["input_aliases"] == {"up-in-2": "file-in-2"}
    assert route.metadata["upstream_headers"] == {"authorization": "Bearer t"}
    assert not route.metadata.get("upstream_lost") and job.resendable
    # Counted on its worker: 4.0's reconciliation reads it to its end (and its row's end).
    assert route.metadata["active_counted"] and line.pool.workers[0].active_jobs == 1
    stored, name = job.sources["file-in-2"]
    assert sources.files["file-in-2"] == stored and sources.pins[stored.path] == 1
    assert name == "a.pdf" and stored.path.read_bytes() == b"%PDF-1.4 2"

    # Its bytes gone (a damaged volume): kept, not resendable, it fails clearly when lost.
    stored.path.unlink()
    again = line_on(tmp_path / "other")[0]
    again._registry, again._sources = ResourceRegistry(), SourceFileStore(Path("/unused"))
    assert again.revive(rows["job_2"]).item.resendable is False  # type: ignore[union-attr]


def test_4_0_retention_takes_rows_out_of_the_store(tmp_path: Path) -> None:
    import asyncio

    state = tmp_path / "state"

    async def scenario() -> None:
        line, registry, sources = line_on(state)
        kept = job_on(line, registry, sources, state, 1, "running")
        kept.item.route.metadata["payload"]["status"] = "completed"
        line.supervisor.release(kept)
        kept.item.route.metadata["expired"] = True
        registry.collect_expired(sources)
        assert RouterStore(state / DB_NAME).rows() == []

    asyncio.run(scenario())


def test_a_job_another_router_took_over_is_never_failed_here_when_its_worker_forgets_it(
    tmp_path: Path,
) -> None:
    """Disowned (its lease lapsed and another router took the job): 4.0 keeps its route
    here, and when the worker it names answers 404 (the new owner sent it elsewhere) the
    job keeps its last payload here, not 4.0's failure; its inputs' pins go."""

    async def scenario() -> None:
        line, registry, sources = line_on(tmp_path / "state")
        line.supervisor.fleet.audit = SimpleNamespace(write_record=lambda *a, **k: None)
        kept = job_on(line, registry, sources, tmp_path / "state", 2, "running")
        route = kept.item.route
        line.supervisor.disown(["job_2"], "taken over by router-b")
        assert line.supervisor.find("job_2") is None
        assert registry.find("job", "job_2") is route  # kept: reads under way go on
        assert all(count == 0 for count in sources.pins.values()), sources.pins
        line.mark_missing = lambda route, pool: {"status": "failed"}
        assert line.missing(route, line.pool)["status"] == "running"
        await line.supervisor.close()

    asyncio.run(scenario())

"""Admission (issue 31): nothing is acknowledged that the router did not keep.

The supervisor's reservations under the caps (count and bytes) hold under a
burst; a directory without room refuses with 507 before anything is staged;
a store row that cannot be written refuses after the fact and undoes the
submission on both lines (3.x: MinerU's real registry and payload classes;
4.0: its registry and source store reduced to what the line calls). Disk
room is a fake ``statvfs``. No processes.
"""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from mineru_health import metrics
from mineru_health.mineru4.router.endpoints import submit_with_failover, track_submitted
from mineru_health.mineru4.router.jobs import JobLine
from mineru_health.runtime.router import admission
from mineru_health.runtime.router.admission import CAP, STORAGE, UNDESCRIBED, Refused, storage_error
from test_router_resume import registry, router, submit
from test_router_resume4 import ResourceRegistry, SourceFileStore, StoredSourceFile, line_on
from test_task_supervisor import Fleet, line_for

MIB = 1024 * 1024


class Disk:
    """``os.statvfs`` of one file system with ``free`` bytes, read-only or not."""

    def __init__(self, free: int) -> None:
        self.free, self.read_only, self.asked = free, False, 0

    def __call__(self, path: Any) -> Any:
        self.asked += 1
        return SimpleNamespace(
            f_bavail=self.free // 4096,
            f_frsize=4096,
            f_fsid=7,
            f_flag=os.ST_RDONLY if self.read_only else 0,
        )


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Disk:
    fake = Disk(1 << 40)
    monkeypatch.setattr(admission.os, "statvfs", fake)
    return fake


def run(test: Any) -> None:
    async def main() -> None:
        await test(Fleet())

    asyncio.run(main())


def test_a_burst_is_held_to_both_caps_from_its_admission(disk: Disk) -> None:
    """20 x 19 MB at once against MAX_KEPT_MB=100: 5 admitted (95 MB), 15 refused with 503."""

    async def scenario(fleet: Fleet) -> None:
        supervisor = line_for(fleet, max_kept_mb=100, max_kept_tasks=1000).supervisor
        admitted, refused = [], []
        for _ in range(20):
            try:
                admitted.append(supervisor.admit(19 * MIB))
            except Refused as refusal:
                refused.append(refusal)
        assert len(admitted) == 5 and supervisor.admitted_bytes == 95 * MIB
        assert {(r.status, r.reason) for r in refused} == {(503, CAP)}
        assert all(r.headers["Retry-After"] == str(supervisor.retry_after_s) for r in refused)
        assert supervisor.refusal_counts() == {CAP: 15, STORAGE: 0}
        # Kept: the kept submission counts instead of its reservation.
        item = SimpleNamespace(payload=SimpleNamespace(release=lambda: None))
        kept = supervisor.keep(
            "t0", item, "w0", "http://w0:1", size_bytes=19 * MIB, save=False, admission=admitted[0]
        )
        assert not admitted[0].open and supervisor.kept_bytes == 19 * MIB
        assert supervisor.admitted_bytes == 76 * MIB
        with pytest.raises(Refused):
            supervisor.admit(19 * MIB)
        admitted[1].close()  # refused later (its row, its staging): its bytes come back
        supervisor.admit(19 * MIB).close()
        supervisor.drop(kept)
        assert supervisor.kept_bytes == 0
        # The count cap counts admissions too.
        by_count = line_for(fleet, max_kept_tasks=3).supervisor
        held = [by_count.admit(0) for _ in range(3)]
        with pytest.raises(Refused):
            by_count.admit(0)
        for one in held:
            one.close()

    run(scenario)


def test_a_streamed_size_is_reserved_when_it_is_known(disk: Disk) -> None:
    async def scenario(fleet: Fleet) -> None:
        supervisor = line_for(fleet, max_kept_mb=10).supervisor
        first = supervisor.admit(0)  # chunked: nothing declared
        first.resize(6 * MIB)
        assert supervisor.admitted_bytes == 6 * MIB
        second = supervisor.admit(0)
        with pytest.raises(Refused) as refused:
            second.resize(6 * MIB)
        assert refused.value.status == 503 and not second.open
        assert supervisor.admitted_bytes == 6 * MIB
        first.resize(1 * MIB)  # smaller than declared: what is kept counts
        first.close()
        assert supervisor.admitted_bytes == 0
        # One upload larger than the whole cap is admitted alone, never refused for good.
        alone = supervisor.admit(50 * MIB)
        with pytest.raises(Refused):
            supervisor.admit(1)
        alone.close()

    run(scenario)


def test_a_disk_without_room_refuses_with_507_before_staging(tmp_path: Path, disk: Disk) -> None:
    async def scenario(fleet: Fleet) -> None:
        line = router(fleet, tmp_path / "state")
        supervisor = line.supervisor
        disk.free = 10 * MIB
        first = supervisor.admit(5 * MIB)  # 5 MB + the row's margin fit in 10
        with pytest.raises(Refused) as refused:
            supervisor.admit(5 * MIB)  # 10 - 5 reserved < 5 + 1
        assert refused.value.status == 507 and refused.value.code == "insufficient_storage"
        assert refused.value.directory == str(tmp_path / "state")
        assert str(tmp_path / "state") in refused.value.detail
        assert refused.value.headers["Retry-After"]
        first.close()
        disk.read_only = True
        with pytest.raises(Refused) as refused:
            supervisor.admit(1)
        assert "read-only" in refused.value.detail
        disk.read_only, disk.free = False, 1 << 30  # room returns: admitted again
        supervisor.admit(5 * MIB).close()
        assert supervisor.refusal_counts() == {CAP: 0, STORAGE: 2}
        await supervisor.close()

    run(scenario)


def test_a_row_that_cannot_be_written_is_refused_and_undone_on_3x(
    tmp_path: Path, disk: Disk
) -> None:
    async def scenario(fleet: Fleet) -> None:
        line = router(fleet, tmp_path / "state")
        store = line.supervisor.store
        assert store is not None
        tasks = registry()
        saves = store.save
        store.save = lambda saved: False  # type: ignore[method-assign]  # ENOSPC on the row
        with pytest.raises(Refused) as refused:
            await submit(line, tasks, tmp_path, "full", "pending")
        assert refused.value.status == 507 and str(tmp_path / "state") in refused.value.detail
        assert tasks._tasks == {}  # never served as accepted
        kept_dir = line.kept_dir()
        assert kept_dir is not None and list(kept_dir.iterdir()) == []  # staged files deleted
        assert line.supervisor.in_flight == 0 and line.supervisor.kept_bytes == 0
        assert line.supervisor.refusal_counts()[STORAGE] == 1
        store.save = saves  # type: ignore[method-assign]  # room returns
        record, _payload = await submit(line, tasks, tmp_path, "kept", "pending")
        assert list(tasks._tasks) == [record.task_id] and store.count() == 1
        await line.supervisor.close()

    run(scenario)


def test_a_submission_the_line_cannot_describe_is_refused_not_acknowledged(
    tmp_path: Path, disk: Disk
) -> None:
    """No row, no acceptance: a line that cannot describe a submission for the store (our
    bug) refuses it with 500, undone like a row that cannot be written (it used to be
    answered 202 and lost at the router's next restart)."""

    async def scenario(fleet: Fleet) -> None:
        line = router(fleet, tmp_path / "state")
        store = line.supervisor.store
        assert store is not None
        tasks = registry()
        snapshot = line.snapshot

        def broken(kept: Any) -> Any:
            raise RuntimeError("a record the line does not know")

        line.snapshot = broken  # type: ignore[method-assign]
        with pytest.raises(Refused) as refused:
            await submit(line, tasks, tmp_path, "odd", "pending")
        assert (refused.value.status, refused.value.code) == (500, "router_cannot_keep")
        assert tasks._tasks == {} and store.count() == 0
        kept_dir = line.kept_dir()
        assert kept_dir is not None and list(kept_dir.iterdir()) == []
        assert line.supervisor.in_flight == 0
        assert line.supervisor.refusal_counts()[UNDESCRIBED] == 1
        line.snapshot = snapshot  # type: ignore[method-assign]
        await submit(line, tasks, tmp_path, "kept", "pending")
        assert store.count() == 1
        await line.supervisor.close()

    run(scenario)


def test_a_row_that_cannot_be_written_is_refused_and_undone_on_4_0(
    tmp_path: Path, disk: Disk
) -> None:
    """4.0's submit_job reduced to its steps: inputs staged and bound, job created on w0,
    route registered, ``job_submitted``, the payload read (``observe`` writes the row)."""
    line, routes, sources = line_on(tmp_path / "state")
    deleted: list[str] = []
    released: list[str] = []

    async def request_upstream(pool: Any, worker: Any, method: str, path: str) -> None:
        deleted.append(f"{method} {worker.worker_id}{path}")

    line._ns.update(
        release_job_load=lambda route, pool: released.append(route.public_id),
        request_upstream=request_upstream,
    )
    line._pool.get = lambda worker_id: SimpleNamespace(
        worker_id=worker_id, base_url=f"http://{worker_id}:1"
    )
    _augment(routes, sources, line)
    data = tmp_path / "state" / "sources" / "uploads" / "task-1"
    data.parent.mkdir(parents=True)
    upload = SimpleNamespace(bytes=3 * MIB, filename="a.pdf", sha256sum="")

    async def submit_job(body: dict[str, Any], request: Any, uploads: Any) -> Any:
        data.write_bytes(b"%PDF-1.4 one")
        stored = StoredSourceFile(data, 3 * MIB, "cd" * 32, "application/pdf")
        routes.register(
            "file",
            owner_scope="s",
            worker_id="w0",
            upstream_id="up-in",
            public_id="file-in",
            metadata={"payload": {"filename": "a.pdf"}},
        )
        sources.bind_source("file-in", stored, owner_scope="s")
        route = routes.register(
            "job", owner_scope="s", worker_id="w0", upstream_id="up-job", public_id="job_1"
        )
        route.metadata["input_aliases"] = {"up-in": "file-in"}
        sent = {"files": [{"source": {"type": "file_id", "file_id": "up-in"}}]}
        track_submitted(line, route, sent)
        return line._ns["rewrite_job_payload"](
            {"job_id": "job_1", "status": "queued"},
            SimpleNamespace(worker_id="w0"),
            None,
            None,
            "s",
        )

    async def scenario() -> None:
        store = line.supervisor.store
        assert store is not None
        store.save = lambda saved: False  # type: ignore[method-assign]
        body = {"files": [{"source": {"type": "file_id", "file_id": "upload-0"}}]}
        with pytest.raises(Refused) as refused:
            await submit_with_failover(line, submit_job, body, None, {0: upload})
        assert refused.value.status == 507
        assert routes.find("job", "job_1") is None and routes.find("file", "file-in") is None
        assert not data.exists() and released == ["job_1"]
        assert line.supervisor.in_flight == 0 and line.supervisor.admitted_bytes == 0
        for _ in range(100):  # the worker is told in the background
            if len(deleted) == 2:
                break
            await asyncio.sleep(0.01)
        assert deleted == ["DELETE w0/v1/parse/jobs/up-job", "DELETE w0/v1/files/up-in"]

    asyncio.run(scenario())


class RouterProxyError(Exception):
    status_code = 0
    code = ""


def _augment(routes: ResourceRegistry, sources: SourceFileStore, line: JobLine) -> None:
    """4.0's removals and submission names, which the resume tests' reductions do not need."""
    line._ns["RouterProxyError"] = RouterProxyError
    line._pool.workers = []

    def remove(kind: str, public_id: str) -> Any:
        return routes.routes.pop((kind, public_id), None)

    def find_file(file_id: str) -> Any:
        return sources.files.get(file_id)

    def delete_file(file_id: str) -> None:
        stored = sources.files.pop(file_id, None)
        if stored is not None and not sources.pins.get(stored.path):
            stored.path.unlink(missing_ok=True)

    routes.remove = remove  # type: ignore[attr-defined]
    sources.find_file = find_file  # type: ignore[attr-defined]
    sources.delete_file = delete_file  # type: ignore[attr-defined]


def test_4_0_admits_through_the_same_caps(tmp_path: Path, disk: Disk) -> None:
    line, routes, sources = line_on(tmp_path / "state")
    _augment(routes, sources, line)
    line.supervisor.max_kept = 1
    calls: list[int] = []

    async def submit_job(body: dict[str, Any], request: Any, uploads: Any) -> Any:
        calls.append(1)
        second = {"files": []}
        with pytest.raises(Refused) as refused:  # the first one's place is still reserved
            await submit_with_failover(line, submit_job, second, None, {})
        assert refused.value.status == 503
        return SimpleNamespace(status_code=202)

    async def scenario() -> None:
        await submit_with_failover(line, submit_job, {"files": []}, None, {})
        assert calls == [1] and line.supervisor.admitted_bytes == 0

    asyncio.run(scenario())
    assert isinstance(line, JobLine)


def test_storage_errors_are_found_in_their_causes() -> None:
    full = OSError(errno.ENOSPC, "No space left on device", "/state/kept/x")
    try:
        try:
            raise full
        except OSError as error:
            raise RuntimeError("staging failed") from error
    except RuntimeError as wrapped:
        assert storage_error(wrapped) is full
    assert storage_error(OSError(errno.EROFS, "Read-only file system")) is not None
    assert storage_error(OSError(errno.ENOENT, "gone")) is None
    assert storage_error(ValueError("no")) is None


def test_refusals_are_read_at_scrape_time(disk: Disk) -> None:
    metrics._registry.reset()
    try:
        counts = {CAP: 2, STORAGE: 3}
        metrics.router.bind_admission_refusals(lambda: counts)
        text = metrics.exposition().decode()
        assert "mineru_router_storage_full_refusals_total 3.0" in text
        assert "mineru_router_kept_cap_refusals_total 2.0" in text
        counts[STORAGE] = 4
        assert "mineru_router_storage_full_refusals_total 4.0" in metrics.exposition().decode()
    finally:
        metrics._registry.reset()

"""A new router resumes what the last one accepted (issue 24): MinerU 3.x's task line, its store.

MinerU's real ``RouterTaskRecord``, ``RouterTaskRegistry``, ``StagedUpload`` and
``MultipartPayload`` (from the installed, unpatched ``mineru.cli.router``); the
workers are the fake fleet of ``test_task_supervisor``. The first router keeps
tasks in its store and is dropped without a shutdown (a ``kill -9``); a
second one, on the same store, resumes them. No processes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from mineru_health.mineru3.router.endpoints import retained_payload_class
from mineru_health.mineru3.router.tasks import RETAINED_CLASS, TaskLine, move_staged, workers_tried
from mineru_health.runtime.router.store import DB_NAME, RouterStore
from mineru_health.runtime.router.supervisor import Supervisor
from mineru_health.runtime.settings import HealthSettings
from test_task_supervisor import DEAD, Fleet, P, Rejected, Unavailable, settle, until

router_mod = pytest.importorskip("mineru.cli.router", reason="mineru 3.x is not importable")


def namespace(fleet: Fleet) -> dict[str, Any]:
    return {
        "submit_payload_to_upstream": fleet.submit,
        "UpstreamSubmissionUnavailable": Unavailable,
        "UpstreamSubmissionRejected": Rejected,
        "normalize_upload_filename": lambda name: name,
        "utc_now_iso": router_mod.utc_now_iso,
        "RouterTaskRecord": router_mod.RouterTaskRecord,
        "StagedUpload": router_mod.StagedUpload,
        RETAINED_CLASS: retained_payload_class(router_mod.MultipartPayload),
    }


def router(fleet: Fleet, state: Path, **settings: Any) -> TaskLine:
    """A router's task line and supervisor on the store in ``state``, as the pool builds them."""
    base = HealthSettings.preset("fast").replace(
        interval_s=0.05, probe_timeout_s=0.02, connect_timeout_s=0.01, boot_timeout_s=1.0
    )
    from types import SimpleNamespace

    pool = SimpleNamespace(
        **{
            name: getattr(fleet, name)
            for name in (
                "fleet",
                "client",
                "get_server",
                "acquire_submission_server",
                "release_submission_server",
                "mark_submission_failure",
            )
        }
    )
    line = TaskLine(pool, namespace(fleet))
    state.mkdir(exist_ok=True)  # the router claimed it
    pool.supervisor = Supervisor(
        fleet,
        line,
        base.replace(**settings) if settings else base,  # type: ignore[arg-type]
        store=RouterStore(state / DB_NAME),
    )
    return line


def registry() -> Any:
    return router_mod.RouterTaskRegistry(task_retention_seconds=3600, cleanup_interval_seconds=3600)


async def submit(line: TaskLine, tasks: Any, tmp: Path, name: str, status: str) -> Any:
    """A task staged as MinerU stages one, moved to the kept directory, submitted to w0."""
    staged = tmp / f"mineru-router-request-{name}"
    staged.mkdir()
    (staged / f"{name}.pdf").write_bytes(b"%PDF-1.4 " + name.encode())
    payload = line._ns[RETAINED_CLASS](
        temp_dir=str(staged),
        fields=[("backend", "vlm-http-client")],
        uploads=[
            router_mod.StagedUpload(
                "files", f"{name}.pdf", "application/pdf", str(staged / f"{name}.pdf")
            )
        ],
    )
    kept_dir = line.kept_dir()
    assert kept_dir is not None
    move_staged(payload, kept_dir)
    record = await tasks.register(
        upstream_server_id="w0",
        upstream_base_url="http://w0:1",
        upstream_task_id=f"first-{name}",
        backend="vlm-http-client",
        file_names=[name],
        created_at=router_mod.utc_now_iso(),
        status=status,
        started_at=None,
        completed_at=None,
        error=None,
        queued_ahead=None,
    )
    await line.track(record, payload, None, tasks)
    payload.cleanup()  # MinerU's finally: a kept payload stays
    return record, payload


def test_a_new_router_serves_what_ended_and_sends_again_what_its_worker_lost(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"

    async def first_router() -> tuple[Any, Any, Any]:
        fleet = Fleet()
        line = router(fleet, state)
        tasks = registry()
        done, done_payload = await submit(line, tasks, tmp_path, "done", "pending")
        fleet.answers["http://w0:1/tasks/first-done"] = {"status": "completed", "error": None}
        await line.refresh(done)
        assert done.status == "completed" and not Path(done_payload.temp_dir).exists()
        running, running_payload = await submit(line, tasks, tmp_path, "running", "processing")
        held, _ = await submit(line, tasks, tmp_path, "held", "pending")
        assert Path(running_payload.temp_dir).parent == state / "kept"
        await settle(line)
        return done, running, held  # no close: the router is killed

    done, running, held = asyncio.run(first_router())
    (state / "kept" / "mineru-router-request-leftover").mkdir()  # staged when it was killed

    async def second_router() -> None:
        fleet = Fleet()
        # w0's new instance: restored "held" from its task store, never heard of "running".
        fleet.answers["http://w0:1/tasks/first-running"] = 404
        fleet.answers["http://w0:1/tasks/first-held"] = {"status": "processing", "error": None}
        line = router(fleet, state, task_retries=0)  # a router restart is not a retry
        tasks = registry()
        line.resume(tasks)
        await settle(line)
        back = await tasks.get(done.task_id)
        assert back.status == "completed" and back.upstream_task_id == "first-done"
        assert workers_tried(back) == ["w0"]
        again = await tasks.get(running.task_id)
        assert fleet.submitted == [("w0", "up-1")], fleet.submitted  # its worker may take it
        assert (again.upstream_task_id, workers_tried(again), again.status) == (
            "up-1",
            ["w0", "w0"],
            "pending",
        )
        assert (await tasks.get(held.task_id)).status == "processing"
        kept = {Path(k.item.payload.temp_dir).name for k in line.supervisor.kept()}
        assert kept == {"mineru-router-request-running", "mineru-router-request-held"}
        assert sorted(p.name for p in (state / "kept").iterdir()) == sorted(kept)
        rows = {r.key: r for r in line.supervisor.store.rows()}  # type: ignore[union-attr]
        assert rows[running.task_id].workers == ["w0", "w0"]
        assert rows[running.task_id].upstream_id == "up-1"
        assert rows[done.task_id].source == "" and rows[done.task_id].state == "completed"

        # An engine death after the resume is the worker's again: a retry (none left).
        fleet.answers["http://w0:1/tasks/up-1"] = DEAD
        await line.refresh(again)
        await settle(line)
        assert again.status == "failed" and "not resubmitted" in again.error
        # A graceful shutdown leaves what is unfinished for the next router.
        await line.supervisor.close()
        assert (state / "kept" / "mineru-router-request-held").is_dir()

    asyncio.run(second_router())


class Fleet2(Fleet):
    """The fake fleet whose ``status`` of a worker it does not have is None, as the fleet's."""

    def status(self, sid: str) -> Any:
        return super().status(sid) if sid in self.phase else None


def test_a_task_whose_worker_left_the_fleet_is_sent_to_another(tmp_path: Path) -> None:
    state = tmp_path / "state"

    async def first_router() -> Any:
        line = router(Fleet2(), state)
        record, _ = await submit(line, registry(), tmp_path, "orphan", "processing")
        record.upstream_server_id = "w9"  # the first router had a third worker
        kept = line.supervisor.kept()[0]
        kept.workers[:] = ["w9"]
        line.supervisor.save(kept)
        return record

    record = asyncio.run(first_router())

    async def second_router() -> None:
        fleet = Fleet2()  # w0 and w1 only
        line = router(fleet, state)
        tasks = registry()
        line.resume(tasks)
        await settle(line)
        assert workers_tried(await tasks.get(record.task_id)) == ["w9", "w0"]
        assert fleet.submitted == [("w0", "up-1")]
        await line.supervisor.close()

    asyncio.run(second_router())


def test_resume_returns_at_once_and_reconciles_newest_first_a_few_at_a_time(
    tmp_path: Path,
) -> None:
    """Issue 32: a big store never delays serving. ``resume`` only revives the rows; the
    checks run in the background, newest first, at most RECONCILE_LANES at once (each
    resubmission included), and one a client asks about is checked before its turn."""
    from mineru_health.runtime.router.supervisor import RECONCILE_LANES

    state = tmp_path / "state"
    count = 3 * RECONCILE_LANES

    async def first_router() -> list[Any]:
        line = router(Fleet(), state)
        tasks = registry()
        records = [
            (await submit(line, tasks, tmp_path, f"t{n:02d}", "pending"))[0] for n in range(count)
        ]
        await settle(line)
        return records

    records = asyncio.run(first_router())
    for n, record in enumerate(records):  # accepted one second apart, t00 first
        row = next(r for r in RouterStore(state / DB_NAME).rows() if r.key == record.task_id)
        row.accepted_at = 1_000_000.0 + n
        RouterStore(state / DB_NAME).save(row)

    async def second_router() -> None:
        fleet = Fleet()
        asked: list[str] = []
        running, most = 0, 0
        gate = asyncio.Event()

        async def get(url: str, timeout: float) -> Any:
            nonlocal running, most
            asked.append(url.rsplit("-", 1)[-1])
            running += 1
            most = max(most, running)
            if "t00" not in url:
                await gate.wait()
            running -= 1
            return await fleet._get(url, timeout)

        fleet.client = SimpleNamespace(get=get)
        fleet.answers.update({f"http://w0:1/tasks/first-{r.file_names[0]}": 404 for r in records})
        line = router(fleet, state)
        tasks = registry()
        line.resume(tasks)  # every answer is 404: each one is sent again
        supervisor = line.supervisor
        assert asked == [] and supervisor.reconciling == count  # nothing awaited in resume
        back = [await tasks.get(r.task_id) for r in records]
        assert all(b is not None and b.status == "pending" for b in back)  # all answered now
        await until(lambda: len(asked) == RECONCILE_LANES)
        newest = [f"t{n:02d}" for n in range(count - 1, count - 1 - RECONCILE_LANES, -1)]
        assert asked == newest, asked
        await line.refresh(back[0])  # the oldest, asked about by its client: checked now
        assert asked[-1] == "t00", asked
        await until(lambda: ("w0", "up-1") in fleet.submitted or ("w1", "up-1") in fleet.submitted)
        gate.set()
        await settle(line)
        assert supervisor.reconciling == 0 and most <= RECONCILE_LANES + 1, most
        assert len(fleet.submitted) == count
        assert {workers_tried(await tasks.get(r.task_id))[-1] for r in records} <= {"w0", "w1"}

    asyncio.run(second_router())


def test_a_task_whose_worker_boots_with_the_router_is_asked_there_once_it_is_up(
    tmp_path: Path,
) -> None:
    """Issue 32: the router serves before its local workers are up. A resumed task whose
    worker is still booting is asked once that worker is in rotation (asked before, it
    could not answer and would wait for a sweep), found there and not sent again;
    meanwhile the fleet counts as healing, so new submissions are held, not refused."""
    state = tmp_path / "state"

    async def first_router() -> Any:
        line = router(Fleet(), state)
        record, _ = await submit(line, registry(), tmp_path, "boot", "processing")
        await settle(line)
        return record

    record = asyncio.run(first_router())

    async def second_router() -> None:
        fleet = Fleet()
        fleet.phase["w0"] = P.STARTING
        asked: list[str] = []

        async def get(url: str, timeout: float) -> Any:
            asked.append(url)
            return await fleet._get(url, timeout)

        fleet.client = SimpleNamespace(get=get)
        url = "http://w0:1/tasks/first-boot"  # its new instance restored it
        fleet.answers[url] = {"status": "processing", "error": None}
        line = router(fleet, state, boot_timeout_s=30.0)
        tasks = registry()
        line.resume(tasks)
        supervisor = line.supervisor
        assert supervisor.healing()
        for _ in range(20):  # the lanes run up to their wait for the worker
            await asyncio.sleep(0)
        assert asked == [] and supervisor.reconciling == 1
        fleet.phase["w0"] = P.HEALTHY
        await settle(line)
        assert asked == [url] and fleet.submitted == [] and not supervisor.healing()
        back = await tasks.get(record.task_id)
        assert back.status == "processing" and workers_tried(back) == ["w0"]
        await supervisor.close()

    asyncio.run(second_router())

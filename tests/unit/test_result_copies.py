"""A drained worker's finished results copied to the router before it is forgotten
(runtime/router/result_copies.py), on both lines' retired outputs: what is copied, what is
not (the worker's error, no room, a wrong digest), and that the router's client answers
from the copy once the worker is gone. The worker is an httpx.MockTransport.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from mineru_health.mineru3.router.pool import RetiredOutputs as Retired3
from mineru_health.mineru4.router.retired import RetiredOutputs as Retired4
from mineru_health.runtime.router.result_copies import CopyFailed, copy_result

WORKER = "http://127.0.0.2:8000"


class Worker:
    """What a worker serves, by path; gone once ``gone`` is set (every request refused)."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.gone = False
        self.asked: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.asked.append(request.url.path)
        if self.gone:
            raise httpx.ConnectError("connection refused", request=request)
        body = self.files.get(request.url.path)
        if body is None:
            return httpx.Response(404, json={"detail": "not found"})
        return httpx.Response(
            200,
            content=body,
            headers={
                "content-type": "application/zip",
                "content-disposition": 'attachment; filename="doc.zip"',
            },
        )


def test_copy_result_stops_at_the_room_it_is_given(tmp_path: Path) -> None:
    worker = Worker({"/r": b"x" * 1000})

    async def run() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(worker)) as client:
            copied = await copy_result(client, f"{WORKER}/r", tmp_path / "a", 1000)
            assert copied.size == 1000 and copied.sha256 == hashlib.sha256(b"x" * 1000).hexdigest()
            with pytest.raises(CopyFailed, match="MAX_KEPT_MB"):
                await copy_result(client, f"{WORKER}/r", tmp_path / "b", 999)
            with pytest.raises(CopyFailed, match="answered 404"):
                await copy_result(client, f"{WORKER}/missing", tmp_path / "c", 1000)

    asyncio.run(run())
    assert (tmp_path / "a").read_bytes() == b"x" * 1000
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


def test_a_drained_3x_workers_results_are_answered_from_the_copy(tmp_path: Path) -> None:
    worker = Worker({"/tasks/t1/result": b"zip one", "/tasks/t2/result": b"zip two"})
    retired = Retired3(retention_s=0)
    urls = [f"{WORKER}/tasks/{t}/result" for t in ("t1", "t2", "t3")]  # t3: the worker lost it

    async def run() -> list[httpx.Response]:
        client = httpx.AsyncClient(transport=httpx.MockTransport(worker))
        retired.answer_under(client)
        async with client:
            report = await retired.copy_results(client, urls, max_bytes=1 << 20)
            assert (report.copied, report.size, len(report.failed)) == (2, 14, 1)
            assert "2 finished result(s) copied" in str(report) and "answered 404" in str(report)
            worker.gone = True  # the pod is gone
            answers = [await client.get(url) for url in urls[:2]]
            with pytest.raises(httpx.ConnectError):
                await client.get(urls[2])
            # Copied once: a second drain of the same results copies nothing again.
            again = await retired.copy_results(client, urls[:2], max_bytes=1 << 20)
            assert again.copied == 0
            return answers

    one, two = asyncio.run(run())
    assert (one.status_code, one.content, two.content) == (200, b"zip one", b"zip two")
    assert one.headers["content-type"] == "application/zip"
    assert one.headers["content-disposition"] == 'attachment; filename="doc.zip"'
    assert worker.asked.count("/tasks/t1/result") == 1  # the answers came from the copy
    retired.close()
    assert retired.answer("GET", httpx.URL(urls[0])) is None


def test_3x_copies_go_after_minerus_retention(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mineru_health.mineru3.router import pool

    now = [100.0]
    monkeypatch.setattr(pool.time, "monotonic", lambda: now[0])
    worker = Worker({"/tasks/t1/result": b"one", "/tasks/t2/result": b"two"})
    retired = Retired3(retention_s=60)

    async def copy(task: str) -> Any:
        async with httpx.AsyncClient(transport=httpx.MockTransport(worker)) as client:
            return await retired.copy_results(
                client, [f"{WORKER}/tasks/{task}/result"], max_bytes=4
            )

    assert asyncio.run(copy("t1")).copied == 1
    assert asyncio.run(copy("t2")).failed  # 3 + 3 bytes: over the room of 4
    now[0] += 61  # past the retention: the first copy goes, its room with it
    assert asyncio.run(copy("t2")).copied == 1
    assert retired.answer("GET", httpx.URL(f"{WORKER}/tasks/t1/result")) is None
    retired.close()


def test_a_drained_40_workers_files_are_answered_from_the_copy(tmp_path: Path) -> None:
    good, bad = b"# Document 3\n", b"# Document 4\n"
    worker = Worker({"/v1/files/file-aa01/content": good, "/v1/files/file-bb02/content": b"not it"})
    out = "parse_output"
    meta = {
        "file-aa01": {"sha256sum": hashlib.sha256(good).hexdigest(), "purpose": out},
        "file-bb02": {"sha256sum": hashlib.sha256(bad).hexdigest(), "purpose": out},
        "file-cc03": {"purpose": out},  # no digest: nothing to check a copy against
        # A source file: the worker never serves its content (403), not asked for.
        "file-dd04": {"sha256sum": hashlib.sha256(good).hexdigest(), "purpose": "user_data"},
    }
    retired = Retired4()

    async def run() -> tuple[httpx.Response, httpx.Response]:
        transport = retired.transport(httpx.MockTransport(worker))
        async with httpx.AsyncClient(transport=transport) as client:
            report = await retired.copy_results(client, WORKER, meta.items(), max_bytes=1 << 20)
            assert (report.copied, len(report.failed)) == (1, 1), report
            assert "does not match its sha256sum" in report.failed[0]
            worker.gone = True
            content = await client.get(f"{WORKER}/v1/files/file-aa01/content")
            metadata = await client.get(f"{WORKER}/v1/files/file-aa01")
            return content, metadata

    content, metadata = asyncio.run(run())
    assert content.status_code == 200 and content.content == good
    assert metadata.json()["id"] == "file-aa01"
    assert all(f not in retired for f in ("file-bb02", "file-cc03", "file-dd04"))
    assert "/v1/files/file-dd04/content" not in worker.asked
    retired.close()


def test_3x_copies_the_completed_tasks_minerus_registry_lists_on_the_worker() -> None:
    from types import SimpleNamespace

    from mineru_health.mineru3.router.tasks import TaskLine

    def record(task: str, worker: str, status: str) -> Any:
        return SimpleNamespace(
            upstream_server_id=worker,
            upstream_base_url=f"http://{worker}:8000",
            upstream_task_id=f"up-{task}",
            status=status,
        )

    namespace = {"TASKS_ENDPOINT": "/tasks", "TASK_COMPLETED": "completed"}
    line = TaskLine(pool=None, namespace=namespace)
    assert line.result_urls("w1") == []  # MinerU's registry not there yet
    line._registry = SimpleNamespace(
        _tasks={
            "a": record("a", "w1", "completed"),
            "b": record("b", "w1", "failed"),  # no result to keep
            "c": record("c", "w2", "completed"),  # another worker's
        }
    )
    assert line.result_urls("w1") == ["http://w1:8000/tasks/up-a/result"]


def test_a_40_output_whose_metadata_4_0_has_not_read_yet_is_read_then_copied() -> None:
    """4.0 reads an output file's metadata after the job ended: a worker drained and
    forgotten in between still has that file copied (its metadata asked of it first)."""
    body = b"# Document 17\n"
    metadata = {"id": "file-ee05", "sha256sum": hashlib.sha256(body).hexdigest()}
    worker = Worker(
        {
            "/v1/files/file-ee05/content": body,
            "/v1/files/file-ee05": json.dumps({**metadata, "purpose": "parse_output"}).encode(),
        }
    )
    retired = Retired4()

    async def run() -> httpx.Response:
        transport = retired.transport(httpx.MockTransport(worker))
        async with httpx.AsyncClient(transport=transport) as client:
            files = [("file-ee05", None), ("file-ff06", None)]  # the second: no answer
            report = await retired.copy_results(client, WORKER, files, max_bytes=1 << 20)
            assert (report.copied, len(report.failed)) == (1, 1), report
            worker.gone = True
            return await client.get(f"{WORKER}/v1/files/file-ee05/content")

    content = asyncio.run(run())
    assert content.status_code == 200 and content.content == body
    retired.close()

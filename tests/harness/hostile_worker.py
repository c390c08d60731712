"""A fake ``mineru-api`` (3.x or 4.0) on loopback whose answers can break every bound.

``HostileWorkers(hostile=1, honest=1, line="3")`` listens on one port per
worker, in a thread with its own event loop. Every worker answers its
health healthy and takes submissions (3.x: ``POST /tasks``; 4.0: ``POST
/v1/parse/jobs`` with a ``url`` source, after ``/v1/health``, ``/v1/tiers``
and ``/v1/models`` say it parses the flash tier); an honest worker's tasks
stay running (each status read reaches it) and its results are small. On a
hostile worker a task behaves as the stem of its document's name says (3.x:
the uploaded file's; 4.0: the last segment of its source URL):

- ``huge-status``: its status declares 300 MB and sends them;
- ``endless-status`` / ``trickle-status``: chunked, without end (1 MiB
  chunks / one byte every 0.2 s);
- ``endless-result`` / ``trickle-result``: completed; its result (a zip) comes
  without end / 1 KiB every 0.2 s;
- ``endless-error-result``: completed; its result request is answered 500 with
  a body without end;
- ``endless-submit`` (3.x): its submission is answered 202 with a body without end.

(4.0: a result is the content of the job's markdown output file.)

Every answer without end stops once its reader is gone, and at the latest
after ``MAX_BYTES`` or ``MAX_S`` (bounded, whatever the router does).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

__all__ = ["HostileWorkers", "hostile_workers"]

MIB = 1024 * 1024
MAX_BYTES = 512 * MIB  # what one answer sends at most
MAX_S = 120.0  # how long one answer lasts at most
_FILENAME = re.compile(rb'filename="([^"]+)"')


class HostileWorkers:
    """Fake workers on loopback ports (``urls``: hostile first); see the module's doc."""

    def __init__(self, *, hostile: int = 1, honest: int = 1, line: str = "3") -> None:
        self._kinds = ["hostile"] * hostile + ["honest"] * honest
        self._line = line
        self.urls: list[str] = []
        self.modes: dict[str, str] = {}  # task id -> how it behaves
        self.received: list[tuple[str, str]] = []  # (hostile or honest, name) per submission
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._servers: list[asyncio.Server] = []

    def start(self) -> None:
        self._thread.start()
        for kind in self._kinds:
            server = asyncio.run_coroutine_threadsafe(self._serve(kind), self._loop).result(10)
            self._servers.append(server)
            port = server.sockets[0].getsockname()[1]
            self.urls.append(f"http://127.0.0.1:{port}")

    def stop(self) -> None:
        async def close() -> None:
            for server in self._servers:
                server.close()
            handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in handlers:
                task.cancel()
            # Each handler closes its connection as it ends; the transports finish closing
            # on the loop's next turns. A transport left half-closed when the loop stops is
            # reported (ResourceWarning) in whichever later test collects it.
            await asyncio.gather(*handlers, return_exceptions=True)
            for server in self._servers:
                await server.wait_closed()
            for _ in range(3):
                await asyncio.sleep(0)

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()

    async def _serve(self, kind: str) -> asyncio.Server:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while await self._one(kind, reader, writer):
                    pass
            except (
                ConnectionError,
                asyncio.IncompleteReadError,
                asyncio.TimeoutError,
                asyncio.CancelledError,
            ):
                pass  # the reader is gone, or the fake stops
            finally:
                writer.close()

        return await asyncio.start_server(handle, "127.0.0.1", 0)

    async def _one(
        self, kind: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), MAX_S)
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {
            k.strip().lower(): v.strip()
            for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)
        }
        body = await reader.readexactly(int(headers.get("content-length") or 0))
        if self._line == "4":
            return await self._one4(kind, method, path, body, writer)
        if method == "GET" and path == "/health":
            await _json(
                writer,
                200,
                {
                    "status": "healthy",
                    "protocol_version": 2,
                    "queued_tasks": 0,
                    "processing_tasks": 0,
                    "completed_tasks": 0,
                    "failed_tasks": 0,
                    "max_concurrent_requests": 100,
                    "processing_window_size": 64,
                },
            )
            return True
        if method == "POST" and path == "/tasks":
            found = _FILENAME.search(body)
            name = found.group(1).decode() if found else "doc.pdf"
            task_id = str(uuid.uuid4())
            self.modes[task_id] = name.rsplit(".", 1)[0] if kind == "hostile" else "honest"
            self.received.append((kind, name))
            if self.modes[task_id] == "endless-submit":
                await _endless(writer, 202, {"Transfer-Encoding": "chunked"}, MIB, 0.0)
                return False
            await _json(writer, 202, _status(task_id, name, "pending"))
            return True
        match = re.fullmatch(r"/tasks/([^/]+)(/result)?", path)
        mode = self.modes.get(match.group(1), "") if match else ""
        if not mode:
            await _json(writer, 404, {"detail": "Task not found"})
            return True
        task_id = match.group(1) if match else ""
        if match and match.group(2):
            return await self._result(mode, writer)
        if mode in ("huge-status", "endless-status", "trickle-status"):
            return await self._hostile_status(mode, writer)
        state = "processing" if mode == "honest" else "completed"
        await _json(writer, 200, _status(task_id, "doc.pdf", state))
        return True

    async def _one4(
        self, kind: str, method: str, path: str, body: bytes, writer: asyncio.StreamWriter
    ) -> bool:
        if method == "GET" and path in ("/v1/health", "/v1/tiers", "/v1/models"):
            await _json(
                writer,
                200,
                {
                    "/v1/health": {
                        "status": "ok",
                        "features": {
                            "sources": ["url", "file_id", "inline", "local"],
                            "output_formats": ["markdown", "json"],
                        },
                    },
                    "/v1/tiers": {"data": [{"id": "flash"}]},
                    "/v1/models": {"data": []},
                }[path],
            )
            return True
        if method == "POST" and path == "/v1/parse/jobs":
            url = json.loads(body)["files"][0]["source"]["url"]
            job_id = str(uuid.uuid4())
            self.modes[job_id] = url.rsplit("/", 1)[-1] if kind == "hostile" else "honest"
            self.received.append((kind, url.rsplit("/", 1)[-1]))
            await _json(writer, 202, _job(job_id, "queued"))
            return True
        match = re.fullmatch(r"/v1/(parse/jobs|files)/([^/]+?)(/content)?", path)
        upstream_id = match.group(2).removeprefix("out-") if match else ""
        mode = self.modes.get(upstream_id, "")
        if not match or not mode:
            await _json(writer, 404, {"error": {"code": "not_found", "message": "not found"}})
            return True
        if match.group(1) == "files":
            if match.group(3):
                return await self._result(mode, writer)
            await _json(
                writer,
                200,
                {
                    "id": match.group(2),
                    "object": "file",
                    "filename": "doc.md",
                    "purpose": "parse_output",
                    "bytes": 10,
                },
            )
            return True
        if mode in ("huge-status", "endless-status", "trickle-status"):
            return await self._hostile_status(mode, writer)
        await _json(writer, 200, _job(upstream_id, "running" if mode == "honest" else "completed"))
        return True

    async def _hostile_status(self, mode: str, writer: asyncio.StreamWriter) -> bool:
        if mode == "huge-status":
            await _endless(
                writer,
                200,
                {"Content-Length": str(300 * 1000 * 1000)},
                MIB,
                0.0,
                limit=300 * 1000 * 1000,
            )
        else:
            endless = mode == "endless-status"
            await _endless(
                writer,
                200,
                {"Transfer-Encoding": "chunked"},
                MIB if endless else 1,
                0.0 if endless else 0.2,
            )
        return False

    async def _result(self, mode: str, writer: asyncio.StreamWriter) -> bool:
        if mode == "endless-result":
            await _endless(
                writer,
                200,
                {"Transfer-Encoding": "chunked", "Content-Type": "application/zip"},
                MIB,
                0.0,
            )
        elif mode == "trickle-result":
            await _endless(
                writer,
                200,
                {"Transfer-Encoding": "chunked", "Content-Type": "application/zip"},
                1024,
                0.2,
            )
        elif mode == "endless-error-result":
            await _endless(writer, 500, {"Transfer-Encoding": "chunked"}, MIB, 0.0)
        else:
            await _json(writer, 200, {"results": {"doc": {"md_content": "# honest"}}})
            return True
        return False


def _status(task_id: str, name: str, state: str) -> dict[str, Any]:
    now = datetime.now(timezone.utc).isoformat()
    return {
        "task_id": task_id,
        "status": state,
        "backend": "pipeline",
        "file_names": [name],
        "created_at": now,
        "started_at": now,
        "completed_at": now if state == "completed" else None,
        "error": None,
        "queued_ahead": 0,
    }


def _job(job_id: str, state: str) -> dict[str, Any]:
    done = state == "completed"
    outputs = {"markdown": {"file_id": f"out-{job_id}"}} if done else {}
    return {
        "job_id": job_id,
        "object": "parse.job",
        "status": state,
        "tier": "flash",
        "files": [{"status": state, "output_files": outputs}],
        "links": {"self": f"/v1/parse/jobs/{job_id}"},
    }


async def _json(writer: asyncio.StreamWriter, status: int, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode()
    writer.write(
        f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()


async def _endless(
    writer: asyncio.StreamWriter,
    status: int,
    headers: dict[str, str],
    chunk: int,
    pause_s: float,
    limit: int = MAX_BYTES,
) -> None:
    """Sends ``chunk`` bytes every ``pause_s`` until the reader is gone, ``limit`` or MAX_S."""
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    writer.write(f"HTTP/1.1 {status} X\r\n{head}\r\n".encode())
    chunked = headers.get("Transfer-Encoding") == "chunked"
    piece = b'{"status": "processing", "pad": "' + b"x" * chunk
    sent, loop = 0, asyncio.get_running_loop()
    until = loop.time() + MAX_S
    while sent < limit and loop.time() < until:
        data = piece[:chunk] if sent else piece
        data = data[: limit - sent] if not chunked else data
        writer.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
        sent += len(data)
        await writer.drain()
        if pause_s:
            await asyncio.sleep(pause_s)


@contextmanager
def hostile_workers(
    *, hostile: int = 1, honest: int = 1, line: str = "3"
) -> Iterator[HostileWorkers]:
    workers = HostileWorkers(hostile=hostile, honest=honest, line=line)
    workers.start()
    try:
        yield workers
    finally:
        workers.stop()

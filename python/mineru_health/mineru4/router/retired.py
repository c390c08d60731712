"""Finished outputs of a replaced local worker, still served after its restart.

MinerU 4.0's worker keeps file metadata in memory and its blobs in an upload
directory that the router deletes when it stops the worker: a restart made
every earlier result answer 404. The pool keeps that directory instead
(``retire``) and the router's HTTP client answers, for the output files the
router already knew (their metadata carries ``sha256sum``), from the blob
the worker wrote (``blobs/<sha[:2]>/<sha[2:]>``, content-addressed):

    retired = RetiredOutputs()
    client = httpx.AsyncClient(transport=retired.transport())
    retired.retire(temp_dir, [(upstream_file_id, metadata), ...])   # before the stop
    # GET <any worker>/v1/files/<that id>[/content] is answered from disk
    retired.close()                                                 # router shutdown

Every route of 4.0's router that reads a file (metadata, content, the task
result, a copy to another worker) goes through that client, so none needs
changing. File ids are random per worker (``file-`` + 24 hex digits), so an
id names one file. Runs on the router's event loop; not thread-safe.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["RetiredOutputs"]

_FILE_PATH = re.compile(r"/v1/files/([A-Za-z0-9_-]+)(/content)?")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class RetiredOutputs:
    """Upload directories of replaced instances, and the files the router knew in them."""

    def __init__(self) -> None:
        self._dirs: list[Any] = []  # TemporaryDirectory objects, cleaned up by close()
        self._files: dict[str, tuple[Path, dict[str, Any]]] = {}

    def retire(self, temp_dir: Any, files: Iterable[tuple[str, Mapping[str, Any]]], *,
               uploads: Path | None = None) -> int:
        """Keeps ``temp_dir`` (4.0's per-instance directory); returns the files now served.

        ``uploads``: the instance's upload directory when it is not the one in
        ``temp_dir`` (a durable one, shared by the worker's instances).
        """
        if temp_dir is None:
            return 0
        self._dirs.append(temp_dir)
        blobs = (uploads if uploads is not None else Path(temp_dir.name) / "uploads") / "blobs"
        served = 0
        for upstream_id, payload in files:
            if upstream_id in self._files:
                # An earlier instance's file, retired with its own directory: the
                # router still lists it on this worker, but its blob is not here.
                continue
            sha = payload.get("sha256sum")
            if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
                continue
            metadata = dict(payload)
            metadata["id"] = upstream_id  # as the worker said it; the router rewrites it
            self._files[upstream_id] = (blobs / sha[:2] / sha[2:], metadata)
            served += 1
        return served

    def __contains__(self, upstream_id: object) -> bool:
        return upstream_id in self._files

    def answer(self, method: str, path: str) -> tuple[int, dict[str, str], bytes] | None:
        """The answer for a request about a retired file, or None (not one: ask the worker)."""
        match = _FILE_PATH.fullmatch(path)
        if match is None or match.group(1) not in self._files:
            return None
        import json

        file_id, content = match.group(1), bool(match.group(2))
        blob, metadata = self._files[file_id]
        as_json = {"content-type": "application/json"}
        if method == "DELETE" and not content:
            del self._files[file_id]
            body = {"id": file_id, "object": "file", "deleted": True}
            return 200, as_json, json.dumps(body).encode()
        if method != "GET":
            return None
        if not content:
            return 200, as_json, json.dumps(metadata).encode()
        try:
            data = blob.read_bytes()
        except OSError:
            error = {"error": {"type": "invalid_request_error", "code": "file_not_found",
                               "message": f"File {file_id} not found"}}
            return 404, as_json, json.dumps(error).encode()
        # As the worker itself answers a file's content, whatever its name.
        return 200, {"content-type": "application/octet-stream"}, data

    def transport(self, inner: Any = None) -> Any:
        """An httpx transport that answers for retired files and hands the rest to ``inner``."""
        import httpx

        retired = self
        wrapped = inner if inner is not None else httpx.AsyncHTTPTransport()

        class _Transport(httpx.AsyncBaseTransport):
            async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
                answer = retired.answer(request.method, request.url.path)
                if answer is None:
                    return await wrapped.handle_async_request(request)
                status, headers, body = answer
                return httpx.Response(status, headers=headers, content=body, request=request)

            async def aclose(self) -> None:
                await wrapped.aclose()

        return _Transport()

    def close(self) -> None:
        self._files.clear()
        for temp_dir in self._dirs:
            shutil.rmtree(temp_dir.name, ignore_errors=True)
            temp_dir.cleanup()
        self._dirs.clear()

"""Finished outputs of a replaced local worker (or a drained remote one), served after it.

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
id names one file.

A remote worker found by DNS and drained leaves with its files: before the
router forgets it, ``copy_results`` fetches the content of every file the
router still lists on it into a directory of the router's, laid out as a
worker's (``result_copies.py``: result bounds, MAX_KEPT_MB in all, each
checked against its ``sha256sum``), and retires that directory; the copies
go after the router's retention. Runs on the router's event loop; not
thread-safe.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # result_copies imports httpx: only a running router loads it
    from mineru_health.runtime.router.result_copies import CopyReport

__all__ = ["RetiredOutputs"]

_FILE_PATH = re.compile(r"/v1/files/([A-Za-z0-9_-]+)(/content)?")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_FILE_ID = re.compile(r"[A-Za-z0-9_-]+")
_OUTPUT = "parse_output"  # 4.0's purpose of a job's output file


class RetiredOutputs:
    """Upload directories of replaced instances, and the files the router knew in them."""

    def __init__(self, retention_s: float = 0.0) -> None:
        self._retention_s = retention_s  # for copies of drained workers' files (0: kept)
        self._dirs: list[Any] = []  # TemporaryDirectory objects, cleaned up by close()
        self._files: dict[str, tuple[Path, dict[str, Any]]] = {}
        self._copy_dirs: list[tuple[float, Any, list[str], int]] = []  # (time, dir, ids, size)
        self._copied_bytes = 0

    def retire(
        self,
        temp_dir: Any,
        files: Iterable[tuple[str, Mapping[str, Any]]],
        *,
        uploads: Path | None = None,
    ) -> int:
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

    async def copy_results(
        self,
        client: Any,
        base_url: str,
        files: Iterable[tuple[str, Mapping[str, Any] | None]],
        *,
        max_bytes: int,
    ) -> CopyReport:
        """Copies the content of the output ``files`` (upstream id, metadata) from the worker at
        ``base_url`` (a drained one, about to be forgotten) through ``client``, at most
        ``max_bytes`` of copies in all, each checked against its ``sha256sum``; they are
        served as a retired instance's are from then on. Metadata given as None is read
        from the worker first."""
        from mineru_health.runtime.router.result_copies import CopyFailed, CopyReport, copy_result

        self._expire()
        report, copied = CopyReport(), []
        temp_dir = tempfile.TemporaryDirectory(prefix="mineru-health-drained-")
        blobs = Path(temp_dir.name) / "uploads" / "blobs"
        for upstream_id, known in files:
            if upstream_id in self._files or not _FILE_ID.fullmatch(upstream_id):
                continue
            payload = known if known is not None else await _metadata(client, base_url, upstream_id)
            if payload is None:
                report.failed.append(f"{base_url}/v1/files/{upstream_id}: no metadata")
                continue
            sha = payload.get("sha256sum")
            # A worker serves only its outputs' content (a source file answers 403).
            if payload.get("purpose") != _OUTPUT or upstream_id in self._files:
                continue
            if not isinstance(sha, str):
                continue
            if not _SHA256.fullmatch(sha) or not _FILE_ID.fullmatch(upstream_id):
                continue
            url = f"{base_url}/v1/files/{upstream_id}/content"
            room = max_bytes - self._copied_bytes
            try:
                got = await copy_result(client, url, blobs / sha[:2] / sha[2:], room)
            except CopyFailed as exc:
                report.failed.append(str(exc))
                continue
            if got.sha256 != sha:
                got.path.unlink(missing_ok=True)
                report.failed.append(f"{url}: its content does not match its sha256sum")
                continue
            copied.append((upstream_id, payload))
            self._copied_bytes += got.size
            report.copied += 1
            report.size += got.size
        if not copied:
            shutil.rmtree(temp_dir.name, ignore_errors=True)
            temp_dir.cleanup()
            return report
        self.retire(temp_dir, copied)
        self._copy_dirs.append((time.monotonic(), temp_dir, [i for i, _ in copied], report.size))
        return report

    def _expire(self) -> None:
        # The router's registry expires those files after its retention; the copies go then.
        now = time.monotonic()
        while self._copy_dirs and 0 < self._retention_s < now - self._copy_dirs[0][0]:
            _, temp_dir, ids, size = self._copy_dirs.pop(0)
            for upstream_id in ids:
                self._files.pop(upstream_id, None)
            self._copied_bytes -= size
            if temp_dir in self._dirs:
                self._dirs.remove(temp_dir)
            shutil.rmtree(temp_dir.name, ignore_errors=True)
            temp_dir.cleanup()

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
            error = {
                "error": {
                    "type": "invalid_request_error",
                    "code": "file_not_found",
                    "message": f"File {file_id} not found",
                }
            }
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
        self._copy_dirs.clear()
        self._files.clear()
        for temp_dir in self._dirs:
            shutil.rmtree(temp_dir.name, ignore_errors=True)
            temp_dir.cleanup()
        self._dirs.clear()


async def _metadata(client: Any, base_url: str, upstream_id: str) -> Mapping[str, Any] | None:
    """A file's metadata as its worker answers it, or None (no answer, not an object)."""
    try:
        response = await client.get(f"{base_url}/v1/files/{upstream_id}")
        found = response.json() if response.status_code == 200 else None
    except Exception:  # noqa: BLE001 -- any failure is "no metadata": the copy is skipped
        return None
    return found if isinstance(found, dict) else None

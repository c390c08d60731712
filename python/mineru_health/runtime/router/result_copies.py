"""Copies of a drained worker's finished results, made before the router forgets it.

A worker found by DNS that left the answer is drained, then forgotten
(``discovery.py``). Its pod goes with it, and with the pod every result it
finished that a client has not fetched yet: the router fetches them through
its worker's URL. So before forgetting it, the line's pool copies those
results into the router's retired outputs (3.x's and 4.0's ``RetiredOutputs``,
which already serve what a restarted local worker finished) and their
transport answers the requests for them from the copy from then on; MinerU's
routes read results through that client and need no change.

    copied = await copy_result(client, url, path, room_bytes)   # CopyFailed says why not
    client = httpx.AsyncClient(transport=answering_transport(retired.answer, inner))

Each copy is read within the result bounds (``upstream_reads.results``:
MAX_RESULT_MB, MAX_RESULT_S) and the room the caller gives (what is left of
MAX_KEPT_MB for copies, in all); the retired outputs let copies go after
MinerU's task retention. Imports httpx: only a running router imports it.
Not thread-safe: on the router's event loop.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from .upstream_reads import MIB, results

__all__ = [
    "Copied",
    "CopyFailed",
    "CopyReport",
    "FileStream",
    "Served",
    "answering_transport",
    "copy_result",
    "room_for_copies",
    "url_key",
]

_CHUNK = 64 * 1024

#: What a retired-outputs ``answer`` gives for a request it answers itself:
#: (status, headers, body as bytes or a stream of a copied file).
Served = tuple[int, dict[str, str], "bytes | FileStream"]


class CopyFailed(Exception):
    """A result could not be copied (the worker's answer, a bound, no room): says why."""


@dataclass(frozen=True, slots=True)
class Copied:
    """One result copied to ``path``: its size, digest and the headers to answer it with."""

    path: Path
    size: int
    sha256: str
    content_type: str
    content_disposition: str | None


@dataclass
class CopyReport:
    """What copying a drained worker's results did, as its ``worker_forgotten`` record says."""

    copied: int = 0
    size: int = 0
    failed: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        text = f"{self.copied} finished result(s) copied to the router ({self.size / MIB:.1f} MiB)"
        if self.failed:
            text += f"; {len(self.failed)} not copied (first: {self.failed[0]})"
        return text


def room_for_copies(settings: Any) -> int:
    """Bytes of copies the router keeps at most, in all: MAX_KEPT_MB (an account apart from
    the kept uploads')."""
    return int(settings.max_kept_mb) * MIB


async def copy_result(client: Any, url: str, path: Path, room: int) -> Copied:
    """GETs ``url`` through ``client`` into ``path``, within the result bounds and ``room``
    bytes; raises ``CopyFailed`` (nothing left at ``path``) when it cannot."""
    digest, size = hashlib.sha256(), 0
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with results():
            async with client.stream("GET", url) as response:
                if response.status_code != 200:
                    raise CopyFailed(f"{url} answered {response.status_code}")
                with path.open("wb") as out:
                    async for chunk in response.aiter_bytes():
                        size += len(chunk)
                        if size > room:
                            raise CopyFailed(
                                f"{url}: no room left for copies of drained workers' "
                                f"results (MINERU_ROUTER_HEALTH_MAX_KEPT_MB)"
                            )
                        digest.update(chunk)
                        out.write(chunk)
                headers = response.headers
    except (httpx.HTTPError, OSError, CopyFailed) as exc:
        path.unlink(missing_ok=True)
        if isinstance(exc, CopyFailed):
            raise
        raise CopyFailed(f"{url}: {type(exc).__name__}: {exc}") from exc
    return Copied(
        path,
        size,
        digest.hexdigest(),
        headers.get("content-type", "application/octet-stream"),
        headers.get("content-disposition"),
    )


class FileStream(httpx.AsyncByteStream):
    """A copied file as a response body, read a chunk at a time."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("rb")  # opened now: a missing copy is the caller's 404

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while chunk := self._file.read(_CHUNK):
            yield chunk

    async def aclose(self) -> None:
        self._file.close()


def answering_transport(
    answer: Callable[[str, httpx.URL], Served | None], inner: Any = None
) -> httpx.AsyncBaseTransport:
    """An httpx transport that answers what ``answer(method, url)`` answers and hands the
    rest to ``inner`` (httpx's own transport when None)."""
    wrapped = inner if inner is not None else httpx.AsyncHTTPTransport()

    class _Answering(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            found = answer(request.method, request.url)
            if found is None:
                return await wrapped.handle_async_request(request)
            status, headers, body = found
            if isinstance(body, bytes):
                return httpx.Response(status, headers=headers, content=body, request=request)
            return httpx.Response(status, headers=headers, stream=body, request=request)

        async def aclose(self) -> None:
            await wrapped.aclose()

    return _Answering()


def url_key(url: httpx.URL | str) -> str:
    """``scheme://host:port/path`` of a URL (no query), as copies are looked up."""
    url = httpx.URL(url)
    return f"{url.scheme}://{url.netloc.decode('ascii')}{url.path}"

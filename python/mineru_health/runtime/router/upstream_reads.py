"""Bounded reads of what workers answer the router, for either MinerU line.

MinerU's routers read every worker answer through one ``httpx.AsyncClient``
with a per-read timeout only: a worker (or anything at an ``--upstream-url``)
that answers a status with 300 MB takes the router's memory, one that
streams without end takes all of it, and one that trickles holds its
connections until the client's pool is spent and every other task's status
waits behind it. :func:`install` puts a :class:`BoundedTransport` under that
client, so every read has bounds, whoever makes it:

- an *answer* (a status, a listing, an error, anything read whole): at most
  ``MAX_STATUS_MB``, in all at most the request's own read timeout (MinerU's
  60 s, the supervisor's status checks a few seconds), counted from the end
  of the request's body when it has one (an upload takes what its size takes);
- a *result* (``results()`` around the code that fetches one): its body at
  most ``MAX_RESULT_MB`` and ``MAX_RESULT_S`` in all; an error answer to it is
  an answer. Results the router streams to its client are never held whole;
  the few MinerU code paths that read a result whole are held to the cap;
- requests in flight to one worker at most a quarter of the client's
  connections for each kind (waiting for a turn counts against the time
  bound), so one worker never takes the connections another one's tasks
  need;
- every request asks for ``Accept-Encoding: identity`` and a compressed
  answer breaks a bound: a small compressed body could expand past any cap
  once decoded.

A bound broken raises :class:`BoundBroken` (an ``httpx.TransportError``, so
MinerU's own handlers take it as the worker failing) naming the worker's
address and the bound, and counts it (``broken()``, read by
``mineru_router_upstream_bounds_broken_total`` at scrape time). A body over
its cap is cut where it passes it: never more than the cap plus one chunk is
held. Imports httpx, so only the router imports this module, when it runs.
Not thread-safe: all on the router's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

__all__ = [
    "BOUNDS",
    "BoundBroken",
    "BoundedTransport",
    "Bounds",
    "SyncBoundedTransport",
    "UpstreamReads",
    "bounded_sync_client",
    "install",
    "reads_of",
    "results",
]

MIB = 1024 * 1024
T = TypeVar("T")

#: The bounds a read can break, as the counter's ``bound`` label spells them.
BOUNDS: tuple[str, ...] = ("size", "time", "encoding")

# What the code reading now fetches: ANSWER unless inside ``results()``. A context
# variable, so MinerU's own functions are bounded without changing their calls.
_ANSWER, _RESULT = "answer", "result"
_KIND: contextvars.ContextVar[str] = contextvars.ContextVar(
    "mineru_health_read_kind", default=_ANSWER
)

# When a request names no read timeout (MinerU always names one).
_DEFAULT_ANSWER_S = 60.0
# httpx's default pool, when the transport under the client does not say its own.
_DEFAULT_CONNECTIONS = 100


@contextlib.contextmanager
def results() -> Iterator[None]:
    """Requests made inside fetch a result: result bounds for their 2xx bodies."""
    token = _KIND.set(_RESULT)
    try:
        yield
    finally:
        _KIND.reset(token)


class BoundBroken(httpx.TransportError):
    """A worker's answer broke a bound (``bound``: one of :data:`BOUNDS`)."""

    def __init__(self, message: str, *, bound: str, worker: str, request: httpx.Request) -> None:
        super().__init__(message, request=request)
        self.bound = bound
        self.worker = worker  # the worker's address (scheme://host:port)


@dataclass(frozen=True, slots=True)
class Bounds:
    """What a worker's answer may cost the router."""

    answer_bytes: int  # MAX_STATUS_MB
    result_bytes: int  # MAX_RESULT_MB
    result_s: float  # MAX_RESULT_S

    @classmethod
    def of(cls, settings: Any) -> Bounds:
        return cls(
            answer_bytes=int(settings.max_status_mb) * MIB,
            result_bytes=int(settings.max_result_mb) * MIB,
            result_s=float(settings.max_result_s),
        )


class UpstreamReads:
    """The bounds of one router's reads, and the count of the ones broken."""

    def __init__(self, bounds: Bounds) -> None:
        self.bounds = bounds
        self._broken: dict[tuple[str, str], int] = {}  # (worker address, bound) -> count
        self._lock = threading.Lock()  # MinerU 3.x submits from threads (``SyncBoundedTransport``)

    def broken(self) -> dict[tuple[str, str], int]:
        """Bounds broken so far, by (worker address, bound); read by the metrics at scrape time."""
        with self._lock:
            return dict(self._broken)

    def breach(self, request: httpx.Request, worker: str, bound: str, how: str) -> BoundBroken:
        """The error for ``worker``'s answer to ``request`` breaking ``bound`` (``how``),
        counted."""
        what = f"{request.method} {request.url.raw_path.decode('ascii', 'replace')}"
        exc = BoundBroken(
            f"worker at {worker} broke a bound: its answer to {what} {how}",
            bound=bound,
            worker=worker,
            request=request,
        )
        with self._lock:
            self._broken[(worker, bound)] = self._broken.get((worker, bound), 0) + 1
        return exc


def install(client: Any, settings: Any) -> UpstreamReads | None:
    """Puts the bounds under ``client`` (MinerU's router client); None if it is no httpx client.

    httpx has no public way to wrap the transport of a client made by
    someone else: ``_transport`` has been its name since httpx 0.18.
    """
    if not isinstance(client, httpx.AsyncClient):
        return None
    current = getattr(client, "_transport", None)
    if isinstance(current, BoundedTransport):
        return current.reads
    if not isinstance(current, httpx.AsyncBaseTransport):
        return None
    reads = UpstreamReads(Bounds.of(settings))
    client._transport = BoundedTransport(current, reads)
    return reads


def reads_of(client: Any) -> UpstreamReads | None:
    """The bounds ``install`` put under ``client``, if any."""
    transport = getattr(client, "_transport", None)
    return transport.reads if isinstance(transport, BoundedTransport) else None


def _connections(transport: httpx.AsyncBaseTransport) -> int:
    pool = getattr(transport, "_pool", None)
    found = getattr(pool, "_max_connections", None)
    return found if isinstance(found, int) and found > 0 else _DEFAULT_CONNECTIONS


def _read_timeout(request: httpx.Request) -> float:
    timeout = request.extensions.get("timeout")
    read = timeout.get("read") if isinstance(timeout, dict) else None
    return float(read) if isinstance(read, (int, float)) and read > 0 else _DEFAULT_ANSWER_S


if sys.version_info >= (3, 11):

    async def _by(deadline: float, step: Awaitable[T]) -> T:
        """``step`` if it ends before ``deadline`` (the loop's clock); else asyncio.TimeoutError.

        In the caller's task: httpx's body is read where the response was opened.
        """
        async with asyncio.timeout_at(deadline):
            return await step
else:

    async def _by(deadline: float, step: Awaitable[T]) -> T:
        """``step`` if it ends before ``deadline`` (the loop's clock); else asyncio.TimeoutError."""
        return await asyncio.wait_for(step, max(0.0, deadline - asyncio.get_running_loop().time()))


def _has_body(request: httpx.Request) -> bool:
    return (
        request.headers.get("content-length", "0") != "0" or "transfer-encoding" in request.headers
    )


class _Sending(httpx.AsyncByteStream, httpx.SyncByteStream):
    """A request body that calls ``sent()`` once it is all sent."""

    def __init__(self, inner: Any, sent: Callable[[], None]) -> None:
        self._inner = inner
        self._sent = sent

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            yield chunk
        self._sent()

    def __iter__(self) -> Iterator[bytes]:
        yield from self._inner
        self._sent()


async def _answer_to_upload(
    inner: httpx.AsyncBaseTransport, request: httpx.Request, limit_s: float
) -> tuple[httpx.Response, float]:
    """The answer to a request with a body, and its deadline: ``limit_s`` after the body is sent."""
    loop = asyncio.get_running_loop()
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(None) as timeout:
            request.stream = _Sending(
                request.stream, lambda: timeout.reschedule(loop.time() + limit_s)
            )
            response = await inner.handle_async_request(request)
        return response, timeout.when() or loop.time() + limit_s
    # Before 3.11 a deadline cannot move: the wait for the answer's head is httpx's own.
    response = await inner.handle_async_request(request)
    return response, loop.time() + limit_s


def _origin(url: httpx.URL) -> str:
    port = f":{url.port}" if url.port is not None else ""
    return f"{url.scheme}://{url.host}{port}"


class BoundedTransport(httpx.AsyncBaseTransport):
    """``inner`` with the bounds of ``reads`` on every answer (see the module's doc)."""

    def __init__(self, inner: httpx.AsyncBaseTransport, reads: UpstreamReads) -> None:
        self.inner = inner
        self.reads = reads
        # A quarter of the pool for each kind, so that one worker's answers and its
        # results together leave half of it to the others.
        self._turns_per_worker = max(1, _connections(inner) // 4)
        self._turns: dict[tuple[str, str], asyncio.Semaphore] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        kind = _KIND.get()
        worker = _origin(request.url)
        loop = asyncio.get_running_loop()
        limit_s = self.reads.bounds.result_s if kind == _RESULT else _read_timeout(request)
        deadline = loop.time() + limit_s
        request.headers["Accept-Encoding"] = "identity"

        def broken(bound: str, how: str) -> BoundBroken:
            return self.reads.breach(request, worker, bound, how)

        late = f"took more than {limit_s:g} s in all" + (
            " (MINERU_ROUTER_HEALTH_MAX_RESULT_S)" if kind == _RESULT else ""
        )
        turns = self._turns.setdefault((worker, kind), asyncio.Semaphore(self._turns_per_worker))
        try:
            await _by(deadline, turns.acquire())
        except asyncio.TimeoutError:
            raise broken(
                "time", late + f", waiting behind {self._turns_per_worker} others in flight to it"
            ) from None
        try:
            try:
                if _has_body(request):
                    # An upload takes what its size takes: the clock of the answer starts
                    # once it is sent.
                    response, deadline = await _answer_to_upload(self.inner, request, limit_s)
                else:
                    response = await _by(deadline, self.inner.handle_async_request(request))
            except asyncio.TimeoutError:
                raise broken("time", late) from None
            encoding = response.headers.get("content-encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                await response.aclose()
                raise broken(
                    "encoding",
                    f"came {encoding}-encoded (identity was asked: "
                    "a compressed answer has no bound once decoded)",
                )
            result = kind == _RESULT and 200 <= response.status_code < 300
            cap, setting = (
                (self.reads.bounds.result_bytes, "MAX_RESULT_MB")
                if result
                else (self.reads.bounds.answer_bytes, "MAX_STATUS_MB")
            )
            too_big = f"passed {cap // MIB} MiB (MINERU_ROUTER_HEALTH_{setting})"
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > cap:
                await response.aclose()
                raise broken("size", f"declared {int(declared)} bytes: {too_big}")
        except BaseException:
            turns.release()
            raise
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        response.stream = _BoundedStream(
            stream,
            cap,
            deadline,
            turns,
            lambda bound: broken(bound, too_big if bound == "size" else late),
        )
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


# After its deadline, a response nobody closed is closed by the transport: a reader
# still at it has ended by then (its own read is bounded by the same deadline).
_CLOSE_LEFT_OPEN_S = 1.0


class _BoundedStream(httpx.AsyncByteStream):
    """A response body cut where it passes ``cap`` bytes or ``deadline``; frees its turn once.

    One left open (a client that went away before a streamed result was
    relayed, and nothing closed it) is closed just after its deadline, so that
    neither its connection nor its turn is held longer than its bound.
    """

    def __init__(
        self,
        inner: httpx.AsyncByteStream,
        cap: int,
        deadline: float,
        turns: asyncio.Semaphore,
        broken: Any,
    ) -> None:
        self._inner = inner
        self._cap = cap
        self._deadline = deadline
        self._turns: asyncio.Semaphore | None = turns
        self._broken = broken
        loop = asyncio.get_running_loop()
        self._left_open = loop.call_at(deadline + _CLOSE_LEFT_OPEN_S, self._close_left_open)
        self._closing: asyncio.Task[None] | None = None

    def _close_left_open(self) -> None:
        if self._turns is not None:
            self._closing = asyncio.get_running_loop().create_task(self.aclose())

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = self._inner.__aiter__()
        received = 0
        while True:
            try:
                chunk = await _by(self._deadline, chunks.__anext__())
            except StopAsyncIteration:
                return
            except asyncio.TimeoutError:
                await self.aclose()
                raise self._broken("time") from None
            received += len(chunk)
            if received > self._cap:
                await self.aclose()
                raise self._broken("size")
            yield chunk

    async def aclose(self) -> None:
        turns, self._turns = self._turns, None
        if turns is not None:
            self._left_open.cancel()
            turns.release()
            await self._inner.aclose()


def bounded_sync_client(reads: Callable[[], UpstreamReads | None]) -> Callable[..., httpx.Client]:
    """An ``httpx.Client`` factory whose clients read within the bounds ``reads()`` gives.

    For code that makes a blocking client of its own per request (MinerU 3.x
    submits from a thread that way); without bounds yet, a plain client.
    """

    def client(*args: Any, **kwargs: Any) -> httpx.Client:
        found = reads()
        if found is None or "transport" in kwargs:
            return httpx.Client(*args, **kwargs)
        inner = httpx.HTTPTransport(verify=kwargs.get("verify", True))
        return httpx.Client(*args, transport=SyncBoundedTransport(inner, found), **kwargs)

    return client


class SyncBoundedTransport(httpx.BaseTransport):
    """:class:`BoundedTransport`'s answer bounds for a blocking client (one thread per request).

    A blocking read cannot be cut mid-way: the time in all is checked at each
    chunk, so a trickle ends at the timeout plus one read timeout at most.
    """

    def __init__(self, inner: httpx.BaseTransport, reads: UpstreamReads) -> None:
        self.inner = inner
        self.reads = reads

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        worker = _origin(request.url)
        limit_s = _read_timeout(request)
        deadline = time.monotonic() + limit_s
        if _has_body(request):  # the clock of the answer starts once the upload is sent

            def sent() -> None:
                nonlocal deadline
                deadline = time.monotonic() + limit_s

            request.stream = _Sending(request.stream, sent)
        cap = self.reads.bounds.answer_bytes
        request.headers["Accept-Encoding"] = "identity"

        def broken(bound: str, how: str) -> BoundBroken:
            return self.reads.breach(request, worker, bound, how)

        too_big = f"passed {cap // MIB} MiB (MINERU_ROUTER_HEALTH_MAX_STATUS_MB)"
        response = self.inner.handle_request(request)
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        declared = response.headers.get("content-length", "")
        failure = None
        if encoding not in ("", "identity"):
            failure = broken("encoding", f"came {encoding}-encoded (identity was asked)")
        elif declared.isdigit() and int(declared) > cap:
            failure = broken("size", f"declared {int(declared)} bytes: {too_big}")
        if failure is not None:
            response.close()
            raise failure
        stream = response.stream
        assert isinstance(stream, httpx.SyncByteStream)

        def body() -> Iterator[bytes]:
            received = 0
            try:
                for chunk in stream:
                    received += len(chunk)
                    if received > cap:
                        raise broken("size", too_big)
                    if time.monotonic() > deadline:
                        raise broken("time", f"took more than {limit_s:g} s in all")
                    yield chunk
            finally:
                stream.close()

        response.stream = _SyncStream(body(), stream)
        return response

    def close(self) -> None:
        self.inner.close()


class _SyncStream(httpx.SyncByteStream):
    def __init__(self, chunks: Iterator[bytes], inner: httpx.SyncByteStream) -> None:
        self._chunks = chunks
        self._inner = inner

    def __iter__(self) -> Iterator[bytes]:
        yield from self._chunks

    def close(self) -> None:
        self._inner.close()

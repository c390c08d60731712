"""The bounds on what workers answer the router (``runtime.router.upstream_reads``), no sockets.

A real ``httpx.AsyncClient`` whose transport (under the bounds) is an
``httpx.MockTransport`` answering as a hostile worker would: bodies too
long, declared too long, without end, trickling, late headers, compressed.
Bounds are small (1 MiB, fractions of a second) so every case ends fast.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from mineru_health import metrics
from mineru_health.runtime.router import upstream_reads
from mineru_health.runtime.router.line import ask_status
from mineru_health.runtime.router.policy import AnswerKind
from mineru_health.runtime.router.upstream_reads import MIB, BoundBroken

SETTINGS = SimpleNamespace(max_status_mb=1, max_result_mb=2, max_result_s=0.5)
Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]


class Body(httpx.AsyncByteStream):
    """``count`` chunks of ``size`` bytes (None: without end), ``pause_s`` apart."""

    def __init__(self, size: int, count: int | None, pause_s: float = 0.0) -> None:
        self.size, self.count, self.pause_s = size, count, pause_s
        self.sent = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while self.count is None or self.sent < self.count:
            if self.pause_s:
                await asyncio.sleep(self.pause_s)
            self.sent += 1
            yield b"x" * self.size


def client_for(handler: Handler, connections: int = 100) -> httpx.AsyncClient:
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    client._transport._pool = SimpleNamespace(_max_connections=connections)  # type: ignore[attr-defined]
    reads = upstream_reads.install(client, SETTINGS)
    assert reads is not None
    return client


def run(coro: Awaitable[Any]) -> Any:
    async def bounded() -> Any:
        async with asyncio.timeout(10):  # a bound that does not hold fails, never hangs
            return await coro

    return asyncio.run(bounded())


async def get(
    client: httpx.AsyncClient, url: str = "http://w1:8000/tasks/t", timeout_s: float = 0.5
) -> httpx.Response:
    async with client:
        return await client.get(url, timeout=timeout_s)


def broken_counts(client: httpx.AsyncClient) -> dict[tuple[str, str], int]:
    reads = upstream_reads.reads_of(client)
    assert reads is not None
    return reads.broken()


def test_an_answer_read_whole_is_cut_past_max_status_mb_and_counted() -> None:
    body = Body(256 * 1024, None)  # without end

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=body)

    client = client_for(handler)
    with pytest.raises(BoundBroken) as caught:
        run(get(client))
    assert caught.value.bound == "size"
    assert "worker at http://w1:8000" in str(caught.value)
    assert "GET /tasks/t" in str(caught.value) and "MAX_STATUS_MB" in str(caught.value)
    assert body.sent <= 5  # cut at the cap: 1 MiB and one chunk, never more
    assert broken_counts(client) == {("http://w1:8000", "size"): 1}


def test_a_declared_length_past_the_cap_is_refused_before_reading() -> None:
    body = Body(1024, 1)

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-length": str(300 * MIB)}, stream=body)

    with pytest.raises(BoundBroken, match="declared 314572800 bytes"):
        run(get(client_for(handler)))
    assert body.sent == 0


def test_an_answer_within_the_bounds_is_read_as_it_was() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["accept-encoding"] == "identity"
        return httpx.Response(200, json={"status": "processing"})

    response = run(get(client_for(handler)))
    assert response.json() == {"status": "processing"}


def test_a_trickling_answer_ends_at_its_timeout_in_all() -> None:
    # Every chunk comes well within the read timeout: only a bound on the whole ends it.
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=Body(1, None, pause_s=0.01))

    client = client_for(handler)
    with pytest.raises(BoundBroken, match="took more than 0.3 s in all") as caught:
        run(get(client, timeout_s=0.3))
    assert caught.value.bound == "time"


def test_the_clock_of_an_answer_to_an_upload_starts_once_the_upload_is_sent() -> None:
    # An upload that takes longer than the timeout (a large file on a slow link) is not cut;
    # its answer still has the timeout in all, from the end of the upload.
    async def upload() -> AsyncIterator[bytes]:
        for _ in range(6):
            await asyncio.sleep(0.05)
            yield b"x" * 1024

    async def handler(request: httpx.Request) -> httpx.Response:
        await request.aread()  # the upload, 0.3 s
        if request.url.path == "/late":
            await asyncio.Event().wait()
        return httpx.Response(202, json={"task_id": "t"})

    async def post(path: str) -> httpx.Response:
        async with client_for(handler) as client:
            return await client.post(f"http://w1:8000{path}", content=upload(), timeout=0.2)

    assert run(post("/tasks")).json() == {"task_id": "t"}
    with pytest.raises(BoundBroken, match="took more than 0.2 s in all"):
        run(post("/late"))


def test_headers_that_never_come_end_at_the_timeout() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    with pytest.raises(BoundBroken, match="in all"):
        run(get(client_for(handler), timeout_s=0.2))


def test_a_compressed_answer_breaks_the_encoding_bound() -> None:
    bomb = gzip.compress(b"\0" * (16 * MIB))  # 16 KiB on the wire, 16 MiB decoded

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-encoding": "gzip"}, content=bomb)

    client = client_for(handler)
    with pytest.raises(BoundBroken, match="gzip-encoded"):
        run(get(client))
    assert broken_counts(client) == {("http://w1:8000", "encoding"): 1}


def test_results_have_their_own_cap_and_time_but_an_error_answer_is_an_answer() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/bad"):
            return httpx.Response(500, stream=Body(MIB, 2))
        return httpx.Response(200, stream=Body(MIB // 2, 3))  # 1.5 MiB: past the status cap

    async def fetch(path: str) -> httpx.Response:
        with upstream_reads.results():
            return await get(client_for(handler), f"http://w1:8000/tasks/t/{path}")

    assert len(run(fetch("result")).content) == 3 * MIB // 2
    with pytest.raises(BoundBroken, match="MAX_STATUS_MB"):
        run(fetch("bad"))


def test_an_endless_result_is_cut_at_max_result_mb_and_a_trickling_one_at_max_result_s() -> None:
    async def endless(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=Body(256 * 1024, None))

    async def trickling(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=Body(1, None, pause_s=0.01))

    async def stream(handler: Handler) -> int:
        client = client_for(handler)
        received = 0
        with upstream_reads.results():
            async with client, client.stream("GET", "http://w1:8000/r", timeout=60) as response:
                async for chunk in response.aiter_raw():
                    received += len(chunk)
        return received

    with pytest.raises(BoundBroken, match="MAX_RESULT_MB"):
        run(stream(endless))
    with pytest.raises(BoundBroken, match=r"0.5 s in all \(MINERU_ROUTER_HEALTH_MAX_RESULT_S\)"):
        run(stream(trickling))


def test_a_worker_that_holds_its_turns_delays_no_other_worker() -> None:
    # 8 connections: 2 turns per worker and kind. Worker "slow" never answers.
    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "slow":
            await asyncio.Event().wait()
        return httpx.Response(200, json={"status": "done"})

    client = client_for(handler, connections=8)

    async def scenario() -> tuple[list[BaseException | httpx.Response], bool]:
        async with client:
            slow = [
                asyncio.create_task(client.get("http://slow:1/tasks/a", timeout=0.4))
                for _ in range(6)
            ]
            await asyncio.sleep(0.05)  # all six under way: two hold the slow worker's turns
            answer = await client.get("http://fast:1/tasks/b", timeout=0.4)
            assert answer.json() == {"status": "done"}
            slow_still_pending = not any(task.done() for task in slow)
            done = await asyncio.gather(*slow, return_exceptions=True)
            return done, slow_still_pending

    done, slow_still_pending = run(scenario())
    assert slow_still_pending  # the other worker answered while the slow one held its turns
    assert all(isinstance(e, BoundBroken) and e.bound == "time" for e in done)
    assert any("waiting behind 2 others" in str(e) for e in done)


def test_a_response_left_open_gives_its_turn_back_after_its_deadline() -> None:
    # One turn per worker (4 connections): the first response is never read nor closed.
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=Body(1, 1))

    client = client_for(handler, connections=4)

    async def scenario() -> dict[str, str]:
        async with client:
            request = client.build_request("GET", "http://w1:8000/r", timeout=0.2)
            left_open = await client.send(request, stream=True)
            assert not left_open.is_closed
            # Waits for the turn the first one holds until that one is closed for it.
            second = await client.get("http://w1:8000/r", timeout=5)
            return {"second": second.text}

    assert run(scenario()) == {"second": "x"}


def test_install_is_idempotent_and_leaves_other_clients_alone() -> None:
    client = httpx.AsyncClient()
    first = upstream_reads.install(client, SETTINGS)
    assert first is not None and upstream_reads.install(client, SETTINGS) is first
    assert upstream_reads.install(SimpleNamespace(), SETTINGS) is None
    run(client.aclose())


def test_the_counter_is_read_at_scrape_time() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-length": str(2 * MIB)}, stream=Body(1, 1))

    client = client_for(handler)
    reads = upstream_reads.reads_of(client)
    assert reads is not None
    metrics.router.bind_upstream_reads(reads.broken)
    try:
        with pytest.raises(BoundBroken):
            run(get(client))
        scraped = metrics.exposition().decode()
    finally:
        metrics.router.bind_upstream_reads(None)
    assert (
        'mineru_router_upstream_bounds_broken_total{bound="size",worker="http://w1:8000"} 1.0'
        in scraped
    )


def test_ask_status_takes_a_broken_bound_as_the_worker_answering_badly() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=Body(MIB, None))

    client = client_for(handler)
    fleet: Any = SimpleNamespace(client=client)
    answer = run(ask_status(fleet, "http://w1:8000", "/tasks/t", 0.5))
    assert answer.kind is AnswerKind.BAD_ANSWER
    assert "MAX_STATUS_MB" in answer.detail


def test_ask_status_takes_a_status_too_slow_as_no_answer_in_time() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=Body(8, 10, pause_s=0.2))

    client = client_for(handler)
    fleet: Any = SimpleNamespace(client=client)
    answer = run(ask_status(fleet, "http://w1:8000", "/tasks/t", 0.5))
    assert answer.kind is AnswerKind.UNREACHABLE  # waited on, like a read timeout
    assert "took more than 0.5 s" in answer.detail


def test_ask_status_parses_a_large_status_off_the_loop() -> None:
    payload = {"status": "done", "results": "y" * (512 * 1024)}

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=payload)

    fleet: Any = SimpleNamespace(client=client_for(handler))
    answer = run(ask_status(fleet, "http://w1:8000", "/tasks/t", 0.5))
    assert answer.kind is AnswerKind.STATUS and answer.payload == payload


def sync_client(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.Client:
    reads = upstream_reads.UpstreamReads(upstream_reads.Bounds.of(SETTINGS))
    return httpx.Client(
        transport=upstream_reads.SyncBoundedTransport(httpx.MockTransport(handler), reads)
    )


def test_a_blocking_client_reads_an_answer_within_the_bounds_too() -> None:
    def endless() -> Iterator[bytes]:
        while True:
            yield b"x" * (256 * 1024)

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/small":
            return httpx.Response(202, json={"task_id": "t"})
        if request.url.path == "/gzip":
            return httpx.Response(202, headers={"content-encoding": "gzip"}, content=b"")
        return httpx.Response(202, stream=_Endless(endless()))

    with sync_client(handler) as client:
        assert client.post("http://w1:8000/small").json() == {"task_id": "t"}
        with pytest.raises(BoundBroken, match="MAX_STATUS_MB"):
            client.post("http://w1:8000/tasks")
        with pytest.raises(BoundBroken, match="gzip-encoded"):
            client.post("http://w1:8000/gzip")


class _Endless(httpx.SyncByteStream):
    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        yield from self.chunks


def test_the_3x_router_module_submits_with_a_bounded_client() -> None:
    from mineru_health.mineru3.router.reads import bound_submissions

    async def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200)

    bounded = client_for(answer)
    app = SimpleNamespace(state=SimpleNamespace(http_client=bounded))
    namespace: dict[str, Any] = {"httpx": httpx}
    bound_submissions(app, namespace)
    bound_submissions(app, namespace)  # idempotent
    shim = namespace["httpx"]
    assert shim.HTTPError is httpx.HTTPError and shim.Timeout is httpx.Timeout
    with shim.Client(timeout=5) as client:
        assert isinstance(client._transport, upstream_reads.SyncBoundedTransport)
    bound_submissions(SimpleNamespace(state=SimpleNamespace()), namespace)  # main's own app,
    with shim.Client(timeout=5) as client:  # before its start-up: MinerU's own client
        assert not isinstance(client._transport, upstream_reads.SyncBoundedTransport)
    run(bounded.aclose())

"""Issue 32: a remote wait's bounds at the client's I/O, and the slots' share by server.

No test waits for a bound: the fake health below says when a bound is past,
and the servers are loopback fakes (``harness.remote_servers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, ClassVar

import httpx
import pytest
from harness.remote_servers import hostile_server
from mineru_health.mineru3.worker.fairness import ServerShare, server_key
from mineru_health.runtime.worker import engine_calls, model_cache, remote_waits


@dataclass
class _Status:
    reason: str = ""
    server: str = ""
    left_s: float | None = None


class _Health:
    """Stands in for WorkerHealth: a status set by the test, and what was heard."""

    def __init__(self) -> None:
        self.status: _Status | None = None
        self.heard: list[str] = []
        self.asked: list[str] = []
        self.expire_after_heard: int | None = None
        self.waits: list[tuple[str, str]] = []

    @contextlib.contextmanager
    def remote_wait(self, task_id: str, server: str = "") -> Iterator[None]:
        self.waits.append((task_id, server))
        yield

    def remote_asked(self, task_id: str, server: str = "") -> None:
        self.asked.append(server)

    def remote_heard(self, task_id: str, server: str = "") -> None:
        self.heard.append(server)
        if self.expire_after_heard is not None and len(self.heard) >= self.expire_after_heard:
            self.status = _Status("total", server)

    def remote_wait_status(self, task_id: str) -> _Status | None:
        return self.status


_health = _Health()
_settings = SimpleNamespace(task_hang_s=3.0, remote_wait_s=8.0)
remote_waits._wrap_transports(httpx, health=lambda: _health, settings=lambda: _settings)


@pytest.fixture(autouse=True)
def fresh_health() -> Iterator[_Health]:
    _health.__init__()  # type: ignore[misc]
    yield _health


def test_a_server_is_named_by_host_and_port_only() -> None:
    name = remote_waits.server_name
    assert name("http://user:secret@10.0.0.7:8000/v1/chat?key=s3cret") == "10.0.0.7:8000"
    assert name("https://vlm.example.com/") == "vlm.example.com:443"
    assert name("http://[::1]:30000") == "[::1]:30000"
    assert name("") == name(None) == name("not a url") == ""
    task = SimpleNamespace(backend="vlm-http-client", server_url="http://a:1/x")
    assert server_key(task) == "a:1"
    assert server_key(SimpleNamespace(backend="vlm-auto-engine", server_url="http://a:1")) == ""


def test_the_error_names_the_server_and_the_bound() -> None:
    silent = remote_waits.describe(
        _Status("silent", "10.0.0.7:8000"), task_hang_s=3, remote_wait_s=8
    )
    assert "10.0.0.7:8000 sent nothing for 3 s (MINERU_HEALTH_TASK_HANG_S)" in silent
    assert "failed alone" in silent
    total = remote_waits.describe(_Status("total", ""), task_hang_s=3, remote_wait_s=8)
    assert "its engine server kept it waiting 8 s (MINERU_HEALTH_REMOTE_WAIT_S)" in total


def test_outside_a_remote_wait_httpx_is_left_alone(fresh_health: _Health) -> None:
    fresh_health.status = _Status("silent")  # would refuse, were it asked
    with (
        hostile_server("trickle", every_s=0.01) as url,
        httpx.Client() as client,
        client.stream("GET", url) as response,
    ):
        assert response.status_code == 200
    assert fresh_health.heard == []


def test_a_first_request_is_capped_to_the_silence_it_starts(
    fresh_health: _Health,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The native state counts silence from the first request asked: the cap is read after it.

    Read before, a first request (an http client asking for the model name,
    under MinerU's model lock) got the total bound's minutes and held the
    lock past its task's failure, and every task queued behind it waited.
    """
    fresh_health.status = _Status(left_s=2400.0)  # nothing asked yet: the total bound only
    asked = fresh_health.remote_asked

    def remote_asked(task_id: str, server: str = "") -> None:
        asked(task_id, server)
        fresh_health.status = _Status(left_s=0.2)  # silence runs from now

    monkeypatch.setattr(fresh_health, "remote_asked", remote_asked)
    with (
        hostile_server("silent") as url,
        httpx.Client(timeout=600) as client,
        remote_waits.waiting(fresh_health, "t9", "x"),
    ):  # type: ignore[arg-type]
        started = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            client.get(url)
        assert time.monotonic() - started < 30  # not the total bound's 2400 s


def test_a_silent_server_is_cut_at_what_is_left_of_the_bound(fresh_health: _Health) -> None:
    fresh_health.status = _Status(left_s=0.2)
    with (
        hostile_server("silent") as url,
        httpx.Client(timeout=600) as client,
        remote_waits.waiting(fresh_health, "t1", "x"),
    ):  # type: ignore[arg-type]
        started = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            client.get(url)
        assert time.monotonic() - started < 30  # not the client's 600 s
        # Past the bound, the next try (a retry of MinerU's client) is refused unsent.
        fresh_health.status = _Status("silent", "")
        with pytest.raises(remote_waits.RemoteWaitExceeded, match=r"127\.0\.0\.1:\d+ sent"):
            client.get(url)
    assert fresh_health.waits == [("t1", "x")]


def test_a_trickling_server_is_heard_and_cut_at_the_total_bound(fresh_health: _Health) -> None:
    fresh_health.status = _Status(left_s=5.0)
    fresh_health.expire_after_heard = 4  # the head, then three bytes
    with (
        hostile_server("trickle", every_s=0.01) as url,
        httpx.Client(timeout=600) as client,
        remote_waits.waiting(fresh_health, "t2", ""),  # type: ignore[arg-type]
        pytest.raises(remote_waits.RemoteWaitExceeded, match="kept it waiting 8 s"),
    ):
        client.get(url)
    server = url.removeprefix("http://")
    assert fresh_health.asked == [server]
    assert fresh_health.heard[:4] == [server] * 4


def test_a_request_of_a_task_that_ended_is_abandoned(fresh_health: _Health) -> None:
    """The watcher failed the task; the thread still building its client must not wait on."""
    fresh_health.status = _Status(left_s=5.0)
    with (
        hostile_server("trickle", every_s=0.01) as url,
        httpx.Client(timeout=600) as client,
        remote_waits.waiting(fresh_health, "t5", ""),
    ):  # type: ignore[arg-type]
        fresh_health.status = None  # the task watchdog no longer tracks it
        with pytest.raises(remote_waits.RemoteWaitExceeded, match="has ended"):
            client.get(url)


def test_an_async_trickling_server_is_cut_too(fresh_health: _Health) -> None:
    fresh_health.status = _Status(left_s=5.0)
    fresh_health.expire_after_heard = 2

    async def fetch(url: str) -> None:
        async with httpx.AsyncClient(timeout=600) as client:
            await client.get(url)

    with (
        hostile_server("trickle", every_s=0.01) as url,
        remote_waits.waiting(fresh_health, "t3", ""),  # type: ignore[arg-type]
        pytest.raises(remote_waits.RemoteWaitExceeded),
    ):
        asyncio.run(fetch(url))


def test_a_cached_client_is_found_without_minerus_lock() -> None:
    """MinerU looks clients up under one lock it also holds while a server answers."""

    class ModelSingleton:
        def __init__(self) -> None:
            self._lock = threading.Lock()
            self._models: dict[Any, Any] = {("http-client", None, "http://h:1"): "honest"}

        def get_model(self, backend: str, model_path: Any, server_url: Any) -> Any:
            with self._lock:
                return self._models.setdefault((backend, model_path, server_url), "new")

    health = _Health()
    model_cache.remote_lookups(
        ModelSingleton,
        lambda: health,  # type: ignore[arg-type]
        cached_by_key=True,
    )
    models = ModelSingleton()
    with models._lock:  # a silent server's client being built
        assert models.get_model("http-client", None, "http://h:1") == "honest"
    with engine_calls.task_context("t4"):
        assert models.get_model("http-client", None, "http://u:p@h:2/") == "new"
        assert models.get_model("vlm-engine", None, None) == "new"
    assert health.waits == [("t4", "h:2")]  # only the http client's lookup waits on a server


def test_client_builds_queue_on_the_loop_and_cached_clients_need_no_thread() -> None:
    built: list[str] = []

    class ModelSingleton:
        _instance: ClassVar[Any] = None
        _models: ClassVar[dict[Any, Any]] = {("http-client", None, "http://h:1"): "honest"}

    async def get_model_async(backend: str, model_path: Any, server_url: Any) -> Any:
        built.append(server_url)
        await asyncio.sleep(0)
        return f"client of {server_url}"

    module = type(sys)("fake_vlm_analyze")
    module._get_model_async = get_model_async  # type: ignore[attr-defined]
    module.ModelSingleton = ModelSingleton  # type: ignore[attr-defined]
    health = _Health()
    model_cache.install(
        lambda: health,  # type: ignore[arg-type]
        lambda name, wrap: wrap(module),
    )
    lookup = module._get_model_async  # type: ignore[attr-defined]

    async def run() -> list[Any]:
        with engine_calls.task_context("t7"):
            return list(
                await asyncio.gather(
                    lookup("http-client", None, "http://h:1"),
                    lookup("http-client", None, "http://h:2"),
                    lookup("vlm-engine", None, None),
                )
            )

    assert asyncio.run(run()) == ["honest", "client of http://h:2", "client of None"]
    assert built == ["http://h:2", None]
    assert health.waits == [("t7", "h:2")]


def test_a_task_queued_on_minerus_lock_leaves_once_its_task_ended(fresh_health: _Health) -> None:
    lock = threading.Lock()
    installed = (lambda: fresh_health, lambda: _settings)  # what install() hands the wrappers
    fresh_health.status = _Status(left_s=5.0)
    with remote_waits.waiting(fresh_health, "t6", "h:1"):  # type: ignore[arg-type]
        remote_waits.wait_for_lock(lock, *installed)  # type: ignore[arg-type]  # free: at once
        assert not lock.locked()
        with lock:  # another task's client build holds it
            fresh_health.status = None  # the watcher failed this task meanwhile
            with pytest.raises(remote_waits.RemoteWaitExceeded, match="has ended"):
                remote_waits.wait_for_lock(lock, *installed)  # type: ignore[arg-type]


def _admitted(shares: ServerShare, keys: list[str], slots: int) -> tuple[list[str], Any]:
    """Starts one task per key (in order) and returns the keys that got a slot at once."""
    got: list[str] = []

    async def run() -> Any:
        async def one(key: str) -> None:
            await shares.enter(key, slots)
            got.append(key)

        tasks = [asyncio.ensure_future(one(key)) for key in keys]
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return tasks

    loop = asyncio.new_event_loop()
    tasks = loop.run_until_complete(run())
    return got, (loop, tasks)


def test_a_server_holds_its_share_while_others_wait() -> None:
    shares = ServerShare(0.34)  # 1 of 3 slots
    assert shares.cap(3) == 1 and ServerShare(0.67).cap(3) == 2 and shares.cap(1) == 1
    got, (loop, tasks) = _admitted(shares, ["silent"] * 3 + ["trickle"] * 3 + ["honest"], 3)
    # Alone at first, silent takes every free slot (nobody else waits yet).
    assert got == ["silent"] * 3
    shares.leave("silent", 3)
    loop.run_until_complete(asyncio.sleep(0))
    assert got[3:] == ["trickle"]  # within its share, ahead of silent's fourth
    shares.leave("silent", 3)
    loop.run_until_complete(asyncio.sleep(0))
    assert got[4:] == ["honest"]  # trickle is at its share while honest waits
    shares.leave("honest", 3)
    loop.run_until_complete(asyncio.sleep(0))
    # Only servers past their share wait: the free slot is used all the same.
    assert got[5:] == ["trickle"]
    assert sum(shares.held.values()) == 3
    for task in tasks:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.close()


def test_a_cancelled_waiter_gives_up_its_place() -> None:
    shares = ServerShare(0.5)
    got, (loop, tasks) = _admitted(shares, ["a", "a", "b"], 2)
    assert got == ["a", "a"]
    tasks[2].cancel()
    loop.run_until_complete(asyncio.gather(tasks[2], return_exceptions=True))
    shares.leave("a", 2)
    assert shares.held == {"a": 1}
    loop.close()

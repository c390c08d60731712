"""The ports a router hands to its local workers (``launch.py``): never the router's own,
never one another worker holds, never the same one to two launches at once."""

from __future__ import annotations

import asyncio
import itertools
import sys
import threading
import types
from collections.abc import Callable, Iterator

import pytest
from mineru_health.runtime.router import launch
from mineru_health.runtime.router.launch import PortBook, free_port, launching_class, router_ports


def _offers(*ports: int) -> Callable[[str], int]:
    """What the kernel offers, in turn (then the last one for ever)."""
    offered = iter(ports)
    last = [ports[-1]]

    def pick(host: str) -> int:
        last[0] = next(offered, last[0])
        return last[0]

    return pick


def test_the_routers_port_comes_from_its_command_line() -> None:
    assert router_ports(["mineru-router", "--port", "9100", "--local-gpus", "0,1"]) == {9100}
    assert router_ports(["mineru-router", "--port=9101"]) == {9101}
    assert router_ports(["mineru-router", "--host", "0.0.0.0"]) == {8002}  # MinerU's default
    assert router_ports(["mineru-router", "--port"]) == {8002}


def test_the_routers_port_and_held_ports_are_never_handed_out() -> None:
    book = PortBook(router={9100}, pick=_offers(9100, 9200, 9200, 9100, 9201))
    assert book.take("127.0.0.1", "w0 main") == 9200  # 9100 is the router's
    assert book.take("127.0.0.1", "w1 main") == 9201  # 9200 is w0's, 9100 the router's
    assert book.held() == {"w0 main": 9200, "w1 main": 9201}


def test_a_new_launch_replaces_its_holders_port() -> None:
    book = PortBook(router=set(), pick=_offers(9300, 9301))
    assert book.take("127.0.0.1", "w0 health") == 9300
    assert book.take("127.0.0.1", "w0 health") == 9301
    assert book.held() == {"w0 health": 9301}


def test_a_kernel_that_offers_only_taken_ports_is_a_named_error() -> None:
    book = PortBook(router={9100}, pick=_offers(9100))
    with pytest.raises(OSError, match=r"no port for w0 main on 127\.0\.0\.1.*\[9100\]"):
        book.take("127.0.0.1", "w0 main")


def test_concurrent_launches_never_share_a_port() -> None:
    # A kernel that offers the same few ports again and again, to 16 launches at once.
    cycle = itertools.cycle(range(9400, 9420))
    lock = threading.Lock()

    def pick(host: str) -> int:
        with lock:
            return next(cycle)

    book = PortBook(router={9400}, pick=pick)
    got: list[int] = []
    barrier = threading.Barrier(16)

    def launch_one(n: int) -> None:
        barrier.wait(10)
        got.append(book.take("127.0.0.1", f"w{n} main"))

    threads = [threading.Thread(target=launch_one, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(got) == 16 and len(set(got)) == 16 and 9400 not in got


def test_real_ports_are_bindable_and_not_the_routers() -> None:
    router = free_port("127.0.0.1")
    book = PortBook(router={router})
    ports = {book.take("127.0.0.1", f"w{n}") for n in range(4)}
    assert len(ports) == 4 and router not in ports


@pytest.fixture
def fake_mineru4() -> Iterator[types.ModuleType]:
    """A module shaped like MinerU 4.0's workers module: it picks ports itself in ``start``."""
    module = types.ModuleType("fake_mineru4_workers")
    module.reserve_local_port = lambda host: 8002  # type: ignore[attr-defined]

    class ManagedLocalWorker:
        worker_id = "local-gpu-0"

        async def start(self, client: object) -> None:
            self.port = module.reserve_local_port("127.0.0.1")  # type: ignore[attr-defined]

        async def wait_until_ready(self, *args: object) -> None:
            return None

    ManagedLocalWorker.__module__ = module.__name__
    module.ManagedLocalWorker = ManagedLocalWorker  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def test_mineru4s_own_port_choice_goes_through_the_book(
    fake_mineru4: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    book = PortBook(router={8002}, pick=_offers(8002, 9500))
    monkeypatch.setattr(launch, "PORTS", book)
    worker = launching_class(fake_mineru4.ManagedLocalWorker)()
    asyncio.run(worker.launch(None))
    assert worker.port == 9500  # not the router's 8002, which the kernel offered first
    assert book.held() == {"local-gpu-0 main": 9500}

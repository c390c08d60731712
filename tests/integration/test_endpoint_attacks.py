"""A real router with two real workers while one worker's native endpoint is attacked.

Issue 17: 64 sockets trickling a byte a second used to fill every slot of a
worker's native endpoint, so the router's probes failed and the healthy
worker was ejected and restarted; a flood of requests did the same to the
``fast`` preset. Here both attacks run from loopback, the router's own
address, against a worker behind a real ``mineru-router`` with the ``fast``
preset (0.5 s probe timeout, two failures eject), and the test asserts that
nothing was ejected: no audit record beyond the two admissions. Every loop is
bounded in time and count, and only 127.0.0.1 is touched.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Router, http_get
from mineru_health.demo import sandbox
from mineru_health.demo.fleet import FLEET4_ENV, LINE4, fleet

pytestmark = pytest.mark.integration

ATTACK_S = 12.0
SLOW_SOCKETS = 128
FLOOD_THREADS = 8
FLOOD_CONNECTIONS = 20_000  # in all, at most


def _native_port(worker_url: str) -> int:
    response = http_get(f"{worker_url}/health", 30.0)
    assert response is not None, worker_url
    port = response.json().get("native_health_port")
    assert isinstance(port, int), response.text
    return port


def _slowloris(port: int, stop: threading.Event, opened: list[int]) -> None:
    """SLOW_SOCKETS connections trickling one byte each, reopened when the server closes them."""
    held: list[socket.socket] = []
    deadline = time.monotonic() + ATTACK_S
    while not stop.is_set() and time.monotonic() < deadline:
        while len(held) < SLOW_SOCKETS:
            try:
                held.append(socket.create_connection(("127.0.0.1", port), timeout=1.0))
                opened[0] += 1
            except OSError:
                break
        alive = []
        for sock in held:
            try:
                sock.send(b"G")
                alive.append(sock)
            except OSError:
                sock.close()
        held = alive
        stop.wait(0.25)
    for sock in held:
        sock.close()


def _flood(port: int, stop: threading.Event, budget: list[int], lock: threading.Lock) -> None:
    """Complete requests as fast as one thread can send them, the answers never read."""
    request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    deadline = time.monotonic() + ATTACK_S
    while not stop.is_set() and time.monotonic() < deadline:
        with lock:
            if budget[0] <= 0:
                return
            budget[0] -= 1
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
                sock.sendall(request)
        except OSError:
            pass


def _attack(port: int, attack: str) -> tuple[list[threading.Thread], Callable[[], None]]:
    """Starts the attack on ``port``; returns its threads and what checks that it ran."""
    stop = threading.Event()
    opened = [0]
    budget = [FLOOD_CONNECTIONS]
    lock = threading.Lock()
    if attack == "slow-clients":
        attackers = [threading.Thread(target=_slowloris, args=(port, stop, opened))]
    else:
        attackers = [
            threading.Thread(target=_flood, args=(port, stop, budget, lock))
            for _ in range(FLOOD_THREADS)
        ]
    for thread in attackers:
        thread.start()

    def end() -> None:
        stop.set()
        for thread in attackers:
            thread.join(timeout=30.0)
        if attack == "slow-clients":
            assert opened[0] >= SLOW_SOCKETS, "the slow clients never connected"
        else:
            assert FLOOD_CONNECTIONS - budget[0] > 100, "the flood never ran"

    return attackers, end


@pytest.mark.parametrize("attack", ["slow-clients", "flood"])
def test_an_attacked_endpoint_of_a_mineru4_worker_is_not_ejected(
    tmp_path: Path, attack: str
) -> None:
    """The same attacks on a MinerU 4.0 worker's native endpoint (its router probes there)."""
    python = sandbox.mineru4_python()
    if python is None:
        pytest.skip(f"set {sandbox.MINERU4_PYTHON_ENV} to a MinerU 4.0 Python")
    with fleet(LINE4, tmp_path, python, env=FLEET4_ENV) as router:
        url = router.worker_url(router.worker_pids()[0])
        response = http_get(f"{url}/v1/health", 30.0)
        assert response is not None and response.status_code == 200, url
        port = response.json()["native_health_port"]
        since = time.time()
        _, end = _attack(port, attack)
        try:
            time.sleep(ATTACK_S)
        finally:
            end()
        time.sleep(2.0)  # probes answered after the attack are in the audit file too
        records = [r for r in router.audit_records(since=since) if "from" in r]
        assert records == [], records


@pytest.mark.parametrize("attack", ["slow-clients", "flood"])
def test_an_attacked_endpoint_is_not_ejected(
    launch_router: Callable[..., Router], attack: str
) -> None:
    router = launch_router({"MINERU_ROUTER_HEALTH_PRESET": "fast"})
    servers = router.wait_in_rotation()
    victim_id, victim = min(servers.items())
    port = _native_port(victim["base_url"])

    _, end_attack = _attack(port, attack)
    out_of_rotation = []
    try:
        end = time.monotonic() + ATTACK_S
        while time.monotonic() < end:
            entry = router.servers().get(victim_id, {})
            if not entry.get("in_rotation", True):
                out_of_rotation.append(entry)
            time.sleep(0.25)
    finally:
        end_attack()

    assert out_of_rotation == [], [e.get("last_error") for e in out_of_rotation]
    records = [r for r in router.audit_records() if "from" in r]  # the policy's transitions
    assert [r["action"] for r in records] == ["admitted", "admitted"], records
    assert router.servers()[victim_id]["consecutive_failures"] == 0

"""How a local worker is launched: with variables of its own, and without waiting for health.

    Local = launching_class(ManagedLocalServer)   # MinerU's local-worker class, either line
    local.launch_env = {"MINERU_HEALTH_PORT": "9101", ...}
    await local.launch(client, ...)               # spawns it; the poller says when it is up

Every port a local worker gets (its main port, its native health port)
comes from ``PORTS``: never the router's own (its ``--port``, which uvicorn
binds only after the workers launched), never one already handed to another
worker, taken under a lock.

    port = PORTS.take("127.0.0.1", "local-gpu-0 health")   # replaces that holder's last one

Not thread-safe but ``PORTS``: the router's loop launches workers one
coroutine at a time.
"""

from __future__ import annotations

import contextvars
import os
import socket
import sys
import threading
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "HEALTH_BIND_ENV",
    "HEALTH_PORT_ENV",
    "PARENT_PID_ENV",
    "PORTS",
    "PortBook",
    "free_port",
    "launching_class",
    "router_ports",
]

#: Variables a local worker gets for one launch (its native endpoint) or all (the router's pid).
HEALTH_PORT_ENV = "MINERU_HEALTH_PORT"
HEALTH_BIND_ENV = "MINERU_HEALTH_BIND"
PARENT_PID_ENV = "MINERU_HEALTH_PARENT_PID"
#: MinerU's routers' port when ``--port`` is not given (both lines).
DEFAULT_ROUTER_PORT = 8002
#: Ports the kernel offers before ``PortBook.take`` gives up (each one held or the router's).
PORT_ATTEMPTS = 64


def router_ports(argv: Sequence[str]) -> set[int]:
    """The port a MinerU router's command line makes it listen on (``--port N`` or
    ``--port=N``; MinerU's default when absent)."""
    ports: set[int] = set()
    for i, arg in enumerate(argv):
        value = (
            argv[i + 1]
            if arg == "--port" and i + 1 < len(argv)
            else arg.partition("=")[2]
            if arg.startswith("--port=")
            else ""
        )
        if value.isdigit():
            ports.add(int(value))
    return ports or {DEFAULT_ROUTER_PORT}


def free_port(host: str) -> int:
    """A port free on ``host`` now (whoever gets it binds it a moment later)."""
    host = host.strip("[]") or "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class PortBook:
    """The ports a router handed to its local workers, one per holder (a worker's main or
    native port): a new one is never the router's own nor another holder's.

    A port the kernel calls free may still be promised: the router binds its
    own only after its workers launched, and a worker binds its port a moment
    after its launch. Thread-safe (one lock).
    """

    def __init__(self, router: Iterable[int] | None = None, pick: Any = free_port) -> None:
        self._lock = threading.Lock()
        self._router = set(router) if router is not None else None
        self._held: dict[str, int] = {}  # holder -> its port
        self._pick = pick  # host -> a port the kernel calls free

    def take(self, host: str, holder: str) -> int:
        """A port for ``holder`` (its previous one given back). Raises ``OSError`` naming
        what it skipped when the kernel keeps offering ports that are not free for it."""
        with self._lock:
            if self._router is None:  # the router's command line, read once
                self._router = router_ports(sys.argv)
            self._held.pop(holder, None)
            taken = set(self._held.values()) | self._router
            for _ in range(PORT_ATTEMPTS):
                port = int(self._pick(host))
                if port not in taken:
                    self._held[holder] = port
                    return port
            raise OSError(
                f"no port for {holder} on {host}: {PORT_ATTEMPTS} offered by the "
                f"kernel were the router's ({sorted(self._router)}) or held by its "
                "workers"
            )

    def held(self) -> dict[str, int]:
        with self._lock:
            return dict(self._held)


#: This router process's book.
PORTS = PortBook()
_holder: contextvars.ContextVar[str] = contextvars.ContextVar(
    "mineru_health_port_holder", default=""
)


def launching_class(base: type) -> type:
    """MinerU's local-worker class, whose processes start with per-launch variables and
    whose ``launch`` starts one without waiting for health (the poller decides that).

    MinerU's ``start`` copies ``os.environ`` right before its ``Popen`` and then
    awaits ``wait_until_ready``: ``launch_env`` is set just before ``start`` and
    restored first thing in ``wait_until_ready``, with no ``await`` in between,
    so no other coroutine ever sees it.
    """

    class LaunchingWorker(base):  # type: ignore[misc]
        launch_env: dict[str, str] | None = None
        _skip_ready = False
        _saved_env: dict[str, str | None] | None = None

        async def start(self, *args: Any, **kwargs: Any) -> None:
            _holder.set(f"{getattr(self, 'worker_id', '') or id(self)} main")
            if self.launch_env:
                self._saved_env = {name: os.environ.get(name) for name in self.launch_env}
                os.environ.update(self.launch_env)
            try:
                await super().start(*args, **kwargs)
            finally:
                self._restore_env()  # start failed before its Popen, or is done

        async def launch(self, *args: Any, **kwargs: Any) -> None:
            """Spawns the process; the poller, not MinerU's health wait, says when it is up."""
            self._skip_ready = True
            try:
                await self.start(*args, **kwargs)
            finally:
                self._skip_ready = False

        async def wait_until_ready(self, *args: Any, **kwargs: Any) -> None:
            self._restore_env()  # the process is spawned: the variables did their job
            if not self._skip_ready:
                await super().wait_until_ready(*args, **kwargs)

        def _restore_env(self) -> None:
            saved, self._saved_env = self._saved_env, None
            for name, value in (saved or {}).items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    LaunchingWorker.__name__ = LaunchingWorker.__qualname__ = base.__name__
    _book_ports_of(sys.modules.get(base.__module__))
    return LaunchingWorker


def _book_ports_of(module: Any) -> None:
    """MinerU 4.0 picks a worker's port inside ``start`` (its module's ``reserve_local_port``):
    that function takes it from ``PORTS`` instead, for the worker being started."""
    original = getattr(module, "reserve_local_port", None)
    if original is None or getattr(original, "_mineru_health", False):
        return

    def reserve_local_port(host: str) -> int:
        return PORTS.take(str(host), _holder.get() or f"worker {len(PORTS.held())}")

    reserve_local_port._mineru_health = True  # type: ignore[attr-defined]
    module.reserve_local_port = reserve_local_port

"""How a local worker is launched: with variables of its own, and without waiting for health.

    Local = launching_class(ManagedLocalServer)   # MinerU's local-worker class, either line
    local.launch_env = {"MINERU_HEALTH_PORT": "9101", ...}
    await local.launch(client, ...)               # spawns it; the poller says when it is up

Not thread-safe: the router's loop launches workers one coroutine at a time.
"""

from __future__ import annotations

import os
import socket
from typing import Any

__all__ = ["HEALTH_BIND_ENV", "HEALTH_PORT_ENV", "PARENT_PID_ENV", "free_port",
           "launching_class"]

#: Variables a local worker gets for one launch (its native endpoint) or all (the router's pid).
HEALTH_PORT_ENV = "MINERU_HEALTH_PORT"
HEALTH_BIND_ENV = "MINERU_HEALTH_BIND"
PARENT_PID_ENV = "MINERU_HEALTH_PARENT_PID"


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
    return LaunchingWorker


def free_port(host: str) -> int:
    """A port free on ``host`` now (the worker binds it a moment later)."""
    host = host.strip("[]") or "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])

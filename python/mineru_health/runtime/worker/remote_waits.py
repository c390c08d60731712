"""Bounds on a task's remote waits: the I/O half (issue 32).

A *remote wait* (:mod:`.engine_calls`) is a task waiting on an engine server
it named (``server_url`` with an ``*-http-client`` backend). The native
worker state bounds it twice: the server sending nothing for
``MINERU_HEALTH_TASK_HANG_S`` (when set), and the wait lasting
``MINERU_HEALTH_REMOTE_WAIT_S`` in all. The worker's watcher fails a task
past either bound (``line.fail_remote_waits``, on 3.x); this module ends the
wait's I/O too, so that no thread, connection or MinerU lock stays held:

* silence is measured where MinerU's client (httpx) sends and reads: from
  each request sent (each try), until a response's head is complete, then
  between the chunks of its body. A server that trickles its head byte by
  byte is silent until the head is complete; a wait with no request out yet
  (a task waiting on MinerU's model lock, or working locally) is not silence,
  only the total bound runs.
* every request sent inside a remote wait (each retry of MinerU's client
  too) has its connect, read and write timeouts capped to what is left of
  the bounds, and is refused with :class:`RemoteWaitExceeded` once a bound
  is past, or once its task has ended (a thread the watcher could not stop,
  still building a client for a task it already failed); each body chunk
  read then raises it too.

Outside a remote wait (the task in context is not waiting on a server)
httpx is left as it is.

Thread-safety: the wrappers run on any thread; install() runs once, at
start-up (idempotent).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

from .health import WorkerHealth

__all__ = [
    "RemoteWaitExceeded",
    "configured_server",
    "describe",
    "install",
    "server_name",
    "waiting",
]

#: The smallest timeout a capped request gets (seconds).
_MIN_TIMEOUT_S = 0.05
_MARK = "__mineru_health_remote_bounds__"

#: The task whose remote wait the code in this context runs in ("" outside one),
#: and whether the task watchdog tracked it when the wait began.
_waiting_task: contextvars.ContextVar[tuple[str, bool]] = contextvars.ContextVar(
    "mineru_health_remote_wait", default=("", False)
)


class RemoteWaitExceeded(Exception):
    """A remote wait went past a bound: the task fails alone (its server's fault)."""


def server_name(url: object) -> str:
    """``host:port`` of an engine server's URL: no user, password, path or query."""
    try:
        parts = urlsplit(str(url or ""))
        host = parts.hostname or ""
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return ""
    if not host:
        return ""
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{port}" if port else host


def configured_server(server_url: object) -> str:
    """host:port of ``server_url``, or of MinerU's default server (``MINERU_VL_SERVER``)."""
    return server_name(server_url or os.environ.get("MINERU_VL_SERVER", ""))


def describe(status: Any, *, task_hang_s: float, remote_wait_s: float) -> str:
    """The task's error: which server, which bound, and that it failed alone."""
    server = status.server or "its engine server"
    if status.reason == "silent":
        what = f"sent nothing for {task_hang_s:g} s (MINERU_HEALTH_TASK_HANG_S)"
    else:
        what = f"kept it waiting {remote_wait_s:g} s (MINERU_HEALTH_REMOTE_WAIT_S)"
    return (
        f"mineru-health: the remote engine server {server} {what}; this task "
        "failed alone (not this worker's fault); resubmit it once the server answers"
    )


@contextlib.contextmanager
def waiting(health: WorkerHealth, task_id: str, server: str) -> Iterator[None]:
    """The block is a remote wait of ``task_id`` on ``server`` (host:port)."""
    with health.remote_wait(task_id, server):
        token = _waiting_task.set((task_id, health.remote_wait_status(task_id) is not None))
        try:
            yield
        finally:
            _waiting_task.reset(token)


class _Bound:
    """One request sent inside a remote wait: checked, timed and heard."""

    def __init__(
        self,
        health: WorkerHealth,
        task_id: str,
        tracked: bool,
        settings: Callable[[], Any],
        request: Any,
    ) -> None:
        self._health = health
        self._task_id = task_id
        self._tracked = tracked
        self._settings = settings
        self._server = server_name(getattr(request, "url", ""))

    def check(self) -> float | None:
        """Raises once a bound is past; else the seconds left (None: unbounded)."""
        status = self._health.remote_wait_status(self._task_id)
        if status is None:
            if self._tracked:  # its task ended (failed, cancelled): nobody waits for it
                raise RemoteWaitExceeded(
                    f"mineru-health: the task waiting on {self._server or 'its server'} "
                    "has ended; its request to that server is abandoned"
                )
            return None
        if status.reason:
            settings = self._settings()
            named = _Named(status.reason, status.server or self._server)
            raise RemoteWaitExceeded(
                describe(
                    named, task_hang_s=settings.task_hang_s, remote_wait_s=settings.remote_wait_s
                )
            )
        return None if status.left_s is None else float(status.left_s)

    def cap_timeouts(self, request: Any, left_s: float | None) -> None:
        if left_s is None:
            return
        cap = max(_MIN_TIMEOUT_S, left_s)
        extensions = getattr(request, "extensions", None)
        if not isinstance(extensions, dict):
            return
        timeouts = dict(extensions.get("timeout") or {})
        for key in ("connect", "read", "write", "pool"):
            current = timeouts.get(key)
            timeouts[key] = cap if current is None else min(float(current), cap)
        extensions["timeout"] = timeouts

    def asked(self) -> None:
        self._health.remote_asked(self._task_id, self._server)

    def heard(self) -> None:
        self._health.remote_heard(self._task_id, self._server)


class _Named:
    """Why a wait failed and the server: the wait's, else the one the request went to."""

    def __init__(self, reason: str, server: str) -> None:
        self.reason = reason
        self.server = server


#: How often a task queued on a lock looks at its own wait (seconds).
_LOCK_POLL_S = 0.25


def wait_for_lock(
    lock: Any, health: Callable[[], WorkerHealth], settings: Callable[[], Any] | None
) -> None:
    """Waits until ``lock`` is free (not taking it), as long as this remote wait may go on.

    MinerU builds http clients one at a time under one lock: a task queued
    behind a hostile server's build holds a thread of MinerU's small pool
    meanwhile. It leaves the queue once its task has ended or its wait went
    past a bound (:class:`RemoteWaitExceeded`), instead of when the lock
    comes to it. ``settings()``: the worker's (None: no bounds known, no wait here).
    """
    task_id, tracked = _waiting_task.get()
    if not task_id or settings is None or not hasattr(lock, "acquire"):
        return
    bound = _Bound(health(), task_id, tracked, settings, None)
    while not lock.acquire(timeout=_LOCK_POLL_S):
        bound.check()
    lock.release()


def _bound_for(
    health: Callable[[], WorkerHealth], settings: Callable[[], Any], request: Any
) -> _Bound | None:
    task_id, tracked = _waiting_task.get()
    if not task_id:
        return None
    bound = _Bound(health(), task_id, tracked, settings, request)
    # Asked first: the silence this request may keep starts now, and its timeouts
    # are capped to it (capped before, a first request got the total bound's
    # minutes and held MinerU's model lock past its task's failure).
    bound.asked()
    bound.cap_timeouts(request, bound.check())
    return bound


def _sync_stream(httpx: Any, inner: Any, bound: _Bound) -> Any:
    class HeardStream(httpx.SyncByteStream):  # type: ignore[misc]
        def __iter__(self) -> Iterator[bytes]:
            for chunk in inner:
                bound.heard()
                bound.check()
                yield chunk

        def close(self) -> None:
            inner.close()

    return HeardStream()


def _async_stream(httpx: Any, inner: Any, bound: _Bound) -> Any:
    class HeardStream(httpx.AsyncByteStream):  # type: ignore[misc]
        async def __aiter__(self) -> AsyncIterator[bytes]:
            async for chunk in inner:
                bound.heard()
                bound.check()
                yield chunk

        async def aclose(self) -> None:
            await inner.aclose()

    return HeardStream()


def _wrap_transports(
    httpx: Any, health: Callable[[], WorkerHealth], settings: Callable[[], Any]
) -> None:
    sync_class, async_class = httpx.HTTPTransport, httpx.AsyncHTTPTransport
    send = sync_class.handle_request
    if not getattr(send, _MARK, False):

        @functools.wraps(send)
        def handle_request(transport: Any, request: Any) -> Any:
            bound = _bound_for(health, settings, request)
            response = send(transport, request)
            if bound is not None:
                bound.heard()  # the response's head
                response.stream = _sync_stream(httpx, response.stream, bound)
            return response

        setattr(handle_request, _MARK, True)
        sync_class.handle_request = handle_request

    send_async = async_class.handle_async_request
    if not getattr(send_async, _MARK, False):

        @functools.wraps(send_async)
        async def handle_async_request(transport: Any, request: Any) -> Any:
            bound = _bound_for(health, settings, request)
            response = await send_async(transport, request)
            if bound is not None:
                bound.heard()
                response.stream = _async_stream(httpx, response.stream, bound)
            return response

        setattr(handle_async_request, _MARK, True)
        async_class.handle_async_request = handle_async_request


def install(
    health: Callable[[], WorkerHealth],
    settings: Callable[[], Any],
    on_import: Callable[[str, Callable[[Any], None]], None],
) -> None:
    """Wraps httpx's transports when httpx is imported (idempotent).

    ``settings()``: the worker's settings (``task_hang_s``, ``remote_wait_s``),
    read when an error is written.
    """
    on_import("httpx", functools.partial(_wrap_transports, health=health, settings=settings))

"""The main port's gate: ASGI middleware in front of a MinerU worker's app, either line.

A dead engine answers the health path with 503 and refuses the submission
paths with a 503 whose error carries the worker's own verdict
(``REFUSAL_ERROR_PREFIX``); a healthy health answer advertises the native
port. Each line's subclass names its paths and what starts once MinerU's
start-up is over (``started``, ``stopped``).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ..verdict import REFUSAL_ERROR_PREFIX
from .health import fatal_cause
from .log import log
from .worker_runtime import ASGIApp, WorkerRuntime


async def _send_json(
    send: Callable[[Any], Awaitable[None]],
    status: int,
    payload: bytes,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode("ascii")),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


#: A body larger than this is passed on as it is (it is not MinerU's small JSON).
_EDIT_MAX_BYTES = 64 * 1024

#: Adds to a JSON object answered by MinerU (in place).
JsonEdit = Callable[[dict[str, Any]], None]


def _editing_send(
    send: Callable[[Any], Awaitable[None]], edit: JsonEdit
) -> Callable[[Any], Awaitable[None]]:
    """Lets ``edit`` add to MinerU's small JSON answer (a non-JSON one is passed on as is).

    The body may come in chunks (4.0's ``BaseHTTPMiddleware`` streams it and
    ends with an empty one): they are held until the last, up to a bound.
    """
    held: list[Any] = []
    parts: list[bytes] = []

    async def flush() -> None:
        for message in held:
            await send(message)
        held.clear()
        parts.clear()

    async def wrapped(message: Any) -> None:
        kind = message.get("type")
        if kind == "http.response.start" and not held:
            held.append(message)
            return
        if kind != "http.response.body" or not held:
            await flush()
            await send(message)
            return
        parts.append(message.get("body", b""))
        if message.get("more_body", False):
            held.append({**message, "more_body": True})
            if sum(map(len, parts)) > _EDIT_MAX_BYTES:
                await flush()
            return
        start = held[0]
        body = b"".join(parts)
        headers = list(start.get("headers", []))
        encoded = any(k.lower() == b"content-encoding" for k, _ in headers)
        with contextlib.suppress(ValueError, TypeError):
            if not encoded:
                data = json.loads(body)
                if isinstance(data, dict):
                    edit(data)
                    body = json.dumps(data).encode("utf-8")
                    headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
                    headers.append((b"content-length", str(len(body)).encode("ascii")))
        held.clear()
        parts.clear()
        await send({**start, "headers": headers})
        await send({**message, "body": body})

    return wrapped


class HealthGate:
    """ASGI middleware on the main port: a dead engine answers 503 and refuses new work.

    The paths are class attributes; ``started`` runs once MinerU's start-up
    (model preload included) is over, from when a blocked loop is a hung loop,
    and ``stopped`` at its shut-down: each MinerU line's subclass names its own.
    ``runtime``: the app's, from ``install`` (``app.add_middleware(gate, runtime=...)``).
    """

    health_paths: frozenset[str] = frozenset()
    gated_posts: frozenset[str] = frozenset()

    def __init__(self, app: ASGIApp, runtime: WorkerRuntime) -> None:
        self.app = app
        self.runtime = runtime

    def answer_edit(self, method: str, path: str) -> JsonEdit | None:
        """What to add to MinerU's JSON answer to this request (a line's job verdict), if any."""
        return None

    def started(self) -> None:
        """MinerU's start-up is over (the line's watcher starts here)."""

    def stopped(self) -> None:
        """MinerU shut down."""

    def lifespan(self, send: Callable[[Any], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
        async def wrapped(message: Any) -> None:
            kind = message.get("type") if isinstance(message, dict) else None
            if kind == "lifespan.startup.complete":
                self.started()
            elif kind in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
                self.stopped()
            await send(message)

        return wrapped

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        kind = scope.get("type")
        if kind == "lifespan":
            await self.app(scope, receive, self.lifespan(send))
            return
        if kind != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", "")).rstrip("/") or "/"
        method = scope.get("method", "")
        is_health = method in ("GET", "HEAD") and path in self.health_paths
        gated = is_health or (method == "POST" and path in self.gated_posts)
        runtime = self.runtime
        health = runtime.health
        if gated and not health.healthy:
            status, body = health.answer("/health", expose_errors=runtime.settings.expose_errors)
            if is_health:
                await _send_json(send, status, body)
            else:
                data = json.loads(body)
                # The body already names the first fatal's rule and category.
                what = (
                    f"{data['category']}, rule {data['rule']}"
                    if data.get("rule")
                    else fatal_cause(None)
                )
                data["error"] = f"{REFUSAL_ERROR_PREFIX} {what}"
                data["message"] = (
                    "The inference engine of this worker is unusable; the request was not "
                    "accepted. Retry on a healthy worker."
                )
                retry = str(runtime.settings.retry_after_s).encode("ascii")
                await _send_json(
                    send, 503, json.dumps(data).encode("utf-8"), [(b"retry-after", retry)]
                )
            return
        edit = self.answer_edit(method, path)
        if is_health and runtime.advertised_port is not None:
            port = runtime.advertised_port
            edit = functools.partial(_advertise, port)
        if edit is not None:
            send = _editing_send(send, edit)
        if not gated:
            await self.app(scope, receive, send)
            return
        started = False

        async def watched_send(message: Any) -> None:
            nonlocal started
            started = started or message.get("type") == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        except OSError as error:
            if started or error.errno not in _STORAGE_FULL:
                raise
            await _refuse_storage_full(runtime, send, error)


#: A full disk or quota where the worker stores uploads and outputs (resource, not a bug).
_STORAGE_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


async def _refuse_storage_full(
    runtime: WorkerRuntime, send: Callable[[Any], Awaitable[None]], error: OSError
) -> None:
    """507 naming the resource, where MinerU answered a bare 500: the client can tell a full
    disk from a bug, and retry elsewhere. The worker stays healthy (its engine is fine)."""
    where = f" ({error.filename})" if error.filename else ""
    reason = os.strerror(error.errno) if error.errno is not None else str(error)
    runtime.health.record_storage_full()
    log("ERROR", f"a submission failed: {reason}{where}; answered 507")
    body = {
        "error": "insufficient_storage",
        "message": f"The worker cannot store the submission: {reason}{where}. "
        "Free space on its output directory, or retry on another worker.",
    }
    retry = str(runtime.settings.retry_after_s).encode("ascii")
    await _send_json(send, 507, json.dumps(body).encode("utf-8"), [(b"retry-after", retry)])


def _advertise(port: int, data: dict[str, Any]) -> None:
    data["native_health_port"] = port

"""4.0's router health says whether the router's store can be reached (issue 35).

4.0 defines ``GET /v1/health`` inside ``create_app`` after ``install_app`` runs, so the
route cannot be wrapped there; an ASGI middleware adds
``"store": {"reachable": ...}`` (``stores.add_store_field``) to that answer's JSON
object and passes every other request straight through. The status is 4.0's own (200
with a healthy worker): a router whose database is down still answers for what it holds.

    app.add_middleware(StoreInHealth, store_of=lambda: line.supervisor.store)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from mineru_health.runtime.router.stores import Store, add_store_field

__all__ = ["HEALTH_PATH", "StoreInHealth"]

#: 4.0's router health.
HEALTH_PATH = "/v1/health"
#: Bytes of a health answer read to add the field to (4.0's is a few hundred).
_MAX_BODY = 1 << 16


class StoreInHealth:
    """ASGI middleware: the store's field in ``GET /v1/health``'s JSON answer."""

    def __init__(self, app: Any, store_of: Callable[[], Store | None]) -> None:
        self.app = app
        self._store_of = store_of

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("path") != HEALTH_PATH:
            await self.app(scope, receive, send)
            return
        start: dict[str, Any] = {}
        body = bytearray()
        passing = False  # an answer too large to be 4.0's health: sent as it is

        async def hold(message: dict[str, Any]) -> None:
            nonlocal passing
            if passing or message["type"] not in ("http.response.start", "http.response.body"):
                await send(message)
                return
            if message["type"] == "http.response.start":
                start.update(message)
                return
            body.extend(message.get("body", b""))
            if message.get("more_body"):
                if len(body) > _MAX_BODY:
                    passing = True
                    await send(start)
                    await send(
                        {"type": "http.response.body", "body": bytes(body), "more_body": True}
                    )
                return
            answer = self._with_store(bytes(body))
            length = str(len(answer)).encode()
            headers = [
                (name, length if name.lower() == b"content-length" else value)
                for name, value in start.get("headers", [])
            ]
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": answer})

        await self.app(scope, receive, hold)

    def _with_store(self, body: bytes) -> bytes:
        try:
            payload = json.loads(body)
        except ValueError:
            return body
        if not isinstance(payload, dict):
            return body
        add_store_field(payload, self._store_of())
        return json.dumps(payload).encode()

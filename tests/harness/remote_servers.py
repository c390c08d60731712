"""Engine servers a hostile user may name in ``server_url`` (issue 32), on loopback.

    with hostile_server("silent") as url: ...             # accepts, never answers
    with hostile_server("trickle", every_s=2.0) as url: ...  # a head, then a byte every 2 s

``silent`` accepts the connection and reads the request, and sends nothing.
``trickle`` lists one model (so MinerU builds its client), and answers any
other request with a complete response head (200, a body of a megabyte
announced) and then one byte of the body every ``every_s``: MinerU's client
(a 600-s read timeout between bytes) would wait for it about a week. Both
stop on their own after ``max_s`` per connection, and when the block ends.
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
import time
from collections.abc import Iterator

_MODEL_LIST = b'{"object": "list", "data": [{"id": "hostile", "object": "model"}]}'
_MODELS = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
    b"Content-Length: " + str(len(_MODEL_LIST)).encode() + b"\r\n\r\n" + _MODEL_LIST
)
_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"


@contextlib.contextmanager
def hostile_server(mode: str, *, every_s: float = 2.0, max_s: float = 120.0) -> Iterator[str]:
    """Serves ``mode`` ("silent" or "trickle") on a free loopback port; yields its URL."""
    if mode not in ("silent", "trickle"):
        raise ValueError(f"unknown mode {mode!r}")
    stop = threading.Event()

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            conn: socket.socket = self.request
            conn.settimeout(0.2)
            head = b""
            deadline = time.monotonic() + max_s
            while b"\r\n\r\n" not in head and time.monotonic() < deadline and not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    head += chunk
            if mode == "trickle" and head.startswith(b"GET /v1/models"):
                with contextlib.suppress(OSError):  # a client is built; its completions trickle
                    conn.sendall(_MODELS)
                return
            if mode == "trickle":
                with contextlib.suppress(OSError):
                    conn.sendall(_HEAD)
            while time.monotonic() < deadline and not stop.wait(every_s):
                if mode == "trickle":
                    try:
                        conn.sendall(b" ")
                    except OSError:
                        return  # the client gave up

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True

    server = Server(("127.0.0.1", 0), Handler)
    serving = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": 0.1},
        name=f"hostile-{mode}",
        daemon=True,
    )
    serving.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
        serving.join(5.0)

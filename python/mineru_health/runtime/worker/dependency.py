"""The worker's own engine server: a dependency whose death is the worker's (issue 33, item 4).

An operator who runs the VLM as a dedicated server (``vllm serve``, OpenAI
compatible) configures it for the worker: 3.x's ``MINERU_VL_SERVER`` (what
MinerU's http client uses when a task names no ``server_url``), 4.0's
``model.vlm.server_url`` (``--vlm-server-url``). That server is the worker's
engine: when it dies, every task the worker takes fails, so the worker must
leave rotation. A server a tenant names in a task's own ``server_url`` is not
(its failures stay the task's, :mod:`.remote_waits`).

When a task on the worker's own server fails and no rule called it fatal,
the judge asks :func:`check` whether the server still answers: ``GET /health``
on its host and port, bounded by the verifier's timeout
(``MINERU_HEALTH_VERIFY_S``; 0 turns the check off). Down: no connection, no
answer within the bound, or a 5xx (vLLM's own answer while its engine is
dead). Any other answer (a 404 from a server without ``/health`` included)
is a live server, and the failure stays task-local. A down server is
recorded as fatal (rule :data:`RULE`, category :data:`CATEGORY`, the server
named in the record), which ``/health`` reports like an engine's death.

The check uses the standard library's HTTP client, outside MinerU's httpx
(whose requests :mod:`.remote_waits` bounds per task). Thread-safety: any
thread; it blocks up to its bound, so callers keep it off an event loop.
"""

from __future__ import annotations

import http.client
import os
from collections.abc import Callable
from urllib.parse import urlsplit

from ...safe_text import describe_exception
from . import remote_waits

__all__ = ["CATEGORY", "RULE", "check", "configured_server", "describe_down", "is_own"]

#: The rule and category of a fatal record for the worker's own engine server, down.
RULE = "dependency.engine_server"
CATEGORY = "dependency_down"
#: 3.x: the server MinerU's http client uses when a task names none.
SERVER_ENV = "MINERU_VL_SERVER"

#: A connection to ``host:port``: (host, port, timeout_s) -> the connection to ask.
Connect = Callable[[str, int, float], http.client.HTTPConnection]


def configured_server(env: dict[str, str] | None = None) -> str:
    """host:port of the server the operator configured for a 3.x worker ("" when none)."""
    source = os.environ if env is None else env
    return remote_waits.server_name(source.get(SERVER_ENV, ""))


def is_own(task_server_url: object, own: str) -> bool:
    """A remote task's server is the worker's own: it names none (MinerU uses the
    configured one) or names that same host:port."""
    if not own:
        return False
    named = remote_waits.server_name(task_server_url) if task_server_url else ""
    return not named or named == own


def _connect(host: str, port: int, timeout_s: float) -> http.client.HTTPConnection:
    return http.client.HTTPConnection(host, port, timeout=timeout_s)


def check(server: str, timeout_s: float, connect: Connect = _connect) -> str:
    """Why ``server`` (host:port) is down, or "" when it answers. Never raises."""
    try:
        parts = urlsplit(f"http://{server}")
        host, port = parts.hostname or "", parts.port or 80
    except ValueError:
        return ""  # not a server we can name: no evidence either way
    if not host or timeout_s <= 0:
        return ""
    conn = connect(host, port, timeout_s)
    try:
        conn.request("GET", "/health")
        status = conn.getresponse().status
    except (OSError, http.client.HTTPException) as exc:
        return f"GET /health: {describe_exception(exc)}"
    finally:
        conn.close()
    return f"GET /health answered {status}" if status >= 500 else ""


def describe_down(server: str, why: str, failure: BaseException) -> str:
    """The fatal record's text: the dependency, why it is down, the task's own failure."""
    return (
        f"the worker's engine server {server} is down ({why}); the task failed with "
        f"{describe_exception(failure)}"
    )

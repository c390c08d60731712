"""A router store URL that cannot be used stops ``mineru-router`` at start-up, naming the
variable (issue 35, item 2): one line, no traceback, never the URL's password.

The patched 3.x ``mineru-router`` with ``MINERU_ROUTER_HEALTH_STORE_URL`` naming another
database kind, then a PostgreSQL on a loopback port where nothing listens.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest
from conftest import Router, wait_until

pytestmark = pytest.mark.integration

VARIABLE = "MINERU_ROUTER_HEALTH_STORE_URL"


def test_a_store_url_that_cannot_be_used_stops_the_router_naming_it(
    launch_router: Callable[..., Router],
) -> None:
    with socket.socket() as unused:  # bound, never listening: connections are refused
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
        for url in (
            "mysql://mineru:secret@db/routers",
            f"postgresql://mineru:secret@127.0.0.1:{port}/routers",
        ):
            router = launch_router({VARIABLE: url})
            assert wait_until(lambda r=router: r.proc.poll() is not None, 60), url
            log = router.proc.log_tail(6000)
            assert router.proc.poll() != 0, log
            assert f"mineru-router refuses to start: {VARIABLE}" in log, log
            assert "secret" not in log and "Traceback" not in log, log

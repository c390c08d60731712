"""The worker's own engine server (the operator's): down, it is the worker's death; a tenant's
``server_url`` never is. Servers on loopback, answered by the test's own handler."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import socket
import threading
import types
from collections.abc import Iterator

import pytest
from mineru_health.mineru3.worker import tasks
from mineru_health.runtime.worker import dependency, judge
from mineru_health.runtime.worker.health import Recorded
from mineru_health.runtime.worker.worker_runtime import WorkerRuntime


@contextlib.contextmanager
def answering(status: int) -> Iterator[str]:
    """A loopback server whose every GET answers ``status``; yields its host:port."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def closed_port() -> str:
    """host:port where nothing listens (a port bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_a_server_that_answers_is_up_and_one_that_does_not_is_down() -> None:
    with answering(200) as up, answering(404) as without_health, answering(503) as dead:
        assert dependency.check(up, 2.0) == ""
        assert dependency.check(without_health, 2.0) == ""  # it answers: alive
        assert dependency.check(dead, 2.0) == "GET /health answered 503"
    assert "GET /health: " in dependency.check(closed_port(), 2.0)
    assert dependency.check(closed_port(), 0.0) == ""  # checks off: no evidence


def test_only_the_configured_server_is_the_workers_own() -> None:
    env = {dependency.SERVER_ENV: "http://127.0.0.1:30000/"}
    own = dependency.configured_server(env)
    assert own == "127.0.0.1:30000"
    assert dependency.is_own(None, own)  # MinerU uses the configured one
    assert dependency.is_own("http://127.0.0.1:30000/v1", own)
    assert not dependency.is_own("http://10.0.0.9:8000", own)  # a tenant's
    assert not dependency.is_own(None, dependency.configured_server({}))


def test_3x_tasks_name_the_workers_server_only_when_it_is_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(dependency.SERVER_ENV, "http://127.0.0.1:30000")

    def task(backend: str, server_url: str | None) -> object:
        return types.SimpleNamespace(backend=backend, server_url=server_url)

    assert tasks._own_server(task("vlm-http-client", None)) == "127.0.0.1:30000"
    assert tasks._own_server(task("hybrid-http-client", "http://127.0.0.1:30000")) != ""
    assert tasks._own_server(task("vlm-http-client", "http://127.0.0.1:9")) == ""
    assert tasks._own_server(task("vlm-engine", None)) == ""
    monkeypatch.delenv(dependency.SERVER_ENV)
    assert tasks._own_server(task("vlm-http-client", None)) == ""


def test_the_own_server_down_makes_the_worker_unhealthy_named_a_dependency(
    runtime: WorkerRuntime,
) -> None:
    failure = ConnectionError("All connection attempts failed")
    outcome = judge.judge(
        runtime, failure, remote_engine=True, item_id="t1", own_server=closed_port()
    )
    assert outcome.fatal and outcome.first
    assert (outcome.rule, outcome.category) == (dependency.RULE, dependency.CATEGORY)
    assert runtime.trigger_task == "t1"
    verdict = judge.task_verdict(outcome).to_wire()
    assert verdict["engine_dead"] is True, verdict  # the router resubmits it
    status, body = runtime.health.answer("/health")
    answer = json.loads(body)
    assert status == 503 and answer["rule"] == dependency.RULE, answer
    assert answer["category"] == dependency.CATEGORY, answer


def test_a_live_own_server_or_a_tenants_server_leaves_the_failure_task_local(
    runtime: WorkerRuntime,
) -> None:
    failure = ConnectionError("All connection attempts failed")
    with answering(200) as up:
        live = judge.judge(runtime, failure, remote_engine=True, own_server=up)
    tenants = judge.judge(runtime, failure, remote_engine=True, own_server="")
    assert not live.fatal and not tenants.fatal
    assert runtime.health.healthy
    assert runtime.health.snapshot().task_local_count == 2


def test_on_an_event_loop_the_check_runs_on_a_thread_and_records_the_death(
    runtime: WorkerRuntime,
) -> None:
    """4.0 asks on an event loop: the answer is not held up, the record follows."""
    failure = ConnectionError("All connection attempts failed")

    async def ask() -> Recorded:
        return judge.judge(runtime, failure, remote_engine=True, own_server=closed_port())

    outcome = asyncio.run(ask())
    assert not outcome.fatal  # MinerU fails this job as it would
    assert runtime.health.wait_until_unhealthy(10.0), runtime.health.snapshot()
    first = runtime.health.snapshot().first_fatal
    assert first is not None and first.rule == dependency.RULE, first

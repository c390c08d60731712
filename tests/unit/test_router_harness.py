"""mineru_health.demo.fleet against a fake router on loopback: the job client of both lines,
the stream's outcomes, the rotation log and the fault run (no MinerU)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from harness.samplers import run_fault
from mineru_health.demo.fleet import (
    LINE3,
    LINE4,
    Client,
    Line,
    Router,
    Stream,
)
from mineru_health.demo.processes import ManagedProcess

pytest.importorskip("httpx")


class FakeRouter(ThreadingHTTPServer):
    """Tasks complete on their third status; names say otherwise ("refuse", "bad", "hang")."""

    def __init__(self, line: Line) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.line = line
        self.lock = threading.Lock()
        self.tasks: dict[str, list[Any]] = {}  # id -> [name, statuses asked]
        self.in_rotation = 2

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeRouter

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"])).decode("latin-1")
        name = body.split('filename="', 1)[1].split('"', 1)[0]
        if "refuse" in name:
            self._answer(503, {"error": "no worker"})
            return
        with self.server.lock:
            task_id = f"t{len(self.server.tasks)}"
            self.server.tasks[task_id] = [name, 0]
        self._answer(202, {"task_id": task_id})

    def do_GET(self) -> None:
        fake, tasks = self.server, f"{self.server.line.tasks}/"
        if self.path.startswith(tasks):
            with fake.lock:
                entry = fake.tasks[self.path[len(tasks) :]]
                entry[1] += 1
            name, asked = entry
            status = (
                "running"
                if asked < 3 or "hang" in name
                else ("failed" if "bad" in name else "completed")
            )
            self._answer(200, {"status": status, "attempts": 1, "name": name})
        elif self.path == "/v1/usage":
            self._answer(200, {"limits": {"max_concurrent_jobs": fake.in_rotation}})
        else:
            servers = [
                {"server_id": f"w{i}", "in_rotation": i < fake.in_rotation} for i in range(2)
            ]
            self._answer(200, {"servers": servers})


@pytest.fixture(params=[LINE3, LINE4], ids=["3", "4.0"])
def fake(request: pytest.FixtureRequest) -> Iterator[FakeRouter]:
    server = FakeRouter(request.param)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    thread.join(10)
    server.server_close()


def test_a_stream_ends_each_document_as_its_router_says(fake: FakeRouter) -> None:
    client = Client(fake.base, fake.line, poll_s=0.01)
    names = ["a.pdf", "refuse.pdf", "bad.pdf", "hang.pdf", "b.pdf"]
    with Stream(
        client,
        lambda n: (names[n], b"%PDF-"),
        every_s=0.01,
        count=len(names),
        task_timeout_s=5.0,
        poll_s=0.01,
    ) as stream:
        outcomes = stream.outcomes(30.0)
    assert [(o.name, o.status, o.number) for o in outcomes] == [
        ("a.pdf", "completed", 0),
        ("refuse.pdf", "rejected", 1),
        ("bad.pdf", "failed", 2),
        ("hang.pdf", "hung", 3),
        ("b.pdf", "completed", 4),
    ]
    assert outcomes[1].detail["code"] == 503 and outcomes[0].detail["name"] == "a.pdf"
    assert len(client.task_ids) == 4
    assert client.run("c.pdf", b"%PDF-").status == "completed"


def test_a_fault_run_reads_out_and_back_from_the_rotation(fake: FakeRouter, tmp_path: Path) -> None:
    proc = ManagedProcess.__new__(ManagedProcess)
    proc.base_url = fake.base
    router = Router(fake.line, proc, tmp_path, workers=2)

    def inject() -> None:
        fake.in_rotation = 1
        threading.Timer(1.0, lambda: setattr(fake, "in_rotation", 2)).start()

    run = run_fault(
        router,
        inject,
        client=Client(fake.base, fake.line, poll_s=0.01),
        document=lambda n: (f"doc{n}.pdf", b"%PDF-"),
        every_s=0.1,
        warm=2,
        recovery_timeout_s=10.0,
        task_timeout_s=30.0,
        after_s=0.2,
        poll_s=0.05,
    )
    assert len(run.before) >= 2 and len(run.outcomes) > len(run.before) and not run.lost
    assert run.out_at is not None and run.back_at is not None
    assert run.fault_at <= run.out_at < run.back_at

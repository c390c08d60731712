"""Shared by the MinerU 4.0 integration tests: a patched ``mineru-api`` 4.0 on loopback.

Skips unless ``MINERU_HEALTH_MINERU4_PYTHON`` names the interpreter of a
MinerU 4.0 venv (``scripts/setup.sh`` makes ``.venv-mineru4``). The worker
runs the flash tier offline, ``MINERU_HOME``/``HOME`` in a scratch
directory, with the fault plan plugin of the test sandbox.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from mineru_health.testing import sandbox
from mineru_health.testing.sandbox import ManagedProcess, Processes, free_port, wait_until

if TYPE_CHECKING:
    from typing_extensions import Self

START_TIMEOUT_S = 180.0
JOB_TIMEOUT_S = 300.0


@dataclass
class Worker4:
    proc: ManagedProcess
    base_url: str
    native_url: str
    plan: Path

    def get(self, path: str, timeout_s: float = 10.0) -> httpx.Response:
        return httpx.get(f"{self.base_url}{path}", timeout=timeout_s)

    def native(self, path: str = "/health", timeout_s: float = 5.0) -> httpx.Response:
        return httpx.get(f"{self.native_url}{path}", timeout=timeout_s)

    def submit(self, pdf: bytes, *, path: str = "/v1/tasks", name: str = "doc.pdf",
               formats: tuple[str, ...] = ("markdown",),
               timeout_s: float = 60.0) -> httpx.Response:
        params: list[tuple[str, str | int | float | bool | None]] = [("tier", "flash")]
        params += [("output_formats", f) for f in formats]
        return httpx.post(f"{self.base_url}{path}", params=params,
                          files={"files": (name, pdf, "application/pdf")}, timeout=timeout_s)

    def job(self, task_id: str) -> dict[str, Any]:
        # 4.0 answers on the loop it blocks for most of a minute after a large job.
        response = self.get(f"/v1/tasks/{task_id}", timeout_s=600.0)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def wait_terminal(self, task_id: str, timeout_s: float = JOB_TIMEOUT_S) -> dict[str, Any]:
        def terminal() -> dict[str, Any] | None:
            body = self.job(task_id)
            return body if body["status"] in ("completed", "partial", "failed", "canceled") else None

        body = wait_until(terminal, timeout_s, 0.2)
        assert body, f"job {task_id} did not finish:\n{self.proc.log_tail()}"
        result: dict[str, Any] = body
        return result


def mineru4_python() -> str:
    python = sandbox.mineru4_python()
    if python is None:
        pytest.skip(f"{sandbox.MINERU4_PYTHON_ENV} is not set (a MinerU 4.0 venv's python)")
    try:
        sandbox.mineru_package_dir(python, timeout_s=60)
    except sandbox.SandboxError as exc:
        pytest.skip(str(exc))
    return python


def text_pdf(pages: int = 2, **kwargs: Any) -> bytes:
    """A PDF whose pages have a real text layer (the flash tier reads it, no OCR)."""
    return sandbox.make_pdf(pages, lines_per_page=40, **kwargs)


@pytest.fixture(scope="session")
def python4() -> str:
    return mineru4_python()


@pytest.fixture(scope="session")
def site4(tmp_path_factory: pytest.TempPathFactory, python4: str) -> Path:
    return sandbox.patched_site4(tmp_path_factory.mktemp("mineru4-site"), python4)


@pytest.fixture
def start_worker4(tmp_path: Path, python4: str, site4: Path) -> Iterator[Any]:
    processes = Processes()
    count = 0

    def start(extra_env: Mapping[str, str] | None = None, args: tuple[str, ...] = (),
              upload_dir: Path | None = None) -> Worker4:
        nonlocal count
        count += 1
        scratch = tmp_path / f"worker{count}"
        scratch.mkdir()
        port, native_port = free_port(), free_port()
        plan = scratch / "fault-plan"
        env = sandbox.mineru4_env(site4, scratch, extra={
            "MINERU_HEALTH_PORT": str(native_port),
            "MINERU_HEALTH_FAULT_PLAN": str(plan),
            **(extra_env or {}),
        })
        argv = sandbox.mineru4_api_command(python4, port, upload_dir or scratch / "uploads",
                                           args=args)
        proc = processes.start("mineru-api-4", argv, env=env, log_path=scratch / "api.log")
        worker = Worker4(proc, f"http://{sandbox.HOST}:{port}",
                         f"http://{sandbox.HOST}:{native_port}", plan)

        def up() -> bool:
            assert proc.poll() is None, f"mineru-api exited:\n{proc.log_tail()}"
            try:
                return worker.get("/v1/health", 2.0).status_code == 200
            except httpx.TransportError:
                return False

        assert wait_until(up, START_TIMEOUT_S, 0.5), f"mineru-api did not start:\n{proc.log_tail()}"
        return worker

    yield start
    processes.stop_all(15.0)


def plan_consumed(worker: Worker4, timeout_s: float = 10.0) -> None:
    """Waits until the worker read the plan file (its watcher polls every 100 ms)."""
    assert wait_until(lambda: not worker.plan.exists(), timeout_s, 0.05), worker.proc.log_tail()


def elapsed(fn: Any) -> float:
    start = time.monotonic()
    fn()
    return time.monotonic() - start


class Prober:
    """Asks ``url`` every 100 ms from a thread of its own; keeps (latency, status) per answer."""

    def __init__(self, url: str, timeout_s: float = 300.0) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.answers: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=self.timeout_s) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    status = client.get(self.url).status_code
                except httpx.HTTPError:
                    status = 0
                self.answers.append((time.monotonic() - started, status))
                self._stop.wait(0.1)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(self.timeout_s + 5)

    @property
    def worst_s(self) -> float:
        return max((latency for latency, _ in self.answers), default=0.0)

"""Shared fixtures on :mod:`mineru_health.demo.sandbox` and :mod:`~mineru_health.demo.fleet`
(the demo's fleet, which the tests run on) and the tests' own ``harness``.

Integration tests never touch the venv's MinerU: they copy the ``mineru``
package into a temporary directory, patch the copy and start processes with
that directory first on ``PYTHONPATH``. MinerU runs under
``MINERU_HEALTH_MINERU_PYTHON`` (default: this interpreter).

Fixtures and helpers (for every test module):

* ``free_port()`` / fixture ``free_port`` (a callable) — a free 127.0.0.1 port.
* ``wait_until(predicate, timeout_s, interval_s)`` — bounded polling.
* ``http_get(url, timeout_s)`` — one GET with httpx, ``None`` on a connection error.
* fixture ``processes`` — a ``Processes``: children in sessions of their own,
  all reaped (their children too) at teardown.
* fixture ``mineru_python`` — the interpreter that runs MinerU (skips if MinerU
  is not importable there).
* fixtures ``mineru_copy`` (fresh, unpatched, per test) and
  ``patched_mineru_site`` (patched once per session) — the directory to put
  first on ``PYTHONPATH``.
* fixture ``fake_vlm_url`` — a session fake OpenAI-compatible server.
* ``make_pdf(...)`` (``sandbox.make_pdf``) / fixture ``tiny_pdf`` — a one-page PDF.
* fixture ``mineru_api_factory`` — ``start_worker`` of a 3.x ``mineru-api``
  with the given site dir and env; returns its ``ManagedProcess`` (with
  ``base_url``), once ``/health`` answers.
* fixture ``launch_router`` — ``start_router`` of the patched 3.x
  ``mineru-router`` with two local workers; returns the ``Router``.
* ``run_cli(*args)`` — ``python -m mineru_health`` with this interpreter.
* fixture ``postgres`` — a real PostgreSQL server on 127.0.0.1 for the session
  (``harness.postgres``; ``new_database()`` per test), skipped where none can start.
* ``exception_groups`` — where ``ExceptionGroup`` and ``BaseExceptionGroup`` live:
  the builtins from Python 3.11; on 3.10 the ``exceptiongroup`` backport (pytest's
  dependency there, and the groups anyio, so MinerU, raises).
"""

from __future__ import annotations

import atexit
import builtins
import functools
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from mineru_health.demo import sandbox
from mineru_health.demo.fleet import LINE3, Router, start_fake_vlm, start_router, start_worker
from mineru_health.demo.sandbox import (
    MINERU_PYTHON_ENV,
    ManagedProcess,
    Processes,
    free_port,
    make_pdf,
    wait_until,
)

__all__ = [
    "MINERU_PYTHON_ENV",
    "ManagedProcess",
    "Router",
    "exception_groups",
    "free_port",
    "generated_docs",
    "http_get",
    "make_pdf",
    "run_cli",
    "submit_task",
    "task_status",
    "wait_task",
    "wait_until",
    "worker_health",
]


def _harness_on_workers_path() -> None:
    """Worker processes import ``harness.children`` and ``harness.fake_engines`` when a fault
    plan asks: a directory holding only a link to ``tests/harness`` goes on the ``PYTHONPATH``
    every process started by a test inherits (the sandboxes keep what they inherit)."""
    link_dir = Path(tempfile.mkdtemp(prefix="mineru-health-harness-"))
    (link_dir / "harness").symlink_to(
        Path(__file__).resolve().parent / "harness", target_is_directory=True
    )
    atexit.register(shutil.rmtree, link_dir, ignore_errors=True)
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([*inherited, str(link_dir)])


_harness_on_workers_path()

exception_groups: Any = (
    builtins if sys.version_info >= (3, 11) else importlib.import_module("exceptiongroup")
)


@pytest.fixture(name="free_port")
def free_port_fixture() -> Callable[[], int]:
    return free_port


@pytest.fixture(scope="session")
def postgres() -> Iterator[Any]:
    """A PostgreSQL server on 127.0.0.1 for the session (``harness.postgres``)."""
    from harness.postgres import running

    with running() as server:
        yield server


def http_get(url: str, timeout_s: float = 5.0) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=timeout_s)
    except httpx.TransportError:
        return None


@functools.cache
def generated_docs() -> Any:
    """``scripts/generated_docs.py`` as a module: what rewrites the generated docs sections."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "generated_docs.py"
    spec = importlib.util.spec_from_file_location("generated_docs", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- one 3.x worker's task API (its engine: vlm-http-client on server_url) ----------------------


def submit_task(
    base_url: str,
    pdf: bytes,
    server_url: str,
    *,
    path: str = "/tasks",
    name: str = "doc.pdf",
    mime: str = "application/pdf",
    timeout_s: float = 60.0,
) -> httpx.Response:
    return httpx.post(
        f"{base_url}{path}",
        files={"files": (name, pdf, mime)},
        data={"backend": "vlm-http-client", "server_url": server_url},
        timeout=timeout_s,
    )


def task_status(base_url: str, task_id: str) -> dict[str, Any]:
    response = httpx.get(f"{base_url}/tasks/{task_id}", timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def wait_task(proc: ManagedProcess, task_id: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """The task's status once it is completed or failed (asserted within ``timeout_s``)."""

    def terminal() -> dict[str, Any] | None:
        body = task_status(proc.base_url, task_id)
        return body if body["status"] in ("completed", "failed") else None

    body = wait_until(terminal, timeout_s, 0.1)
    assert body, f"task {task_id} did not finish:\n{proc.log_tail()}"
    return body


def worker_health(proc: ManagedProcess) -> httpx.Response:
    response = http_get(f"{proc.base_url}/health", 5.0)
    assert response is not None, proc.log_tail()
    return response


@pytest.fixture
def runtime() -> Any:
    """A worker runtime of the test's own (native health, verifier, rules), as ``install``
    builds one for a worker's app."""
    from mineru_health.runtime.settings import WorkerSettings
    from mineru_health.runtime.worker.worker_runtime import WorkerRuntime

    return WorkerRuntime(WorkerSettings.from_env({}))


@pytest.fixture(scope="session")
def mineru_python() -> str:
    python = sandbox.mineru_python()
    try:
        sandbox.mineru_package_dir(python, timeout_s=60)
    except sandbox.SandboxError as exc:
        pytest.skip(str(exc))
    return python


def run_cli(
    *args: str, input_text: str | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Runs ``python -m mineru_health`` with this interpreter (the installed package)."""
    return subprocess.run(
        [sys.executable, "-m", "mineru_health", *args],
        input=input_text,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=dict(env) if env is not None else None,
    )


@pytest.fixture
def mineru_copy(tmp_path: Path, mineru_python: str) -> Path:
    return sandbox.copy_mineru(tmp_path / "site", mineru_python)


@pytest.fixture(scope="session")
def patched_mineru_site(tmp_path_factory: pytest.TempPathFactory, mineru_python: str) -> Path:
    return sandbox.patched_site(tmp_path_factory.mktemp("patched") / "site", mineru_python)


@pytest.fixture(scope="session")
def fake_vlm_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with Processes() as procs:
        yield start_fake_vlm(procs, tmp_path_factory.mktemp("vlm"))


@pytest.fixture(scope="session")
def tiny_pdf() -> bytes:
    pytest.importorskip("reportlab")
    return make_pdf()


@pytest.fixture
def processes() -> Iterator[Processes]:
    """Processes reaped at teardown, what they started included."""
    procs = Processes()
    yield procs
    procs.stop_all(10.0)


@pytest.fixture
def mineru_api_factory(
    processes: Processes,
    mineru_python: str,
    tmp_path: Path,
) -> Callable[..., ManagedProcess]:
    def start(
        site: Path,
        *,
        env: Mapping[str, str] | None = None,
        name: str = "mineru-api",
        wait_healthy: bool = True,
    ) -> ManagedProcess:
        return start_worker(
            processes,
            LINE3,
            site,
            mineru_python,
            tmp_path / name,
            env=env,
            wait=wait_healthy,
            name=name,
        ).proc

    return start


@pytest.fixture
def launch_router(
    processes: Processes,
    patched_mineru_site: Path,
    mineru_python: str,
    tmp_path: Path,
) -> Callable[..., Router]:
    """``launch_router(extra_env, **kwargs)``: ``start_router`` of the patched 3.x copy.

    Each router's files go in a directory of its own under tmp_path (``router``,
    ``router-1``...); not waited for (``Router.wait_in_rotation``).
    """
    count = 0

    def launch(extra_env: Mapping[str, str], **kwargs: Any) -> Router:
        nonlocal count
        scratch = tmp_path / ("router" if count == 0 else f"router-{count}")
        count += 1
        return start_router(
            processes, LINE3, patched_mineru_site, mineru_python, scratch, env=extra_env, **kwargs
        )

    return launch

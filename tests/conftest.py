"""Shared fixtures on :mod:`mineru_health.testing.sandbox` (the demo uses the same sandbox).

Integration tests never touch the venv's MinerU: they copy the ``mineru``
package into a temporary directory, patch the copy and start processes with
that directory first on ``PYTHONPATH``. MinerU runs under
``MINERU_HEALTH_MINERU_PYTHON`` (default: this interpreter).

Fixtures and helpers (for every test module):

* ``free_port()`` / fixture ``free_port`` (a callable) — a free 127.0.0.1 port.
* ``wait_until(predicate, timeout_s, interval_s)`` — bounded polling.
* ``http_get(url, timeout_s)`` — one GET with httpx, ``None`` on a connection error.
* ``ManagedProcess`` / fixture ``process_factory`` — processes in sessions of
  their own with logs in tmp files, all reaped (their children too) at teardown.
* fixture ``mineru_python`` — the interpreter that runs MinerU (skips if MinerU
  is not importable there).
* fixture ``mineru_health_path`` — the directory from which ``mineru_health``
  is importable (goes on ``PYTHONPATH`` after the MinerU copy).
* ``copy_mineru(dest_dir, mineru_python)`` / fixtures ``mineru_copy`` (fresh,
  unpatched, per test) and ``patched_mineru_site`` (patched once per session)
  — return the directory to put first on ``PYTHONPATH``.
* ``mineru_env(site, mineru_health_path, output_root, extra)`` — the environment of
  a MinerU process running that copy.
* fixture ``fake_vlm_url`` — a session fake OpenAI-compatible server.
* ``make_pdf(...)`` (``sandbox.make_pdf``) / fixture ``tiny_pdf`` — a one-page PDF.
* fixture ``mineru_api_factory`` — starts ``python -m mineru.cli.fast_api`` on
  a free port with the given site dir and env; returns a ``ManagedProcess``
  with ``base_url``; waits until ``/health`` answers.
* ``run_cli(*args)`` — ``python -m mineru_health`` with this interpreter.
* ``exception_groups`` — where ``ExceptionGroup`` and ``BaseExceptionGroup`` live:
  the builtins from Python 3.11; on 3.10 the ``exceptiongroup`` backport (pytest's
  dependency there, and the groups anyio, so MinerU, raises).
"""

from __future__ import annotations

import builtins
import importlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from mineru_health.testing import sandbox
from mineru_health.testing.sandbox import (
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
    "copy_mineru",
    "exception_groups",
    "free_port",
    "http_get",
    "make_pdf",
    "mineru_env",
    "run_cli",
    "wait_until",
]

exception_groups: Any = (builtins if sys.version_info >= (3, 11)
                         else importlib.import_module("exceptiongroup"))

PROCESS_STOP_TIMEOUT_S = 10.0
MINERU_START_TIMEOUT_S = 120.0


@pytest.fixture(name="free_port")
def free_port_fixture() -> Callable[[], int]:
    return free_port


def http_get(url: str, timeout_s: float = 5.0) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=timeout_s)
    except httpx.TransportError:
        return None


@pytest.fixture
def process_factory(tmp_path: Path) -> Iterator[Callable[..., ManagedProcess]]:
    processes = Processes()
    count = 0

    def start(args: list[str], *, env: Mapping[str, str], name: str = "proc",
              cwd: Path | None = None) -> ManagedProcess:
        nonlocal count
        log_path = tmp_path / f"{name}-{count}.log"
        count += 1
        return processes.start(name, args, env=env, log_path=log_path, cwd=cwd)

    yield start
    processes.stop_all(PROCESS_STOP_TIMEOUT_S)


@pytest.fixture(scope="session")
def mineru_python() -> str:
    python = sandbox.mineru_python()
    try:
        sandbox.mineru_package_dir(python, timeout_s=60)
    except sandbox.SandboxError as exc:
        pytest.skip(str(exc))
    return python


@pytest.fixture(scope="session")
def mineru_health_path() -> str:
    return sandbox.mineru_health_path()


def copy_mineru(dest_dir: Path, mineru_python: str) -> Path:
    """Copies the ``mineru`` package into ``dest_dir``; returns ``dest_dir``."""
    return sandbox.copy_mineru(dest_dir, mineru_python)


def run_cli(*args: str, input_text: str | None = None,
            env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Runs ``python -m mineru_health`` with this interpreter (the installed package)."""
    return subprocess.run(
        [sys.executable, "-m", "mineru_health", *args], input=input_text, capture_output=True,
        text=True, timeout=120, check=False, env=dict(env) if env is not None else None,
    )


@pytest.fixture
def mineru_copy(tmp_path: Path, mineru_python: str) -> Path:
    return copy_mineru(tmp_path / "site", mineru_python)


@pytest.fixture(scope="session")
def patched_mineru_site(tmp_path_factory: pytest.TempPathFactory, mineru_python: str) -> Path:
    return sandbox.patched_site(tmp_path_factory.mktemp("patched") / "site", mineru_python)


@pytest.fixture(scope="session")
def fake_vlm_url(tmp_path_factory: pytest.TempPathFactory,
                 mineru_health_path: str) -> Iterator[str]:
    port = free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([mineru_health_path, env.get("PYTHONPATH", "")])
    with Processes() as processes:
        proc = processes.start(
            "fake-vlm", sandbox.fake_vlm_command(sys.executable, port), env=env,
            log_path=tmp_path_factory.mktemp("vlm") / "fake-vlm.log",
        )
        url = f"http://127.0.0.1:{port}"
        ready = wait_until(lambda: http_get(f"{url}/v1/models", 2.0), 30.0, 0.1)
        assert ready is not None and ready.status_code == 200, proc.log_tail()
        yield url


@pytest.fixture(scope="session")
def tiny_pdf() -> bytes:
    pytest.importorskip("reportlab")
    return make_pdf()


def mineru_env(site: Path, mineru_health_path: str, output_root: Path,
               extra: Mapping[str, str] | None = None) -> dict[str, str]:
    return sandbox.mineru_env(site, health_path=mineru_health_path, output_root=output_root,
                              extra=extra)


@pytest.fixture
def mineru_api_factory(
    process_factory: Callable[..., ManagedProcess],
    mineru_python: str,
    mineru_health_path: str,
    tmp_path: Path,
) -> Callable[..., ManagedProcess]:
    def start(site: Path, *, env: Mapping[str, str] | None = None, name: str = "mineru-api",
              wait_healthy: bool = True) -> ManagedProcess:
        full_env = mineru_env(site, mineru_health_path, tmp_path / f"{name}-output", env)
        # A free port can be taken by another process before the worker binds
        # it (other suites on a shared machine): then a new port, three tries.
        for _attempt in range(3):
            port = free_port()
            proc = process_factory(
                [mineru_python, "-m", "mineru.cli.fast_api", "--host", "127.0.0.1",
                 "--port", str(port)],
                env=full_env, name=name, cwd=tmp_path,
            )
            proc.base_url = f"http://127.0.0.1:{port}"
            if not wait_healthy:
                return proc

            def up(proc: ManagedProcess = proc) -> bool:
                if proc.poll() is not None:
                    raise AssertionError(f"mineru-api exited early:\n{proc.log_tail()}")
                response = http_get(f"{proc.base_url}/health", 2.0)
                return response is not None and response.status_code == 200

            try:
                assert wait_until(up, MINERU_START_TIMEOUT_S, 0.2), proc.log_tail()
            except AssertionError:
                if "address already in use" not in proc.log_tail():
                    raise
                continue
            return proc
        raise AssertionError(f"mineru-api found no free port:\n{proc.log_tail()}")

    return start


def worker_pids(ports: set[str]) -> set[int]:
    """pids of the mineru-api processes listening on ``ports`` (their argv, read from /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().decode("utf-8", "replace").split("\0")
        except OSError:
            continue
        if "mineru.cli.fast_api" in args and "--port" in args:
            index = args.index("--port") + 1
            if index < len(args) and args[index] in ports:
                found.add(int(entry.name))
    return found


# --- the router -------------------------------------------------------------------------------

ROUTER_START_TIMEOUT_S = 240.0


def start_router(
    process_factory: Callable[..., ManagedProcess],
    site: Path,
    mineru_python: str,
    mineru_health_path: str,
    tmp_path: Path,
    extra_env: Mapping[str, str],
    *,
    local_gpus: str = "0,1",
) -> ManagedProcess:
    """A patched ``mineru-router`` on a free loopback port with its own local workers."""
    port = free_port()
    env = mineru_env(site, mineru_health_path, tmp_path / "router-output", extra_env)
    proc = process_factory(
        [mineru_python, "-m", "mineru.cli.router", "--host", "127.0.0.1", "--port", str(port),
         "--local-gpus", local_gpus],
        env=env, name="mineru-router", cwd=tmp_path,
    )
    proc.base_url = f"http://127.0.0.1:{port}"
    return proc


@pytest.fixture
def launch_router(
    process_factory: Callable[..., ManagedProcess],
    patched_mineru_site: Path,
    mineru_python: str,
    mineru_health_path: str,
    tmp_path: Path,
) -> Callable[..., ManagedProcess]:
    """``launch_router(extra_env, **kwargs)``: :func:`start_router` with this test's fixtures."""

    def launch(extra_env: Mapping[str, str], **kwargs: Any) -> ManagedProcess:
        return start_router(process_factory, patched_mineru_site, mineru_python,
                            mineru_health_path, tmp_path, extra_env, **kwargs)

    return launch


def router_servers(base: str) -> dict[str, dict[str, Any]]:
    """The router's ``/health`` ``servers`` by id; empty while it does not answer."""
    response = http_get(f"{base}/health", 10.0)
    if response is None or response.status_code not in (200, 503):
        return {}
    return {s["server_id"]: s for s in response.json().get("servers", [])}


def wait_both_in_rotation(proc: ManagedProcess) -> dict[str, dict[str, Any]]:
    """Until the router's two workers are in rotation; returns its servers then."""

    def both() -> dict[str, dict[str, Any]] | None:
        if proc.poll() is not None:
            raise AssertionError(f"router exited:\n{proc.log_tail()}")
        servers = router_servers(proc.base_url)
        ok = len(servers) == 2 and all(s["in_rotation"] for s in servers.values())
        return servers if ok else None

    servers = wait_until(both, ROUTER_START_TIMEOUT_S, 0.5)
    assert servers, proc.log_tail()
    result: dict[str, dict[str, Any]] = servers
    return result


def wait_restarted(proc: ManagedProcess, server_id: str, old_url: str,
                   timeout_s: float = 180.0) -> None:
    """Until the router's ``server_id`` is back in rotation on a new process (a new URL)."""

    def restarted() -> bool:
        entry = router_servers(proc.base_url).get(server_id, {})
        return bool(entry.get("in_rotation")) and entry.get("base_url") != old_url

    assert wait_until(restarted, timeout_s, 0.5), (router_servers(proc.base_url),
                                                   proc.log_tail())

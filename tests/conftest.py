"""Shared fixtures: free ports, bounded waits, managed processes, a patched MinerU copy, a PDF.

Integration tests never touch the venv's MinerU: they copy the ``mineru``
package into a temporary directory, patch the copy with
``mineru-health patch apply --mineru-path`` and start processes with that
directory first on ``PYTHONPATH``. MinerU runs under
``MINERU_HEALTH_MINERU_PYTHON`` (default: this interpreter).

Fixtures and helpers (for every test module):

* ``free_port()`` / fixture ``free_port`` (a callable) — a free 127.0.0.1 port.
* ``wait_until(predicate, timeout_s, interval_s)`` — bounded polling.
* ``http_get(url, timeout_s)`` — one GET with httpx, ``None`` on a connection error.
* ``ManagedProcess`` / fixture ``process_factory`` — processes with logs in
  tmp files, killed in finalizers.
* fixture ``mineru_python`` — the interpreter that runs MinerU (skips if MinerU
  is not importable there).
* fixture ``mineru_health_path`` — the directory from which ``mineru_health``
  is importable (goes on ``PYTHONPATH`` after the MinerU copy).
* ``copy_mineru(dest_dir, mineru_python)`` / fixtures ``mineru_copy`` (fresh,
  unpatched, per test) and ``patched_mineru_site`` (patched once per session)
  — return the directory to put first on ``PYTHONPATH``.
* fixture ``fake_vlm_url`` — a session fake OpenAI-compatible server.
* fixture ``tiny_pdf`` — bytes of a one-page PDF.
* fixture ``mineru_api_factory`` — starts ``python -m mineru.cli.fast_api`` on
  a free port with the given site dir and env; returns a ``ManagedProcess``
  with ``base_url``; waits until ``/health`` answers.
"""

from __future__ import annotations

import io
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

MINERU_PYTHON_ENV = "MINERU_HEALTH_MINERU_PYTHON"
PROCESS_STOP_TIMEOUT_S = 10.0
MINERU_START_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(name="free_port")
def free_port_fixture() -> Callable[[], int]:
    return free_port


def wait_until(
    predicate: Callable[[], Any], timeout_s: float, interval_s: float = 0.1
) -> Any:
    """Polls ``predicate`` until it returns a truthy value; returns it, or the last falsy one."""
    deadline = time.monotonic() + timeout_s
    result = predicate()
    while not result and time.monotonic() < deadline:
        time.sleep(interval_s)
        result = predicate()
    return result


def http_get(url: str, timeout_s: float = 5.0) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=timeout_s)
    except httpx.TransportError:
        return None


class ManagedProcess:
    """A child process whose output goes to a log file; always reaped by the fixture."""

    def __init__(self, args: list[str], *, env: Mapping[str, str], log_path: Path,
                 cwd: Path | None = None) -> None:
        self.args = args
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.popen = subprocess.Popen(
            args, env=dict(env), cwd=cwd, stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self.base_url = ""

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout_s: float) -> int | None:
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_bytes().decode("utf-8", "replace")

    def log_tail(self, chars: int = 4000) -> str:
        return self.log()[-chars:]

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            if self.wait(PROCESS_STOP_TIMEOUT_S) is None:
                self.popen.kill()
                self.wait(PROCESS_STOP_TIMEOUT_S)
        self._log.close()


@pytest.fixture
def process_factory(tmp_path: Path) -> Iterator[Callable[..., ManagedProcess]]:
    started: list[ManagedProcess] = []

    def start(args: list[str], *, env: Mapping[str, str], name: str = "proc",
              cwd: Path | None = None) -> ManagedProcess:
        proc = ManagedProcess(args, env=env, log_path=tmp_path / f"{name}-{len(started)}.log",
                              cwd=cwd)
        started.append(proc)
        return proc

    yield start
    for proc in reversed(started):
        proc.stop()


def _mineru_python() -> str:
    return os.environ.get(MINERU_PYTHON_ENV) or sys.executable


_FIND_MINERU = (
    "import importlib.util as u; s = u.find_spec('mineru'); "
    "print(list(s.submodule_search_locations)[0] if s else '')"
)


def _mineru_package_dir(python: str) -> Path | None:
    probe = subprocess.run(
        [python, "-c", _FIND_MINERU],
        capture_output=True, text=True, timeout=60, check=False,
    )
    location = probe.stdout.strip()
    return Path(location) if probe.returncode == 0 and location else None


@pytest.fixture(scope="session")
def mineru_python() -> str:
    python = _mineru_python()
    if _mineru_package_dir(python) is None:
        pytest.skip(f"mineru is not importable by {python} (set {MINERU_PYTHON_ENV})")
    return python


@pytest.fixture(scope="session")
def mineru_health_path() -> str:
    import mineru_health

    return str(Path(mineru_health.__file__).resolve().parent.parent)


def copy_mineru(dest_dir: Path, mineru_python: str) -> Path:
    """Copies the ``mineru`` package into ``dest_dir``; returns ``dest_dir``."""
    source = _mineru_package_dir(mineru_python)
    assert source is not None
    shutil.copytree(source, dest_dir / "mineru",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest_dir


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
    site = copy_mineru(tmp_path_factory.mktemp("patched") / "site", mineru_python)
    result = run_cli("patch", "apply", "--mineru-path", str(site / "mineru"))
    assert result.returncode == 0, result.stdout + result.stderr
    return site


def _session_process(args: list[str], env: Mapping[str, str], log: Path) -> ManagedProcess:
    return ManagedProcess(args, env=env, log_path=log)


@pytest.fixture(scope="session")
def fake_vlm_url(tmp_path_factory: pytest.TempPathFactory,
                 mineru_health_path: str) -> Iterator[str]:
    port = free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([mineru_health_path, env.get("PYTHONPATH", "")])
    proc = _session_process(
        [sys.executable, "-m", "mineru_health.testing.fake_vlm_server", "--host", "127.0.0.1",
         "--port", str(port)],
        env, tmp_path_factory.mktemp("vlm") / "fake-vlm.log",
    )
    url = f"http://127.0.0.1:{port}"
    try:
        ready = wait_until(lambda: http_get(f"{url}/v1/models", 2.0), 30.0, 0.1)
        assert ready is not None and ready.status_code == 200, proc.log_tail()
        yield url
    finally:
        proc.stop()


def make_pdf(text: str = "mineru-health test page") -> bytes:
    from reportlab.pdfgen import canvas

    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer)
    pdf.drawString(72, 720, text)
    pdf.showPage()
    pdf.save()
    return buffer.getvalue()


@pytest.fixture(scope="session")
def tiny_pdf() -> bytes:
    pytest.importorskip("reportlab")
    return make_pdf()


def mineru_env(site: Path, mineru_health_path: str, output_root: Path,
               extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINERU_HEALTH_")}
    env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(site), mineru_health_path]),
            "MINERU_MODEL_SOURCE": "local",
            "MINERU_API_OUTPUT_ROOT": str(output_root),
            "MINERU_API_DISABLE_ACCESS_LOG": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra or {})
    return env


@pytest.fixture
def mineru_api_factory(
    process_factory: Callable[..., ManagedProcess],
    mineru_python: str,
    mineru_health_path: str,
    tmp_path: Path,
) -> Callable[..., ManagedProcess]:
    def start(site: Path, *, env: Mapping[str, str] | None = None, name: str = "mineru-api",
              wait_healthy: bool = True) -> ManagedProcess:
        port = free_port()
        full_env = mineru_env(site, mineru_health_path, tmp_path / f"{name}-output", env)
        proc = process_factory(
            [mineru_python, "-m", "mineru.cli.fast_api", "--host", "127.0.0.1",
             "--port", str(port)],
            env=full_env, name=name, cwd=tmp_path,
        )
        proc.base_url = f"http://127.0.0.1:{port}"
        if wait_healthy:
            def up() -> bool:
                if proc.poll() is not None:
                    raise AssertionError(f"mineru-api exited early:\n{proc.log_tail()}")
                response = http_get(f"{proc.base_url}/health", 2.0)
                return response is not None and response.status_code == 200

            assert wait_until(up, MINERU_START_TIMEOUT_S, 0.2), proc.log_tail()
        return proc

    return start

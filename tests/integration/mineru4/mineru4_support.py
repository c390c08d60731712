"""Shared by the MinerU 4.0 integration tests: a patched ``mineru-api`` 4.0 on loopback.

Skips unless ``MINERU_HEALTH_MINERU4_PYTHON`` names the interpreter of a
MinerU 4.0 venv (``scripts/setup.sh`` makes ``.venv-mineru4``). The worker
(``mineru_health/demo/fleet.py``'s ``start_worker``) runs the flash tier offline,
``MINERU_HOME``/``HOME`` in a scratch directory, its native endpoint on a
port of its own, with the fault plan plugin of the test sandbox.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from harness.samplers import Prober
from mineru_health.demo import sandbox
from mineru_health.demo.fleet import LINE4, Worker, start_worker, text_pdf
from mineru_health.demo.sandbox import Processes, wait_until

__all__ = ["Prober", "Worker", "plan_consumed", "text_pdf"]


@pytest.fixture(scope="session")
def python4() -> str:
    python = sandbox.mineru4_python()
    if python is None:
        pytest.skip(f"{sandbox.MINERU4_PYTHON_ENV} is not set (a MinerU 4.0 venv's python)")
    try:
        sandbox.mineru_package_dir(python, timeout_s=60)
    except sandbox.SandboxError as exc:
        pytest.skip(str(exc))
    _insist_on_own_install(python)
    return python


def _insist_on_own_install(python: str) -> None:
    """The 4.0 venv runs the mineru-health a user would have there: its own `pip install`
    of this checkout (scripts/setup.sh and test.sh make it), never this venv's borrowed."""
    import hashlib
    import subprocess

    import mineru_health

    digest = (
        "import hashlib, pathlib, mineru_health as m; d = hashlib.sha256(); "
        "root = pathlib.Path(m.__file__).parent; "
        "[d.update(p.relative_to(root).as_posix().encode() + p.read_bytes()) "
        "for p in sorted(root.rglob('*.py'))]; print(m.__file__); print(d.hexdigest())"
    )
    done = subprocess.run(
        [python, "-I", "-c", digest], capture_output=True, text=True, timeout=60, check=False
    )
    ours = hashlib.sha256()
    root = Path(mineru_health.__file__).parent
    for path in sorted(root.rglob("*.py")):
        ours.update(path.relative_to(root).as_posix().encode() + path.read_bytes())
    lines = done.stdout.split()
    if done.returncode != 0 or len(lines) != 2:
        pytest.fail(
            f"mineru-health is not installed in the MinerU 4.0 venv ({python}): "
            f"pip install this checkout into it (scripts/setup.sh does) | {done.stderr[-300:]}"
        )
    if lines[1] != ours.hexdigest():
        pytest.fail(
            f"the MinerU 4.0 venv's mineru-health ({lines[0]}) is not this checkout's: "
            "reinstall it (scripts/test.sh does)"
        )


@pytest.fixture(scope="session")
def site4(tmp_path_factory: pytest.TempPathFactory, python4: str) -> Path:
    return sandbox.patched_site4(tmp_path_factory.mktemp("mineru4-site"), python4)


@pytest.fixture
def start_worker4(tmp_path: Path, python4: str, site4: Path) -> Iterator[Any]:
    with Processes() as processes:
        count = 0

        def start(
            extra_env: Mapping[str, str] | None = None,
            args: tuple[str, ...] = (),
            upload_dir: Path | None = None,
        ) -> Worker:
            nonlocal count
            count += 1
            return start_worker(
                processes,
                LINE4,
                site4,
                python4,
                tmp_path / f"worker{count}",
                env=extra_env,
                native=True,
                faults=True,
                args=args,
                uploads=upload_dir,
                timeout_s=180.0,
                name="mineru-api-4",
            )

        yield start


def plan_consumed(worker: Worker, timeout_s: float = 10.0) -> None:
    """Waits until the worker read the plan file (its watcher polls every 100 ms)."""
    assert wait_until(lambda: not worker.plan.exists(), timeout_s, 0.05), worker.proc.log_tail()

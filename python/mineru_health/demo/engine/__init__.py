"""A real llama.cpp engine for the demo to kill: a tiny model for it, and the switch that closes it.

MinerU 4.0's default engine on CPU is llama.cpp, in-process (``mineru-llama-cpp``). To
show that engine really dying (no fault plugin, no exception made up), ``mineru-health
demo`` runs MinerU 4.0's standard tier on:

* :mod:`.tiny_gguf`: a tiny random-weight MinerU 2.5 VLM (GGUF model and projector,
  ~650 KB, written in ~0.05 s) and, with :mod:`.tiny_onnx`, stand-ins for the small ONNX
  layout/OCR models, laid out as MinerU's model store (:func:`write_home`). They are
  written by MinerU's own Python, which needs ``gguf`` and ``onnx`` for it
  (:data:`REQUIRED`, :func:`missing`);
* :mod:`.engine_switch`: loaded by a worker only when ``ENGINE_SWITCH_CLOSE_ARM`` is in
  its environment (:func:`worker_env`); when the arm file appears, the next generation
  closes the engine under the jobs running on it.

:func:`prepare` readies a sandbox with both (the demo's and ``bench/recovery``'s way).

The tests (``tests/integration/mineru4``) and ``bench/recovery --line 4`` take the same
pieces from here. Nothing of the worker or router integration imports this package.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .engine_switch import ARM_ENV, install_into_site

__all__ = [
    "ARM_ENV",
    "REQUIRED",
    "WORKER_ENV",
    "EngineSetupError",
    "RealEngine",
    "install_into_site",
    "missing",
    "missing_modules",
    "prepare",
    "run_writer",
    "worker_env",
    "write_home",
]

#: What MinerU's Python needs for a real engine: the engine, and the writers of the models.
REQUIRED = ("mineru_llama_cpp", "gguf", "onnx")
#: Every standard-tier worker on the tiny model: its models from ``MINERU_HOME`` only, and one
#: page per processing window, so that a job's pages reach the engine one after another (an
#: engine closed after one page fails the next page of the same job).
WORKER_ENV = {"MINERU_PROCESSING_WINDOW_SIZE": "1", "MINERU_MODEL_SOURCE": "local"}
# Imported (a module that is there but does not load counts as missing), or only found.
_MISSING = (
    "import importlib, importlib.util, sys\n"
    "find = sys.argv[1] == 'find'\n"
    "for name in sys.argv[2:]:\n"
    "    try:\n"
    "        assert importlib.util.find_spec(name) if find else importlib.import_module(name)\n"
    "    except Exception:\n"
    "        print(name)\n"
)


class EngineSetupError(RuntimeError):
    """The tiny model could not be written, or MinerU's Python could not be asked."""


def missing_modules(
    python: str,
    names: tuple[str, ...],
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 120.0,
    find_only: bool = False,
) -> list[str]:
    """The ``names`` that ``python`` cannot import (``find_only``: cannot find, without
    importing them); all of them when it cannot be asked."""
    try:
        done = subprocess.run(
            [python, "-c", _MISSING, "find" if find_only else "import", *names],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            env=None if env is None else dict(env),
        )
    except (OSError, subprocess.TimeoutExpired):
        return list(names)
    if done.returncode != 0:
        return list(names)
    return [name for name in done.stdout.split() if name in names]


def missing(
    python: str, env: Mapping[str, str] | None = None, timeout_s: float = 120.0
) -> list[str]:
    """The :data:`REQUIRED` modules that ``python`` cannot import (all of them if it fails)."""
    return missing_modules(python, REQUIRED, env=env, timeout_s=timeout_s)


def run_writer(
    argv: list[str], what: str, *, env: Mapping[str, str] | None = None, timeout_s: float = 300.0
) -> str:
    """Runs a model writer (MinerU's Python on one of this package's modules); its output.
    Raises EngineSetupError naming ``what`` when it cannot run, times out or fails."""
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            env=None if env is None else dict(env),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EngineSetupError(f"writing {what}: {exc}") from None
    if done.returncode != 0:
        raise EngineSetupError(f"writing {what} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def last_json(output: str) -> dict[str, Any]:
    """A writer's report: the last line it printed, as JSON."""
    report: dict[str, Any] = json.loads(output.strip().splitlines()[-1])
    return report


def write_home(
    python: str, home: Path, env: Mapping[str, str] | None = None, timeout_s: float = 300.0
) -> dict[str, Any]:
    """MinerU 4.0's model store in ``home`` (``MINERU_HOME``), written by MinerU's ``python``.

    ``env``: its environment (``PYTHONPATH`` must reach this package and MinerU). Returns
    :mod:`.tiny_gguf`'s report: the files' paths and sizes, the seconds it took.
    """
    argv = [python, "-m", f"{__name__}.tiny_gguf", str(home), "--mineru-home"]
    return last_json(run_writer(argv, "the tiny model", env=env, timeout_s=timeout_s))


def worker_env(
    home: Path, arm: Path | None = None, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A standard-tier worker's variables: the tiny model in ``home``, the switch on ``arm``."""
    env = {**WORKER_ENV, "MINERU_HOME": str(home)}
    if arm is not None:
        env[ARM_ENV] = str(arm)
    return {**env, **(extra or {})}


@dataclass(frozen=True)
class RealEngine:
    """A sandbox readied by :func:`prepare`: its workers' variables, and the switch to close."""

    home: Path  # MINERU_HOME: the tiny model and the small-model stand-ins
    arm: Path  # the arm file: absent until :meth:`close`
    report: dict[str, Any]  # write_home's

    @property
    def env(self) -> dict[str, str]:
        return worker_env(self.home, self.arm)

    def close(self) -> None:
        """Arms the switch: the next generation of one worker's engine closes that engine."""
        self.arm.touch()

    def describe(self) -> str:
        size = sum(int(b) for b in self.report.get("bytes", {}).values())
        return (
            f"wrote a tiny random-weight MinerU 2.5 model for llama.cpp and stand-in ONNX "
            f"layout/OCR models ({size / 1024:.0f} KB, {self.report.get('seconds')}s) "
            f"in {self.home}"
        )


def prepare(
    site: Path, scratch: Path, python: str, env: Mapping[str, str] | None = None
) -> RealEngine:
    """Readies a real engine death: the switch loaded from ``site``, the model in ``scratch``.

    ``python`` and ``env``: MinerU's interpreter and its environment (:func:`write_home`).
    """
    install_into_site(site)
    home = scratch / "tiny-vlm-home"
    return RealEngine(home, scratch / "close-engine", write_home(python, home, env))

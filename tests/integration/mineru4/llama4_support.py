"""Real MinerU 4.0 standard-tier workers on the tiny llama.cpp VLM (``tests/engines``).

* fixture ``tiny_vlm_home`` (session): a ``MINERU_HOME`` holding the tiny GGUF pair and
  the stand-in ONNX layout/OCR models, generated once per run by ``tests/engines/tiny_gguf.py``
  in MinerU 4.0's venv (which has ``gguf`` and ``onnx``: ``scripts/setup.sh``).
* fixture ``site4_llama`` (session): a patched copy of MinerU 4.0 with ``engine_switch``
  (``tests/engines/engine_switch.py``) next to it. It is loaded only by processes given
  ``ENGINE_SWITCH_CLOSE_ARM``; without it the workers run the copy untouched.
* ``LINE4_STANDARD``: the 4.0 line of ``testing/router.py`` with standard-tier workers and
  jobs, for :func:`~mineru_health.testing.router.start_router` and ``run_fault``.
* ``big_page_pdf()``: a document whose page is too large for the tiny model's context.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from mineru_health.testing import sandbox
from mineru_health.testing.router import _ROUTER4, HOST, Line4

ENGINES = Path(__file__).resolve().parents[2] / "engines"
sys.path.insert(0, str(ENGINES))
import engine_switch  # tests/engines, not a package

__all__ = ["LINE4_STANDARD", "WORKER_ENV", "big_page_pdf", "engine_switch"]

#: Every worker here: one page per processing window, so a job's pages reach the engine one
#: after another (an engine closed after one page fails the next page of the same job).
WORKER_ENV = {"MINERU_PROCESSING_WINDOW_SIZE": "1", "MINERU_MODEL_SOURCE": "local"}


class Line4Standard(Line4):
    """MinerU 4.0 with the VLM: workers started with ``--tier standard``, jobs asking for it."""

    def router_argv(self, python: str, port: int, local_gpus: str) -> list[str]:
        return [python, "-c", _ROUTER4, "--host", HOST, "--port", str(port),
                "--local-gpus", local_gpus, "--worker-tier", "standard"]

    def worker_argv(self, python: str, port: int, uploads: Path,
                    args: Sequence[str]) -> list[str]:
        return super().worker_argv(python, port, uploads, ("--tier", "standard", *args))

    def request(self, engine_url: str, formats: Sequence[str]) -> dict[str, Any]:
        return {"params": [("tier", "standard"), *(("output_formats", f) for f in formats)]}


LINE4_STANDARD = Line4Standard()


@pytest.fixture(scope="session")
def python4_llama() -> str:
    python = sandbox.mineru4_python()
    if python is None:
        pytest.skip(f"{sandbox.MINERU4_PYTHON_ENV} is not set (a MinerU 4.0 venv's python)")
    probe = subprocess.run([python, "-c", "import mineru_llama_cpp, gguf, onnx"],
                           capture_output=True, text=True, timeout=120, check=False)
    if probe.returncode != 0:
        pytest.skip(f"MinerU 4.0's venv lacks mineru_llama_cpp, gguf or onnx: "
                    f"{probe.stderr.strip().splitlines()[-1:]}")
    return python


@pytest.fixture(scope="session")
def tiny_vlm_home(tmp_path_factory: pytest.TempPathFactory, python4_llama: str) -> Path:
    """``MINERU_HOME`` with the tiny VLM and the small-model stand-ins (made once a run)."""
    home = tmp_path_factory.mktemp("tiny-vlm-home")
    done = subprocess.run([python4_llama, str(ENGINES / "tiny_gguf.py"), str(home),
                           "--mineru-home"], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert sum(report["bytes"].values()) < 4 * 1024 * 1024, report
    return home


@pytest.fixture(scope="session")
def site4_llama(tmp_path_factory: pytest.TempPathFactory, python4_llama: str) -> Path:
    site = sandbox.patched_site4(tmp_path_factory.mktemp("mineru4-llama-site"), python4_llama,
                                 faults=False)
    return engine_switch.install_into_site(site)


def worker_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    return {**WORKER_ENV, "MINERU_HOME": str(home), **(extra or {})}


def big_page_pdf(lines: int = 40) -> bytes:
    """Two A1 pages of text: each page's block takes ~3.2k tokens, over the 2k context."""
    from reportlab.lib.pagesizes import A1  # type: ignore[import-untyped]
    from reportlab.pdfgen import canvas  # type: ignore[import-untyped]

    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=A1, invariant=True)
    height = A1[1]
    for page in range(2):
        for line in range(lines):
            pdf.drawString(48, height - 60 - line * 14,
                           f"Oversized page {page}, line {line}: the quick brown fox")
        pdf.showPage()
    pdf.save()
    return buffer.getvalue()

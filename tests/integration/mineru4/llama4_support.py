"""Real MinerU 4.0 standard-tier workers on the tiny llama.cpp VLM (``mineru_health.demo.engine``).

* fixture ``tiny_vlm_home`` (session): a ``MINERU_HOME`` holding the tiny GGUF pair and
  the stand-in ONNX layout/OCR models, generated once per run by ``demo_engine.write_home``
  in MinerU 4.0's venv (which has ``gguf`` and ``onnx``: ``scripts/setup.sh``).
* fixture ``site4_llama`` (session): a patched copy of MinerU 4.0 whose ``sitecustomize``
  loads ``demo_engine.engine_switch`` in processes given ``ENGINE_SWITCH_CLOSE_ARM``;
  without it the workers run the copy untouched.
* ``LINE4_STANDARD`` (``mineru_health/demo/fleet.py``): the 4.0 line with standard-tier workers and
  jobs, for :func:`~mineru_health.demo.fleet.start_router` and ``run_fault``.
* ``big_page_pdf()``: a document whose page is too large for the tiny model's context.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from mineru_health.demo import engine as demo_engine
from mineru_health.demo import sandbox
from mineru_health.demo.engine import install_into_site, worker_env
from mineru_health.demo.fleet import LINE4_STANDARD

__all__ = ["LINE4_STANDARD", "big_page_pdf", "worker_env"]


@pytest.fixture(scope="session")
def python4_llama() -> str:
    python = sandbox.mineru4_python()
    if python is None:
        pytest.skip(f"{sandbox.MINERU4_PYTHON_ENV} is not set (a MinerU 4.0 venv's python)")
    lacking = demo_engine.missing(python)
    if lacking:
        pytest.skip(f"MinerU 4.0's venv lacks {', '.join(lacking)}")
    return python


@pytest.fixture(scope="session")
def tiny_vlm_home(tmp_path_factory: pytest.TempPathFactory, python4_llama: str) -> Path:
    """``MINERU_HOME`` with the tiny VLM and the small-model stand-ins (made once a run)."""
    home = tmp_path_factory.mktemp("tiny-vlm-home")
    report = demo_engine.write_home(python4_llama, home)
    assert sum(report["bytes"].values()) < 4 * 1024 * 1024, report
    return home


@pytest.fixture(scope="session")
def site4_llama(tmp_path_factory: pytest.TempPathFactory, python4_llama: str) -> Path:
    site = sandbox.patched_site4(
        tmp_path_factory.mktemp("mineru4-llama-site"), python4_llama, faults=False
    )
    return install_into_site(site)


def big_page_pdf(lines: int = 40) -> bytes:
    """Two A1 pages of text: each page's block takes ~3.2k tokens, over the 2k context."""
    from reportlab.lib.pagesizes import A1  # type: ignore[import-untyped]
    from reportlab.pdfgen import canvas  # type: ignore[import-untyped]

    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=A1, invariant=True)
    height = A1[1]
    for page in range(2):
        for line in range(lines):
            pdf.drawString(
                48,
                height - 60 - line * 14,
                f"Oversized page {page}, line {line}: the quick brown fox",
            )
        pdf.showPage()
    pdf.save()
    return buffer.getvalue()

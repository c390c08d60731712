"""A throwaway, patched MinerU 4.0 router on loopback, and faults for its workers (tests only).

    python = mineru4_python()                      # $MINERU_HEALTH_MINERU4_PYTHON, or None
    site = patched_site4(tmp / "mineru-site", python)   # copy of MinerU 4.0, router patched
    env = router_env(site, tmp)                    # offline: MINERU_HOME/HOME in tmp
    pdf = text_pdf(pages=2, seed=3)                # a real text layer: flash tier, no models

Faults reach the workers the router launches through a ``sitecustomize``
in ``router_env``'s path: in an ``api-server`` process it wraps 4.0's
``parse_async`` (the call ``_run_job`` makes for every file) so that,
when ``MINERU_HEALTH_FAULT_PLAN`` (``{port}`` becomes the worker's port)
holds a word, the worker behaves as follows (the file is consumed):

``engine_dead``
    this and every later parse raises vLLM's ``EngineDeadError`` (same
    module path and class name, so 4.0.12's own ``is_fatal_engine_error``
    fails the job and turns ``/v1/health`` to 503 ``engine_dead``).
``hang``
    the parse blocks the worker's event loop (``time.sleep`` on it, for
    ``MINERU_HEALTH_FAULT_HANG_S``, default 3600 s): ``/v1/health`` answers
    nothing, the process stays alive.

Written for the router tests until the worker-side 4.0 plugin lands
(branch w4); the ``engine_dead`` error class is ``testing.faults``'s.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from .faults import FAULT_PLAN_ENV, HANG_S_ENV, make_engine_dead_error, write_plan
from .sandbox import SandboxError, copy_mineru

__all__ = [
    "MINERU4_PYTHON_ENV",
    "install_faults",
    "mineru4_python",
    "patched_site4",
    "router_env",
    "text_pdf",
    "write_plan",
]

MINERU4_PYTHON_ENV = "MINERU_HEALTH_MINERU4_PYTHON"
_SITECUSTOMIZE = """\
import sys
if "api-server" in sys.argv:
    from mineru_health.testing import mineru4
    mineru4.install_faults()
"""


def mineru4_python() -> str | None:
    """The interpreter of a MinerU 4.0 environment, or None (tests skip)."""
    return os.environ.get(MINERU4_PYTHON_ENV) or None


def patches_dir() -> Path:
    """The 4.0 patch set (installed with the package, or this checkout's)."""
    from mineru_health.patching import patches_root

    return patches_root() / "mineru-4.0"


def patched_site4(dest_dir: Path, python: str) -> Path:
    """Copies ``python``'s MinerU into ``dest_dir`` and applies the 4.0 router patches."""
    import json

    site = copy_mineru(dest_dir, python)
    package = site / "mineru"
    manifest = json.loads((patches_dir() / "manifest.json").read_text(encoding="utf-8"))
    for entry in manifest["files"]:
        if not entry["target"].startswith("kit/router/"):
            continue  # the worker side is its own patch (and adapter)
        done = subprocess.run(
            ["patch", "-p1", "--forward", "--quiet", "-i", str(patches_dir() / entry["patch"])],
            cwd=package, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SandboxError(f"patch {entry['patch']}: {done.stdout}{done.stderr}")
    return site


def router_env(site: Path, scratch: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a patched router (and so of the workers it launches), offline."""
    import mineru_health

    home = scratch / "home"
    home.mkdir(parents=True, exist_ok=True)
    # Only this package, not the environment it is installed in, joins MinerU's path.
    shim = scratch / "health-path"
    shim.mkdir(exist_ok=True)
    link = shim / "mineru_health"
    if not link.exists():
        link.symlink_to(Path(mineru_health.__file__).resolve().parent)
    (shim / "sitecustomize.py").write_text(_SITECUSTOMIZE, encoding="utf-8")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MINERU_ROUTER_HEALTH_", "MINERU_HEALTH_", "PYTHON"))}
    env.update({
        "PYTHONPATH": os.pathsep.join([str(site), str(shim)]),
        "PYTHONUNBUFFERED": "1",
        "MINERU_HOME": str(home),
        "HOME": str(home),
        "MINERU_MODEL_SOURCE": "local",
        "HF_HUB_OFFLINE": "1",
    })
    env.update(extra or {})
    return env


def text_pdf(pages: int = 2, *, seed: int = 0, lines: int = 40) -> bytes:
    """A PDF whose pages carry ``lines`` lines of real text (the flash tier parses it)."""
    from reportlab.lib.pagesizes import A4  # type: ignore[import-untyped]
    from reportlab.pdfgen import canvas  # type: ignore[import-untyped]

    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=A4, invariant=True)
    _, height = A4
    for page in range(1, pages + 1):
        y = height - 60
        for line in range(1, lines + 1):
            pdf.drawString(50, y, f"Document {seed}, page {page}, line {line}: the quick brown "
                                  f"fox jumps over the lazy dog {seed * 1000 + line}.")
            y -= 18
        pdf.showPage()
    pdf.save()
    return buffer.getvalue()


# --- in the worker process -------------------------------------------------------------------


def install_faults() -> None:
    """Wraps ``mineru.parser.api_server.parse_async`` once that module is imported."""
    plan = os.environ.get(FAULT_PLAN_ENV)
    if not plan:
        return
    port = _port(sys.argv)
    state: dict[str, Any] = {"dead": False, "path": plan.replace("{port}", str(port))}
    hang_s = float(os.environ.get(HANG_S_ENV) or 3600)

    def wrap(module: Any) -> None:
        original = module.parse_async

        async def parse_async(*args: Any, **kwargs: Any) -> Any:
            word = _consume(state["path"])
            if word == "engine_dead":
                state["dead"] = True
            elif word == "hang":
                import time

                time.sleep(hang_s)  # noqa: ASYNC251 -- blocks the event loop, on purpose
            if state["dead"]:
                raise make_engine_dead_error()
            return await original(*args, **kwargs)

        module.parse_async = parse_async

    _after_import("mineru.parser.api_server", wrap)


def _consume(path: str) -> str:
    try:
        word = Path(path).read_text(encoding="utf-8").strip()
    except OSError:
        return ""
    Path(path).unlink(missing_ok=True)
    return word


def _port(argv: list[str]) -> int:
    for index, arg in enumerate(argv):
        if arg == "--port" and index + 1 < len(argv):
            return int(argv[index + 1])
    return 0


def _after_import(name: str, callback: Any) -> None:
    """Calls ``callback(module)`` right after ``name`` is first imported."""
    import importlib.abc
    import importlib.machinery

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is None or spec.loader is None:
                return spec
            loader = spec.loader
            exec_module = loader.exec_module

            def exec_and_wrap(module: Any) -> None:
                exec_module(module)
                callback(module)

            loader.exec_module = exec_and_wrap  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, Finder())


def cleanup(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)

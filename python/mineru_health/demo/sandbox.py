"""A throwaway, patched MinerU on loopback: what the demo, integration and load tests share.

    python = mineru_python()                          # MINERU_HEALTH_MINERU_PYTHON or this one
    site = patched_site(tmp / "site", python)         # copy of MinerU, patched, fault plugin added
    env = mineru_env(site, health_path=mineru_health_path(), output_root=tmp / "out")
    with Processes() as procs:  # every child reaped on exit, grandchildren too
        vlm = procs.start("fake-vlm", fake_vlm_command(python, port), env=env,
                          log_path=tmp / "fake-vlm.log")
        ...
    pdf = make_pdf(pages=50, images_per_page=2, seed=7)   # deterministic bytes per arguments

MinerU runs under ``MINERU_HEALTH_MINERU_PYTHON`` (default: this
interpreter), with the patched copy first on ``PYTHONPATH``; a
``sitecustomize.py`` there loads the fault plan plugin
(:mod:`.fault_plugin`) into every process that has ``MINERU_HEALTH_FAULT_PLAN``
set: production code never loads it. Processes start
in their own session and are always reaped, with what they started
(``processes.py``, re-exported here). ``make_pdf`` needs reportlab and Pillow
(the ``test`` and ``demo`` extras). Nothing here is thread-safe; use one
``Processes`` from one thread at a time.
"""

from __future__ import annotations

import io
import math
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .processes import ManagedProcess, Processes

__all__ = [
    "HOST",
    "MINERU_PYTHON_ENV",
    "ManagedProcess",
    "Processes",
    "SandboxError",
    "add_fault_plugin",
    "copy_mineru",
    "fake_vlm_command",
    "free_port",
    "health_path_for",
    "interpreter",
    "make_pdf",
    "mineru_env",
    "mineru_health_path",
    "mineru_package_dir",
    "mineru_python",
    "patch_site",
    "patched_site",
    "wait_until",
]

# MinerU 4.0 (mineru-api 4.0.x) lives in its own venv: see the end of this module.
__all__ += [
    "MINERU4_PYTHON_ENV",
    "health_link_dir",
    "mineru4_api_command",
    "mineru4_env",
    "mineru4_python",
    "patched_site4",
]

HOST = "127.0.0.1"
MINERU_PYTHON_ENV = "MINERU_HEALTH_MINERU_PYTHON"
# Variables of ours that must not leak from the caller's environment into a sandbox.
_OUR_PREFIXES = ("MINERU_ROUTER_HEALTH_", "MINERU_HEALTH_")
_FIND_MINERU = (
    "import importlib.util as u; s = u.find_spec('mineru'); "
    "print(list(s.submodule_search_locations)[0] if s else '')"
)
_IMPORTS_HEALTH = "import mineru_health.mineru3.worker"
#: Loads the fault plan plugin in every process started from a sandbox site.
_SITECUSTOMIZE = """\
# Written by mineru_health.demo.sandbox: the fault plan plugin, for tests and demos only.
import os
if os.environ.get("MINERU_HEALTH_FAULT_PLAN"):
    import mineru_health.demo.fault_plugin
    mineru_health.demo.fault_plugin.load()
"""


class SandboxError(Exception):
    """MinerU could not be found, copied or patched."""


# --- small helpers ---------------------------------------------------------------------------


def free_port(host: str = HOST) -> int:
    """A port that was free on ``host`` a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_until(predicate: Callable[[], Any], timeout_s: float, interval_s: float = 0.1) -> Any:
    """Polls ``predicate`` until it returns a truthy value; returns it, or the last falsy one."""
    deadline = time.monotonic() + timeout_s
    result = predicate()
    while not result and time.monotonic() < deadline:
        time.sleep(interval_s)
        result = predicate()
    return result


# --- MinerU, copied and patched ----------------------------------------------------------------


def mineru_python() -> str:
    """The interpreter that runs MinerU: ``$MINERU_HEALTH_MINERU_PYTHON`` or this one.

    Made absolute here, as the shell would find it, since MinerU's processes
    start in directories of their own: a path relative to where the command was
    typed (``.venv-mineru4/bin/python``) or a bare name looked up on ``PATH``.
    Symbolic links are kept (a venv's ``python`` is one, and the venv is where
    it points from).
    """
    return interpreter(os.environ.get(MINERU_PYTHON_ENV) or sys.executable)


def interpreter(value: str) -> str:
    """``value`` (a path or a name on ``PATH``) as an absolute path, links kept."""
    if os.sep not in value:
        return shutil.which(value) or value
    return os.path.abspath(value)


def mineru_package_dir(python: str | None = None, *, timeout_s: float = 120.0) -> Path:
    """The ``mineru`` package directory ``python`` imports (found without importing it)."""
    python = python or mineru_python()
    try:
        found = subprocess.run(
            [python, "-c", _FIND_MINERU],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"cannot run {python}: {exc}") from None
    location = found.stdout.strip()
    if found.returncode != 0 or not location:
        detail = " | ".join(found.stderr.strip().splitlines()[-3:])
        raise SandboxError(
            f"mineru is not importable by {python} (set {MINERU_PYTHON_ENV}) {detail}"
        )
    return Path(location)


def mineru_health_path() -> str:
    """The directory this ``mineru_health`` package is imported from (for ``PYTHONPATH``)."""
    import mineru_health

    return str(Path(mineru_health.__file__).resolve().parent.parent)


def copy_mineru(dest_dir: Path, python: str | None = None, *, source: Path | None = None) -> Path:
    """Copies the ``mineru`` package into ``dest_dir`` (created); returns ``dest_dir``.

    ``dest_dir`` is what goes first on ``PYTHONPATH``; pick a name that is not
    a valid module name (``mineru-site``), so nothing imports the folder itself.
    """
    package = source or mineru_package_dir(python)
    shutil.copytree(
        package, dest_dir / "mineru", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    return dest_dir


def patch_site(site: Path) -> Any:
    """Applies the shipped patches to ``site/mineru``; returns the ``PatchReport``.

    Raises ``SandboxError`` when patching is refused or does not cover both the
    worker (``cli/fast_api.py``) and the router (``cli/router.py``).
    """
    from mineru_health import patching
    from mineru_health.errors import MineruHealthError

    try:
        report = patching.apply(site / "mineru")
    except MineruHealthError as exc:
        raise SandboxError(f"mineru-health patch apply: {exc}") from None
    targets = {f.target for f in report.files}
    if not {"cli/fast_api.py", "cli/router.py"} <= targets:
        raise SandboxError(
            f"the patch set covers only {sorted(targets)}; both cli/fast_api.py and "
            "cli/router.py are needed"
        )
    return report


def patched_site(dest_dir: Path, python: str | None = None, *, faults: bool = True) -> Path:
    """``copy_mineru``, ``patch_site`` and, if ``faults``, ``add_fault_plugin``.

    Returns the directory for ``PYTHONPATH``.
    """
    site = copy_mineru(dest_dir, python)
    patch_site(site)
    if faults:
        add_fault_plugin(site)
    return site


def add_fault_plugin(site: Path) -> Path:
    """Makes every process started from ``site`` load the fault plan plugin (patched or not)."""
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE, encoding="utf-8")
    return site


def health_path_for(python: str, site: Path, *, timeout_s: float = 120.0) -> str | None:
    """``mineru_health_path()`` when ``python`` cannot import this package by itself, else None.

    MinerU's Python may be another environment: it then borrows this package's
    directory (after the MinerU copy on ``PYTHONPATH``).
    """
    env = mineru_env(site)
    try:
        done = subprocess.run(
            [python, "-c", _IMPORTS_HEALTH],
            env=env,
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return mineru_health_path()
    return None if done.returncode == 0 else mineru_health_path()


def mineru_env(
    site: Path,
    *,
    health_path: str | None = None,
    output_root: Path | None = None,
    extra: Mapping[str, str] | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of a MinerU process that runs the copy in ``site``.

    ``base`` (default ``os.environ``) without our own variables; ``site``
    first on ``PYTHONPATH``, then ``health_path`` if given, then what was
    there. ``output_root`` sets ``MINERU_API_OUTPUT_ROOT`` (and the local
    model source, access log off, unbuffered output: the test settings).
    """
    source = os.environ if base is None else base
    env = {k: v for k, v in source.items() if not k.startswith(_OUR_PREFIXES)}
    paths = [str(site)] + ([health_path] if health_path else [])
    paths += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in paths]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    if output_root is not None:
        env.update(
            {
                "MINERU_MODEL_SOURCE": "local",
                "MINERU_API_OUTPUT_ROOT": str(output_root),
                "MINERU_API_DISABLE_ACCESS_LOG": "1",
                "PYTHONUNBUFFERED": "1",
            }
        )
    env.update(extra or {})
    return env


def fake_vlm_command(python: str, port: int, host: str = HOST) -> list[str]:
    """argv of the fake OpenAI-compatible VLM server (``demo/fake_vlm_server.py``)."""
    module = "mineru_health.demo.fake_vlm_server"
    return [python, "-m", module, "--host", host, "--port", str(port)]


# --- PDFs ----------------------------------------------------------------------------------------


def make_pdf(
    pages: int = 1,
    *,
    images_per_page: int = 0,
    image_px: int = 256,
    seed: int = 0,
    text: str = "mineru-health test page",
    lines_per_page: int = 1,
) -> bytes:
    """A PDF of ``pages`` A4 pages, each with ``lines_per_page`` lines of text and images.

    MinerU 4.0's flash tier reads the text layer; a page with one short line
    falls back to OCR (which wants model weights): give it tens of lines.

    Every image is ``image_px`` x ``image_px`` RGB noise, so it neither
    compresses nor repeats: size grows with pages x images (about
    4 x image_px^2 bytes each, reportlab stores them ASCII85-encoded; 100
    pages x 4 images of 256 px make about 100 MB in some 20 s). The same
    arguments give the same bytes (reportlab's invariant mode, noise from
    ``random.Random(seed)``).
    """
    if pages < 1:
        raise ValueError(f"pages must be at least 1, not {pages}")
    if not 1 <= lines_per_page <= 60:
        raise ValueError(f"lines_per_page must be between 1 and 60, not {lines_per_page}")
    if images_per_page < 0:
        raise ValueError(f"images_per_page must not be negative, not {images_per_page}")
    if not 1 <= image_px <= 4096:
        raise ValueError(f"image_px must be between 1 and 4096, not {image_px}")
    from reportlab.lib.pagesizes import A4  # type: ignore[import-untyped]
    from reportlab.lib.utils import ImageReader  # type: ignore[import-untyped]
    from reportlab.pdfgen import canvas  # type: ignore[import-untyped]

    rng = random.Random(seed)
    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=A4, invariant=True)
    width, height = A4
    margin = 48.0
    for page in range(1, pages + 1):
        heading = text if pages == 1 else f"{text} {page}"
        pdf.drawString(margin, height - margin - 12, heading)
        for line in range(1, lines_per_page):
            # Text lines take the top half when the page also holds images.
            step = (height / 2 - margin) / lines_per_page if images_per_page else 12.5
            pdf.drawString(
                margin,
                height - margin - 12 - line * step,
                f"{heading}, line {line}: the quick brown fox jumps over the lazy dog",
            )
        if images_per_page:
            _draw_noise(pdf, rng, images_per_page, image_px, ImageReader, margin, width, height)
        pdf.showPage()
    pdf.save()
    return buffer.getvalue()


def _draw_noise(
    pdf: Any,
    rng: random.Random,
    count: int,
    image_px: int,
    reader: Any,
    margin: float,
    width: float,
    height: float,
) -> None:
    from PIL import Image

    columns = math.ceil(math.sqrt(count))
    rows = math.ceil(count / columns)
    cell_w = (width - 2 * margin) / columns
    cell_h = (height - 2 * margin - 24) / rows
    side = min(cell_w, cell_h) * 0.9
    for index in range(count):
        row, column = divmod(index, columns)
        noise = Image.frombytes("RGB", (image_px, image_px), rng.randbytes(image_px * image_px * 3))
        x = margin + column * cell_w
        y = height - margin - 24 - (row + 1) * cell_h
        pdf.drawImage(reader(noise), x, y, width=side, height=side)


# --- MinerU 4.0 -----------------------------------------------------------------------------

MINERU4_PYTHON_ENV = "MINERU_HEALTH_MINERU4_PYTHON"
#: The 4.0 target the sandbox insists on.
WORKER4_TARGET = "parser/api_server.py"


def mineru4_python() -> str | None:
    """The interpreter of the MinerU 4.0 venv (``$MINERU_HEALTH_MINERU4_PYTHON``), if set."""
    value = os.environ.get(MINERU4_PYTHON_ENV)
    return interpreter(value) if value else None


def health_link_dir(dest_dir: Path) -> Path:
    """A directory holding only a link to this ``mineru_health`` package (for ``PYTHONPATH``).

    MinerU 4.0 runs in another venv: putting this venv's whole site-packages
    on its path would shadow that venv's own FastAPI, pydantic...
    """
    import mineru_health

    dest_dir.mkdir(parents=True, exist_ok=True)
    link = dest_dir / "mineru_health"
    if not link.exists():
        link.symlink_to(Path(mineru_health.__file__).resolve().parent, target_is_directory=True)
    return dest_dir


def _patch_site4(site: Path) -> None:
    from mineru_health import patching
    from mineru_health.errors import MineruHealthError

    try:
        report = patching.apply(site / "mineru")
    except MineruHealthError as exc:
        raise SandboxError(f"mineru-health patch apply: {exc}") from None
    targets = {f.target for f in report.files}
    if report.line != "4.0" or WORKER4_TARGET not in targets:
        raise SandboxError(f"line {report.line} patched, covering only {sorted(targets)}")


def patched_site4(
    dest_dir: Path, python: str, *, faults: bool = True, patched: bool = True
) -> Path:
    """A patched copy of MinerU 4.0 in ``dest_dir``, with the fault plugin if ``faults``.

    ``patched=False``: MinerU's own code (with the fault plugin), for baselines.
    """
    site = copy_mineru(dest_dir, python)
    if patched:
        _patch_site4(site)
    if faults:
        add_fault_plugin(site)
    return site


def mineru4_env(
    site: Path, scratch: Path, *, borrow: bool = False, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of a 4.0 process: offline, ``MINERU_HOME`` and ``HOME`` in ``scratch``.

    ``borrow``: the 4.0 venv has no mineru-health of its own, so it borrows
    this one through a link (the demo allows it; the tests insist on the
    venv's own install, as a user has it).
    """
    home = scratch / "home"
    home.mkdir(parents=True, exist_ok=True)
    link = health_link_dir(scratch / "health-path") if borrow else None
    env = mineru_env(
        site,
        health_path=str(link) if link else None,
        extra={
            "MINERU_HOME": str(home),
            "HOME": str(home),
            "HF_HUB_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
            **(extra or {}),
        },
    )
    return env


def mineru4_api_command(
    python: str,
    port: int,
    upload_dir: Path,
    *,
    tier: str = "flash",
    host: str = HOST,
    args: tuple[str, ...] = (),
) -> list[str]:
    """argv of ``mineru-api`` 4.0 (the venv's console script, as a user starts it)."""
    script = Path(python).parent / "mineru-api"
    start = (
        [str(script)]
        if script.is_file()
        else [python, "-c", "from mineru.kit.commands.api_server import main; main()"]
    )
    return [
        *start,
        "--host",
        host,
        "--port",
        str(port),
        "--tier",
        tier,
        "--upload-dir",
        str(upload_dir),
        *args,
    ]

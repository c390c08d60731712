"""mineru_health.demo.sandbox: PDFs, environments and processes that are always reaped.

Process tests start tiny Python children; every wait is bounded.
"""

from __future__ import annotations

import io
import os
import signal
import sys
from pathlib import Path

import pytest
from mineru_health.demo import sandbox

pypdf = pytest.importorskip("pypdf")
pytest.importorskip("reportlab")

WAIT_S = 20.0


# --- make_pdf ---------------------------------------------------------------------


def pages_and_images(data: bytes) -> tuple[int, list[int]]:
    reader = pypdf.PdfReader(io.BytesIO(data))
    return len(reader.pages), [len(page.images) for page in reader.pages]


def test_default_is_one_page_without_images() -> None:
    data = sandbox.make_pdf()
    assert data.startswith(b"%PDF-")
    assert pages_and_images(data) == (1, [0])
    assert "mineru-health test page" in pypdf.PdfReader(io.BytesIO(data)).pages[0].extract_text()


def test_pages_and_images_as_asked() -> None:
    data = sandbox.make_pdf(pages=3, images_per_page=5, image_px=32, seed=1)
    assert pages_and_images(data) == (3, [5, 5, 5])
    image = pypdf.PdfReader(io.BytesIO(data)).pages[2].images[4].image
    assert image.size == (32, 32)


def test_same_arguments_same_bytes_and_seed_matters() -> None:
    args = {"pages": 2, "images_per_page": 2, "image_px": 24}
    assert sandbox.make_pdf(**args, seed=7) == sandbox.make_pdf(**args, seed=7)
    assert sandbox.make_pdf(**args, seed=7) != sandbox.make_pdf(**args, seed=8)


def test_noise_images_make_large_files() -> None:
    small = len(sandbox.make_pdf(pages=2))
    large = len(sandbox.make_pdf(pages=2, images_per_page=2, image_px=128))
    # 4 images of 128 x 128 RGB noise do not compress: about 196 KB.
    assert large - small > 4 * 128 * 128 * 3 * 0.9


@pytest.mark.parametrize(
    "bad", [{"pages": 0}, {"images_per_page": -1}, {"image_px": 0}, {"image_px": 5000}]
)
def test_bad_arguments_are_refused(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        sandbox.make_pdf(**bad)


# --- environments and ports -------------------------------------------------------


def test_mineru_env_puts_the_copy_first_and_drops_our_variables(tmp_path: Path) -> None:
    base = {
        "PATH": "/bin",
        "PYTHONPATH": "/existing",
        "MINERU_HEALTH_FAULT_PLAN": "/leaked",
        "MINERU_ROUTER_HEALTH_PRESET": "slow",
    }
    env = sandbox.mineru_env(tmp_path, health_path="/pkg", base=base, extra={"X": "1"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path), "/pkg", "/existing"]
    assert not any(k.startswith(("MINERU_HEALTH_", "MINERU_ROUTER_HEALTH_")) for k in env)
    assert env["PATH"] == "/bin" and env["X"] == "1"
    assert "MINERU_API_OUTPUT_ROOT" not in env
    out = sandbox.mineru_env(tmp_path, output_root=tmp_path / "out", base=base)
    assert out["MINERU_API_OUTPUT_ROOT"] == str(tmp_path / "out")


def test_free_port_is_bindable() -> None:
    import socket

    port = sandbox.free_port()
    with socket.socket() as sock:
        sock.bind((sandbox.HOST, port))


def test_a_python_that_cannot_run_is_a_sandbox_error(tmp_path: Path) -> None:
    with pytest.raises(sandbox.SandboxError, match="cannot run"):
        sandbox.mineru_package_dir(str(tmp_path / "no-such-python"))


# --- processes ----------------------------------------------------------------------

# A parent that starts a child in a session of its own (as MinerU's router
# starts workers), prints the child's pid, then sleeps; both ignore nothing.
PARENT = r"""
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                         start_new_session=True)
print(child.pid, flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    return state != "Z"


def test_stop_all_reaps_children_and_their_own_sessions(tmp_path: Path) -> None:
    log = tmp_path / "parent.log"
    with sandbox.Processes() as procs:
        parent = procs.start(
            "parent", [sys.executable, "-c", PARENT], env=dict(os.environ), log_path=log
        )
        child_pid = sandbox.wait_until(lambda: parent.log().strip(), WAIT_S)
        assert child_pid, parent.log_tail()
        child = int(child_pid)
        assert alive(child)
        # Recorded while running, as the demo's watcher does.
        procs.record_descendants(parent)
    assert parent.poll() is not None
    assert sandbox.wait_until(lambda: not alive(child), WAIT_S), "grandchild left running"


# A parent that leaves a helper behind in its session and exits at once, as a
# worker does with os._exit(75) after an engine death (MinerU's
# multiprocessing helpers stay).
LEAVER = r"""
import os, subprocess, sys
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(helper.pid, flush=True)
os._exit(75)
"""


def test_stop_all_reaps_what_an_exited_child_left_in_its_session(tmp_path: Path) -> None:
    with sandbox.Processes() as procs:
        leaver = procs.start(
            "leaver",
            [sys.executable, "-c", LEAVER],
            env=dict(os.environ),
            log_path=tmp_path / "leaver.log",
        )
        assert leaver.wait(WAIT_S) == 75  # reaped here, before any stop
        helper = int(leaver.log().strip())
        assert alive(helper)
    assert sandbox.wait_until(lambda: not alive(helper), WAIT_S), "helper left running"


def test_stop_all_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(600)"
    )
    procs = sandbox.Processes()
    proc = procs.start(
        "stubborn",
        [sys.executable, "-c", stubborn],
        env=dict(os.environ),
        log_path=tmp_path / "stubborn.log",
    )
    assert sandbox.wait_until(lambda: "ready" in proc.log(), WAIT_S)
    procs.stop_all(grace_s=0.5)
    assert proc.returncode == -signal.SIGKILL
    procs.stop_all()  # twice is fine


# A parent whose child (own session, as a router's worker) shares its stdin
# pipe, ignores SIGTERM and exits on EOF, as MinerU's workers do with
# MINERU_API_SHUTDOWN_ON_STDIN_EOF=1 even when their router was killed.
EOF_PARENT = r"""
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], start_new_session=True)
print(child.pid, flush=True)
time.sleep(600)
"""
EOF_CHILD = r"""
import pathlib, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
pathlib.Path(sys.argv[1]).write_text("ready")
sys.stdin.read()
pathlib.Path(sys.argv[1]).write_text("eof")
"""


def test_stdin_pipe_is_closed_on_stop(tmp_path: Path) -> None:
    marker = tmp_path / "eof"
    procs = sandbox.Processes()
    parent = procs.start(
        "parent",
        [sys.executable, "-c", EOF_PARENT, EOF_CHILD, str(marker)],
        env=dict(os.environ),
        log_path=tmp_path / "parent.log",
        stdin_pipe=True,
    )
    child_pid = sandbox.wait_until(lambda: parent.log().strip(), WAIT_S)
    assert child_pid, parent.log_tail()
    # Its SIGTERM handler is in place (a slow start would otherwise die of the signal).
    assert sandbox.wait_until(lambda: marker.exists() and marker.read_text() == "ready", WAIT_S)
    procs.stop_all(grace_s=5.0)
    assert not alive(int(child_pid))
    assert marker.read_text() == "eof"  # it left on EOF, not by a signal


def test_wait_and_log_of_a_short_process(tmp_path: Path) -> None:
    with sandbox.Processes() as procs:
        proc = procs.start(
            "short",
            [sys.executable, "-c", "print('hi'); raise SystemExit(3)"],
            env=dict(os.environ),
            log_path=tmp_path / "short.log",
            cwd=tmp_path,
        )
        assert proc.wait(WAIT_S) == 3
        assert proc.log_tail() == "hi\n"
        assert "exited 3" in repr(proc)

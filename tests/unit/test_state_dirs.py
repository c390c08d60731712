"""Claims on state directories (flock with the owner's pid) and the sweep of abandoned ones."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mineru_health.errors import ConfigError
from mineru_health.runtime import state_dirs

_HOLD = """
import sys, time
from mineru_health.runtime import state_dirs
lock = state_dirs.claim(sys.argv[1])
print("held", flush=True)
sys.stdin.read()
"""


def _holder(directory: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(directory)],
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _end(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.communicate(timeout=30)


def test_a_directory_held_by_a_live_process_is_refused(tmp_path: Path) -> None:
    holder = _holder(tmp_path / "state")
    try:
        with pytest.raises(ConfigError) as refused:
            state_dirs.claim(tmp_path / "state", variable="MINERU_HEALTH_STATE_DIR")
        assert refused.value.variable == "MINERU_HEALTH_STATE_DIR"
        assert f"pid {holder.pid}" in str(refused.value)
    finally:
        _end(holder)
    # Its owner is dead: the lock is no lock, and is taken over.
    lock = state_dirs.claim(tmp_path / "state")
    assert (tmp_path / "state" / state_dirs.LOCK_NAME).read_text().strip() == str(os.getpid())
    lock.release()


def test_abandoned_directories_are_swept_live_and_foreign_ones_kept(tmp_path: Path) -> None:
    abandoned = tmp_path / "mineru-health-state-a"
    state_dirs.claim(abandoned).release()  # claimed once, owner gone
    (abandoned / "mineru-health-tasks.sqlite3").write_bytes(b"x")
    foreign = tmp_path / "mineru-health-state-b"  # no lock file: not ours to judge
    foreign.mkdir()
    live = tmp_path / "mineru-health-state-c"
    holder = _holder(live)
    try:
        removed = state_dirs.sweep_abandoned(tmp_path, "mineru-health-state-")
    finally:
        _end(holder)
    assert removed == [abandoned]
    assert not abandoned.exists() and foreign.is_dir() and live.is_dir()


def test_a_directory_whose_maker_died_before_its_claim_is_swept(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(30)
    unclaimed = tmp_path / f"mineru-health-state-{dead.pid}-w-x1"  # mkdtemp, then killed
    unclaimed.mkdir()
    (unclaimed / "partial").write_bytes(b"x")
    making = tmp_path / f"mineru-health-state-{os.getpid()}-w-x2"  # its maker lives: not yet
    making.mkdir()
    removed = state_dirs.sweep_abandoned(tmp_path, "mineru-health-state-")
    assert removed == [unclaimed] and making.is_dir()


def test_set_aside_keeps_the_file_and_its_companions(tmp_path: Path) -> None:
    db = tmp_path / "store.sqlite3"
    db.write_bytes(b"bad")
    (tmp_path / "store.sqlite3-wal").write_bytes(b"wal")
    moved = state_dirs.set_aside(db, "file is not a database")
    assert not db.exists() and moved.read_bytes() == b"bad"
    assert moved.with_name(moved.name + "-wal").read_bytes() == b"wal"
    db.write_bytes(b"bad again")
    assert state_dirs.set_aside(db, "again") != moved


def test_only_files_set_aside_since_the_launch_are_news(tmp_path: Path) -> None:
    base = tmp_path / "state"
    (base / "local-gpu-0").mkdir(parents=True)
    earlier = state_dirs.set_aside(_garbage(base / "local-gpu-0" / "store.sqlite3"), "old")
    dirs = state_dirs.StateDirs(base=str(base))
    try:
        directory = dirs.state_dir("local-gpu-0")
        assert dirs.newly_set_aside("local-gpu-0") == []  # an earlier router reported it
        assert dirs.newly_set_aside("local-gpu-1") == []  # never launched
        _garbage(directory / "store.sqlite3-wal")
        fresh = state_dirs.set_aside(_garbage(directory / "store.sqlite3"), "new")
        assert fresh != earlier and dirs.newly_set_aside("local-gpu-0") == [fresh]
        assert dirs.newly_set_aside("local-gpu-0") == []  # once
    finally:
        dirs.close()


def _garbage(path: Path) -> Path:
    path.write_bytes(b"not a database\n")
    return path

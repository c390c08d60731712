"""``patch apply``, ``check`` and a byte-exact ``revert`` on every release the manifests name.

The wheels come from PyPI, fetched by ``scripts/setup.sh`` into the directory
``MINERU_HEALTH_RELEASE_WHEELS`` names (``scripts/test.sh`` sets it and
requires every release to be there); without it the test is skipped. Only
``version.py`` and the target files are unpacked: that is all patching reads.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest
from mineru_health import patching

WHEELS_ENV = "MINERU_HEALTH_RELEASE_WHEELS"


def _releases() -> list[tuple[str, str]]:
    return sorted({(m.line, r) for m in patching.load_manifests() for r in m.releases})


def _wheel(release: str) -> Path:
    directory = os.environ.get(WHEELS_ENV, "")
    if not directory:
        pytest.skip(f"{WHEELS_ENV} is not set (scripts/setup.sh fetches the wheels)")
    wheel = Path(directory) / f"mineru-{release}-py3-none-any.whl"
    assert wheel.is_file(), f"{wheel} is missing: run scripts/setup.sh"
    return wheel


def _unpack(wheel: Path, dest: Path) -> Path:
    wanted = {"mineru/version.py", "mineru/__init__.py"}
    wanted |= {f"mineru/{e.target}" for m in patching.load_manifests() for e in m.files}
    with zipfile.ZipFile(wheel) as archive:
        for name in sorted(wanted & set(archive.namelist())):
            archive.extract(name, dest)
    return dest / "mineru"


@pytest.mark.parametrize(("line", "release"), _releases())
def test_apply_check_revert_on_the_released_files(line: str, release: str, tmp_path: Path) -> None:
    mineru_dir = _unpack(_wheel(release), tmp_path)
    originals = {p: p.read_bytes() for p in mineru_dir.rglob("*.py")}

    before = patching.check(mineru_dir)
    assert before.line == line and before.mineru_version == release
    assert {f.state for f in before.files} == {patching.FileState.ORIGINAL}

    assert patching.apply(mineru_dir).all_patched
    assert patching.check(mineru_dir).all_patched
    assert patching.startup_problem(mineru_dir) is None

    reverted = patching.revert(mineru_dir)
    assert {f.state for f in reverted.files} == {patching.FileState.ORIGINAL}
    assert {p: p.read_bytes() for p in mineru_dir.rglob("*.py")} == originals
    assert not list(mineru_dir.rglob(f"*{patching.BACKUP_SUFFIX}"))

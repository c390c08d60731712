"""``mineru-health patch`` on a temporary copy of MinerU, and on fake trees."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from conftest import run_cli
from mineru_health import patching
from mineru_health.errors import PatchError, UnsupportedMinerUError


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _targets(mineru_dir: Path) -> list[Path]:
    manifest = patching.load_manifest(patching.mineru_version(mineru_dir))
    return [mineru_dir / entry.target for entry in manifest.files]


def test_apply_check_revert_byte_for_byte(mineru_copy: Path) -> None:
    mineru_dir = mineru_copy / "mineru"
    targets = _targets(mineru_dir)
    originals = {t: t.read_bytes() for t in targets}
    modes = {t: t.stat().st_mode for t in targets}

    check = run_cli("patch", "check", "--mineru-path", str(mineru_dir), "--json")
    assert check.returncode == 1, check.stderr
    assert {f["state"] for f in json.loads(check.stdout)["files"]} == {"original"}

    applied = run_cli("patch", "apply", "--mineru-path", str(mineru_dir))
    assert applied.returncode == 0, applied.stderr
    for target in targets:
        assert target.read_bytes() != originals[target]
        assert (target.with_name(target.name + patching.BACKUP_SUFFIX)).read_bytes() == \
            originals[target]
        assert target.stat().st_mode == modes[target]
    fast_api = (mineru_dir / "cli" / "fast_api.py").read_text(encoding="utf-8")
    assert "mineru_health_worker.install(app)" in fast_api
    assert "mineru_health_worker.on_task_failed(self, task, exc)" in fast_api

    again = run_cli("patch", "apply", "--mineru-path", str(mineru_dir), "--json")
    assert again.returncode == 0
    assert {f["action"] for f in json.loads(again.stdout)["files"]} == {"unchanged"}

    check = run_cli("patch", "check", "--mineru-path", str(mineru_dir), "--json")
    assert check.returncode == 0
    assert json.loads(check.stdout)["all_patched"] is True

    reverted = run_cli("patch", "revert", "--mineru-path", str(mineru_dir))
    assert reverted.returncode == 0, reverted.stderr
    for target in targets:
        assert target.read_bytes() == originals[target]
        assert not target.with_name(target.name + patching.BACKUP_SUFFIX).exists()
    assert run_cli("patch", "revert", "--mineru-path", str(mineru_dir)).returncode == 0


def test_revert_without_backup_reverse_applies(mineru_copy: Path) -> None:
    mineru_dir = mineru_copy / "mineru"
    targets = _targets(mineru_dir)
    originals = {t: _sha(t) for t in targets}
    patching.apply(mineru_dir)
    for target in targets:
        target.with_name(target.name + patching.BACKUP_SUFFIX).unlink()
    report = patching.revert(mineru_dir)
    assert {f.action for f in report.files} == {"reverse-applied"}
    assert {t: _sha(t) for t in targets} == originals


def test_refuses_a_modified_file(mineru_copy: Path) -> None:
    mineru_dir = mineru_copy / "mineru"
    fast_api = mineru_dir / "cli" / "fast_api.py"
    fast_api.write_bytes(fast_api.read_bytes() + b"\n# local change\n")
    before = fast_api.read_bytes()
    for action in ("apply", "revert"):
        result = run_cli("patch", action, "--mineru-path", str(mineru_dir))
        assert result.returncode == 4
        assert "fast_api.py" in result.stderr and "modified" in result.stderr
    assert fast_api.read_bytes() == before
    check = run_cli("patch", "check", "--mineru-path", str(mineru_dir), "--json")
    assert json.loads(check.stdout)["files"][0]["state"] == "modified"


def _fake_tree(root: Path, version: str, *, fast_api: bool) -> Path:
    mineru_dir = root / "mineru"
    (mineru_dir / "cli").mkdir(parents=True)
    (mineru_dir / "__init__.py").write_text("", encoding="utf-8")
    (mineru_dir / "version.py").write_text(f'__version__ = "{version}"\n', encoding="utf-8")
    if fast_api:
        (mineru_dir / "cli" / "fast_api.py").write_text("app = None\n", encoding="utf-8")
    return mineru_dir


def test_refuses_mineru_4(tmp_path: Path) -> None:
    mineru_dir = _fake_tree(tmp_path, "4.0.1", fast_api=False)
    result = run_cli("patch", "apply", "--mineru-path", str(mineru_dir))
    assert result.returncode == 3
    assert "MinerU 4.x removed mineru.cli.fast_api" in result.stderr
    assert "3.4 line" in result.stderr
    with pytest.raises(UnsupportedMinerUError):
        patching.check(mineru_dir)


def test_refuses_a_tree_without_fast_api(tmp_path: Path) -> None:
    mineru_dir = _fake_tree(tmp_path, "3.4.4", fast_api=False)
    result = run_cli("patch", "check", "--mineru-path", str(mineru_dir))
    assert result.returncode == 3
    assert "removed mineru.cli.fast_api" in result.stderr


def test_refuses_an_unknown_version(tmp_path: Path) -> None:
    mineru_dir = _fake_tree(tmp_path, "3.1.0", fast_api=True)
    result = run_cli("patch", "apply", "--mineru-path", str(mineru_dir), "--json")
    assert result.returncode == 3
    body = json.loads(result.stdout)
    assert "3.1.0 is not supported" in body["error"] and "3.4.4" in body["error"]


def test_not_mineru_at_all(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_cli("patch", "check", "--mineru-path", str(empty))
    assert result.returncode == 3
    with pytest.raises(PatchError):
        patching.check(tmp_path / "does-not-exist")


def test_manifest_entries_match_their_patches(mineru_copy: Path) -> None:
    mineru_dir = mineru_copy / "mineru"
    manifest = patching.load_manifest(patching.mineru_version(mineru_dir))
    assert manifest.files, "the manifest lists no file"
    for entry in manifest.files:
        made = patching.make_manifest_entry(mineru_dir, entry.target,
                                            manifest.directory / entry.patch)
        assert made == {"target": entry.target, "patch": entry.patch,
                        "original_sha256": entry.original_sha256,
                        "patched_sha256": entry.patched_sha256}


def test_help_everywhere() -> None:
    for args in ([], ["patch"], ["classify"], ["rules"], ["probe"]):
        result = run_cli(*args, "--help")
        assert result.returncode == 0, (args, result.stderr)
        assert "usage" in result.stdout

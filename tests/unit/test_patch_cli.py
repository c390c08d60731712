"""``mineru-health patch`` on a temporary copy of MinerU, and on fake trees."""

from __future__ import annotations

import errno
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli
from mineru_health import patching, safe_files
from mineru_health.errors import PatchError, UnsupportedMinerUError


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _targets(mineru_dir: Path) -> list[Path]:
    manifest, _states = patching.detect(mineru_dir)
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
        assert (target.with_name(target.name + patching.BACKUP_SUFFIX)).read_bytes() == originals[
            target
        ]
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


def test_refuses_a_tree_with_no_known_file(tmp_path: Path) -> None:
    mineru_dir = _fake_tree(tmp_path, "4.0.1", fast_api=False)
    result = run_cli("patch", "apply", "--mineru-path", str(mineru_dir))
    assert result.returncode == 3
    assert "4.0.1" in result.stderr and "match no release" in result.stderr
    assert "3.3.0-3.4.5" in result.stderr
    with pytest.raises(UnsupportedMinerUError):
        patching.check(mineru_dir)


def test_a_known_release_with_a_target_missing_is_refused(small_tree: Path) -> None:
    (small_tree / "cli" / "fast_api.py").unlink()
    result = run_cli("patch", "check", "--mineru-path", str(small_tree), "--json")
    assert result.returncode == 1
    states = {f["target"]: f["state"] for f in json.loads(result.stdout)["files"]}
    assert states["cli/fast_api.py"] == "missing"
    applied = run_cli("patch", "apply", "--mineru-path", str(small_tree))
    assert applied.returncode == 4 and "missing" in applied.stderr


def test_refuses_an_unknown_release(tmp_path: Path) -> None:
    mineru_dir = _fake_tree(tmp_path, "3.1.0", fast_api=True)
    result = run_cli("patch", "apply", "--mineru-path", str(mineru_dir), "--json")
    assert result.returncode == 3
    body = json.loads(result.stdout)
    assert "3.1.0" in body["error"] and "not supported" in body["error"]
    assert "3.3.0-3.4.5" in body["error"]


def test_the_line_is_recognised_by_contents_not_version(small_tree: Path) -> None:
    """A release string nobody listed is accepted when its files are known ones."""
    (small_tree / "version.py").write_text('__version__ = "3.4.99"\n', encoding="utf-8")
    report = patching.apply(small_tree)
    assert report.all_patched and report.line == "3" and report.mineru_version == "3.4.99"
    assert patching.revert(small_tree).files[0].state is patching.FileState.ORIGINAL


def test_not_mineru_at_all(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_cli("patch", "check", "--mineru-path", str(empty))
    assert result.returncode == 3
    with pytest.raises(PatchError):
        patching.check(tmp_path / "does-not-exist")


def test_manifest_variants_match_their_patches(mineru_copy: Path) -> None:
    mineru_dir = mineru_copy / "mineru"
    manifest, _states = patching.detect(mineru_dir)
    assert manifest.files, "the manifest lists no file"
    version = patching.mineru_version(mineru_dir)
    for entry in manifest.files:
        variant = next(v for v in entry.variants if version in v.releases)
        made = patching.make_variant(mineru_dir, entry.target, manifest.directory / variant.patch)
        assert made == {
            "releases": [version],
            "patch": variant.patch,
            "original_sha256": variant.original_sha256,
            "patched_sha256": variant.patched_sha256,
        }


def test_every_shipped_manifest_loads() -> None:
    manifests = patching.load_manifests()
    assert {m.line for m in manifests} >= {"3"}
    for manifest in manifests:
        for entry in manifest.files:
            for variant in entry.variants:
                assert (manifest.directory / variant.patch).is_file(), variant


def _half_apply(small_tree: Path) -> tuple[Path, Path]:
    """What a SIGKILL between the two renames of apply leaves: one file patched."""
    patching.apply(small_tree)
    fast_api, router = small_tree / "cli" / "fast_api.py", small_tree / "cli" / "router.py"
    router.write_bytes(_backup(router).read_bytes())
    _backup(router).unlink()
    return fast_api, router


@pytest.mark.parametrize("how", ["check", "apply", "startup"])
def test_a_half_applied_pair_is_completed(small_tree: Path, how: str) -> None:
    """Issue 17: a killed apply left one file patched and one not until someone reran it."""
    _fast_api, router = _half_apply(small_tree)
    if how == "check":
        report = patching.check(small_tree)
        assert report.all_patched
        assert {f.target: f.action for f in report.files}[
            "cli/router.py"
        ] == "completed a half-finished apply"
    elif how == "apply":
        assert patching.apply(small_tree).all_patched
    else:
        assert patching.startup_problem(small_tree) is None
    assert patching.check(small_tree).all_patched
    assert _backup(router).is_file()


def test_startup_problem_names_an_unpatched_file(small_tree: Path) -> None:
    assert patching.startup_problem(small_tree) is not None  # nothing patched yet
    patching.apply(small_tree)
    assert patching.startup_problem(small_tree) is None
    router = small_tree / "cli" / "router.py"
    router.write_bytes(router.read_bytes() + b"# edited\n")
    problem = patching.startup_problem(small_tree)
    assert problem is not None and str(router) in problem and "modified" in problem


def test_help_everywhere() -> None:
    for args in ([], ["patch"], ["classify"], ["rules"], ["probe"]):
        result = run_cli(*args, "--help")
        assert result.returncode == 0, (args, result.stderr)
        assert "usage" in result.stdout


# --- hardening (issue 10, items 4 and 9): links, leftovers, transactions, --json -------------
#
# These run on a small tree: the installed MinerU's version.py and the target
# files only, which is all that patching reads or writes.


@pytest.fixture
def small_tree(tmp_path: Path) -> Path:
    installed = patching.find_mineru()
    mineru_dir = tmp_path / "site" / "mineru"
    (mineru_dir / "cli").mkdir(parents=True)
    (mineru_dir / "__init__.py").write_bytes(b"")
    (mineru_dir / "version.py").write_bytes((installed / "version.py").read_bytes())
    for target in _targets(installed):
        relative = target.relative_to(installed)
        (mineru_dir / relative).parent.mkdir(parents=True, exist_ok=True)
        (mineru_dir / relative).write_bytes(target.read_bytes())
    return mineru_dir


def _snapshot(directory: Path) -> dict[str, bytes | str]:
    """Every entry under ``directory``: file bytes, or "-> target" for a link."""
    found: dict[str, bytes | str] = {}
    for path in sorted(directory.rglob("*")):
        key = str(path.relative_to(directory))
        if path.is_symlink():
            found[key] = f"-> {path.readlink()}"
        elif path.is_file():
            found[key] = path.read_bytes()
    return found


def _backup(target: Path) -> Path:
    return target.with_name(target.name + patching.BACKUP_SUFFIX)


def test_refuses_a_backup_path_that_is_a_symlink(small_tree: Path, tmp_path: Path) -> None:
    precious = tmp_path / "precious.txt"
    precious.write_bytes(b"not MinerU's\n")
    fast_api = small_tree / "cli" / "fast_api.py"
    _backup(fast_api).symlink_to(precious)
    before = _snapshot(small_tree)
    result = run_cli("patch", "apply", "--mineru-path", str(small_tree))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "symbolic link" in result.stderr and str(_backup(fast_api)) in result.stderr
    assert precious.read_bytes() == b"not MinerU's\n"
    assert _snapshot(small_tree) == before


def test_refuses_a_symlinked_target_and_keeps_the_link(small_tree: Path, tmp_path: Path) -> None:
    fast_api = small_tree / "cli" / "fast_api.py"
    elsewhere = tmp_path / "elsewhere" / "fast_api.py"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(fast_api.read_bytes())
    fast_api.unlink()
    fast_api.symlink_to(elsewhere)
    before = _snapshot(small_tree)
    for action in ("apply", "revert"):
        result = run_cli("patch", action, "--mineru-path", str(small_tree), "--json")
        assert result.returncode == 2, result.stdout + result.stderr
        body = json.loads(result.stdout)
        assert "symbolic link" in body["error"] and body["exit_code"] == 2
    assert fast_api.is_symlink() and fast_api.readlink() == elsewhere
    assert _snapshot(small_tree) == before
    assert not _backup(elsewhere).exists()


def test_cleans_temporary_files_a_killed_run_left(small_tree: Path, tmp_path: Path) -> None:
    cli = small_tree / "cli"
    precious = tmp_path / "precious.txt"
    precious.write_bytes(b"keep me\n")
    leftovers = [
        cli / ".fast_api.py.k3x9_a1b.tmp",  # a half-written patched file
        cli / ".router.py.mineru-health.orig.zz0_9abc.tmp",  # a half-written backup
    ]
    for leftover in leftovers:
        leftover.write_bytes(b"partial")
    linked = cli / ".fast_api.py.abcdefgh.tmp"
    linked.symlink_to(precious)
    unrelated = cli / ".fast_api.py.notours.tmp"
    unrelated.write_bytes(b"someone else's")

    result = run_cli("patch", "apply", "--mineru-path", str(small_tree), "--json")
    assert result.returncode == 0, result.stderr
    cleaned = set(json.loads(result.stdout)["cleaned"])
    assert cleaned == {str(p) for p in [*leftovers, linked]}
    for path in [*leftovers, linked]:
        assert not path.exists() and not path.is_symlink()
    assert precious.read_bytes() == b"keep me\n"  # a link is removed, never followed
    assert unrelated.read_bytes() == b"someone else's"


def _fail_on(monkeypatch: pytest.MonkeyPatch, doomed: set[str], calls: list[str]) -> None:
    """Makes ``safe_files.replace_file`` fail (ENOSPC) when it writes a file named in ``doomed``."""
    real = safe_files.replace_file

    def replace(path: Path, data: bytes, *rest: Any) -> None:
        calls.append(path.name)
        if path.name in doomed:
            doomed.discard(path.name)
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, data, *rest)

    monkeypatch.setattr(safe_files, "replace_file", replace)


def test_apply_is_all_or_nothing(small_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    targets = _targets(small_tree)
    assert len(targets) >= 2
    before = _snapshot(small_tree)
    calls: list[str] = []
    _fail_on(monkeypatch, {targets[-1].name}, calls)
    with pytest.raises(PatchError) as info:
        patching.apply(small_tree)
    assert info.value.exit_code == 2
    assert "No space left on device" in str(info.value)
    assert "every file was restored" in str(info.value)
    assert targets[0].name in calls  # the first file had been patched
    assert _snapshot(small_tree) == before  # ... and is original again, with no backup left
    monkeypatch.undo()
    assert patching.apply(small_tree).all_patched


def test_revert_is_all_or_nothing(small_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    patching.apply(small_tree)
    targets = _targets(small_tree)
    before = _snapshot(small_tree)
    calls: list[str] = []
    _fail_on(monkeypatch, {targets[-1].name}, calls)
    with pytest.raises(PatchError) as info:
        patching.revert(small_tree)
    assert "every file was restored" in str(info.value)
    assert targets[0].name in calls
    assert _snapshot(small_tree) == before  # still patched, backups kept
    assert patching.check(small_tree).all_patched


def test_a_failed_rollback_is_reported(small_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    targets = _targets(small_tree)
    calls: list[str] = []
    # The second target fails, then restoring the first fails too.
    real = safe_files.replace_file
    failures = {targets[-1].name: 1, targets[0].name: 2}

    def replace(path: Path, data: bytes, *rest: Any) -> None:
        calls.append(path.name)
        if path.name in failures and calls.count(path.name) == failures[path.name]:
            raise OSError(errno.EIO, "Input/output error", str(path))
        real(path, data, *rest)

    monkeypatch.setattr(safe_files, "replace_file", replace)
    with pytest.raises(PatchError) as info:
        patching.apply(small_tree)
    assert "ROLLBACK INCOMPLETE" in str(info.value) and str(targets[0]) in str(info.value)


@pytest.mark.parametrize("action", ["apply", "check", "revert"])
def test_json_on_an_os_error(
    small_tree: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    action: str,
) -> None:
    from mineru_health import cli

    if action == "revert":
        patching.apply(small_tree)

    def unreadable(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(errno.EACCES, "Permission denied", str(small_tree / "cli"))

    # check, apply and revert all hash the files; apply and revert then write them.
    monkeypatch.setattr(patching, "_sha256", unreadable)
    code = cli.main(["patch", action, "--mineru-path", str(small_tree), "--json"])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    body = json.loads(out)
    assert "Permission denied" in body["error"] and body["exit_code"] == 2
    assert "Traceback" not in err


def test_json_on_a_failed_write(
    small_tree: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from mineru_health import cli

    def no_space(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safe_files.tempfile, "mkstemp", no_space)
    code = cli.main(["patch", "apply", "--mineru-path", str(small_tree), "--json"])
    out, _err = capsys.readouterr()
    assert code == 2
    assert "No space left on device" in json.loads(out)["error"]
    assert patching.check(small_tree).files[0].state is patching.FileState.ORIGINAL


def test_exit_codes_in_json(tmp_path: Path, small_tree: Path) -> None:
    fast_api = small_tree / "cli" / "fast_api.py"
    fast_api.write_bytes(fast_api.read_bytes() + b"# local\n")
    modified = run_cli("patch", "apply", "--mineru-path", str(small_tree), "--json")
    assert modified.returncode == 4 and json.loads(modified.stdout)["exit_code"] == 4
    mineru4 = _fake_tree(tmp_path / "four", "2.0.0", fast_api=False)
    unsupported = run_cli("patch", "apply", "--mineru-path", str(mineru4), "--json")
    assert unsupported.returncode == 3 and json.loads(unsupported.stdout)["exit_code"] == 3


def test_runs_on_one_tree_are_serialised(small_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(patching, "LOCK_TIMEOUT_S", 0.0)
    with safe_files.locked(small_tree, timeout_s=0.0):
        with pytest.raises(PatchError) as info:
            patching.apply(small_tree)
        assert "another mineru-health patch run" in str(info.value)
    assert patching.apply(small_tree).all_patched

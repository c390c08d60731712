"""Apply, check and revert the mineru-health patches on an installed MinerU.

The patches live in ``patches/mineru-<version>/`` (shipped in the wheel as
``mineru_health/patches/``), next to a ``manifest.json``::

    {
      "format": 1,
      "mineru_version": "3.4.4",
      "files": [
        {"target": "cli/fast_api.py",          # relative to the mineru package dir
         "patch": "fast_api.patch",            # unified diff, paths a/<target> b/<target>
         "original_sha256": "...",             # MinerU's pristine file
         "patched_sha256": "..."}              # the file after the patch
      ]
    }

Every target is in one of four states: ``original``, ``patched``,
``modified`` (neither hash: someone else changed it) or ``missing``. Apply and
revert refuse a modified or missing file (exit code 4) before touching
anything; both are idempotent. Apply keeps a byte-for-byte backup
``<file>.mineru-health.orig``; revert restores from it when its hash is the
original one, else applies the patch in reverse, and always verifies the
result's hash before replacing the file.

Writing into a package directory, often as root, is done defensively:

* Symbolic links are never followed. A target file that is a symbolic link
  (``fast_api.py -> elsewhere``) is refused with a clear message rather than
  patched through the link or replaced by a regular file: the file it points
  to may belong to another installation. A backup path that is a symbolic
  link is refused too. Files are read and written by
  :mod:`mineru_health.safe_files` (``O_NOFOLLOW`` reads, ``O_EXCL``
  temporary files renamed into place).
* Apply and revert are one transaction over every target: if any step fails,
  the files already written are restored (and new backups removed) before
  the error is reported, so MinerU is never left half patched.
* Temporary files that a killed run left behind (``.<file>.*.tmp``) are
  removed by the next apply or revert. Runs on one MinerU directory are
  serialised with an advisory lock on the directory itself.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import importlib.util
import json
import os
import re
import stat
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import safe_files
from .errors import PatchError, UnsupportedMinerUError

__all__ = [
    "BACKUP_SUFFIX",
    "EXIT_MODIFIED",
    "FileState",
    "FileStatus",
    "Manifest",
    "ManifestEntry",
    "PatchReport",
    "apply",
    "check",
    "find_mineru",
    "load_manifest",
    "make_manifest_entry",
    "mineru_version",
    "patches_root",
    "revert",
    "supported_versions",
]

BACKUP_SUFFIX = ".mineru-health.orig"
EXIT_ERROR = 2
EXIT_MODIFIED = 4
#: How long apply/revert wait for another run on the same MinerU directory.
LOCK_TIMEOUT_S = 30.0
MANIFEST_NAME = "manifest.json"
NO_FAST_API = "MinerU 4.x removed mineru.cli.fast_api; mineru-health supports the 3.4 line"

_VERSION_RE = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.MULTILINE)


class FileState(enum.Enum):
    ORIGINAL = "original"
    PATCHED = "patched"
    MODIFIED = "modified"
    MISSING = "missing"


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    target: str
    patch: str
    original_sha256: str
    patched_sha256: str


@dataclass(frozen=True, slots=True)
class Manifest:
    mineru_version: str
    directory: Path
    files: tuple[ManifestEntry, ...]


@dataclass(frozen=True, slots=True)
class FileStatus:
    target: str
    path: Path
    state: FileState
    action: str = ""  # what apply/revert did: "patched", "reverted", "unchanged", ...

    def to_json(self) -> dict[str, str]:
        return {"target": self.target, "path": str(self.path), "state": self.state.value,
                "action": self.action}


@dataclass(frozen=True, slots=True)
class PatchReport:
    mineru_dir: Path
    mineru_version: str
    files: tuple[FileStatus, ...]
    cleaned: tuple[Path, ...] = ()  # temporary files a killed run had left

    @property
    def all_patched(self) -> bool:
        return all(f.state is FileState.PATCHED for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {
            "mineru_dir": str(self.mineru_dir),
            "mineru_version": self.mineru_version,
            "all_patched": self.all_patched,
            "files": [f.to_json() for f in self.files],
            "cleaned": [str(p) for p in self.cleaned],
        }


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def patches_root() -> Path:
    """``mineru_health/patches`` in an installed wheel, else the source checkout's ``patches/``."""
    package_dir = Path(__file__).resolve().parent
    candidates = [package_dir / "patches", package_dir.parent.parent / "patches"]
    override = os.environ.get("MINERU_HEALTH_PATCHES_DIR", "").strip()
    if override:
        candidates.insert(0, Path(override))
    for candidate in candidates:
        if candidate.is_dir() and any(candidate.glob(f"mineru-*/{MANIFEST_NAME}")):
            return candidate
    raise PatchError(
        "cannot find the mineru-health patches (looked in "
        + ", ".join(str(c) for c in candidates) + ")"
    )


def supported_versions(root: Path | None = None) -> list[str]:
    base = root or patches_root()
    return sorted(p.parent.name.removeprefix("mineru-") for p in base.glob(f"mineru-*/{MANIFEST_NAME}"))


def find_mineru(path: str | os.PathLike[str] | None = None) -> Path:
    """The ``mineru`` package directory: ``path`` if given, else the importable one.

    The package is located without being imported (MinerU's imports are heavy).
    """
    if path is not None:
        directory = Path(path).expanduser().resolve()
        if not directory.is_dir():
            raise PatchError(f"{directory} is not a directory", exit_code=2)
        if not (directory / "__init__.py").is_file() and (directory / "mineru").is_dir():
            directory = directory / "mineru"  # a site-packages-like parent was given
        return directory
    spec = importlib.util.find_spec("mineru")
    if spec is None or not spec.submodule_search_locations:
        raise PatchError(
            "MinerU is not importable from this Python; pass --mineru-path DIR "
            "(the directory of the mineru package)",
            exit_code=2,
        )
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def mineru_version(mineru_dir: Path) -> str:
    version_file = mineru_dir / "version.py"
    try:
        text = version_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise UnsupportedMinerUError(
            f"{mineru_dir} does not look like MinerU: cannot read {version_file} ({error})"
        ) from error
    match = _VERSION_RE.search(text)
    if not match:
        raise UnsupportedMinerUError(f"cannot find __version__ in {version_file}")
    return match.group(1)


def load_manifest(version: str, root: Path | None = None) -> Manifest:
    base = root or patches_root()
    directory = base / f"mineru-{version}"
    manifest_path = directory / MANIFEST_NAME
    if not manifest_path.is_file():
        raise UnsupportedMinerUError(
            f"MinerU {version} is not supported; mineru-health has patches for "
            + ", ".join(supported_versions(base))
        )
    try:
        data = json.loads(manifest_path.read_text(encoding="utf-8"))
        files = tuple(
            ManifestEntry(
                target=str(entry["target"]),
                patch=str(entry["patch"]),
                original_sha256=str(entry["original_sha256"]).lower(),
                patched_sha256=str(entry["patched_sha256"]).lower(),
            )
            for entry in data["files"]
        )
    except (ValueError, KeyError, TypeError) as error:
        raise PatchError(f"broken patch manifest {manifest_path}: {error}") from error
    return Manifest(str(data.get("mineru_version", version)), directory, files)


def _resolve(mineru_path: str | os.PathLike[str] | None) -> tuple[Path, str, Manifest]:
    mineru_dir = find_mineru(mineru_path)
    version = mineru_version(mineru_dir)
    if version.split(".", 1)[0].isdigit() and int(version.split(".", 1)[0]) >= 4:
        raise UnsupportedMinerUError(f"MinerU {version} at {mineru_dir}: {NO_FAST_API}")
    if not (mineru_dir / "cli" / "fast_api.py").is_file():
        raise UnsupportedMinerUError(f"MinerU {version} at {mineru_dir}: {NO_FAST_API}")
    return mineru_dir, version, load_manifest(version)


def _state(path: Path, entry: ManifestEntry) -> FileState:
    if not path.is_file():
        return FileState.MISSING
    digest = _sha256(path)
    if digest == entry.original_sha256:
        return FileState.ORIGINAL
    if digest == entry.patched_sha256:
        return FileState.PATCHED
    return FileState.MODIFIED


def _states(mineru_dir: Path, manifest: Manifest) -> list[tuple[ManifestEntry, Path, FileState]]:
    return [
        (entry, mineru_dir / entry.target, _state(mineru_dir / entry.target, entry))
        for entry in manifest.files
    ]


def _refuse_unknown(states: Sequence[tuple[ManifestEntry, Path, FileState]], verb: str) -> None:
    for entry, path, state in states:
        if state is FileState.MODIFIED:
            raise PatchError(
                f"refusing to {verb}: {path} was modified by someone else (its sha256 is "
                "neither MinerU's original nor mineru-health's patched file); restore it "
                "(e.g. reinstall MinerU) and try again",
                exit_code=EXIT_MODIFIED,
            )
        if state is FileState.MISSING:
            raise PatchError(f"refusing to {verb}: {path} is missing", exit_code=EXIT_MODIFIED)


def _run_patch(entry: ManifestEntry, manifest: Manifest, source: bytes, *, reverse: bool) -> bytes:
    """Applies one patch (or its reverse) to ``source`` in a scratch directory."""
    import patch_ng  # type: ignore[import-untyped]

    patch_file = manifest.directory / entry.patch
    patch_set = patch_ng.fromfile(str(patch_file))
    if not patch_set:
        raise PatchError(f"cannot parse patch {patch_file}")
    with tempfile.TemporaryDirectory(prefix="mineru-health-patch-") as scratch:
        work = Path(scratch) / entry.target
        work.parent.mkdir(parents=True, exist_ok=True)
        work.write_bytes(source)
        ok = patch_set.revert(strip=1, root=scratch) if reverse else patch_set.apply(
            strip=1, root=scratch
        )
        if not ok:
            raise PatchError(f"{patch_file} does not apply to {entry.target}")
        return work.read_bytes()


def _backup_path(path: Path) -> Path:
    return path.with_name(path.name + BACKUP_SUFFIX)


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(safe_files.locked(directory, timeout_s=LOCK_TIMEOUT_S))
        except TimeoutError:
            raise PatchError(
                f"another mineru-health patch run holds {directory}; try again later"
            ) from None
        yield


def _refuse_links(states: Sequence[tuple[ManifestEntry, Path, FileState]], verb: str) -> None:
    for _entry, path, _state in states:
        if path.is_symlink():
            raise PatchError(
                f"refusing to {verb}: {path} is a symbolic link (to {os.readlink(path)}); "
                "mineru-health neither writes through it nor replaces it. Point --mineru-path "
                "at the MinerU that owns the real file, or replace the link with a copy",
                exit_code=EXIT_ERROR,
            )
        backup = _backup_path(path)
        info = safe_files.lstat_or_none(backup)
        if info is not None and not stat.S_ISREG(info.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a regular file"
            raise PatchError(
                f"refusing to {verb}: the backup path {backup} is {kind}; mineru-health never "
                "writes through links. Remove it and try again",
                exit_code=EXIT_ERROR,
            )


@contextlib.contextmanager
def _transaction(verb: str) -> Iterator[safe_files.Transaction]:
    """Runs the body as one transaction; any failure rolls back and raises PatchError."""
    txn = safe_files.Transaction()
    try:
        yield txn
    except BaseException as error:
        failures = txn.rollback()
        if not isinstance(error, Exception):
            raise
        outcome = (
            "every file was restored as it was"
            if not failures
            else "ROLLBACK INCOMPLETE, restore these by hand: " + "; ".join(failures)
        )
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        where = f" ({error.filename})" if isinstance(error, OSError) and error.filename else ""
        exit_code = error.exit_code if isinstance(error, PatchError) else EXIT_ERROR
        raise PatchError(f"{verb} failed: {reason}{where}; {outcome}",
                         exit_code=exit_code) from error


# --- the three commands --------------------------------------------------------------------


def check(mineru_path: str | os.PathLike[str] | None = None) -> PatchReport:
    """Reports the state of every target file; changes nothing."""
    mineru_dir, version, manifest = _resolve(mineru_path)
    return PatchReport(
        mineru_dir, version,
        tuple(FileStatus(e.target, p, s) for e, p, s in _states(mineru_dir, manifest)),
    )


def apply(mineru_path: str | os.PathLike[str] | None = None) -> PatchReport:
    """Patches every target that is still original; a no-op for patched ones."""
    mineru_dir, version, manifest = _resolve(mineru_path)
    with _locked(mineru_dir):
        cleaned = safe_files.clean_temporaries(
            [mineru_dir / e.target for e in manifest.files], extra_suffixes=(BACKUP_SUFFIX,)
        )
        states = _states(mineru_dir, manifest)
        _refuse_unknown(states, "patch")
        _refuse_links(states, "patch")
        # Compute every patched file first so that a broken patch changes nothing.
        planned: list[tuple[ManifestEntry, Path, bytes, bytes | None]] = []
        for entry, path, state in states:
            if state is FileState.PATCHED:
                planned.append((entry, path, b"", None))
                continue
            original = safe_files.read_regular(path)
            patched = _run_patch(entry, manifest, original, reverse=False)
            if _sha256_bytes(patched) != entry.patched_sha256:
                raise PatchError(f"patching {path} gave an unexpected result (sha256 mismatch)")
            planned.append((entry, path, original, patched))

        results = []
        with _transaction("patching") as txn:
            for entry, path, source, new_bytes in planned:
                if new_bytes is None:
                    results.append(FileStatus(entry.target, path, FileState.PATCHED, "unchanged"))
                    continue
                # The backup first: a patched file never exists without its backup.
                txn.write(_backup_path(path), source)
                txn.write(path, new_bytes)
                if _state(path, entry) is not FileState.PATCHED:
                    raise PatchError(f"{path} does not have the expected content after patching")
                results.append(FileStatus(entry.target, path, FileState.PATCHED, "patched"))
            txn.commit()
    return PatchReport(mineru_dir, version, tuple(results), cleaned)


def revert(mineru_path: str | os.PathLike[str] | None = None) -> PatchReport:
    """Restores MinerU's original files byte for byte; a no-op for original ones."""
    mineru_dir, version, manifest = _resolve(mineru_path)
    with _locked(mineru_dir):
        cleaned = safe_files.clean_temporaries(
            [mineru_dir / e.target for e in manifest.files], extra_suffixes=(BACKUP_SUFFIX,)
        )
        states = _states(mineru_dir, manifest)
        _refuse_unknown(states, "revert")
        _refuse_links(states, "revert")
        planned: list[tuple[ManifestEntry, Path, bytes | None, str, bool]] = []
        for entry, path, state in states:
            backup = _backup_path(path)
            saved = safe_files.read_regular(backup) if safe_files.lstat_or_none(backup) is not None else None
            backup_ok = saved is not None and _sha256_bytes(saved) == entry.original_sha256
            if state is FileState.ORIGINAL:
                planned.append((entry, path, None, "unchanged", backup_ok))
                continue
            if saved is not None and backup_ok:
                original = saved
                action = "restored from backup"
            else:
                original = _run_patch(entry, manifest, safe_files.read_regular(path), reverse=True)
                action = "reverse-applied"
            if _sha256_bytes(original) != entry.original_sha256:
                raise PatchError(f"reverting {path} gave an unexpected result (sha256 mismatch)")
            planned.append((entry, path, original, action, backup_ok))

        results = []
        with _transaction("reverting") as txn:
            for entry, path, restored, action, backup_ok in planned:
                if restored is not None:
                    txn.write(path, restored)
                if backup_ok:
                    txn.remove_at_commit(_backup_path(path))
                results.append((entry, path, action))
            # The files are reverted; a backup that cannot be removed is
            # harmless (the next apply overwrites it) and is reported.
            stale = set(txn.commit())
    files = tuple(
        FileStatus(
            entry.target, path, _state(path, entry),
            action + (" (backup not removed)" if _backup_path(path) in stale else ""),
        )
        for entry, path, action in results
    )
    return PatchReport(mineru_dir, version, files, cleaned)


def make_manifest_entry(
    mineru_path: str | os.PathLike[str], target: str, patch: str | os.PathLike[str]
) -> dict[str, str]:
    """A manifest entry for ``patch`` (a unified diff of ``target``) against a pristine tree.

    For maintainers adding a patch: the hashes come from the pristine file and
    from the result of applying the patch to it.
    """
    import patch_ng

    mineru_dir = find_mineru(mineru_path)
    source_path = mineru_dir / target
    patch_path = Path(patch)
    source = source_path.read_bytes()
    patch_set = patch_ng.fromfile(str(patch_path))
    if not patch_set:
        raise PatchError(f"cannot parse patch {patch_path}")
    with tempfile.TemporaryDirectory(prefix="mineru-health-patch-") as scratch:
        work = Path(scratch) / target
        work.parent.mkdir(parents=True, exist_ok=True)
        work.write_bytes(source)
        if not patch_set.apply(strip=1, root=scratch):
            raise PatchError(f"{patch_path} does not apply to {source_path}")
        patched = work.read_bytes()
    return {
        "target": target,
        "patch": patch_path.name,
        "original_sha256": _sha256_bytes(source),
        "patched_sha256": _sha256_bytes(patched),
    }

"""Apply, check and revert the mineru-health patches on an installed MinerU.

The patches live in one directory per MinerU line, ``patches/<line>/``
(shipped in the wheel as ``mineru_health/patches/``), next to a
``manifest.json`` that names the target files by their contents, not by a
version string::

    {
      "format": 2,
      "line": "3",                                  # patches/mineru-3/
      "summary": "MinerU 3.3.0-3.4.5: ...",
      "files": [
        {"target": "cli/fast_api.py",               # relative to the mineru package dir
         "variants": [                              # one per distinct pristine file
           {"releases": ["3.3.0", ..., "3.4.5"],    # where that file ships (informational)
            "patch": "fast_api.patch",              # unified diff, paths a/<target> b/<target>
            "original_sha256": "...",               # MinerU's pristine file
            "patched_sha256": "..."}]}              # the file after the patch
      ]
    }

The line of an installed MinerU is the one whose target files all hash to a
known original or patched variant, so every release that ships the same
files is accepted whatever its version says, and a file nobody knows is
refused: as *modified* (exit code 4) when ``version.py`` names a release of
that line, as *unsupported* (exit code 3) otherwise.

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
import sys
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
    "Variant",
    "apply",
    "check",
    "detect",
    "find_mineru",
    "load_manifests",
    "make_variant",
    "mineru_version",
    "patches_root",
    "revert",
    "running_problem",
    "startup_problem",
    "supported_releases",
]

BACKUP_SUFFIX = ".mineru-health.orig"
EXIT_ERROR = 2
EXIT_MODIFIED = 4
#: How long apply/revert wait for another run on the same MinerU directory.
LOCK_TIMEOUT_S = 30.0
MANIFEST_NAME = "manifest.json"

_VERSION_RE = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.MULTILINE)


class FileState(enum.Enum):
    ORIGINAL = "original"
    PATCHED = "patched"
    MODIFIED = "modified"
    MISSING = "missing"


@dataclass(frozen=True, slots=True)
class Variant:
    """One pristine form of a target file and what the patch makes of it."""

    releases: tuple[str, ...]
    patch: str
    original_sha256: str
    patched_sha256: str


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    target: str
    variants: tuple[Variant, ...]

    def match(self, digest: str) -> tuple[FileState, Variant | None]:
        """The state a file with this sha256 is in, and the variant it belongs to."""
        for variant in self.variants:
            if digest == variant.original_sha256:
                return FileState.ORIGINAL, variant
            if digest == variant.patched_sha256:
                return FileState.PATCHED, variant
        return FileState.MODIFIED, None


@dataclass(frozen=True, slots=True)
class Manifest:
    line: str
    summary: str
    directory: Path
    files: tuple[ManifestEntry, ...]

    @property
    def releases(self) -> tuple[str, ...]:
        """Every release any target's variants name, oldest first."""
        found = {r for entry in self.files for v in entry.variants for r in v.releases}
        return tuple(sorted(found, key=_release_key))


@dataclass(frozen=True, slots=True)
class FileStatus:
    target: str
    path: Path
    state: FileState
    action: str = ""  # what apply/revert did: "patched", "reverted", "unchanged", ...

    def to_json(self) -> dict[str, str]:
        return {
            "target": self.target,
            "path": str(self.path),
            "state": self.state.value,
            "action": self.action,
        }


@dataclass(frozen=True, slots=True)
class PatchReport:
    mineru_dir: Path
    mineru_version: str
    line: str
    files: tuple[FileStatus, ...]
    cleaned: tuple[Path, ...] = ()  # temporary files a killed run had left

    @property
    def all_patched(self) -> bool:
        return all(f.state is FileState.PATCHED for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {
            "mineru_dir": str(self.mineru_dir),
            "mineru_version": self.mineru_version,
            "line": self.line,
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
        + ", ".join(str(c) for c in candidates)
        + ")"
    )


def _release_key(release: str) -> tuple[int | str, ...]:
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"[.+-]", release))


def load_manifests(root: Path | None = None) -> tuple[Manifest, ...]:
    """Every line's manifest under ``root`` (default: the shipped patches)."""
    base = root or patches_root()
    return tuple(_load_manifest(path) for path in sorted(base.glob(f"mineru-*/{MANIFEST_NAME}")))


def _load_manifest(manifest_path: Path) -> Manifest:
    try:
        data = json.loads(manifest_path.read_text(encoding="utf-8"))
        if data.get("format") != 2:
            raise ValueError(f"format {data.get('format')!r}, expected 2")
        files = tuple(
            ManifestEntry(
                target=str(entry["target"]),
                variants=tuple(
                    Variant(
                        releases=tuple(str(r) for r in variant["releases"]),
                        patch=str(variant["patch"]),
                        original_sha256=str(variant["original_sha256"]).lower(),
                        patched_sha256=str(variant["patched_sha256"]).lower(),
                    )
                    for variant in entry["variants"]
                ),
            )
            for entry in data["files"]
        )
        return Manifest(
            str(data["line"]), str(data.get("summary", "")), manifest_path.parent, files
        )
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise PatchError(f"broken patch manifest {manifest_path}: {error}") from error


def supported_releases(root: Path | None = None) -> str:
    """The releases the shipped patches know, line by line, for messages."""
    parts = []
    for manifest in load_manifests(root):
        releases = manifest.releases
        span = releases[0] if len(releases) == 1 else f"{releases[0]}-{releases[-1]}"
        parts.append(span if releases else f"line {manifest.line}")
    return ", ".join(parts)


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


@dataclass(frozen=True, slots=True)
class _Target:
    entry: ManifestEntry
    path: Path
    state: FileState
    variant: Variant | None


def _state(path: Path, entry: ManifestEntry) -> tuple[FileState, Variant | None]:
    if not path.is_file():
        return FileState.MISSING, None
    return entry.match(_sha256(path))


def _states(mineru_dir: Path, manifest: Manifest) -> list[_Target]:
    found = []
    for entry in manifest.files:
        path = mineru_dir / entry.target
        found.append(_Target(entry, path, *_state(path, entry)))
    return found


def detect(mineru_dir: Path, root: Path | None = None) -> tuple[Manifest, list[_Target]]:
    """The line whose target files ``mineru_dir`` holds, and each target's state.

    A line all of whose targets are original or patched wins. Failing that,
    the line whose releases include the one ``version.py`` names is returned
    with its modified or missing files, for the caller to refuse (exit 4).
    Anything else is not a MinerU these patches know (exit 3).
    """
    version = mineru_version(mineru_dir)
    claimed: tuple[Manifest, list[_Target]] | None = None
    for manifest in load_manifests(root):
        targets = _states(mineru_dir, manifest)
        if all(t.state in (FileState.ORIGINAL, FileState.PATCHED) for t in targets):
            return manifest, targets
        if version in manifest.releases:
            claimed = (manifest, targets)
    if claimed is not None:
        return claimed
    raise UnsupportedMinerUError(
        f"MinerU {version} at {mineru_dir} is not supported: its files match no release "
        f"mineru-health knows ({supported_releases(root)})"
    )


def startup_problem(mineru_dir: Path) -> str | None:
    """Why the running MinerU's files are not ones mineru-health patched, or None.

    Workers and routers call this once at start-up: a target that is still
    original, modified or missing next to a patched one (a half-finished
    apply, a local edit, an upgrade of one package without the other) is
    said plainly instead of showing up later as odd behaviour. A pair that
    a killed apply left half patched is completed first.
    """
    try:
        _manifest, targets = detect(mineru_dir)
        if _half_applied(targets):
            apply(mineru_dir)  # finish what a killed apply began
            _manifest, targets = detect(mineru_dir)
    except PatchError as error:
        return str(error)
    except OSError as error:  # a read-only site-packages: say so, do not stop
        return f"cannot finish a half-finished apply in {mineru_dir}: {error}"
    wrong = [t for t in targets if t.state is not FileState.PATCHED]
    if not wrong:
        return None
    listed = ", ".join(f"{t.path} is {t.state.value}" for t in wrong)
    return f"{listed}; run `mineru-health patch check --mineru-path {mineru_dir}`"


def running_problem() -> str | None:
    """:func:`startup_problem` for the ``mineru`` package this process imported."""
    module = sys.modules.get("mineru")
    location = getattr(module, "__file__", None)
    if not location:
        return None
    return startup_problem(Path(location).resolve().parent)


def _refuse_unknown(targets: Sequence[_Target], verb: str) -> None:
    for target in targets:
        if target.state is FileState.MODIFIED:
            raise PatchError(
                f"refusing to {verb}: {target.path} was modified by someone else (its sha256 is "
                "neither MinerU's original nor mineru-health's patched file); restore it "
                "(e.g. reinstall MinerU) and try again",
                exit_code=EXIT_MODIFIED,
            )
        if target.state is FileState.MISSING:
            raise PatchError(
                f"refusing to {verb}: {target.path} is missing", exit_code=EXIT_MODIFIED
            )


def _run_patch(target: str, patch_file: Path, source: bytes, *, reverse: bool) -> bytes:
    """Applies one patch (or its reverse) to ``source`` in a scratch directory."""
    import patch_ng  # type: ignore[import-untyped]

    patch_set = patch_ng.fromfile(str(patch_file))
    if not patch_set:
        raise PatchError(f"cannot parse patch {patch_file}")
    with tempfile.TemporaryDirectory(prefix="mineru-health-patch-") as scratch:
        work = Path(scratch) / target
        work.parent.mkdir(parents=True, exist_ok=True)
        work.write_bytes(source)
        ok = (
            patch_set.revert(strip=1, root=scratch)
            if reverse
            else patch_set.apply(strip=1, root=scratch)
        )
        if not ok:
            raise PatchError(f"{patch_file} does not apply to {target}")
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


def _refuse_links(targets: Sequence[_Target], verb: str) -> None:
    for path in (t.path for t in targets):
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
        raise PatchError(
            f"{verb} failed: {reason}{where}; {outcome}", exit_code=exit_code
        ) from error


# --- the three commands --------------------------------------------------------------------


def _half_applied(targets: Sequence[_Target]) -> bool:
    """Some targets patched and the others original: an apply that was killed midway."""
    states = {t.state for t in targets}
    return states == {FileState.PATCHED, FileState.ORIGINAL}


def check(mineru_path: str | os.PathLike[str] | None = None) -> PatchReport:
    """Reports the state of every target file.

    Changes nothing, except to finish an apply that was killed between its
    files (some patched, the rest original): that pair is completed, since
    a half-patched MinerU runs one process healed and the other not.
    """
    mineru_dir = find_mineru(mineru_path)
    manifest, targets = detect(mineru_dir)
    if _half_applied(targets):
        report = apply(mineru_dir)
        files = tuple(
            FileStatus(
                f.target,
                f.path,
                f.state,
                "completed a half-finished apply" if f.action == "patched" else "",
            )
            for f in report.files
        )
        return PatchReport(
            report.mineru_dir, report.mineru_version, report.line, files, report.cleaned
        )
    return PatchReport(
        mineru_dir,
        mineru_version(mineru_dir),
        manifest.line,
        tuple(FileStatus(t.entry.target, t.path, t.state) for t in targets),
    )


def _prepare(
    mineru_path: str | os.PathLike[str] | None, verb: str
) -> tuple[Path, Manifest, list[_Target], tuple[Path, ...]]:
    """Finds the line, removes a killed run's leftovers, refuses what must not be touched.

    Runs under the directory lock held by the caller.
    """
    mineru_dir = find_mineru(mineru_path)
    manifest, targets = detect(mineru_dir)
    cleaned = safe_files.clean_temporaries(
        [t.path for t in targets], extra_suffixes=(BACKUP_SUFFIX,)
    )
    _refuse_unknown(targets, verb)
    _refuse_links(targets, verb)
    return mineru_dir, manifest, targets, tuple(cleaned)


def apply(mineru_path: str | os.PathLike[str] | None = None) -> PatchReport:
    """Patches every target that is still original; a no-op for patched ones."""
    with _locked(find_mineru(mineru_path)):
        mineru_dir, manifest, targets, cleaned = _prepare(mineru_path, "patch")
        # Compute every patched file first so that a broken patch changes nothing.
        planned: list[tuple[_Target, bytes, bytes | None]] = []
        for target in targets:
            assert target.variant is not None  # original or patched, by _refuse_unknown
            if target.state is FileState.PATCHED:
                planned.append((target, b"", None))
                continue
            original = safe_files.read_regular(target.path)
            patched = _run_patch(
                target.entry.target,
                manifest.directory / target.variant.patch,
                original,
                reverse=False,
            )
            if _sha256_bytes(patched) != target.variant.patched_sha256:
                raise PatchError(
                    f"patching {target.path} gave an unexpected result (sha256 mismatch)"
                )
            planned.append((target, original, patched))

        results = []
        with _transaction("patching") as txn:
            for target, source, new_bytes in planned:
                name, path = target.entry.target, target.path
                if new_bytes is None:
                    results.append(FileStatus(name, path, FileState.PATCHED, "unchanged"))
                    continue
                # The backup first: a patched file never exists without its backup.
                txn.write(_backup_path(path), source)
                txn.write(path, new_bytes)
                if _state(path, target.entry)[0] is not FileState.PATCHED:
                    raise PatchError(f"{path} does not have the expected content after patching")
                results.append(FileStatus(name, path, FileState.PATCHED, "patched"))
            txn.commit()
    return PatchReport(
        mineru_dir, mineru_version(mineru_dir), manifest.line, tuple(results), cleaned
    )


def revert(mineru_path: str | os.PathLike[str] | None = None) -> PatchReport:
    """Restores MinerU's original files byte for byte; a no-op for original ones."""
    with _locked(find_mineru(mineru_path)):
        mineru_dir, manifest, targets, cleaned = _prepare(mineru_path, "revert")
        planned: list[tuple[_Target, bytes | None, str, bool]] = []
        for target in targets:
            variant, path = target.variant, target.path
            assert variant is not None  # original or patched, by _refuse_unknown
            backup = _backup_path(path)
            saved = (
                safe_files.read_regular(backup)
                if safe_files.lstat_or_none(backup) is not None
                else None
            )
            backup_ok = saved is not None and _sha256_bytes(saved) == variant.original_sha256
            if target.state is FileState.ORIGINAL:
                planned.append((target, None, "unchanged", backup_ok))
                continue
            if saved is not None and backup_ok:
                original = saved
                action = "restored from backup"
            else:
                original = _run_patch(
                    target.entry.target,
                    manifest.directory / variant.patch,
                    safe_files.read_regular(path),
                    reverse=True,
                )
                action = "reverse-applied"
            if _sha256_bytes(original) != variant.original_sha256:
                raise PatchError(f"reverting {path} gave an unexpected result (sha256 mismatch)")
            planned.append((target, original, action, backup_ok))

        with _transaction("reverting") as txn:
            for target, restored, _action, backup_ok in planned:
                if restored is not None:
                    txn.write(target.path, restored)
                if backup_ok:
                    txn.remove_at_commit(_backup_path(target.path))
            # The files are reverted; a backup that cannot be removed is
            # harmless (the next apply overwrites it) and is reported.
            stale = set(txn.commit())
    files = tuple(
        FileStatus(
            target.entry.target,
            target.path,
            _state(target.path, target.entry)[0],
            action + (" (backup not removed)" if _backup_path(target.path) in stale else ""),
        )
        for target, _restored, action, _backup_ok in planned
    )
    return PatchReport(mineru_dir, mineru_version(mineru_dir), manifest.line, files, cleaned)


def make_variant(
    mineru_path: str | os.PathLike[str], target: str, patch: str | os.PathLike[str]
) -> dict[str, Any]:
    """A manifest variant for ``patch`` (a unified diff of ``target``) against a pristine tree.

    For maintainers adding a release: the hashes come from the pristine file
    and from the result of applying the patch to it.
    """
    mineru_dir = find_mineru(mineru_path)
    source = (mineru_dir / target).read_bytes()
    patched = _run_patch(target, Path(patch), source, reverse=False)
    return {
        "releases": [mineru_version(mineru_dir)],
        "patch": Path(patch).name,
        "original_sha256": _sha256_bytes(source),
        "patched_sha256": _sha256_bytes(patched),
    }

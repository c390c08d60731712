"""A submission's kept uploads in the store several routers share, for whichever router
resumes it (issue 35).

A router keeps what it needs to send a submission again in its own state directory:
the files under its row's ``source`` (``Snapshot.source``: 3.x a staged upload's
directory, 4.0 its inputs' files, one path a line). A router that takes a dead router's
rows over on another node cannot read that directory. So with a store that keeps uploads
(``PostgresStore``: the ``uploads`` table beside the rows; the SQLite store keeps none
and nothing changes) those files are written there too when the submission is committed,
before its client hears of it, and read back by the router that takes the row back where
the directory is not readable::

    kept = keep(store, saved)         # after its row: False, not kept (the row forgotten)
    drop(store, key)                  # it ended: nothing to send again
    saved = restore(store, saved)     # at take-back: its uploads here, paths rebased

Names in the store are line-agnostic: the ``i``-th path of ``source`` is ``i/<its
name>``, and a file under it (a directory's) ``i/<its name>/<path inside it>``.
``restore`` writes them into a fresh directory under ``into`` (by default ``tempfile``'s
directory: in a router, its own scratch, ``scratch.py``) and gives back the row with its
``source`` and every string of its ``record`` that names a path under an old source path
rebased onto the new one (:func:`rebase`): the line revives it from there as it would
from its own directory, knowing nothing of the move.

Not thread-safe. ``keep`` and ``drop`` run where the row's write runs (a thread of
``store_writes.py``; 4.0's first row still on the event loop, which the bytes then hold:
``bench/router_store``); ``restore`` in
the takeover's thread (``Lease``'s ``take_in``), and at start-up in ``resume`` (before
the router serves).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from mineru_health import safe_text

from .store import Saved

__all__ = ["drop", "keep", "keeps_uploads", "rebase", "restore", "source_paths"]

_log = safe_text.logger("mineru_health.router.store")

#: Prefix of the directory a row's uploads are restored into.
RESTORED_PREFIX = "kept-uploads-"


def keeps_uploads(store: Any) -> bool:
    """Whether ``store`` keeps uploads for another router (PostgreSQL's), not SQLite's."""
    needed = ("keep_upload", "read_upload", "upload_names", "drop_uploads")
    return store is not None and all(callable(getattr(store, name, None)) for name in needed)


def source_paths(source: str) -> list[str]:
    """The paths a row's ``source`` names, one a line ("" : none)."""
    return [path for path in source.split("\n") if path]


def keep(store: Any, saved: Saved) -> bool:
    """Writes the files under ``saved.source`` to ``store`` (its row written already), one
    transaction each. True once all are kept, or when there is nothing to keep here (a
    store that keeps no uploads, an ended submission). False when one could not be kept
    (the store logs why): the row is forgotten again, with what was kept of its uploads,
    and the submission is refused as one whose row could not be written."""
    if not keeps_uploads(store):
        return True
    for name, path in _files(saved.source):
        try:
            with open(path, "rb") as file:
                kept = bool(store.keep_upload(saved.key, name, file))
        except OSError as error:
            _log.error("%s: its upload %s cannot be read to keep it (%s)", saved.key, path, error)
            kept = False
        if not kept:
            store.forget([saved.key])  # its uploads go with it (ON DELETE CASCADE)
            return False
    return True


def drop(store: Any, key: str) -> None:
    """Deletes ``key``'s kept uploads (it ended: it will not be sent again)."""
    if keeps_uploads(store):
        store.drop_uploads(key)


def restore(store: Any, saved: Saved, into: Path | None = None) -> Saved:
    """``saved`` as this router can revive it: itself when every path of its source is
    here (or it has none, or the store keeps no uploads); else a copy whose uploads were
    read back from ``store`` into a fresh directory under ``into`` and whose source and
    record name them there. One whose uploads are neither here nor in the store is
    returned as it is (logged): it cannot be sent again."""
    paths = source_paths(saved.source)
    if not keeps_uploads(store) or all(os.path.exists(path) for path in paths):
        return saved
    try:
        names = store.upload_names(saved.key)
    except Exception as error:  # noqa: BLE001 -- revived as it is: sent again, it fails clearly
        _log.error("%s: its kept uploads cannot be read (%s)", saved.key, error)
        return saved
    if not names:
        _log.warning(
            "%s: its uploads (%s) are not on this node and the store keeps none: it "
            "cannot be sent again if its worker lost it",
            saved.key,
            ", ".join(paths),
        )
        return saved
    directory: Path | None = None
    try:
        directory = Path(tempfile.mkdtemp(prefix=RESTORED_PREFIX, dir=into))
        size = 0
        for name in names:
            target = _inside(directory, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "wb") as file:
                size += store.read_upload(saved.key, name, file) or 0
    except Exception as error:  # noqa: BLE001 -- as above
        _log.error("%s: its kept uploads cannot be restored (%s)", saved.key, error)
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
        return saved
    kept = {PurePosixPath(name).parts[0] for name in names}
    moves = {
        path: str(directory / _base(index, path))
        for index, path in enumerate(paths)
        if str(index) in kept
    }
    _log.warning(
        "%s: its uploads are not on this node: %d file(s), %d bytes, restored from the "
        "store into %s",
        saved.key,
        len(names),
        size,
        directory,
    )
    return dataclasses.replace(
        saved,
        source="\n".join(moves.get(path, path) for path in paths),
        record=rebase(saved.record, moves),
    )


def rebase(value: Any, moves: dict[str, str]) -> Any:
    """``value`` (a row's JSON record) with every string that is a path in ``moves``, or
    under one, moved to where that path went (``moves``: old path -> new path)."""
    if isinstance(value, str):
        for old, new in moves.items():
            if value == old or value.startswith(old.rstrip("/") + "/"):
                return new + value[len(old) :]
        return value
    if isinstance(value, dict):
        return {key: rebase(item, moves) for key, item in value.items()}
    if isinstance(value, list):
        return [rebase(item, moves) for item in value]
    return value


def _base(index: int, path: str) -> str:
    """The store's name of a row's ``index``-th source path."""
    return f"{index}/{Path(path).name}"


def _files(source: str) -> list[tuple[str, str]]:
    """(name in the store, path here) of each file under a row's source paths; a path
    that is not here (nothing to keep) is left out."""
    found = []
    for index, path in enumerate(source_paths(source)):
        base = _base(index, path)
        if os.path.isfile(path):
            found.append((base, path))
            continue
        with contextlib.suppress(OSError):
            for file in sorted(Path(path).rglob("*")):
                if file.is_file() and not file.is_symlink():
                    found.append((f"{base}/{file.relative_to(path).as_posix()}", str(file)))
    return found


def _inside(directory: Path, name: str) -> Path:
    """Where the upload ``name`` is restored under ``directory``; ValueError for a name
    that would leave it (the store's rows are written by routers, but read with care)."""
    parts = PurePosixPath(name).parts
    if not parts or name.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"a kept upload's name {name!r} is not a relative path")
    return directory.joinpath(*parts)

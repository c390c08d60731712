"""Admission: a submission is answered 2xx only once the router has kept it.

The router keeps every submission it accepts (its upload in its state
directory, its row in the router's store) so that it can send it again and a
new router can resume it. What it cannot keep it refuses, in a way clients
retry, before the client hears "accepted":

- **503 with Retry-After** while the caps on kept submissions are reached
  (``MAX_KEPT_TASKS`` submissions, ``MAX_KEPT_MB`` of uploads);
- **503 store_unreachable with Retry-After** while the router's store is a
  database that cannot be reached (``Store.unreachable``: down, restarting,
  cut off): a transient outage, unlike a full disk; what the router holds is
  still answered;
- **507 insufficient_storage with Retry-After**, naming the directory, while
  the disk cannot take it: the state directory or the scratch directory has
  less room than the upload needs, is read-only, or a write failed there
  (ENOSPC, EDQUOT, EIO, EROFS: :data:`STORAGE_ERRNOS`).

One design on both lines, in two steps:

1. **Before anything is staged** the supervisor *admits* the submission
   (``Supervisor.admit(size)``) from its declared size (``Content-Length``):
   it reserves one place and that many bytes under the caps, and checks the
   room left on each directory the submission will be written to
   (``statvfs``, less what the admissions in flight reserved). A burst of
   concurrent uploads therefore cannot pass the caps, or a nearly full disk,
   between its check and its keeping: each one counts from its admission.
   Most refusals happen here, before a byte is staged or anything is sent to
   a worker. The reservation follows the submission: resized to the size
   actually staged (a chunked upload declares none), taken over by the kept
   submission when it is kept, given back when it is refused (every path
   ends in :meth:`Admission.close`, idempotent).
2. **After the fact**: a write that fails anyway (staging, the move into the
   state directory, the store's row: ``RouterStore.save`` returns False)
   refuses the submission with 507 too, and the line undoes what it did:
   the staged files are deleted and the task or job leaves MinerU's registry,
   so it is never served as accepted.

Each refusal is counted by the supervisor (``refusals``), which the router's
metrics read at scrape time (``mineru_router_storage_full_refusals_total``,
``mineru_router_kept_cap_refusals_total``,
``mineru_router_store_unreachable_refusals_total``). Nothing is disabled by a
refusal: status and result requests go on, and the next submission is
admitted as soon as room returns (the check is made afresh each time).
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "CAP",
    "ROW_MARGIN_BYTES",
    "STORAGE",
    "STORAGE_ERRNOS",
    "STORE_DOWN",
    "UNDESCRIBED",
    "Admission",
    "Refused",
    "answer_refusals",
    "lack_of_room",
    "storage_error",
]

#: The write errors that mean "the disk cannot keep it": refused with 507, never a 500.
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})
#: Room the state directory needs beyond an upload: the store's row and its write-ahead log.
ROW_MARGIN_BYTES = 1024 * 1024

#: ``Refused.reason`` of a cap (503), of a lack of storage (507), of a store that cannot be
#: reached (503) and of a submission the router could not describe for its store (500:
#: our fault, its log has the error); the metrics' keys.
CAP = "kept_cap"
STORAGE = "storage_full"
STORE_DOWN = "store_unreachable"
UNDESCRIBED = "undescribed"

#: (status, error code) of each reason.
_ANSWERS = {
    CAP: (503, "router_at_capacity"),
    STORAGE: (507, "insufficient_storage"),
    STORE_DOWN: (503, "store_unreachable"),
    UNDESCRIBED: (500, "router_cannot_keep"),
}

_MIB = 1024 * 1024


class Refused(Exception):
    """A submission the router does not accept: ``status`` 503 (a cap, a store that cannot
    be reached), 507 (storage) or 500 (it could not be described for the store)."""

    def __init__(
        self, reason: str, detail: str, retry_after_s: int, directory: str | None = None
    ) -> None:
        super().__init__(detail)
        self.reason = reason
        #: ``code``: the error code of the line's error body.
        self.status, self.code = _ANSWERS[reason]
        self.detail = detail
        self.retry_after_s = retry_after_s
        self.directory = directory
        #: What the line had made of the submission when it was refused after the fact
        #: (set by the line, for it to undo).
        self.item: Any = None

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}


class Admission:
    """One submission's place and bytes under the caps, from its admission until it is
    kept (the kept submission counts instead) or refused."""

    __slots__ = ("_release", "_resize", "size_bytes")

    def __init__(
        self,
        size_bytes: int,
        resize: Callable[[Admission, int], None],
        release: Callable[[Admission], None],
    ) -> None:
        self.size_bytes = size_bytes
        self._resize: Callable[[Admission, int], None] | None = resize
        self._release: Callable[[Admission], None] | None = release

    @property
    def open(self) -> bool:
        return self._release is not None

    def resize(self, size_bytes: int) -> None:
        """Reserves what was actually staged; raises :class:`Refused` (503) when the bytes
        past the declared size do not fit under the cap (then it is closed)."""
        if self._resize is not None:
            self._resize(self, size_bytes)

    def close(self) -> None:
        """Gives the reservation back (kept or refused); idempotent."""
        release, self._release, self._resize = self._release, None, None
        if release is not None:
            release(self)

    def __repr__(self) -> str:
        return f"Admission({self.size_bytes} bytes, {'open' if self.open else 'closed'})"


def storage_error(error: BaseException) -> OSError | None:
    """``error`` (or what caused it) when it is a write failure of the disk, else None."""
    seen = 0
    current: BaseException | None = error
    while current is not None and seen < 8:  # bounded: a cycle of causes ends here
        if isinstance(current, OSError) and current.errno in STORAGE_ERRNOS:
            return current
        current = current.__cause__ or current.__context__
        seen += 1
    return None


def lack_of_room(
    directories: Iterable[Path | str], need_bytes: int, reserved_bytes: int
) -> tuple[str, str] | None:
    """(directory, why) for the first of ``directories`` that cannot take ``need_bytes``
    more, after the ``reserved_bytes`` of the admissions in flight; None when all can.

    One ``statvfs`` per file system; a directory that does not exist yet or cannot be
    asked is left to the write itself (refused after the fact if it fails).
    """
    seen: set[int] = set()
    for directory in directories:
        try:
            found = os.statvfs(directory)
        except OSError:
            continue
        device = int(getattr(found, "f_fsid", 0)) or id(directory)
        if device in seen:
            continue
        seen.add(device)
        if found.f_flag & os.ST_RDONLY:
            return str(directory), f"{directory} is on a read-only file system"
        free = int(found.f_bavail) * int(found.f_frsize) - reserved_bytes
        if free < need_bytes:
            return str(directory), (
                f"{directory} has {max(0, free) / _MIB:.1f} MiB free for new submissions, "
                f"less than the {need_bytes / _MIB:.1f} MiB needed"
            )
    return None


def answer_refusals(
    app: Any, supervisor_of: Callable[[Any], Any], body: Callable[[Refused], dict[str, Any]]
) -> None:
    """Makes ``app`` answer a :class:`Refused` that reaches it with its status, ``body(refusal)``
    and Retry-After, and a storage write failure of MinerU's own (an upload it writes to the
    scratch directory before any of our code runs) with 507, counted by the supervisor
    (``supervisor_of(request)``), rather than a bare 500. Any other error is left as it was.
    """
    from starlette.responses import JSONResponse  # MinerU's routers depend on it; we do not

    def answer(refusal: Refused) -> Any:
        return JSONResponse(body(refusal), status_code=refusal.status, headers=refusal.headers)

    async def on_refused(request: Any, refusal: Refused) -> Any:
        return answer(refusal)

    async def on_os_error(request: Any, error: OSError) -> Any:
        full = storage_error(error)
        supervisor = supervisor_of(request)
        if full is None or supervisor is None:
            raise error
        where = os.path.dirname(str(full.filename)) if full.filename else tempfile.gettempdir()
        return answer(
            supervisor.refuse(
                STORAGE,
                f"insufficient storage: the router could not "
                f"write to {where} ({full.strerror or full}); "
                "retry once room returns",
                where,
            )
        )

    app.add_exception_handler(Refused, on_refused)
    app.add_exception_handler(OSError, on_os_error)

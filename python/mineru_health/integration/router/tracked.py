"""A router task the supervisor keeps, and which workers it was submitted to.

    tracked = TrackedTask(record, payload, digest)   # MinerU's RouterTaskRecord, kept upload
    workers_tried(record)                            # ["local-gpu-0", "local-gpu-1"]

Not thread-safe; the router's loop owns every instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

__all__ = ["WORKERS_ATTR", "TrackedTask", "upload_names", "workers_tried"]

#: Attribute on MinerU's RouterTaskRecord: the server ids it was submitted to, in order.
WORKERS_ATTR = "_mineru_health_workers_tried"


def workers_tried(record: Any) -> list[str]:
    """Server ids the task was submitted to, first one first."""
    tried = getattr(record, WORKERS_ATTR, None)
    if isinstance(tried, list):  # empty: a held task not sent yet
        return list(tried)
    server = getattr(record, "upstream_server_id", "")
    return [server] if server else []


def payload_bytes(payload: Any) -> int:
    """Bytes the staged uploads take on disk (0 for one already gone)."""
    total = 0
    for upload in getattr(payload, "uploads", []):
        with contextlib.suppress(OSError, TypeError):
            total += os.stat(upload.path).st_size
    return total


def upload_names(payload: Any) -> list[str]:
    """The names the client uploaded, in order (MinerU's staged payload)."""
    return [str(u.upload_name) for u in getattr(payload, "uploads", [])]


class TrackedTask:
    """A non-terminal router task and what is needed to send it again."""

    __slots__ = ("busy", "check", "digest", "generation", "last_check", "payload", "record",
                 "resubmitting", "size_bytes")

    def __init__(self, record: Any, payload: Any, digest: str | None) -> None:
        self.record = record
        self.payload = payload  # endpoints.RetainedPayload
        self.size_bytes = payload_bytes(payload)  # on disk, for the cap on kept uploads
        self.digest = digest  # of the uploads; None until first needed (sending.py)
        self.busy = False  # a resubmission (or the wait for a worker) is under way
        self.resubmitting = False  # counted as a retry in flight from its first resubmission
        self.generation = 0  # +1 per resubmission: answers about an older upstream are stale
        self.check: asyncio.Task[None] | None = None
        self.last_check = 0.0

    @property
    def upload_names(self) -> list[str]:
        return upload_names(self.payload)

"""The poison-document guard: a document that killed engines on two workers is not sent again.

    guard = PoisonGuard()
    guard.record_trigger(digest, "local-gpu-0", "vllm.engine_dead")   # None: one worker so far
    quarantine = guard.record_trigger(digest, "local-gpu-1", "vllm.engine_dead")
    quarantine.message(["report.pdf"])   # the error the task fails with
    guard.quarantined(digest)            # the same Quarantine, for later submissions
    guard.deaths(digest); guard.load(digest, deaths)   # what the router's store keeps

A document is identified by ``content_digest`` of its uploaded files (their
bytes, in upload order), not by its name. Only *trigger* deaths count (the
task whose own exception was fatal, ``verdict.role == "trigger"``), never
collateral ones, and two deaths on the same worker are one worker. Memory is
bounded: at most ``capacity`` documents are remembered, least recently
touched first out. Pure bookkeeping; not thread-safe (the router's loop
owns it).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["Death", "PoisonGuard", "Quarantine", "content_digest"]

#: Distinct workers whose engine a document must have killed to be quarantined.
WORKERS_TO_QUARANTINE = 2
_CHUNK = 1 << 20


def content_digest(paths: Iterable[str]) -> str:
    """SHA-256 over the files' SHA-256 digests, in order (blocking: run it in a thread)."""
    outer = hashlib.sha256()
    for path in paths:
        inner = hashlib.sha256()
        with open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                inner.update(chunk)
        outer.update(inner.digest())
    return outer.hexdigest()


@dataclass(frozen=True, slots=True)
class Death:
    worker_id: str
    rule: str


@dataclass(frozen=True, slots=True)
class Quarantine:
    digest: str
    deaths: tuple[Death, ...]

    @property
    def workers(self) -> list[str]:
        return [d.worker_id for d in self.deaths]

    @property
    def rules(self) -> list[str]:
        return sorted({d.rule for d in self.deaths})

    def message(self, file_names: Sequence[str] = ()) -> str:
        what = ", ".join(file_names) if file_names else f"document {self.digest[:12]}"
        deaths = "; ".join(f"{d.worker_id} ({d.rule})" for d in self.deaths)
        return (
            f"Not sent again: {what} killed the inference engine of "
            f"{len(self.deaths)} different workers, each time as the task that failed first: "
            f"{deaths}. The document is quarantined (sha256 {self.digest[:16]}...); "
            "check it, or the rules that fired, before resubmitting it."
        )


class PoisonGuard:
    """Trigger deaths per document; quarantines at WORKERS_TO_QUARANTINE distinct workers."""

    def __init__(
        self, *, workers_needed: int = WORKERS_TO_QUARANTINE, capacity: int = 10_000
    ) -> None:
        if workers_needed < 1 or capacity < 1:
            raise ValueError("workers_needed and capacity must be at least 1")
        self.workers_needed = workers_needed
        self.capacity = capacity
        # digest -> deaths, one per worker, in order; least recently touched first.
        self._deaths: OrderedDict[str, tuple[Death, ...]] = OrderedDict()

    def record_trigger(self, digest: str, worker_id: str, rule: str) -> Quarantine | None:
        """Counts one trigger death; returns the Quarantine when this one completes it."""
        deaths = self._deaths.pop(digest, ())
        already = len(deaths) >= self.workers_needed
        if all(d.worker_id != worker_id for d in deaths) and not already:
            deaths = (*deaths, Death(worker_id, rule))
        self._deaths[digest] = deaths
        while len(self._deaths) > self.capacity:
            self._deaths.popitem(last=False)
        if not already and len(deaths) >= self.workers_needed:
            return Quarantine(digest, deaths)
        return None

    def quarantined(self, digest: str) -> Quarantine | None:
        deaths = self._deaths.get(digest, ())
        if len(deaths) < self.workers_needed:
            return None
        self._deaths.move_to_end(digest)
        return Quarantine(digest, deaths)

    def deaths(self, digest: str) -> tuple[Death, ...]:
        """The trigger deaths remembered for ``digest`` (one per worker, in order)."""
        return self._deaths.get(digest, ())

    def load(self, digest: str, deaths: Iterable[Death]) -> None:
        """Remembers ``deaths`` for ``digest`` as they were (a new router resuming)."""
        unique: dict[str, Death] = {}
        for death in deaths:
            unique.setdefault(death.worker_id, death)
        self._deaths[digest] = tuple(unique.values())[: self.workers_needed]
        self._deaths.move_to_end(digest)
        while len(self._deaths) > self.capacity:
            self._deaths.popitem(last=False)

    def suspects(self) -> int:
        """Documents with at least one trigger death remembered (quarantined ones included)."""
        return len(self._deaths)

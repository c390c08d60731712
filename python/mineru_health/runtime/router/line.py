"""What a MinerU line does for the supervisor, and the values they exchange.

A ``Kept`` is one submission the router keeps; a :class:`Line` asks about it,
writes statuses back, sends it again or fails it, the way its MinerU line
does (``mineru3.router.tasks.TaskLine``, ``mineru4.router.jobs.JobLine``);
``send`` answers with a :class:`Sent`, :class:`Unavailable` or
:class:`NotSent`. For the router's store (``store.py``) the line says what
a submission's row holds (``snapshot``: a :class:`Snapshot`) and puts a
row back into MinerU's objects when a new router resumes (``revive``: a
:class:`Revived` for one that is not over). ``ask_status`` is the HTTP
status request both lines make. Not thread-safe: all on the router's event
loop.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .fleet import Fleet
from .policy import Answer, AnswerKind, Refusal
from .store import Saved

__all__ = ["Kept", "Line", "NotSent", "Revived", "Sent", "Snapshot", "Unavailable", "ask_status"]


class Kept:
    """One unfinished submission the router keeps, and what is needed to send it again."""

    __slots__ = (
        "accepted_at",
        "busy",
        "check",
        "counted",
        "digest",
        "generation",
        "instance",
        "item",
        "key",
        "last_check",
        "resumed",
        "size_bytes",
        "workers",
    )

    def __init__(
        self,
        key: str,
        item: Any,
        workers: list[str],
        instance: str,
        digest: str | None,
        size_bytes: int,
    ) -> None:
        self.key = key  # the router's id of the submission, as its client knows it
        self.item = item  # the line's own record of it (3.x task, 4.0 job)
        self.workers = workers  # worker ids it was submitted to, in order ([] while held)
        self.instance = instance  # base URL of the worker instance it was last submitted to
        self.digest = digest  # of its documents; None until first needed
        self.size_bytes = size_bytes  # what keeping it costs on disk (the cap on kept bytes)
        self.busy = False  # a resubmission (or the wait for a worker) is under way
        self.counted = False  # a retry in flight for the budget, from its first resubmission
        self.generation = 0  # +1 per submission made: answers about an older one are stale
        self.check: asyncio.Task[None] | None = None
        self.last_check = 0.0
        self.accepted_at = time.time()  # unix time the router accepted it (its store row's)
        self.resumed = False  # taken back by a new router: its next submission is not a retry

    @property
    def worker(self) -> str:
        """The worker it was last submitted to ("" while held)."""
        return self.workers[-1] if self.workers else ""

    def __repr__(self) -> str:
        return f"Kept({self.key!r}, workers={self.workers}, busy={self.busy})"


@dataclass(frozen=True, slots=True)
class Sent:
    """A submission made (again): the worker that took it, and that worker's base URL."""

    worker_id: str
    instance: str  # the worker's base URL


@dataclass(frozen=True, slots=True)
class Unavailable:
    """The worker chosen could not take it now (another one may)."""

    worker_id: str
    error: str


@dataclass(frozen=True, slots=True)
class NotSent:
    """Why a submission is not sent (again): it fails with this note."""

    refusal: Refusal
    note: str


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the router's store keeps of a submission, in the line's words (``Line.snapshot``)."""

    state: str  # its status as the router knows it now
    upstream_id: str  # its worker's id of it: where its status and result are
    source: str  # where its kept upload lives while it may be sent again, else ""
    record: dict[str, Any]  # the line's record of it (JSON-serialisable)


@dataclass(frozen=True, slots=True)
class Revived:
    """An unfinished submission a line put back from the store (``Line.revive``)."""

    item: Any  # the line's own record of it, as ``Kept.item``
    workers: list[str]  # the workers tried, the list the line shows its client
    size_bytes: int  # what keeping it costs on disk


class Line(Protocol):
    """What a MinerU line does for the supervisor; all on the router's loop."""

    async def ask(self, kept: Kept, url: str) -> Answer:
        """The status of ``kept``'s upstream submission as the instance at ``url`` says it."""

    async def stored(self, kept: Kept) -> Answer | None:
        """What the store of ``kept``'s local worker, whose process is gone, says; or None."""

    async def apply(self, kept: Kept, answer: Answer, url: str, *, adopt: bool) -> None:
        """Takes a status as the router's own (``adopt``: the instance at ``url`` restored it)."""

    async def count_error(self, kept: Kept, detail: str) -> None:
        """A worker in rotation answered with an error: the line's own count of them."""

    def lost(self, kept: Kept) -> None:
        """Its upstream submission is gone: it is about to be sent again."""

    async def digest(self, kept: Kept) -> str | None:
        """The digest of its documents (the poison guard's key), or None if it has none."""

    async def send(self, kept: Kept, avoid: set[str]) -> Sent | Unavailable | NotSent | None:
        """Submits ``kept`` to a healthy worker not in ``avoid``; None when none took it."""

    async def fail(self, kept: Kept, text: str) -> None:
        """Ends ``kept`` failed with ``text``."""

    def release(self, kept: Kept) -> None:
        """Lets go of what keeping ``kept`` holds (uploads, pinned inputs)."""

    def disowned(self, kept: Kept) -> None:
        """Another router took ``kept`` over (a shared store, leases.py): out of MinerU's
        records here, so that this router answers it from the store as any other router's;
        its uploads are left for the new owner."""

    def names(self, kept: Kept) -> list[str]:
        """The document names its client gave, for messages and audit records."""

    def terminal(self, kept: Kept) -> bool:
        """True once the router's own record of ``kept`` is terminal."""

    def snapshot(self, kept: Kept) -> Snapshot:
        """What the router's store keeps of ``kept`` now."""

    def revive(self, saved: Saved) -> Revived | None:
        """Puts a stored submission back into MinerU's records.

        One that is over is only put back (its status and result are served
        as before the restart): None. One that is not is returned to be kept
        and checked again.
        """


async def ask_status(
    fleet: Fleet,
    url: str,
    path: str,
    timeout_s: float,
    view: Callable[[dict[str, Any]], Mapping[str, Any]] = dict,
) -> Answer:
    """``GET url + path`` as an :class:`Answer`; ``view`` reads a status payload for the policy.

    ``timeout_s`` bounds the whole answer, and its size is MAX_STATUS_MB at most
    (``upstream_reads``, under the fleet's client): one that breaks a bound is
    a bad answer, the worker's error for this task.
    """
    import httpx  # MinerU's routers depend on it; this package does not

    from .upstream_reads import BoundBroken

    if not url:
        return Answer(AnswerKind.UNREACHABLE, detail="the worker has no URL (restarting)")
    try:
        response = await fleet.client.get(f"{url}{path}", timeout=timeout_s)
    except BoundBroken as exc:
        # Too slow is no answer in time, as a read timeout is (a worker whose loop a starting
        # vLLM starves for seconds), not a bad answer: that would fail the task.
        late = exc.bound == "time"
        return Answer(AnswerKind.UNREACHABLE if late else AnswerKind.BAD_ANSWER, detail=str(exc))
    except httpx.HTTPError as exc:
        return Answer(AnswerKind.UNREACHABLE, detail=f"{type(exc).__name__}: {exc}".strip())
    if response.status_code == 404:
        return Answer(AnswerKind.NOT_FOUND, detail=f"404 from {url}")
    if response.status_code != 200:
        return Answer(AnswerKind.BAD_ANSWER, detail=f"{response.status_code} from {url}")
    try:
        payload = await _json(response.content)
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        return Answer(AnswerKind.BAD_ANSWER, detail="Invalid status payload")
    return Answer.of_status(view(payload))


# A status of this size parses in well under a millisecond; a larger one (up to
# MAX_STATUS_MB) is parsed off the loop so that no other task's status waits on it.
_PARSE_ON_LOOP_BYTES = 64 * 1024


async def _json(body: bytes) -> Any:
    if len(body) <= _PARSE_ON_LOOP_BYTES:
        return json.loads(body)
    return await asyncio.to_thread(json.loads, body)

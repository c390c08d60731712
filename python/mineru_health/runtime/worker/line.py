"""What a MinerU line's worker gives the runtime, and the one algorithm the runtime runs on it.

    serve(runtime, TaskLine(runtime))   # the gate's ``started``: store, the line's start, watcher
    act(runtime, line)                  # each watcher step: hung work, remote waits, a fatal record
    act_on_fatal(runtime, line)         # once per fatal record (also a line's failure hook)

A :class:`Line` is one MinerU line's work seen from the worker: its running
work and figures, how one item (a 3.x task, a 4.0 job) is failed with a text
and a verdict, how every unfinished item is failed with a dead engine, and
its store adapter (``started``). The runtime decides when and why (hung, a
remote wait past its bound, a fatal record, acted on once); the line only
touches its MinerU (``mineru3.worker.tasks.TaskLine``,
``mineru4.worker.gate.JobLine``). The judge (:mod:`.judge`) records which
item triggered a death, for both lines. Nothing here imports a line.

All on the worker's event loop thread.
"""

from __future__ import annotations

import functools
from typing import Protocol

from ..verdict import Kind, TaskVerdict
from . import remote_waits
from .health import FatalInfo, fatal_cause
from .log import log
from .loop_watch import start_watcher
from .worker_runtime import WorkerRuntime

__all__ = [
    "REMOTE_WAIT_RULE",
    "Line",
    "act",
    "act_on_fatal",
    "fail_hung",
    "fail_remote_waits",
    "hung_text",
    "remote_wait_verdict",
    "serve",
]

#: The rule of a task failed by its remote wait's bounds (issue 32).
REMOTE_WAIT_RULE = "watchdog.remote_wait"


class Line(Protocol):
    """What a MinerU line's worker does for the runtime; all on the event loop."""

    #: What the line calls one unit of work, for log lines ("task", "job").
    item: str
    #: Whether the runtime fails the items whose remote wait went past a bound (3.x);
    #: a line whose MinerU fails them itself when the wait ends says False (4.0).
    fails_remote_waits: bool

    def started(self) -> None:
        """MinerU's start-up is over: its finished work is back from the runtime's store
        (opened just before) and kept from now on, what the line follows is wrapped, and
        its first figures are reported."""

    def report(self) -> None:
        """Pushes MinerU's work figures (and its own health verdict) to the native state."""

    def remote_engine(self, item_id: str) -> bool:
        """True when the item's engine is a remote server."""

    def fail(self, item_id: str, text: str, verdict: TaskVerdict) -> bool:
        """Fails one unfinished item with ``text`` and ``verdict``, wakes its waiters and
        frees its slot; False when it is not there or not unfinished."""

    def fail_with_engine(self, first: FatalInfo | None) -> str:
        """Fails every unfinished item as collateral of the engine death ``first`` (the
        worker's first fatal record); returns what was done, for the log line."""


def hung_text(runtime: WorkerRuntime) -> str:
    """The error of an item the task watchdog failed (both lines say it alike)."""
    return (
        "mineru-health: the parse made no progress for "
        f"{runtime.settings.task_hang_s:g} s (hung); resubmit it"
    )


def remote_wait_verdict() -> TaskVerdict:
    """An item whose remote wait went past a bound: its server's failure, task-local."""
    return TaskVerdict(Kind.TASK_LOCAL, None, REMOTE_WAIT_RULE, "remote_engine", remote_engine=True)


def fail_hung(runtime: WorkerRuntime, line: Line) -> int:
    """Fails the items the native task watchdog found hung; returns how many.

    Each one's parse made no progress for ``MINERU_HEALTH_TASK_HANG_S`` (in or
    out of engine calls): it fails with a ``hung`` verdict and its slot is freed
    (a thread stuck inside the parse cannot be stopped; when every item is hung
    the worker is stalled, natively, and :func:`act_on_fatal` does the rest).
    """
    hung = set(runtime.health.take_hung_tasks())
    failed = 0
    for item_id in sorted(hung):
        verdict = TaskVerdict.hung(remote_engine=line.remote_engine(item_id))
        if line.fail(item_id, hung_text(runtime), verdict):
            failed += 1
            log(
                "ERROR",
                f"{line.item} {item_id} failed: no progress for "
                f"{runtime.settings.task_hang_s:g} s (hung parse)",
            )
    return failed


def fail_remote_waits(runtime: WorkerRuntime, line: Line) -> int:
    """Fails the items whose remote wait went past a bound; returns how many.

    Their server sent nothing for ``MINERU_HEALTH_TASK_HANG_S`` or kept them
    waiting ``MINERU_HEALTH_REMOTE_WAIT_S``: each fails alone, with an error
    naming the server and a task-local, remote-engine verdict (never the
    worker's fault, never counted against the document); the wait's own I/O
    ends at its next read (:mod:`.remote_waits`).
    """
    if not line.fails_remote_waits:
        return 0
    settings = runtime.settings
    failed = 0
    for status in runtime.health.take_expired_remote_waits():
        text = remote_waits.describe(
            status, task_hang_s=settings.task_hang_s, remote_wait_s=settings.remote_wait_s
        )
        if line.fail(status.task_id, text, remote_wait_verdict()):
            failed += 1
            log("ERROR", f"{line.item} {status.task_id} failed: {text}")
    return failed


def act_on_fatal(runtime: WorkerRuntime, line: Line) -> None:
    """Once per fatal record of ``runtime``: the line fails every unfinished item."""
    health = runtime.health
    if health.healthy or runtime.acted_on_fatal:
        return
    runtime.acted_on_fatal = True
    first = health.snapshot().first_fatal
    done = line.fail_with_engine(first)
    log("ERROR", f"inference engine unusable ({fatal_cause(first)}); {done}")


def act(runtime: WorkerRuntime, line: Line) -> None:
    """The watcher's step, every second: hung items first (they are not collateral), the
    remote waits past their bounds, then a new fatal record."""
    fail_hung(runtime, line)
    fail_remote_waits(runtime, line)
    act_on_fatal(runtime, line)  # cheap while healthy


def serve(runtime: WorkerRuntime, line: Line) -> None:
    """MinerU's start-up is over (the gate's ``started``): the store opened, the line
    started on it, the watcher started with the line's figures and steps."""
    runtime.open_store()
    line.started()
    start_watcher(runtime, line.report, functools.partial(act, runtime, line))

"""MinerU 3.x's slots shared fairly between the engine servers tasks name (issue 32).

    share_slots(manager, share=0.5)   # once, when the task manager starts

MinerU runs at most ``max_concurrent_requests`` tasks at once (its slots);
every queued task gets a processor at once, which waits for a slot. Tasks
that name a ``server_url`` (an ``*-http-client`` backend) wait on that server,
which may be slow or dead (its waits are bounded, the runtime's ``line``
``fail_remote_waits``), so one server's tasks may hold at most a *share* of
the slots, ``max(1, floor(share x slots))``, while a task for another server
waits for one; a task over its server's share waits unstarted (status
``pending``) and holds no slot. When no other task waits, a server may use
every free slot (no slot idles for fairness' sake; the next free slot goes to
the other server's task). Tasks without a ``server_url`` (this worker's own
engine, or the server its operator configured) are held to no share.

A worker's share bounds the fleet's too: a server holds at most its share of
each worker's slots, so of all of them.

Everything here runs on the worker's event loop thread.
"""

from __future__ import annotations

import asyncio
import functools
import math
import sys
from collections import Counter
from typing import Any

from ...runtime.worker.remote_waits import server_name

__all__ = ["ServerShare", "server_key", "share_slots"]

_MARK = "__mineru_health_share__"


def server_key(task: Any) -> str:
    """host:port of the server a task names; "" when it names none (no share applies)."""
    if not str(getattr(task, "backend", "") or "").endswith("http-client"):
        return ""
    return server_name(getattr(task, "server_url", "") or "")


class ServerShare:
    """Who may take a slot now: FIFO, each server within its share while others wait."""

    def __init__(self, share: float) -> None:
        self.share = share
        self.held: Counter[str] = Counter()  # admitted tasks not ended, by server
        self._waiting: list[tuple[str, asyncio.Future[None]]] = []

    def cap(self, slots: int) -> int:
        return max(1, math.floor(self.share * slots + 1e-9))

    def _within_share(self, key: str, slots: int) -> bool:
        return key == "" or self.held[key] < self.cap(slots)

    def may_enter(self, key: str, slots: int) -> bool:
        """A free slot, and ``key`` within its share or no waiter within theirs."""
        if sum(self.held.values()) >= slots:
            return False
        if self._within_share(key, slots):
            return True
        return not any(
            other != key and self._within_share(other, slots) for other, _ in self._waiting
        )

    async def enter(self, key: str, slots: int) -> None:
        """Waits (holding no slot) until ``key`` may take one, then takes it."""
        if not self._waiting and self.may_enter(key, slots):
            self.held[key] += 1
            return
        admitted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((key, admitted))
        self._admit(slots)
        try:
            await admitted
        except BaseException:
            if admitted.done() and not admitted.cancelled():
                self.leave(key, slots)  # admitted as it was cancelled: give it back
            else:
                self._waiting = [w for w in self._waiting if w[1] is not admitted]
            raise

    def leave(self, key: str, slots: int) -> None:
        self.held[key] -= 1
        if self.held[key] <= 0:
            del self.held[key]
        self._admit(slots)

    def _admit(self, slots: int) -> None:
        for waiter in list(self._waiting):
            key, admitted = waiter
            if admitted.done():
                self._waiting.remove(waiter)
            elif self.may_enter(key, slots):
                self._waiting.remove(waiter)
                self.held[key] += 1
                admitted.set_result(None)


def _slots(manager: Any) -> int:
    module = sys.modules.get(type(manager).__module__)
    try:
        return int(module.get_max_concurrent_requests())  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - a MinerU without it: no share
        return 0


def share_slots(manager: Any, share: float) -> ServerShare | None:
    """Wraps ``manager._process_task`` so tasks take a slot by :class:`ServerShare` (once)."""
    process = getattr(manager, "_process_task", None)
    if process is None or getattr(process, _MARK, None) is not None or share >= 1.0:
        return None
    shares = ServerShare(share)

    @functools.wraps(process)
    async def process_task(task_id: str, *args: Any, **kwargs: Any) -> Any:
        slots = _slots(manager)
        key = server_key(getattr(manager, "tasks", {}).get(task_id))
        if slots <= 0:
            return await process(task_id, *args, **kwargs)
        await shares.enter(key, slots)
        try:
            return await process(task_id, *args, **kwargs)
        finally:
            shares.leave(key, slots)

    setattr(process_task, _MARK, shares)
    manager._process_task = process_task
    return shares

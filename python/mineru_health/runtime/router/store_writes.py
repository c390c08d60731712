"""The router store's row writes, made on a thread so that the event loop serves meanwhile.

One write is a PostgreSQL round trip (up to ``WRITE_WAIT_S`` while the database is out of
reach: ``pg_store.py``) or a commit of the SQLite file; made on the event loop, every
request of that router waits for it. Both stores are thread-safe (the SQLite store: one
connection under a lock; PostgreSQL's: a connection pool), so the supervisor hands each
write to a thread (``asyncio.to_thread``) and awaits it: a client still hears of its
submission only once the row is written, and the router's other requests go on meanwhile.

    writes = StoreWrites(store)
    written = await writes.save(saved)   # as store.save: True once committed
    await writes.finish()                # shutdown: every write under way has ended

The writes of one submission are awaited one after another by the one flow that makes them
(accepted, sent again, ended), never two at once: PostgreSQL's fencing names the version
a row's last write left. A write goes on when the task awaiting it is cancelled (a thread
cannot be stopped); ``finish`` waits for it before the store is closed. Runs on the
router's event loop; not thread-safe itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from .store import Saved
from .stores import Store

__all__ = ["StoreWrites"]

T = TypeVar("T")


class StoreWrites:
    """Writes rows of ``store`` on a thread each, and knows which are under way."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._under_way: set[asyncio.Future[Any]] = set()

    async def save(self, saved: Saved) -> bool:
        """``store.save(saved)`` on a thread: True once the row is committed."""
        return await self.run(lambda: self.store.save(saved))

    async def run(self, write: Callable[[], T]) -> T:
        """``write()`` (the store's writes: a row, its uploads) on a thread; its result."""
        under_way = asyncio.ensure_future(asyncio.to_thread(write))
        self._under_way.add(under_way)
        under_way.add_done_callback(self._under_way.discard)
        # Shielded: the awaiting request may go away; the write it started still ends.
        return await asyncio.shield(under_way)

    async def finish(self) -> None:
        """Returns once the writes under way have ended (called once nothing starts new
        ones: the store may be closed then)."""
        if self._under_way:
            await asyncio.gather(*self._under_way, return_exceptions=True)

    @property
    def under_way(self) -> int:
        return len(self._under_way)

    def __repr__(self) -> str:
        return f"StoreWrites(under_way={self.under_way})"

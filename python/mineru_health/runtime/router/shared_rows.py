"""Submissions another router drives, answered from the store the routers share.

Behind one Service a client's status or result request reaches any router, and MinerU's
ids name no router. Where a line's router would answer 404 (MinerU's records do not have
the id), it asks here: with a shared store (``STORE_URL``) the row of that id is read,
whichever router owns it, and the line answers from it, read only: it writes nothing, and
drives nothing (only the owner checks and sends a submission again)::

    found = await row_of_another_router(supervisor, key)   # (owner, Saved) or None
    found = await row_naming(supervisor, file_id)          # 4.0: the row naming a file

A database that cannot be read raises :class:`StoreUnreadable` (the line answers 503 with
``Retry-After``, never 404: the submission may well exist).
"""

from __future__ import annotations

import asyncio
from typing import Any

from mineru_health import safe_text

from .store import Saved

__all__ = ["StoreUnreadable", "row_naming", "row_of_another_router"]

_log = safe_text.logger("mineru_health.router.store")


class StoreUnreadable(Exception):
    """The shared store could not be read: the answer is 503, to ask again."""

    def __init__(self, detail: str, retry_after_s: int) -> None:
        super().__init__(detail)
        self.detail = detail
        self.retry_after_s = retry_after_s

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}


async def row_of_another_router(supervisor: Any, key: str) -> tuple[str, Saved] | None:
    """The row of ``key`` when another router drives it: (that router's id, its row); None
    when the store is not shared, this router keeps ``key``, or no router has it."""
    read = getattr(supervisor.store, "row", None)
    if read is None or supervisor.find(key) is not None:
        return None
    return await _another_routers(supervisor, read, key, f"task {key}")


async def row_naming(supervisor: Any, word: str) -> tuple[str, Saved] | None:
    """As :func:`row_of_another_router`, for the row whose record names ``word`` rather
    than the row of that key: a 4.0 job's input or output file, by its id."""
    read = getattr(supervisor.store, "row_naming", None)
    if read is None:
        return None
    return await _another_routers(supervisor, read, word, word)


async def _another_routers(
    supervisor: Any, read: Any, word: str, what: str
) -> tuple[str, Saved] | None:
    try:
        found: tuple[str, Saved] | None = await asyncio.to_thread(read, word)
    except Exception as error:  # noqa: BLE001 -- answered 503, never 404
        _log.warning("%s: the shared store cannot be read (%s)", word, error)
        raise StoreUnreadable(
            f"the routers' shared store cannot be read now, so {what} cannot be "
            "looked up; retry shortly",
            supervisor.retry_after_s,
        ) from None
    if found is None or found[0] == getattr(supervisor.store, "router_id", None):
        return None  # a row of this router's that it does not keep: MinerU's answer stands
    return found

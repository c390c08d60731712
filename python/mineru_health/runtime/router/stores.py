"""The router store's interface, and the setting that chooses its backend.

    store = open_store(fleet)   # Store | None: what MINERU_ROUTER_HEALTH_STORE_URL names

Unset: ``store.RouterStore``, a SQLite file in the router's state directory (one router;
nothing to run; None without a durable state directory). ``postgresql://...``:
``pg_store.PostgresStore``, one database that several routers share (docs/architecture.md,
"Several routers, one fleet"); psycopg is imported only then.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from mineru_health import safe_text
from mineru_health.errors import ConfigError

from .store import KEPT_NAME, RouterStore, Saved

__all__ = ["Store", "add_store_field", "open_store"]

_log = safe_text.logger("mineru_health.router.store")


class Store(Protocol):
    """What the supervisor and the lines use of a router store, whichever its backend.

    After opening, no method raises on a write: ``save`` returns False (logged) when the
    row is not kept, and the submission is then refused (503 while ``unreachable``, else
    507). ``rows``, ``poison`` and
    ``count`` are this router's (a shared store's other routers have their own)."""

    #: The SQLite file (its directory is the router's state directory), or None.
    path: Path | None
    #: What the router still knows of its rows, for a store that lost some (SQLite's file).
    recall: Callable[[], Iterable[Saved]] | None
    #: The name this router's rows are owned under in a store several routers share; ""
    #: for a store of one router.
    router_id: str

    @property
    def kept_dir(self) -> Path | None:
        """Where kept uploads live, or None: nothing is kept for a new router."""

    def save(self, saved: Saved) -> bool:
        """Writes one submission's row; True only once it is committed."""

    def forget(self, keys: Iterable[str]) -> None:
        """Deletes the rows of ``keys``."""

    def add_poison_death(self, digest: str, worker: str, rule: str) -> list[tuple[str, str]] | None:
        """Adds one trigger death of a document to what the store holds (one per worker, a
        worker's first kept) in one transaction; returns every death now held, every
        router's, or None when the store failed (logged)."""

    def rows(self) -> list[Saved]:
        """Every submission of this router, oldest first."""

    def poison(self) -> list[tuple[str, list[tuple[str, str]]]]:
        """The poison guard's memory: (digest, [(worker id, rule), ...]), oldest first."""

    def count(self) -> int:
        """This router's rows."""

    @property
    def unreachable(self) -> str | None:
        """Why the store cannot be reached now (a database that is down: submissions are
        refused with 503 and Retry-After until it is back), or None."""

    def check(self) -> str | None:
        """How the store vanished under the router (a fresh one is written now), or None."""

    def close(self) -> None:
        """Lets go of the file or the connections."""


def open_store(fleet: Any) -> Store | None:
    """The store ``fleet``'s settings choose: ``store_url`` unset, the SQLite file in its
    durable state directory (None without one); ``postgresql://...``, that database, with
    kept uploads in the state directory where there is one. A URL that is not
    PostgreSQL's, or a database that cannot be used, raises ``ConfigError`` naming the
    variable: the router does not start."""
    url = str(fleet.settings.store_url)
    if not url:
        return RouterStore.of(fleet)

    from .pg_store import PostgresStore, parse_url

    try:
        parse_url(url)  # refused before anything else is looked at
    except ConfigError as error:
        _log.error("mineru-router refuses to start: %s (variable %s)", error, error.variable)
        raise
    directory = fleet.state_dirs.router_dir()
    return PostgresStore.open(
        url,
        router_id=str(fleet.settings.router_id),
        kept_dir=None if directory is None else directory / KEPT_NAME,
    )


def add_store_field(payload: dict[str, Any], store: Store | None) -> None:
    """Adds ``"store": {"reachable": bool[, "error": why]}`` to a router's health payload
    when it has a store. The health's status is left as it is: a router whose database is
    down still answers for what it holds, and every router sharing that database would be
    dropped at once."""
    if store is None:
        return
    down = store.unreachable
    payload["store"] = {"reachable": True} if down is None else {"reachable": False, "error": down}

"""The router store in PostgreSQL: one database that several routers share.

The second backend of :class:`~mineru_health.runtime.router.stores.Store`, chosen by
``MINERU_ROUTER_HEALTH_STORE_URL=postgresql://...`` (docs/architecture.md, "Several
routers, one fleet"). It holds the same rows as the SQLite store, plus what several
routers need::

    store = PostgresStore.open(url, router_id="mineru-router-2")  # schema made if missing
    store.save(saved)            # fenced: only the row's owner, at the version it last saw
    store.rows()                 # this router's rows, oldest first (their versions noted)
    store.renew(lease_s)         # True: its lease held; False: it had lapsed (or is new)
    store.take_over()            # one expired router's rows, moved to this one: [Saved]
    store.row(key)               # any router's row, read only: (owner, Saved) or None
    store.row_naming(file_id)    # any router's row whose record names it (a 4.0 file id)
    store.fenced                 # writes refused because another router owns the row now
    store.keep_upload(key, name, file)       # a kept upload, for whichever router resumes it
    store.read_upload(key, name, into)       # its bytes, a chunk at a time (None: none kept)

Fencing. Each row names its ``owner`` (a router id) and a ``version`` that every write
increments. A router writes a row only ``WHERE owner = me AND version = the one I last
wrote or read``: a router that was paused (a long GC, a partition) while another took
its rows over finds 0 rows updated, logs it and reports False; it never overwrites the
new owner's state.

Leases. Each router renews its row of ``routers`` (``lease_until``); a router whose
lease has expired has its rows taken over by one survivor, in one transaction:
``SELECT ... FOR UPDATE SKIP LOCKED`` picks an expired router no other survivor is
taking over, its rows move to the survivor (versions incremented: the old owner's
writes are fenced from then on) and its lease row goes. Time is the database's
``now()``: one clock for every router, so a node whose clock drifts neither keeps a
lease it lost nor loses one it holds; the tests expire a lease by writing the row (what
a router that stopped renewing leaves), never by sleeping.

Kept uploads live in the database too (``uploads``: 1 MiB ``bytea`` rows, stored as they
are), so that the router that takes a row over can send its submission again: nothing
more to run, secure or back up than the database the rows are in; tested against the
same real server; an upload goes with its row (a foreign key, ``ON DELETE CASCADE``),
which large objects would not (they outlive the row that names them until ``lo_unlink``
or ``vacuumlo``). The price is that each upload's bytes pass through the write-ahead log
and its replicas once (bounded by ``MAX_KEPT_MB``; deleted when the submission ends).

Rows keep ``workers``, ``record`` and the poison guard's ``deaths`` as the JSON text the
router wrote (``text``, not ``jsonb``: byte for byte what was written, with no refusal of
a ``\\u0000`` that ``jsonb`` would reject), read back by the SQLite store's decoder.

Connections: a ``psycopg_pool.ConnectionPool`` (each call borrows one for one short
transaction), every wait bounded (``connect_timeout``, the pool's ``timeout``, TCP's
``tcp_user_timeout`` and keepalives for a peer that went silent). After opening, nothing
here raises: a write that fails is logged once per streak and returns False, as the SQLite
store does on a full disk.

A database that cannot be reached (:func:`cannot_reach`: the connection refused or
broken, the pool's wait run out, the server shutting down or starting) is not a full
one: ``unreachable`` says so (the supervisor refuses with 503 and Retry-After rather than
507), and until it is reached again every write fails at once, without touching the
pool, so that the router's event loop never waits on a database that is down (the first
write that finds it down waits ``WRITE_WAIT_S`` at most). A thread of the store's own
asks the database every ``PROBE_S`` until it answers; the writes that failed meanwhile
(updates of rows already kept, deletions, the poison guard's) are made again by the next
write once it does, so a router restarted later resumes what this one knew::

    store.unreachable            # None, or "the router's store ... cannot be reached (...)"
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from mineru_health import safe_text
from mineru_health.errors import ConfigError

from .store import Saved, decode_poison, decode_row, encode_row, with_death

__all__ = ["STORE_URL_VARIABLE", "PostgresStore", "cannot_reach", "describe_url", "parse_url"]

#: The setting that chooses this backend.
STORE_URL_VARIABLE = "MINERU_ROUTER_HEALTH_STORE_URL"
#: Seconds at most to connect, and to wait for a free connection of the pool.
CONNECT_TIMEOUT_S = 5
#: Bytes of one row of a kept upload (each a statement's worth, never a whole document).
UPLOAD_CHUNK = 1 << 20
#: Seconds a write waits for a connection: the first write that finds the database down
#: holds the router's event loop this long at most (the next ones fail at once).
WRITE_WAIT_S = 2
#: Seconds between two tries to reach a database that could not be reached.
PROBE_S = 1.0
#: Seconds the pool keeps trying one reconnection before it starts a new one at the next
#: request: its back-off (1, 2, 4, 8... s) would otherwise leave the router refusing
#: writes for up to that long after the database is back.
RECONNECT_S = 3.0
#: Rows made again by one write once the database is back (the rest by the next ones, and
#: by ``check``): a long outage's backlog does not hold the event loop all at once.
CATCH_UP_ROWS = 64
#: SQLSTATEs of a server that cannot take a connection now but will (its class 08: the
#: connection; 57P01-03: shut down, crashed, starting; 53300: too many connections).
_TRANSIENT_STATES = ("08", "57P01", "57P02", "57P03", "53300")
#: Connections of one router's pool (its writes are short; the event loop makes them one
#: at a time today).
POOL_MAX = 4

_log = safe_text.logger("mineru_health.router.store")

#: Created if missing, in one transaction; each statement is a no-op once it exists.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS routers (
    router_id   text PRIMARY KEY,       -- a router's name (MINERU_ROUTER_HEALTH_ROUTER_ID)
    lease_until timestamptz NOT NULL,   -- its rows may be taken over after this (now())
    renewed_at  timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS submissions (
    key         text PRIMARY KEY,       -- the router's id, as its client knows it
    owner       text NOT NULL,          -- the router that drives it
    version     bigint NOT NULL,        -- incremented by every write: the fencing token
    state       text NOT NULL,
    worker      text NOT NULL,
    upstream_id text NOT NULL,
    instance    text NOT NULL,
    workers     text NOT NULL,          -- JSON list, as the router wrote it
    source      text NOT NULL,
    digest      text,
    record      text NOT NULL,          -- JSON object, as the router wrote it
    accepted_at double precision NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS submissions_owner ON submissions (owner, accepted_at);
CREATE TABLE IF NOT EXISTS poison (
    digest     text PRIMARY KEY,        -- shared: quarantined by one router, by all
    deaths     text NOT NULL,           -- JSON list of [worker id, rule]
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS uploads (
    key   text NOT NULL REFERENCES submissions (key) ON DELETE CASCADE,
    name  text NOT NULL,                -- the file's name within its submission
    part  integer NOT NULL,             -- UPLOAD_CHUNK bytes each, in order
    bytes bytea NOT NULL,
    PRIMARY KEY (key, name, part)
);
-- Documents are compressed already: stored out of line as they are, not compressed again.
ALTER TABLE uploads ALTER COLUMN bytes SET STORAGE EXTERNAL;
"""

_COLUMNS = "state, worker, upstream_id, instance, workers, source, digest, record, accepted_at"
_INSERT = (
    f"INSERT INTO submissions (key, owner, version, {_COLUMNS}) "
    "VALUES (%s, %s, 1, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
    "ON CONFLICT (key) DO NOTHING RETURNING version"
)
_UPDATE = (
    "UPDATE submissions SET state = %s, worker = %s, upstream_id = %s, instance = %s, "
    "workers = %s, source = %s, digest = %s, record = %s, accepted_at = %s, "
    "version = version + 1, updated_at = now() "
    "WHERE key = %s AND owner = %s AND version = %s RETURNING version"
)
_SELECT = f"SELECT key, version, {_COLUMNS} FROM submissions"


def parse_url(url: str) -> dict[str, Any]:
    """The connection parameters of a ``postgresql://`` URL; ``ConfigError`` naming
    ``MINERU_ROUTER_HEALTH_STORE_URL`` for anything else, or without psycopg."""
    if not url.startswith(("postgresql://", "postgres://")):
        scheme = url.partition("://")[0] if "://" in url else url[:16]  # never a password
        raise ConfigError(
            f"{STORE_URL_VARIABLE}: a {scheme!r}... URL is not a postgresql:// "
            "one (unset: the SQLite file in the state directory)",
            variable=STORE_URL_VARIABLE,
        )
    try:
        from psycopg import conninfo
    except ImportError as error:
        raise ConfigError(
            f"{STORE_URL_VARIABLE} names PostgreSQL, which needs psycopg: "
            f"pip install 'mineru-health[postgres]' ({error})",
            variable=STORE_URL_VARIABLE,
        ) from None
    try:
        params: dict[str, Any] = dict(conninfo.conninfo_to_dict(url))
    except Exception as error:  # noqa: BLE001 -- psycopg's ProgrammingError, in words
        raise ConfigError(
            f"{STORE_URL_VARIABLE} cannot be read as a PostgreSQL URL ({_first_line(error)})",
            variable=STORE_URL_VARIABLE,
        ) from None
    ports = str(params.get("port") or "")  # libpq reads it only when it connects
    if ports and not all(port.isdigit() and int(port) <= 65535 for port in ports.split(",")):
        raise ConfigError(
            f"{STORE_URL_VARIABLE}: its port {ports!r} is not a port number",
            variable=STORE_URL_VARIABLE,
        )
    return params


def cannot_reach(error: BaseException) -> bool:
    """Whether ``error`` of a write means the database cannot be reached now (503, retried
    soon), rather than that it refuses to keep the row (507: full, or an error of ours).

    psycopg's errors without a SQLSTATE are the client's (a connection refused or broken,
    the pool's wait run out); with one, the server says whether it can take work now."""
    import psycopg

    if not isinstance(error, psycopg.Error):
        return False
    state = error.sqlstate
    if state is None:
        return isinstance(error, (psycopg.OperationalError, psycopg.InterfaceError))
    return state.startswith(_TRANSIENT_STATES)


def describe_url(params: dict[str, Any]) -> str:
    """``postgresql://user@host:port/db``: where the store is, never its password."""
    user = f"{params['user']}@" if params.get("user") else ""
    port = f":{params['port']}" if params.get("port") else ""
    return f"postgresql://{user}{params.get('host', '')}{port}/{params.get('dbname', '')}"


class PostgresStore:
    """A router's rows in a PostgreSQL database several routers share (module docstring)."""

    #: No SQLite file (the supervisor's room checks and 4.0's sources directory use one).
    path: Path | None = None

    def __init__(
        self,
        url: str,
        *,
        router_id: str = "",
        kept_dir: Path | None = None,
        min_size: int = 1,
        max_size: int = POOL_MAX,
    ) -> None:
        """Connects (bounded by ``CONNECT_TIMEOUT_S``) and creates the schema if missing.
        Raises ``ConfigError`` naming the variable for a URL that is not PostgreSQL's and
        for a database that cannot be used (unreachable, refusing us): the router does not
        start without it (the refusal says where it is, never its password)."""
        params = parse_url(url)
        import psycopg
        from psycopg_pool import ConnectionPool, PoolTimeout

        self.where = describe_url(params)
        self.router_id = router_id or socket.gethostname()
        self._kept_dir = kept_dir
        #: Unused here: the database does not vanish under the router as a file can.
        self.recall: Callable[[], Iterable[Saved]] | None = None
        #: Writes refused since opening because the row had another owner or version.
        self.fenced = 0
        self._versions: dict[str, int] = {}  # key -> the version this router last saw
        self._lock = threading.Lock()
        self._failing = False
        #: Why the database cannot be reached, while it cannot (written by the probe too).
        self._unreachable: str | None = None
        self._probe: threading.Thread | None = None
        self._closing = threading.Event()
        # Writes that failed while it could not be reached, made again once it can.
        self._unsaved: dict[str, Saved] = {}
        self._unforgotten: set[str] = set()
        self._unsaved_poison: dict[str, list[tuple[str, str]]] = {}
        self._catching_up = False  # those writes are being made (not again from within)
        params.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
        params.setdefault("application_name", f"mineru-health-router:{self.router_id}"[:63])
        # A peer gone silent under an open connection (a partition): unacknowledged
        # sends fail after this, and an idle connection is found dead by keepalives.
        params.setdefault("tcp_user_timeout", CONNECT_TIMEOUT_S * 1000)
        params.setdefault("keepalives_idle", CONNECT_TIMEOUT_S)
        params.setdefault("keepalives_interval", 2)
        params.setdefault("keepalives_count", 2)
        self._params = params  # the probe's own connection (reach)
        self._pool_timeout = PoolTimeout  # the extra's, imported only here
        self._pool = ConnectionPool(
            kwargs=params,
            min_size=min_size,
            max_size=max_size,
            timeout=WRITE_WAIT_S,
            reconnect_timeout=RECONNECT_S,
            open=False,
            # A connection the database dropped (its restart) is
            # replaced before use, not failed once per pooled one.
            check=ConnectionPool.check_connection,
            name=f"mineru-health-{self.router_id}",
        )
        try:
            # One connection first: a refused one fails at once (the pool would retry).
            with psycopg.connect(**params) as conn, conn.transaction():
                # Several routers starting at once: one creates, the others wait for it.
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('mineru-health-schema'))")
                conn.execute(_SCHEMA)
            self._pool.open(wait=True, timeout=CONNECT_TIMEOUT_S)
        except Exception as error:
            self._pool.close()
            raise ConfigError(
                f"{STORE_URL_VARIABLE}: the router's store {self.where} cannot "
                f"be used ({_first_line(error)})",
                variable=STORE_URL_VARIABLE,
            ) from error

    @classmethod
    def open(cls, url: str, *, router_id: str = "", kept_dir: Path | None = None) -> PostgresStore:
        """The store at ``url`` (the router's start-up: errors raise, logged)."""
        try:
            store = cls(url, router_id=router_id, kept_dir=kept_dir)
        except ConfigError as error:
            _log.error("mineru-router refuses to start: %s (variable %s)", error, error.variable)
            raise
        _log.info(
            "the router's store is %s, this router's rows owned as %r", store.where, store.router_id
        )
        return store

    @property
    def kept_dir(self) -> Path | None:
        """Where kept uploads live: the router's own state directory, or None."""
        return self._kept_dir

    # -- writes ----------------------------------------------------------------------------
    @property
    def unreachable(self) -> str | None:
        """Why the database cannot be reached now (where it is, what failed), or None."""
        return self._unreachable

    def save(self, saved: Saved) -> bool:
        """Writes one submission's row, as its owner: True once committed; False when the
        database cannot be written (logged; an update of a row already kept is made again
        once it can) or the row is another router's now, or at another version (fenced:
        logged, counted in ``fenced``, nothing written)."""
        row = encode_row(saved)
        values = row[1:10]  # state .. accepted_at, in _COLUMNS' order
        with self._lock:
            seen = self._versions.get(saved.key)
        if seen is None:
            sql, args = _INSERT, (saved.key, self.router_id, *values)
        else:
            sql, args = _UPDATE, (*values, saved.key, self.router_id, seen)
        written, found = False, None
        if not self._catch_up():
            self._down(f"the row of {saved.key}")
        else:
            try:
                with self._pool.connection() as conn:
                    found = conn.execute(sql, args).fetchone()
                written = True
            except Exception as error:  # noqa: BLE001 -- the database down must not fail the router
                self._failed(f"the row of {saved.key}", error)
        if not written:
            # Never a first row: that submission is refused, not kept.
            if seen is not None and self._unreachable is not None:
                self._unsaved[saved.key] = saved
            return False
        self._working()
        self._unsaved.pop(saved.key, None)
        if found is None:
            self._fence(saved.key, seen)
            return False
        with self._lock:
            self._versions[saved.key] = int(found[0])
        return True

    def forget(self, keys: Iterable[str]) -> None:
        """Deletes the rows of ``keys`` that this router owns (MinerU forgot them)."""
        gone = [str(key) for key in keys]
        if not gone:
            return
        for key in gone:
            self._unsaved.pop(key, None)
        if not self._catch_up():
            self._down(f"{len(gone)} row(s)")
            self._unforgotten.update(gone)
            return
        try:
            with self._pool.connection() as conn:
                conn.execute(
                    "DELETE FROM submissions WHERE key = ANY(%s) AND owner = %s",
                    (gone, self.router_id),
                )
        except Exception as error:  # noqa: BLE001 -- as above
            self._failed(f"{len(gone)} row(s)", error)
            if self._unreachable is not None:
                self._unforgotten.update(gone)
            return
        self._working()
        with self._lock:
            for key in gone:
                self._versions.pop(key, None)

    def add_poison_death(self, digest: str, worker: str, rule: str) -> list[tuple[str, str]] | None:
        """Adds one trigger death of ``digest`` to every router's memory of it, in one
        transaction (the row locked: two routers adding at once both count); returns every
        death held, or None when the database failed (logged; one it could not reach gets
        the death once it is back)."""
        if not self._catch_up():
            self._down(digest)
            self._unsaved_poison.setdefault(digest, []).append((worker, rule))
            return None
        try:
            with self._pool.connection() as conn, conn.transaction():
                conn.execute(
                    "INSERT INTO poison (digest, deaths) VALUES (%s, '[]') "
                    "ON CONFLICT (digest) DO NOTHING",
                    (digest,),
                )
                row = conn.execute(
                    "SELECT deaths FROM poison WHERE digest = %s FOR UPDATE", (digest,)
                ).fetchone()
                held = decode_poison([(digest, row[0])]) if row else []
                deaths = with_death(held[0][1] if held else [], worker, rule)
                conn.execute(
                    "UPDATE poison SET deaths = %s, updated_at = now() WHERE digest = %s",
                    (json.dumps([list(d) for d in deaths]), digest),
                )
        except Exception as error:  # noqa: BLE001 -- as above
            self._failed(digest, error)
            if self._unreachable is not None:
                self._unsaved_poison.setdefault(digest, []).append((worker, rule))
            return None
        self._working()
        return deaths

    def _catch_up(self) -> bool:
        """True when the database can be written: the writes that failed while it could not
        be reached made first (so that the newest write of a row is the last); False while
        it cannot be reached."""
        if self._unreachable is not None:
            return False
        if self._catching_up or not (self._unsaved or self._unforgotten or self._unsaved_poison):
            return True
        unsaved = [self._unsaved.pop(key) for key in list(self._unsaved)[:CATCH_UP_ROWS]]
        forgotten, self._unforgotten = self._unforgotten, set()
        poison, self._unsaved_poison = self._unsaved_poison, {}
        _log.warning(
            "the router's store %s: %d row(s), %d deletion(s) and %d poison record(s) "
            "that could not be written while it was unreachable are written now (%d row(s) "
            "by the next writes)",
            self.where,
            len(unsaved),
            len(forgotten),
            len(poison),
            len(self._unsaved),
        )
        self._catching_up = True
        try:
            for saved in unsaved:
                self.save(saved)
            self.forget(forgotten)
            for digest, deaths in poison.items():
                for worker, rule in deaths:
                    self.add_poison_death(digest, worker, rule)
        finally:
            self._catching_up = False
        return self._unreachable is None

    def _down(self, what: str) -> bool:
        """A write not tried: the database could not be reached a moment ago (logged once)."""
        _log.debug("%s not written: %s", what, self._unreachable)
        return False

    def _fence(self, key: str, seen: int | None) -> None:
        """Says who holds ``key`` now that this router's write to it was refused."""
        self.fenced += 1
        holder = None
        try:
            with self._pool.connection() as conn:
                holder = conn.execute(
                    "SELECT owner, version FROM submissions WHERE key = %s", (key,)
                ).fetchone()
        except Exception:  # noqa: BLE001 -- only for the log line
            _log.debug("who holds %s could not be read", key, exc_info=True)
        now = "gone" if holder is None else f"owned by {holder[0]!r} at version {holder[1]}"
        mine = "a row it did not hold" if seen is None else f"version {seen}"
        _log.warning(
            "%s: this router's write refused (fenced): it wrote %s as %r, the row is "
            "%s; another router drives it now",
            key,
            mine,
            self.router_id,
            now,
        )

    def _failed(self, what: str, error: Exception) -> bool:
        """A write that failed: logged once per streak; when the database cannot be reached,
        ``unreachable`` says so and the probe starts."""
        cause = _first_line(error)
        if cannot_reach(error):
            with self._lock:
                self._unreachable = self._unreachable_text(error)
                if self._probe is None and not self._closing.is_set():
                    self._probe = threading.Thread(
                        target=self._probe_until_reached,
                        name=f"mineru-health-store-probe-{self.router_id}",
                        daemon=True,
                    )
                    self._probe.start()
        if not self._failing:  # once per streak of failures
            _log.error(
                "the router's store %s cannot write %s (%s): submissions are not "
                "acknowledged until it can",
                self.where,
                what,
                cause,
            )
        self._failing = True
        return False

    def _working(self) -> None:
        if self._failing:
            _log.warning("the router's store %s writes again", self.where)
        self._failing = False

    def _unreachable_text(self, error: BaseException) -> str:
        return f"the router's store {self.where} cannot be reached ({_first_line(error)})"

    def reach(self) -> bool:
        """One try to reach the database, at most ``CONNECT_TIMEOUT_S`` + ``WRITE_WAIT_S``:
        True, and writes are tried again, once it answers. A connection of its own first:
        its error says why (the pool's says only that it waited), and ``unreachable``
        gives that reason; then through the pool, so that a connection is ready for the
        next write."""
        import psycopg

        try:
            psycopg.connect(**self._params).close()
            with self._pool.connection(timeout=WRITE_WAIT_S) as conn:
                conn.execute("SELECT 1")
        except Exception as error:  # noqa: BLE001 -- still down: the probe tries again
            _log.debug("the router's store %s: still unreachable (%s)", self.where, error)
            if cannot_reach(error) and not isinstance(error, self._pool_timeout):
                with self._lock:
                    if self._unreachable is not None:
                        self._unreachable = self._unreachable_text(error)
            return False
        with self._lock:
            was, self._unreachable = self._unreachable, None
        if was is not None:
            _log.warning("the router's store %s can be reached again", self.where)
        return True

    def _probe_until_reached(self) -> None:
        """The probe's thread: :meth:`reach` every ``PROBE_S`` until it answers or the store
        is closed."""
        while not self._closing.wait(PROBE_S):
            self.reach()
            with self._lock:  # a write that failed since starts the next probe
                if self._unreachable is None:
                    self._probe = None
                    return
        with self._lock:
            self._probe = None

    # -- kept uploads ----------------------------------------------------------------------
    def keep_upload(self, key: str, name: str, source: BinaryIO) -> bool:
        """Keeps ``source`` (read to its end) as the upload ``name`` of ``key``'s row, in
        one transaction, for whichever router drives it next; True once committed. False
        when this router does not own the row (fenced, nothing written) or the database
        cannot be written (logged)."""
        if self._unreachable is not None:
            return self._down(f"the upload {name!r} of {key}")
        try:
            with self._pool.connection() as conn, conn.transaction():
                owned = conn.execute(
                    "SELECT 1 FROM submissions WHERE key = %s AND owner = %s FOR SHARE",
                    (key, self.router_id),
                ).fetchone()
                if owned is None:
                    written = False
                else:
                    conn.execute("DELETE FROM uploads WHERE key = %s AND name = %s", (key, name))
                    with conn.cursor().copy(
                        "COPY uploads (key, name, part, bytes) FROM STDIN"
                    ) as copy:
                        for part in itertools.count():  # an empty upload: one empty row
                            chunk = source.read(UPLOAD_CHUNK)
                            if part and not chunk:
                                break
                            copy.write_row((key, name, part, chunk))
                    written = True
        except Exception as error:  # noqa: BLE001 -- the database down must not fail the router
            return self._failed(f"the upload {name!r} of {key}", error)
        self._working()
        if not written:
            self._fence(key, None)
        return written

    def read_upload(self, key: str, name: str, into: BinaryIO) -> int | None:
        """Writes the kept upload ``name`` of ``key`` into ``into``, a chunk at a time:
        its size, or None when there is none. Raises what the database raises."""
        size, found = 0, False
        with (
            self._pool.connection() as conn,
            conn.transaction(),
            conn.cursor(name="mineru_health_upload") as cursor,
        ):
            cursor.itersize = 4  # chunks held at once
            cursor.execute(
                "SELECT bytes FROM uploads WHERE key = %s AND name = %s ORDER BY part", (key, name)
            )
            for (chunk,) in cursor:
                into.write(chunk)
                size, found = size + len(chunk), True
        return size if found else None

    def upload_names(self, key: str) -> list[str]:
        """The names of ``key``'s kept uploads."""
        with self._pool.connection() as conn:
            return [
                str(name)
                for (name,) in conn.execute(
                    "SELECT DISTINCT name FROM uploads WHERE key = %s ORDER BY name", (key,)
                )
            ]

    def drop_uploads(self, key: str) -> None:
        """Deletes ``key``'s kept uploads (it ended: nothing to send again), as its owner.
        Forgetting the row deletes them too."""
        if self._unreachable is not None:
            self._down(f"the uploads of {key}")
            return
        try:
            with self._pool.connection() as conn:
                conn.execute(
                    "DELETE FROM uploads u USING submissions s WHERE u.key = %s AND "
                    "s.key = u.key AND s.owner = %s",
                    (key, self.router_id),
                )
        except Exception as error:  # noqa: BLE001 -- as above
            self._failed(f"the uploads of {key}", error)
            return
        self._working()

    # -- leases ----------------------------------------------------------------------------
    def renew(self, lease_s: float) -> bool:
        """Extends this router's lease to ``lease_s`` seconds from the database's now().
        True when it was held without a lapse; False when it had expired (its rows may
        have been taken over: their writes are fenced) or did not exist: a new lease is
        taken either way. Raises what the database raises (the caller retries)."""
        with self._pool.connection() as conn, conn.transaction():
            held = conn.execute(
                "UPDATE routers SET lease_until = now() + make_interval(secs => %s), "
                "renewed_at = now() WHERE router_id = %s AND lease_until > now() "
                "RETURNING 1",
                (lease_s, self.router_id),
            ).fetchone()
            if held is None:
                conn.execute(
                    "INSERT INTO routers VALUES (%s, now() + make_interval(secs => %s), now()) "
                    "ON CONFLICT (router_id) DO UPDATE SET lease_until = "
                    "EXCLUDED.lease_until, renewed_at = EXCLUDED.renewed_at",
                    (self.router_id, lease_s),
                )
        return held is not None

    def release(self) -> None:
        """Ends this router's lease now (a clean shutdown): a survivor may take over at once."""
        with self._pool.connection() as conn:
            conn.execute(
                "UPDATE routers SET lease_until = now() WHERE router_id = %s", (self.router_id,)
            )

    def take_over(self) -> tuple[str, list[Saved]] | None:
        """Takes over the rows of one router whose lease has expired, in one transaction:
        (its id, its rows now this router's, oldest first), or None when no lease has
        expired or every expired one is being taken over by another router. All its rows
        move, ended ones too: the new owner answers for them and forgets them at
        MinerU's retention. Raises what the database raises (nothing moved then)."""
        with self._pool.connection() as conn, conn.transaction():
            dead = conn.execute(
                "SELECT router_id FROM routers WHERE lease_until < now() AND router_id <> %s "
                "ORDER BY lease_until LIMIT 1 FOR UPDATE SKIP LOCKED",
                (self.router_id,),
            ).fetchone()
            if dead is None:
                return None
            moved = conn.execute(
                f"UPDATE submissions SET owner = %s, version = version + 1, updated_at = now() "
                f"WHERE owner = %s RETURNING key, version, {_COLUMNS}",
                (self.router_id, dead[0]),
            ).fetchall()
            conn.execute("DELETE FROM routers WHERE router_id = %s", (dead[0],))
        rows = self._remember(moved)
        _log.warning(
            "took over %d submission(s) of router %r, whose lease expired", len(rows), dead[0]
        )
        return str(dead[0]), rows

    # -- reads -----------------------------------------------------------------------------
    def rows(self) -> list[Saved]:
        """This router's submissions, oldest first; rows that are not what we write are
        deleted. Raises what the database raises: the router resumes nothing without it."""
        with self._pool.connection() as conn:
            raw = conn.execute(
                f"{_SELECT} WHERE owner = %s ORDER BY accepted_at", (self.router_id,)
            ).fetchall()
        return self._remember(raw)

    def row(self, key: str) -> tuple[str, Saved] | None:
        """Any router's row of ``key``, read only: (its owner, the row), or None when there
        is none (or it is unreadable). Raises what the database raises."""
        with self._pool.connection() as conn:
            found = conn.execute(
                f"SELECT owner, {_COLUMNS} FROM submissions WHERE key = %s", (key,)
            ).fetchone()
        if found is None:
            return None
        saved = decode_row(key, *found[1:])
        return None if saved is None else (str(found[0]), saved)

    def row_naming(self, word: str) -> tuple[str, Saved] | None:
        """Any router's row whose record has the JSON string ``word`` in it (a 4.0 job's
        file id: its files are not keys), read only, as :meth:`row`. A scan of the rows
        kept (the id is random: one row names it), for ids this router does not know."""
        with self._pool.connection() as conn:
            found = conn.execute(
                f"SELECT key, owner, {_COLUMNS} FROM submissions "
                "WHERE strpos(record, %s) > 0 LIMIT 1",
                (json.dumps(word),),
            ).fetchone()
        if found is None:
            return None
        saved = decode_row(str(found[0]), *found[2:])
        return None if saved is None else (str(found[1]), saved)

    def _remember(self, raw: Sequence[Sequence[Any]]) -> list[Saved]:
        """Decodes rows (key, version, columns...), noting each one's version."""
        rows, bad = [], []
        with self._lock:
            for key, version, *columns in sorted(raw, key=lambda r: float(r[10])):
                saved = decode_row(key, *columns)
                self._versions[str(key)] = int(version)
                if saved is None:
                    bad.append(str(key))
                else:
                    rows.append(saved)
        if bad:
            _log.warning("the router's store: %d unreadable row(s) dropped", len(bad))
            self.forget(bad)
        return rows

    def poison(self) -> list[tuple[str, list[tuple[str, str]]]]:
        """The poison guard's memory, every router's: (digest, [(worker id, rule), ...])."""
        with self._pool.connection() as conn:
            raw = conn.execute("SELECT digest, deaths FROM poison ORDER BY updated_at").fetchall()
        return decode_poison(raw)

    def count(self) -> int:
        """This router's rows."""
        with self._pool.connection() as conn:
            found = conn.execute(
                "SELECT COUNT(*) FROM submissions WHERE owner = %s", (self.router_id,)
            ).fetchone()
        return int(found[0]) if found is not None else 0

    def check(self) -> str | None:
        """None: a database does not vanish under the router as a file can. Makes the writes
        that failed while it could not be reached, if it can now (the supervisor's sweep
        calls it: an idle router catches up too)."""
        self._catch_up()
        return None

    def close(self) -> None:
        self._closing.set()
        probe = self._probe
        if probe is not None:
            probe.join(timeout=2 * WRITE_WAIT_S + PROBE_S)
        self._pool.close()

    def __repr__(self) -> str:
        return f"PostgresStore({self.where!r}, router_id={self.router_id!r})"


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]

"""One pool per process: the Memories of one database in a process share its connections and the
threads that run their async calls, instead of each opening its own (`Memory.from_defaults` and
`Memory.aopen` open their store here; the CLI's commands, one store each, do not).

A database has up to a number of stores, and every Memory open on it is handed the store that
serves the fewest Memories (a new store while there are fewer than that and each serves one
already). Memories sharing a store share its connection, its lock orders their statements (as
it orders those of the threads sharing a store: one's transaction never sees another's
statements), and it is closed with the last of them.
- SQLite: one store per file (its resolved path): SQLite runs one writer at a time anyway, and
  readers wait only for the store's lock.
- PostgreSQL: up to `pool_size` stores per URL (POOL_SIZE unless a Memory asked for more), each
  with a connection from a psycopg_pool `ConnectionPool` of that size (and a second pool, of the
  same size, for the stores' `reader()` connections). So a process holds at most `pool_size`
  connections to a database (twice that while searches run), however many Memories are open,
  and opening a Memory never waits for a connection.

Each database also has one set of worker threads for the async API's calls (`workers`):
SQLITE_WORKERS for a file (more would only wait for its one lock), `pool_size` for PostgreSQL
(one per store). The last Memory of a database closed closes its stores and pools and stops its
threads, so a process whose Memories are all closed holds no connection and no thread of
memcli's.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memcli.errors import StoreError, UsageError
from memcli.store.base import is_postgres_url, redact_url

if TYPE_CHECKING:
    from memcli.store.base import Store

#: Connections (stores) per PostgreSQL database per process, by default (`pool_size` asks more).
POOL_SIZE = 10
#: Worker threads of a SQLite file's async calls (its one lock orders their statements).
SQLITE_WORKERS = 4

_local = threading.local()  # whether this thread is one of the databases' workers


def _mark_worker() -> None:
    _local.worker = True


@dataclass
class _Database:
    """What the Memories of one database share in this process."""

    key: str
    size: int  # stores at most, and worker threads (SQLite: one store, SQLITE_WORKERS threads)
    stores: dict[int, list[Any]] = field(default_factory=dict)  # id -> [store, Memories on it]
    pools: dict[str, Any] = field(default_factory=dict)  # PostgreSQL: "main" and "reader"
    workers: ThreadPoolExecutor | None = None


_databases: dict[str, _Database] = {}
_by_store: dict[int, _Database] = {}  # id(store) -> its database, while the store is open
_lock = threading.RLock()  # (reentrant: a finaliser may run while this thread holds it)


def check_pool_size(pool_size: object) -> int | None:
    """`pool_size` as given to `Memory.from_defaults`: None, or a whole number >= 1."""
    if pool_size is None:
        return None
    if not isinstance(pool_size, int) or isinstance(pool_size, bool) or pool_size < 1:
        raise UsageError(
            f"pool_size must be a whole number >= 1, not {pool_size!r}",
            f"Leave it out for {POOL_SIZE} connections per database, or ask for more",
        )
    return pool_size


def acquire(db: str | Path, pool_size: int | None = None) -> Store:
    """A store on `db` (a SQLite file or a `postgresql://` URL) shared in this process: the one
    serving the fewest Memories, or a new one while the database has fewer than its size. Give
    it back with `release`."""
    pool_size = check_pool_size(pool_size)
    if is_postgres_url(db):
        assert isinstance(db, str)
        key, size = db, pool_size or POOL_SIZE
    else:
        key, size = f"sqlite:{Path(db).expanduser().resolve()}", 1
    with _lock:
        database = _databases.get(key)
        if database is None:
            database = _databases[key] = _Database(key, size)
        elif pool_size is not None and size > database.size and database.pools:
            database.size = size  # (a larger size asked later grows the pool)
            for pool in database.pools.values():
                pool.resize(min_size=0, max_size=size)
        for ident, (store, _) in list(database.stores.items()):
            if getattr(store, "closed", False):  # (closed by hand, `memory.store.close()`)
                del database.stores[ident]
                _by_store.pop(ident, None)
        least = min(database.stores.values(), key=lambda lease: lease[1], default=None)
        if least is not None and (least[1] == 0 or len(database.stores) >= database.size):
            least[1] += 1
            return least[0]  # type: ignore[no-any-return]
        try:
            store = _open(database, db)
        except BaseException:
            if not database.stores:
                _drop(database)
            raise
        database.stores[id(store)] = [store, 1]
        _by_store[id(store)] = database
        return store


def _open(database: _Database, db: str | Path) -> Store:
    """(Under `_lock`.) A new store of the database."""
    if not database.key.startswith("sqlite:"):
        from memcli.store.postgres import PostgresStore

        assert isinstance(db, str)
        if not database.pools:
            from memcli.store.postgres import connect

            connect(db).close()  # (StoreError naming why, when it cannot connect)
            database.pools["main"] = _new_pool(db, database.size)
            database.pools["reader"] = _new_pool(db, database.size)
        return PostgresStore(db, pool=PooledConnections(database))
    from memcli.store.sqlite import SQLiteStore

    return SQLiteStore(Path(db).expanduser())


def _new_pool(url: str, size: int) -> Any:
    """A psycopg_pool of up to `size` connections to `url`, made as the store makes its own
    (autocommit, the connect timeout, the lock timeout: `postgres.configure`); none kept idle
    for more than a minute. (`_open` connects once first: a URL that does not connect says why
    at once, rather than after the pool's timeout.)"""
    from psycopg_pool import ConnectionPool

    from memcli.store.postgres import CONNECT_TIMEOUT_S, configure

    return ConnectionPool(
        url,
        kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT_S},
        min_size=0,
        max_size=size,
        open=True,
        configure=configure,
        max_idle=60.0,
        num_workers=1,
        name="memcli",
    )


class PooledConnections:
    """Where a pooled PostgresStore takes its connection and gives it back (`take`, `give`), and
    the pool of its `reader()` (`readers`)."""

    def __init__(self, database: _Database, kind: str = "main") -> None:
        self.database = database
        self.kind = kind

    def take(self) -> Any:
        """A connection of the pool (there is one: the database has no more stores than the
        pool has connections); a connection that cannot be made says why."""
        from psycopg_pool import PoolTimeout

        from memcli.store.postgres import CONNECT_TIMEOUT_S, connect

        try:
            return self.database.pools[self.kind].getconn(timeout=CONNECT_TIMEOUT_S)
        except PoolTimeout:
            connect(self.database.key).close()  # says why (StoreError)
            raise StoreError(
                f"no connection to {redact_url(self.database.key)} within {CONNECT_TIMEOUT_S} s",
                "Check that the server runs",
            ) from None

    def give(self, conn: Any) -> None:
        """Back to the pool (a connection the server closed is dropped by it, and replaced)."""
        pool = self.database.pools.get(self.kind)
        if pool is None or pool.closed:
            conn.close()
            return
        try:
            pool.putconn(conn)
        except Exception:  # (not the pool's any more: a pool closed meanwhile)
            conn.close()

    def readers(self) -> PooledConnections:
        return PooledConnections(self.database, "reader")


def release(store: Store) -> None:
    """Give back a store `acquire` gave: one Memory less on it; the last closes it (its
    connection back to the pool), and the database's last store closes its pools and stops its
    threads. Twice is harmless for a store closed; otherwise, once per `acquire`."""
    with _lock:
        database = _by_store.get(id(store))
        lease = database.stores.get(id(store)) if database is not None else None
        if database is None or lease is None or lease[0] is not store:
            return
        lease[1] -= 1
        if lease[1] > 0:
            return
        del database.stores[id(store)]
        del _by_store[id(store)]
        try:
            store.close()
        finally:
            if not database.stores:
                _drop(database)


def _drop(database: _Database) -> None:
    """(Under `_lock`.) The database's last store is closed: its pools and threads go too."""
    if _databases.get(database.key) is database:
        del _databases[database.key]
    for pool in database.pools.values():
        pool.close()
    database.pools.clear()
    if database.workers is not None:
        # A worker thread closing its own database (a Memory closed by `aclose`) does not wait
        # for itself: the threads end as they finish, at once since nothing else is queued.
        database.workers.shutdown(wait=not getattr(_local, "worker", False))
        database.workers = None


def workers(store: Store) -> ThreadPoolExecutor | None:
    """The worker threads of the async calls on a store `acquire` gave (made at the first call;
    stopped with the database's last store); None for another store."""
    with _lock:
        database = _by_store.get(id(store))
        if database is None:
            return None
        if database.workers is None:
            database.workers = ThreadPoolExecutor(
                database.size, thread_name_prefix="memcli-store", initializer=_mark_worker
            )
        return database.workers


def is_shared(store: Store) -> bool:
    """Whether `store` came from `acquire` (and is not released yet)."""
    with _lock:
        return id(store) in _by_store


def open_databases() -> list[str]:
    """The databases this process holds shared stores or pools of (a PostgreSQL URL's password
    as ***): empty once every Memory opened on one is closed."""
    with _lock:
        return [redact_url(key) for key in _databases]

"""One pool per process: the Memories of one database in a process share its connections and the
threads that run their async calls, instead of each opening its own (`Memory.from_defaults` and
`Memory.aopen` open their store here; the CLI's commands, one store each, do not).

- SQLite: one `SQLiteStore` per file (its resolved path) per process, shared by every Memory open
  on it. Its lock orders the statements of all of them, as it orders those of the threads that
  share a store (SQLite runs one writer at a time anyway; readers wait only for this lock).
- PostgreSQL: one psycopg_pool `ConnectionPool` per URL per process, of at most `pool_size`
  connections (POOL_SIZE unless a Memory asked for more), and a second one of the same size for
  the stores' `reader()` connections. Each Memory has a `PostgresStore` of its own (its lock, its
  transactions) over a connection taken from the pool for as long as it is open: so at most
  `pool_size` Memories of one database are open at once in a process, and another open waits
  for one to close (up to POOL_WAIT_S, then a StoreBusy naming the pool's size).

Each database also has one set of worker threads for the async API's calls (`workers`): SQLite_
WORKERS for a file (more would only wait for its one lock), `pool_size` for PostgreSQL (one per
connection). Every Memory open on a database holds a reference; the last one closed closes the
store or the pools and stops the threads, so a process whose Memories are all closed holds no
connection and no thread of memcli's.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memcli.errors import StoreBusy, StoreError, UsageError
from memcli.store.base import is_postgres_url, redact_url

if TYPE_CHECKING:
    from memcli.store.base import Store

#: Connections per PostgreSQL database per process, by default (`pool_size` asks for another).
POOL_SIZE = 10
#: How long opening a Memory waits for a connection of a full pool, in seconds.
POOL_WAIT_S = 30.0
#: How long one try of `Memory.aopen` waits for a connection of a full pool (it tries again,
#: without holding a thread, until POOL_WAIT_S have gone by).
TRY_WAIT_S = 0.05
#: Worker threads of a SQLite file's async calls (its one lock orders their statements).
SQLITE_WORKERS = 4


class PoolFull(StoreBusy):
    """Every connection of the process's pool to a PostgreSQL database stayed in use for the
    time a store waited for one."""


def full_error(url: str, waited: float) -> PoolFull:
    with _lock:
        database = _databases.get(url)
        size = database.size if database is not None else POOL_SIZE
    return PoolFull(
        f"all {size} connections of this process's pool to {redact_url(url)} stayed in use for"
        f" {waited:.0f} s",
        "Close the Memories you no longer use (`close()`, `with`), or open them with a larger"
        " pool_size",
    )


_local = threading.local()  # `in_worker`: whether this thread is one of the pools' workers


def _mark_worker() -> None:
    _local.worker = True


@dataclass
class _Database:
    """What the Memories of one database share in this process."""

    key: str
    size: int
    refs: int = 0
    store: Any = None  # SQLite: the one store
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


def acquire(db: str | Path, pool_size: int | None = None, wait: float | None = None) -> Store:
    """A store on `db` (a SQLite file or a `postgresql://` URL) shared in this process; give it
    back with `release`. SQLite: the file's one store. PostgreSQL: a store of its own over a
    connection of the database's pool, waited for up to `wait` seconds when the pool is full
    (StoreBusy then)."""
    pool_size = check_pool_size(pool_size)
    if is_postgres_url(db):
        assert isinstance(db, str)
        return _acquire_postgres(db, pool_size, POOL_WAIT_S if wait is None else wait)
    return _acquire_sqlite(Path(db).expanduser())


def _acquire_sqlite(path: Path) -> Store:
    from memcli.store.sqlite import SQLiteStore

    key = f"sqlite:{path.resolve()}"
    with _lock:
        database = _databases.get(key)
        if database is None:
            store = SQLiteStore(path)  # (raises before anything is registered)
            database = _databases[key] = _Database(key, SQLITE_WORKERS, store=store)
            _by_store[id(store)] = database
        database.refs += 1
        return database.store  # type: ignore[no-any-return]


def _acquire_postgres(url: str, pool_size: int | None, wait: float) -> Store:
    from memcli.store.postgres import PostgresStore

    with _lock:
        database = _databases.get(url)
        if database is None:
            database = _Database(url, pool_size or POOL_SIZE)
            database.pools["main"] = _new_pool(url, database.size)
            database.pools["reader"] = _new_pool(url, database.size, opened=False)
            _databases[url] = database
        elif pool_size is not None and pool_size > database.size:
            database.size = pool_size
            for pool in database.pools.values():
                pool.resize(min_size=0, max_size=pool_size)
        database.refs += 1
    try:
        store = PostgresStore(url, pool=PooledConnections(database, wait))
    except BaseException:
        with _lock:
            _unref(database)
        raise
    with _lock:
        _by_store[id(store)] = database
    return store


def _new_pool(url: str, size: int, opened: bool = True) -> Any:
    """A psycopg_pool of up to `size` connections to `url`, made as the store makes its own
    (autocommit, the connect timeout, the lock timeout: `postgres.configure`); none kept idle
    for more than a minute. `opened`: its first connection is made now, so that a URL that
    does not connect says why at once (StoreError) rather than after POOL_WAIT_S."""
    from psycopg_pool import ConnectionPool, PoolTimeout

    from memcli.store.postgres import CONNECT_TIMEOUT_S, configure, connect

    pool = ConnectionPool(
        url,
        kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT_S},
        min_size=0,
        max_size=size,
        open=False,
        configure=configure,
        max_idle=60.0,
        num_workers=1,
        name="memcli",
    )
    if not opened:
        pool.open(wait=False)
        return pool
    pool.open(wait=False)
    try:
        pool.putconn(pool.getconn(timeout=CONNECT_TIMEOUT_S))
    except PoolTimeout:
        pool.close()
        connect(url).close()  # says why (StoreError); else it connects now and the pool did not
        raise StoreError(
            f"cannot connect to the database {redact_url(url)}: no connection within"
            f" {CONNECT_TIMEOUT_S} s",
            "Check that the server runs",
        ) from None
    except BaseException:
        pool.close()
        raise
    return pool


class PooledConnections:
    """Where a pooled PostgresStore takes its connection and gives it back (`take`, `give`), and
    the pool of its `reader()` (`readers`)."""

    def __init__(self, database: _Database, wait: float, kind: str = "main") -> None:
        self.database = database
        self.wait = wait
        self.kind = kind

    def take(self) -> Any:
        from psycopg_pool import PoolTimeout

        pool = self.database.pools[self.kind]
        try:
            return pool.getconn(timeout=self.wait)
        except PoolTimeout:
            raise full_error(self.database.key, self.wait) from None

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
        with _lock:
            self.database.refs += 1  # the reader holds the database open too (`release`)
        return PooledConnections(self.database, self.wait, "reader")

    def release(self) -> None:
        """The reader's store closed."""
        with _lock:
            _unref(self.database)


def release(store: Store) -> None:
    """Give back a store `acquire` gave: SQLite, one reference less to the file's store (closed
    with the last); PostgreSQL, the store closed (its connection back to the pool; the pools
    closed with the last store of the database). Twice is harmless."""
    with _lock:
        database = _by_store.get(id(store))
        if database is None or database.store is not None and database.store is not store:
            return
        if database.store is None:  # PostgreSQL: this store is done
            del _by_store[id(store)]
            store.close()  # (its connection back to the pool; its reader's too)
        _unref(database)


def _unref(database: _Database) -> None:
    """(Under `_lock`.) One reference less; the last closes what the database held."""
    database.refs -= 1
    if database.refs > 0:
        return
    if _databases.get(database.key) is database:
        del _databases[database.key]
    if database.store is not None:
        _by_store.pop(id(database.store), None)
        database.store.close()
    for pool in database.pools.values():
        pool.close()
    database.pools.clear()
    if database.workers is not None:
        # A worker thread closing its own pool (a Memory closed by `aclose`) does not wait for
        # itself: the threads end as they finish, at once since nothing else is queued.
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

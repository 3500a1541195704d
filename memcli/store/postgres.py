"""The PostgreSQL store: the Store protocol on a PostgreSQL database (`postgresql://` URLs).

The driver is psycopg 3, imported only when such a URL is opened. Why psycopg 3 and not asyncpg:
memcli's core is synchronous, with an async layer on top (`Memory.aput` and the like run the sync
path, in a worker thread when it would wait); psycopg 3 serves sync and async code with one API,
where asyncpg is async only and would need an event loop inside every sync call. psycopg 3 also
binds parameters on the server, prepares statements a connection runs often, pipelines
`executemany`, has COPY for bulk loads (an import's messages go in by COPY) and a real
connection pool (psycopg_pool) for an app that wants one.

One connection per store: the store's lock serialises its statements anyway (one thread's
statements must never run inside another thread's transaction, and a transaction is a
connection's), so more connections would sit idle. Several threads share one store; several
workers or processes each open their own, and PostgreSQL runs them side by side. The Memories of
one process take their stores' connections from one pool per database (`pool`: psycopg_pool,
bounded): a store given `pool` takes its connection there and gives it back when closed. (Behind
PgBouncer, use session pooling: the lock timeout is a session setting.)

Concurrency:
- Readers never wait: PostgreSQL's MVCC.
- Writers take turns per session, not per database: inside a write transaction, the first
  statement that touches a session (its version read by Memory before a put, an append, a flush,
  a delete) takes a transaction-scoped advisory lock on it (`pg_advisory_xact_lock`), held to
  the commit. So N processes putting into one session flush one at a time, each reading the
  window after the one before committed (nothing lost or duplicated, whole turns oldest first),
  while puts into other sessions go on at once. `transaction(wait=False)` takes it with
  `pg_try_advisory_xact_lock` and raises StoreBusy when another process holds it. A lock waited
  for longer than WRITE_WAIT_S fails (`lock_timeout`).
- Ids come from sequences (identity columns): never given out twice, deleted ones included.

Statements are the portable SQL of `memcli.store.tables` and the helpers, with `?` placeholders,
translated once per statement text to psycopg's `%s` (`translate`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memcli.credentials import hide_secrets
from memcli.errors import StoreBusy, StoreError
from memcli.messages import format_time, metadata_json, session_name
from memcli.store.base import FlushPlan, NewMessage, redact_url
from memcli.store.check import PG_CHECKS, Problem, run_checks
from memcli.store.pg_migrations import LATEST, rewrite_seconds, schema_version, upgrade
from memcli.store.tables import MESSAGE_ROW, TableStore, now_utc
from memcli.words import duration

if TYPE_CHECKING:
    from memcli.store.pool import PooledConnections

#: How long a write waits for a session another process is writing, in seconds.
WRITE_WAIT_S = 60
#: How long opening waits for the server to answer, in seconds.
CONNECT_TIMEOUT_S = 10
#: Opening a database whose migrations rewrite its tables for this long or more says so first.
ANNOUNCE_SECONDS = 1.0
#: Tables whose ids a sequence gives out, and the `counters` row that also remembers given ids.
ID_TABLES = {
    "messages": "message_id",
    "flushes": None,
    "facts": None,
    "fact_history": None,
    "retrieval_vectors": None,
}


#: The call `put_window` makes (arrays typed: an empty list has no type of its own).
_PUT = (
    "SELECT ids, flush_ids, version FROM memcli_put(%s, %s, %s, %s, %s::text[], %s::text[],"
    " %s::text[], %s::text[], %s::bigint[], %s::text[], %s::bigint[], %s::int[], %s::bigint[],"
    " %s::text[])"
)
#: The call for one message that flushes nothing (`memcli_put_one`, migration 24).
_PUT_ONE = "SELECT id, version FROM memcli_put_one(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"


def configure(conn: Any) -> None:
    """A new connection's session settings: the lock timeout (see WRITE_WAIT_S)."""
    conn.execute(f"SET lock_timeout = '{WRITE_WAIT_S}s'")


def connect(url: str) -> Any:
    """A new connection to `url` (autocommit, the session settings); StoreError naming why when
    it cannot be made."""
    import psycopg

    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg.Error as exc:
        text = " ".join(str(exc).split()).rstrip(".")
        password = _password(url)
        text = hide_secrets(text.replace(password, "***") if password else text, url)
        raise StoreError(
            f"cannot connect to the database {redact_url(url)}: {text}",
            "Check the URL (--db, MEMCLI_DB or db in the config), that the server runs, and"
            " that your role may connect to it",
        ) from None
    try:
        configure(conn)
    except psycopg.Error as exc:
        conn.close()
        raise StoreError(
            f"cannot open the database {redact_url(url)}:"
            f" {hide_secrets(' '.join(str(exc).split()), url)}",
            "Check the database (`memcli check`)",
        ) from None
    return conn


def _password(url: str) -> str | None:
    """The password `url` holds, if any (so that no message repeats it)."""
    import psycopg

    try:
        password = psycopg.conninfo.conninfo_to_dict(url).get("password")
        return str(password) if password else None
    except psycopg.Error:
        return None


@lru_cache(maxsize=2048)
def translate(sql: str) -> str:
    """`?` placeholders as psycopg's `%s`, and a literal `%` as `%%` (outside quoted strings and
    identifiers a `?` is a placeholder; inside, it stays)."""
    out = []
    quote = ""
    for char in sql:
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "?":
            out.append("%s")
            continue
        out.append("%%" if char == "%" else char)
    return "".join(out)


@lru_cache(maxsize=4096)
def session_key(session_id: str) -> int:
    """The advisory lock key of a session: 64 bits of a hash of its id (signed, as PostgreSQL's
    bigint). Two sessions sharing a key only take turns more than they need to."""
    digest = hashlib.blake2b(session_id.encode(), digest_size=8, person=b"memcli-session").digest()
    return int.from_bytes(digest, "big", signed=True)


#: The tables a delete for good deletes from, vacuumed after it.
_PURGED = (
    "messages",
    "flushes",
    "sessions",
    "facts",
    "fact_history",
    "fact_topics",
    "summaries",
    "block_state",
    "block_flushes",
    "block_definitions",
    "retrieval_vectors",
    "retrieval_redo",
    "retrieval_marks",
)


class PostgresStore(TableStore):
    """The Store protocol over PostgreSQL (see the module's docstring for the design).

    Opening a database applies the pending migrations (`memcli.store.pg_migrations`) in one
    transaction, under an advisory lock, so two processes opening a new database at once migrate
    it once; with none pending, it reads the version only. A database PostgreSQL serves
    read-only (a hot standby, a role whose transactions default to read-only) is opened
    read-only: reading works, a write transaction raises.
    """

    SNAPSHOT_BEGIN = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
    #: Which SQL the retrieval helpers speak to it (`memcli.store.index`).
    dialect = "postgresql"

    def __init__(
        self,
        url: str,
        on_migrate: Callable[[str], None] | None = None,
        *,
        pool: PooledConnections | None = None,
    ) -> None:
        """`on_migrate` is told, before it starts, when bringing an existing database up to date
        rewrites its tables for ANNOUNCE_SECONDS or more (what, and about how long). `pool`:
        the connection comes from there, and goes back there at `close()` (`memcli.store.pool`);
        without it, the store connects, and closes its connection."""
        import psycopg

        self._psycopg = psycopg
        self.DATABASE_ERRORS = (psycopg.Error,)
        self.url = url
        self.damaged = False  # (PostgreSQL guards its own files: never set)
        self._pool = pool
        #: `close()` was called: the connection is closed (or back in the pool).
        self.closed = False
        conn = self.conn = self._connect()
        self._init_tables()
        #: The sessions whose write lock the open transaction holds.
        self._locked: set[str] = set()
        #: A second connection for reads run alongside this one's (`reader`).
        self._reader: PostgresStore | None = None
        #: Whether the open transaction waits for a session's lock (`transaction(wait=...)`).
        self._wait = True
        #: The open transaction's BEGIN is not sent yet (it goes with its first statement).
        self._begin_pending = False
        try:
            row = conn.execute("SHOW transaction_read_only").fetchone()
        except psycopg.Error as exc:
            self._close_connection()
            raise self._error(exc, f"cannot open the database {self.where}") from None
        self.read_only = row is not None and row[0] == "on"
        try:
            self._migrate(on_migrate)
        except BaseException:
            self._close_connection()
            raise

    def _connect(self) -> Any:
        """A new connection, with the session's settings (the lock timeout): from the pool when
        the store has one."""
        if self._pool is not None:
            return self._pool.take()
        return connect(self.url)

    def _close_connection(self) -> None:
        """The connection closed, or back in the pool."""
        conn = self.conn
        if self._pool is not None:
            self._pool.give(conn)
        else:
            conn.close()

    def _ensure_connection(self) -> None:
        """Connect again when the server closed the connection (a restart, an administrator's
        `pg_terminate_backend`, a network cut): the statement that met the closed connection
        failed, and the next one, outside a transaction, runs on a new connection. A
        transaction open on the old connection is lost with it: its own error stands until it
        ends. (Nothing is sent again: a put whose commit the server may have made before the
        cut would otherwise be stored twice.)"""
        conn = self.conn
        if not (conn.closed or conn.broken):
            return
        if self._depth and not self._begin_pending:
            return
        with self.lock:
            self._close_connection()  # (a pool drops a broken connection)
            self.conn = self._connect()

    @property
    def where(self) -> str:
        """The database's URL, its password (if it holds one) as ***."""
        return redact_url(self.url)

    # -- plumbing ---------------------------------------------------------------------------------

    def _text(self, exc: Exception) -> str:
        """An error's text on one line, without the URL's password should it hold one."""
        text = " ".join(str(exc).split()).rstrip(".")
        password = self._password()
        text = text.replace(password, "***") if password else text
        return hide_secrets(text, self.url)

    def _password(self) -> str | None:
        """The password the URL holds, if any (so that no message repeats it)."""
        return _password(self.url)

    def _error(self, exc: Exception, what: str) -> StoreError:
        errors = self._psycopg.errors
        text = self._text(exc)
        if isinstance(exc, errors.LockNotAvailable):
            return StoreError(
                f"{what}: another process held a lock for over {WRITE_WAIT_S} s ({text})",
                "Try again",
            )
        if isinstance(exc, errors.ReadOnlySqlTransaction):
            return StoreError(
                f"{what}: the database {self.where} is read-only ({text})",
                "Reading commands work on it; point memcli at the primary server to write",
            )
        if isinstance(exc, self._psycopg.OperationalError):
            return StoreError(f"{what}: {text}", "Check that the database server runs")
        return StoreError(f"{what}: {text}", "Check the database (`memcli check`)")

    def _migrate(self, on_migrate: Callable[[str], None] | None = None) -> None:
        try:
            version = schema_version(self.conn)
        except self._psycopg.Error as exc:
            raise self._error(exc, f"cannot read the database {self.where}") from None
        if version >= LATEST:
            return  # no lock, nothing written: the schema is current
        if self.read_only:
            raise StoreError(
                f"the database {self.where} is read-only and has an older schema",
                "Open it once through a server and role that may write, to bring it up to date",
            )
        if on_migrate is not None and version > 0:
            seconds, what = rewrite_seconds(self.conn, version)
            if seconds >= ANNOUNCE_SECONDS:
                on_migrate(
                    f"Bringing the database {self.where} up to date (once): rewriting"
                    f" {' and '.join(what)}, about {duration(seconds)}..."
                )
        with self.lock:
            try:
                self.conn.execute("BEGIN")
                upgrade(self.conn, format_time(now_utc()))
                self.conn.execute("COMMIT")
            except self._psycopg.Error as exc:
                self._quiet_rollback()
                raise StoreError(
                    f"cannot bring the database {self.where} to the current schema:"
                    f" {self._text(exc)}",
                    "Check that your role may create tables, functions and triggers in it",
                ) from None

    def _begin(self, wait: bool = True) -> None:
        if self._depth:
            self._depth += 1
            return
        if self.read_only:
            if not wait:
                raise StoreBusy(f"the database {self.where} is read-only")
            raise StoreError(
                f"cannot write to {self.where}: the server serves it read-only",
                "Reading commands work on it; point memcli at the primary server to write",
            )
        # BEGIN goes with the transaction's first statement (with the session lock, when that
        # is first: one round trip less per write).
        self._begin_pending = True
        self._depth = 1
        self._wait = wait
        self.txn_serial += 1

    def _start(self) -> None:
        """Send the pending BEGIN (on a connection that is open: `_ensure_connection`)."""
        self._ensure_connection()
        if self._begin_pending:
            self._begin_pending = False
            try:
                self.conn.execute("BEGIN")
            except self._psycopg.Error as exc:
                raise self._error(exc, f"cannot write to {self.where}") from None

    def can_write_now(self) -> bool:
        """Whether a write transaction would start without waiting: writers wait only for a
        session another process is writing, and the session is not known yet."""
        return bool(self._depth) or not self.read_only

    def _lock_session(self, session_id: str) -> None:
        if not self._depth or session_id in self._locked:
            return
        key = session_key(session_id)  # (an int: safe as a literal)
        lock = f"SELECT {'pg_advisory_xact_lock' if self._wait else 'pg_try_advisory_xact_lock'}({key})"
        with self.lock:
            self._ensure_connection()
            try:
                if self._begin_pending:  # both in one round trip (simple query protocol)
                    self._begin_pending = False
                    cursor = self.conn.execute(f"BEGIN; {lock}")
                    cursor.nextset()
                else:
                    cursor = self.conn.execute(lock)
                got = cursor.fetchone()
            except self._psycopg.Error as exc:
                raise self._error(exc, f"cannot write to {self.where}") from None
        if not self._wait and not (got and got[0]):
            raise StoreBusy(
                f"another process is writing session {session_name(session_id)!r} in {self.where}"
            )
        self._locked.add(session_id)

    def _finish(self, failed: bool) -> None:
        if self._depth > 1:
            self._depth -= 1
            return
        if failed:
            self._rollback()
            return
        try:
            self._apply_touches()
            self._write_buffer()
        except BaseException:
            self._rollback()
            raise
        if self._begin_pending:  # nothing was sent: nothing to commit
            self._rollback()
            return
        self._depth = 0
        self._end_transaction()
        try:
            status = self.conn.execute("COMMIT").statusmessage
        except self._psycopg.Error as exc:
            error = self._error(exc, f"cannot commit to {self.where}")
            self._quiet_rollback()
            raise error from None
        if status != "COMMIT":  # a statement failed inside: PostgreSQL rolled it all back
            raise StoreError(
                f"cannot commit to {self.where}: a statement of the transaction failed",
                "Nothing was written; try again",
            )

    def _end_transaction(self) -> None:
        super()._end_transaction()
        self._locked.clear()

    def _rollback(self) -> None:
        self._depth = 0
        self._begin_pending = False
        self._end_transaction()
        self._quiet_rollback()

    def _quiet_rollback(self) -> None:
        """ROLLBACK, if a transaction is open."""
        if self.conn.info.transaction_status != self._psycopg.pq.TransactionStatus.IDLE:
            try:
                self.conn.execute("ROLLBACK")
            except self._psycopg.Error:
                pass

    def _execute_now(
        self, sql: str, params: Sequence[Any] = (), prepare: bool | None = None
    ) -> Any:
        """Run one statement, leaving buffered inserts buffered."""
        with self.lock:
            self._start()
            try:
                if params:
                    return self.conn.execute(translate(sql), params, prepare=prepare)
                return self.conn.execute(sql, prepare=prepare)  # (psycopg leaves `%` alone)
            except self._psycopg.Error as exc:
                raise self._error(exc, f"database error in {self.where}") from None

    def execute_unprepared(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """As `execute`, never as a prepared statement: the server plans it for its parameters
        each time. (psycopg prepares a statement run five times, and PostgreSQL may then keep
        a generic plan: for a vector search under a user filter, one that compares every vector
        of the user exactly where the HNSW index was the plan for this user.)"""
        with self.lock:
            if self._buffer:
                self._write_buffer()
            return self._execute_now(sql, params, prepare=False)

    def _executemany_now(self, sql: str, rows: Iterable[Sequence[Any]]) -> Any:
        with self.lock:
            self._start()
            cursor = self.conn.cursor()
            try:
                cursor.executemany(translate(sql), rows)
            except self._psycopg.Error as exc:
                raise self._error(exc, f"database error in {self.where}") from None
            return cursor

    def _new_message_ids(self, count: int) -> list[int]:
        rows = self._execute_now(
            "SELECT nextval('messages_id_seq') FROM generate_series(1, ?)", (count,)
        ).fetchall()
        return [row[0] for row in rows]

    def _first_seq_and_ids(self, session_id: str, count: int) -> tuple[int, list[int]]:
        rows = self._execute_now(
            "SELECT COALESCE((SELECT seq + 1 FROM messages WHERE session_id = ? ORDER BY seq DESC"
            " LIMIT 1), 0),"
            " nextval('messages_id_seq') FROM generate_series(1, ?)",
            (session_id, count),
        ).fetchall()
        return rows[0][0], [row[1] for row in rows]

    def _insert_messages(self, rows: list[list[Any]]) -> None:
        """One INSERT for one row; COPY for more (one round trip for a whole import)."""
        if len(rows) == 1:
            self._execute_now(
                f"INSERT INTO messages ({MESSAGE_ROW}) VALUES ({', '.join('?' * 12)})", rows[0]
            )
            return
        with self.lock:
            self._start()
            try:
                with self.conn.cursor().copy(f"COPY messages ({MESSAGE_ROW}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
            except self._psycopg.Error as exc:
                raise self._error(exc, f"cannot store messages in {self.where}") from None

    def put_window(
        self,
        session_id: str,
        version: int,
        messages: Sequence[NewMessage],
        flushes: Sequence[FlushPlan],
    ) -> tuple[list[int], list[int], int] | None:
        """A put in one round trip: one call of a server-side function, in its own transaction
        (see `Store.put_window`): `memcli_put_one` (migration 24) for one message that flushes
        nothing, the common put; `memcli_put` (migrations 19 and 22) for the others. Inside a
        transaction, the same call, in it."""
        if self.read_only:
            raise StoreError(
                f"cannot write to {self.where}: the server serves it read-only",
                "Reading commands work on it; point memcli at the primary server to write",
            )
        if self._depth:
            # Inside a transaction: under the session's lock, after what the transaction
            # counted and buffered (the function sees the session as the transaction left it).
            with self.lock:
                self._lock_session(session_id)
                self._apply_touches()
                self._write_buffer()
                self._next_seq.pop(session_id, None)  # the function appends: seq read again
        if len(messages) == 1 and not flushes:
            one = messages[0].message
            params_one = (
                session_id,
                session_key(session_id),
                version,
                format_time(now_utc()),
                one.role,
                one.content,
                one.name,
                metadata_json(one.metadata),
                messages[0].tokens,
                format_time(one.timestamp) if one.timestamp else None,
            )
            got = self._call_put(_PUT_ONE, params_one)
            if got is None or got[1] is None:
                return None
            return [got[0]], [], got[1]
        rows = [item.message for item in messages]
        params = (
            session_id,
            session_key(session_id),
            version,
            format_time(now_utc()),
            [m.role for m in rows],
            [m.content for m in rows],
            [m.name for m in rows],
            [metadata_json(m.metadata) for m in rows],
            [item.tokens for item in messages],
            [format_time(m.timestamp) if m.timestamp else None for m in rows],
            [i for f in flushes for i in f.message_ids],
            [len(f.message_ids) for f in flushes],
            [f.tokens for f in flushes],
            [f.reason for f in flushes],
        )
        row = self._call_put(_PUT, params)
        if row is None or row[0] is None:
            return None
        return list(row[0]), list(row[1]), row[2]

    def _call_put(self, sql: str, params: tuple[Any, ...]) -> Any:
        """One call of a put function: its row."""
        with self.lock:
            self._ensure_connection()
            try:
                return self.conn.execute(sql, params).fetchone()
            except self._psycopg.Error as exc:
                raise self._error(exc, f"cannot store messages in {self.where}") from None

    def purge(self) -> None:
        """After a delete for good: VACUUM the tables deleted from, so that PostgreSQL drops the
        dead rows (their space reused; the server's WAL and its archives are the server's)."""
        if self._depth:
            raise StoreError("purge inside a write transaction", "A bug in memcli")
        with self.lock:
            self._ensure_connection()
            for table in _PURGED:
                try:
                    self.conn.execute(f"VACUUM {table}")
                except self._psycopg.Error as exc:
                    if "must be owner" in self._text(exc) or "permission" in self._text(exc):
                        continue  # deleted all the same; the server's autovacuum will come
                    raise self._error(exc, f"cannot vacuum {self.where}") from None

    def reader(self) -> PostgresStore:
        """A second connection to the same database, for reads run alongside this one's (a
        connection runs one statement at a time: the retriever's vector search goes here while
        BM25 ranks on this one). Opened on first use, closed with this store; it connects again
        by itself when the server closed its connection (`_ensure_connection`)."""
        with self.lock:
            if self._reader is None:
                pool = self._pool.readers() if self._pool is not None else None
                self._reader = PostgresStore(self.url, pool=pool)
            return self._reader

    def close(self) -> None:
        """Close the connection (a pooled store gives it back to its pool), and the reader's.
        Twice is harmless."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            reader, self._reader = self._reader, None
            if reader is not None:
                reader.close()
            self._quiet_close()

    def _quiet_close(self) -> None:
        try:
            if self._pool is not None and self._depth:
                self._quiet_rollback()  # (not handed to the next store inside a transaction)
            self._close_connection()
        except Exception:
            pass

    def __del__(self) -> None:
        # A store dropped without close() closes its connection (as a sqlite3 one does), or
        # gives it back to its pool, quietly.
        if getattr(self, "conn", None) is not None and not getattr(self, "closed", True):
            self.closed = True
            self._quiet_close()

    # -- ids, checks, backups ---------------------------------------------------------------------

    def reset_sequences(self) -> None:
        """Move each id sequence past the highest id its table holds (and, for messages, past the
        `counters` high-water mark): call after inserting rows with their own ids (a copy from
        another database), so that new rows get new ids. A sequence never moves back."""
        with self.transaction():
            for table, counter in ID_TABLES.items():
                mark = "0"
                if counter is not None:
                    mark = f"COALESCE((SELECT value FROM counters WHERE name = '{counter}'), 0)"
                self.execute(
                    f"SELECT setval('{table}_id_seq', GREATEST(top, 1), top > 0) FROM (SELECT"
                    f" GREATEST(COALESCE((SELECT MAX(id) FROM {table}), 0), {mark},"
                    f" (SELECT CASE WHEN is_called THEN last_value ELSE 0 END"
                    f" FROM {table}_id_seq)) AS top) AS t"
                )

    def check(self) -> list[Problem]:
        """What is wrong with the database: memcli's own checks (session counters, message
        status against flushes, flush counts, id sequences, vectors against messages), on one
        snapshot; empty when it is sound. (PostgreSQL keeps its own files and foreign keys.)"""
        with self.lock:
            if self._depth:
                raise StoreError("check inside a write transaction", "A bug in memcli")
            try:
                self._ensure_connection()
                self.conn.execute(self.SNAPSHOT_BEGIN)
            except self._psycopg.Error as exc:
                return [Problem("integrity", f"the database cannot be read: {self._text(exc)}")]
            try:
                return run_checks(self.conn, PG_CHECKS, self.DATABASE_ERRORS)
            finally:
                self._quiet_rollback()

    def backup(self, target: str | Path) -> list[Problem]:
        """Not done here: PostgreSQL's own tools back a database up while it is in use."""
        raise StoreError(
            f"`memcli backup` copies SQLite files; {self.where} is a PostgreSQL database",
            "Back it up with PostgreSQL's tools: pg_dump -Fc -f memcli.dump URL (restore with"
            " pg_restore)",
        )

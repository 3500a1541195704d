"""The SQLite store: one file (or memory) holds sessions, messages, flushes and block state."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from memcli.errors import StoreBusy, StoreDamaged, StoreError
from memcli.messages import Message, format_time, metadata_json, parse_time
from memcli.store.base import FlushRecord, NewMessage, SessionInfo, WindowEntry
from memcli.store.check import Problem, check_database, integrity_lines
from memcli.store.migrations import LATEST, schema_version, upgrade

BUSY_TIMEOUT_MS = 10_000
#: How long a write waits its turn while other processes write, in all.
WRITE_WAIT_S = 60.0
#: The first write through a store runs `PRAGMA quick_check` on a file up to this size.
QUICK_CHECK_BYTES = 64 * 1024 * 1024
#: What SQLite says of a damaged file, whatever its error code.
_DAMAGE = "database disk image is malformed"

#: Ids per statement when rows are read or changed by many ids (SQLite allowed 999 parameters
#: before 3.32).
IDS_PER_STATEMENT = 500


def now_utc() -> datetime:
    return datetime.now(tz=UTC)


def _writable(path: Path) -> bool:
    """Whether memcli may write an existing database: the file and its directory (where the
    journal files go) are writable. (A new one is made, or fails to be, as usual.)"""
    if not path.exists():
        return True
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)


def _is_busy(exc: sqlite3.Error) -> bool:
    name = getattr(exc, "sqlite_errorname", "") or ""
    return name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "database is locked" in str(exc)


class _Transaction:
    """The context manager behind `SQLiteStore.transaction()` (a class: puts call it a lot)."""

    __slots__ = ("store", "wait")

    def __init__(self, store: SQLiteStore, wait: bool = True) -> None:
        self.store = store
        self.wait = wait

    def __enter__(self) -> None:
        store = self.store
        if not store.lock.acquire(blocking=self.wait):
            raise StoreBusy(f"another thread is writing to {store.where}")
        try:
            store._begin(self.wait)
        except BaseException:
            store.lock.release()
            raise

    def __exit__(self, kind: object, value: object, traceback: object) -> None:
        try:
            self.store._finish(failed=kind is not None)
        finally:
            self.store.lock.release()


class SQLiteStore:
    """The Store protocol over SQLite, WAL mode, with a busy timeout.

    Opening a database applies the pending migrations (`memcli.store.migrations`) in one write
    transaction, and takes no write lock when there are none; every statement is plain sqlite3,
    so that a command starts fast.

    Readers never wait for writers (WAL). A file that cannot be written (it, or its directory,
    is read-only) is opened read-only, and only reading works. Writers take turns: a write
    transaction waits for the lock (retries after a jittered, growing pause) up to WRITE_WAIT_S.
    A file SQLite reports damaged (any statement; and `PRAGMA quick_check` before a store's
    first write, for files up to QUICK_CHECK_BYTES) raises StoreDamaged and is never written to
    again through this store; `check()` says what is wrong.

    Threads may share a store: `lock` (reentrant) is held by a transaction for its whole length
    and by each read outside one, so that one thread's statements never run inside another
    thread's transaction. (`read_messages` holds it until its iterator is used up or closed:
    read that iterator in the thread that asked for it.)
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = None if path is None or str(path) == ":memory:" else Path(path)
        #: Opened read-only: the file or its directory is not writable. Writing raises StoreError.
        self.read_only = self.path is not None and not _writable(self.path)
        #: SQLite reported the file damaged: nothing more is written to it (see `_error`).
        self.damaged = False
        #: The first write transaction checks the file first (`_check_before_writing`).
        self._write_checked = self.path is None
        try:
            if self.read_only:
                conn = self._connect_read_only()
            else:
                if self.path is not None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                conn = self._connect(str(self.path) if self.path else ":memory:")
                if self.path is not None:
                    conn.execute("PRAGMA journal_mode = WAL")
                    conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
        except sqlite3.Error as exc:
            raise self._error(exc, f"cannot open the database {self.where}") from None
        except OSError as exc:
            raise StoreError(
                f"cannot open the database {self.where}: {exc}",
                "Check the path and its permissions (--db or MEMCLI_DB)",
            ) from None
        self.conn = conn
        #: Held by a transaction from start to end, and by each statement outside one.
        self.lock = threading.RLock()
        self._turn = threading.Condition(self.lock)  # (never notified: a pause without the lock)
        #: The connection's busy timeout now: a write transaction starts with it at 0 (a write
        #: that waits does so in `_begin_waiting`, without the store's lock) and leaves it so (two
        #: PRAGMAs per write would cost ~5%); a statement outside a transaction that meets a lock
        #: meanwhile (in WAL mode reads hardly ever do) sets it back before running again.
        self._busy_ms = BUSY_TIMEOUT_MS
        self._depth = 0
        #: Counts outermost transactions: a cache made inside one is good until it ends.
        self.txn_serial = 0
        # Within a transaction: session counters not yet written, and each session's next seq.
        self._pending: dict[str, dict[str, int]] = {}
        self._next_seq: dict[str, int] = {}
        # New message rows not yet inserted: written in one executemany before any other statement
        # (or the commit), so that a bulk import does not pay one INSERT per message. A flush of
        # buffered messages marks them archived in the buffer itself.
        self._buffer: dict[int, list[Any]] = {}
        self._next_id: int | None = None
        self._txn_stamp: str | None = None
        self._migrate()
        self._set_busy_timeout(BUSY_TIMEOUT_MS)  # (a migration's write set it to 0)

    @property
    def where(self) -> str:
        return str(self.path) if self.path else ":memory:"

    # -- plumbing ---------------------------------------------------------------------------------

    @staticmethod
    def _connect(target: str, uri: bool = False) -> sqlite3.Connection:
        conn = sqlite3.connect(
            target,
            uri=uri,
            isolation_level=None,
            check_same_thread=False,
            timeout=BUSY_TIMEOUT_MS / 1000,
        )
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        return conn

    def _connect_read_only(self) -> sqlite3.Connection:
        """`mode=ro`; in a directory where SQLite cannot make the WAL's shared-memory file, the
        file is opened immutable (nobody can be writing it there: its directory is read-only)."""
        assert self.path is not None
        base = "file:" + quote(str(self.path.resolve()))
        conn = self._connect(base + "?mode=ro", uri=True)
        try:
            conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        except sqlite3.OperationalError as exc:
            if getattr(exc, "sqlite_errorname", "") != "SQLITE_CANTOPEN":
                raise
            conn.close()
            conn = self._connect(base + "?immutable=1", uri=True)
        return conn

    def _error(self, exc: sqlite3.Error, what: str) -> StoreError:
        """The StoreError for a sqlite3 error; one that says the file is damaged marks the store
        damaged, and from then on it refuses to write."""
        name = getattr(exc, "sqlite_errorname", "") or ""
        if name.startswith("SQLITE_CORRUPT") or name == "SQLITE_NOTADB" or _DAMAGE in str(exc):
            self.damaged = True
            return StoreDamaged(
                f"the database {self.where} is damaged ({exc})",
                "Nothing more is written to it. Run `memcli check` to see what is wrong, and "
                "restore it from a backup (`memcli backup`)",
            )
        if name.startswith("SQLITE_READONLY"):
            return StoreError(
                f"{what}: the database {self.where} is read-only ({exc})",
                "Reading commands work on it; make the file and its directory writable to write",
            )
        return StoreError(f"{what}: {exc}", "Check the database file (`memcli check`)")

    def _migrate(self) -> None:
        try:
            version = schema_version(self.conn)
        except sqlite3.Error as exc:
            raise self._error(exc, f"cannot read the database {self.where}") from None
        if version >= LATEST:
            return  # read outside any transaction: no write lock when the schema is current
        if self.read_only:
            raise StoreError(
                f"the database {self.where} is read-only and has an older schema",
                "Open it once with write access (any memcli command) to bring it up to date",
            )
        with self.transaction():
            try:
                upgrade(self.conn)
            except sqlite3.Error as exc:
                raise StoreError(
                    f"cannot bring the database {self.where} to the current schema: {exc}",
                    "Check the database file (`sqlite3 FILE 'PRAGMA integrity_check'`)",
                ) from None

    @property
    def transaction_depth(self) -> int:
        return self._depth

    def transaction(self, wait: bool = True) -> _Transaction:
        """All writes inside happen together or not at all; nested calls join the outer one.

        An outermost one takes the write lock, waiting its turn while other processes write (up
        to WRITE_WAIT_S); with `wait=False` it raises StoreBusy at once instead when the lock is
        held or the database is read-only."""
        return _Transaction(self, wait)

    def _begin(self, wait: bool = True) -> None:
        if self._depth:
            self._depth += 1
            return
        if self.damaged:
            raise StoreDamaged(
                f"the database {self.where} is damaged: memcli does not write to it",
                "Run `memcli check` to see what is wrong, and restore it from a backup",
            )
        if self.read_only:
            if not wait:
                raise StoreBusy(f"the database {self.where} is read-only")
            raise StoreError(
                f"cannot write to {self.where}: the file or its directory is read-only",
                "Reading commands work on it; make the file and its directory writable to write",
            )
        if wait:
            self._begin_waiting()
        else:
            if self.path is not None:  # (no other process can hold an in-memory database)
                self._set_busy_timeout(0)
            try:
                self.conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if _is_busy(exc):
                    raise StoreBusy(f"another process is writing to {self.where}") from None
                raise self._error(exc, f"cannot write to {self.where}") from None
        self._depth = 1
        self.txn_serial += 1
        if not self._write_checked:
            self._check_before_writing()

    def can_write_now(self) -> bool:
        """Whether a write transaction would start without waiting: True inside one; else the
        write lock is taken and given back at once (nothing is written)."""
        if self._depth:
            return True
        try:
            with self.transaction(wait=False):
                return True
        except (StoreBusy, StoreDamaged):  # a damaged file is read, never written
            return False

    def _begin_waiting(self) -> None:
        """BEGIN IMMEDIATE; while another process holds the lock, again after a growing, jittered
        pause, until WRITE_WAIT_S have gone by. The store's lock is given back during each pause
        (not held through SQLite's busy timeout): this process's other threads go on reading,
        and writing if the lock becomes theirs first, while this one waits."""
        if self.path is not None:  # (no other process can hold an in-memory database)
            self._set_busy_timeout(0)
        deadline = time.monotonic() + WRITE_WAIT_S
        pause = 0.001
        while True:
            try:
                self.conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                left = deadline - time.monotonic()
                if not _is_busy(exc):
                    raise self._error(exc, f"cannot write to {self.where}") from None
                if left <= 0:
                    raise StoreError(
                        f"cannot write to {self.where}: {exc}",
                        f"Another process held it for over {WRITE_WAIT_S:.0f} s; try again",
                    ) from None
                # Waits with the lock released (all its levels), then takes it again.
                self._turn.wait(min(left, pause * random.uniform(0.5, 1.5)))
                pause = min(pause * 2, 0.1)
            except sqlite3.Error as exc:
                raise self._error(exc, f"cannot write to {self.where}") from None

    def _set_busy_timeout(self, ms: int) -> None:
        if self._busy_ms != ms:
            self.conn.execute(f"PRAGMA busy_timeout = {ms}")
            self._busy_ms = ms

    def _check_before_writing(self) -> None:
        """Before the first write through this store: `PRAGMA quick_check` of a file up to
        QUICK_CHECK_BYTES (a damaged file is left as it is); above that size, only SQLite's own
        errors tell (and `memcli check`)."""
        self._write_checked = True
        assert self.path is not None
        try:
            if self.path.stat().st_size > QUICK_CHECK_BYTES:
                return
            rows = self.conn.execute("PRAGMA quick_check(1)").fetchall()
        except OSError:
            return
        except sqlite3.Error as exc:
            self._rollback()
            raise self._error(exc, f"cannot check {self.where}") from None
        found = [line for (text,) in rows for line in integrity_lines(text)]
        if found:
            self._rollback()
            self.damaged = True
            raise StoreDamaged(
                f"the database {self.where} is damaged ({found[0]})",
                "Nothing was written to it. Run `memcli check` to see what is wrong, and "
                "restore it from a backup",
            )

    def _finish(self, failed: bool) -> None:
        if self._depth > 1:
            self._depth -= 1
            return
        if not failed:
            try:
                self._apply_touches()
                self._write_buffer()
                if self._next_id is not None:
                    self.execute(
                        "INSERT INTO counters (name, value) VALUES ('message_id', ?)"
                        " ON CONFLICT(name) DO UPDATE SET value = MAX(value, excluded.value)",
                        (self._next_id - 1,),
                    )
            except BaseException:
                self._rollback()
                raise
            self._depth = 0
            self._end_transaction()
            try:
                self.conn.execute("COMMIT")
            except sqlite3.Error as exc:
                error = self._error(exc, f"cannot commit to {self.where}")
                self._quiet_rollback()
                raise error from None
            return
        self._rollback()

    def _rollback(self) -> None:
        self._depth = 0
        self._end_transaction()
        self._quiet_rollback()

    def _quiet_rollback(self) -> None:
        """ROLLBACK, if a transaction is still open (SQLite ends one itself on some errors)."""
        if self.conn.in_transaction:
            try:
                self.conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass

    def _stamp(self) -> str:
        """Now, as stored; one value per transaction (what it writes, it writes at once)."""
        if self._txn_stamp is None:
            self._txn_stamp = format_time(now_utc())
        return self._txn_stamp

    def _end_transaction(self) -> None:
        self._txn_stamp = None
        self._pending.clear()
        self._next_seq.clear()
        self._buffer.clear()
        self._next_id = None

    def _write_buffer(self) -> None:
        if not self._buffer:
            return
        rows = list(self._buffer.values())
        self._buffer.clear()
        try:
            self.conn.executemany(
                "INSERT INTO messages (id, session_id, seq, role, content, name, metadata, tokens,"
                " status, flush_id, timestamp, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
        except sqlite3.Error as exc:
            raise self._error(exc, f"cannot store messages in {self.where}") from None

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> sqlite3.Cursor:
        """Run one statement (after any buffered inserts), turning sqlite errors into StoreError."""
        with self.lock:
            if self._buffer:
                self._write_buffer()
            return self._execute_now(sql, params)

    def _waits_again(self, exc: sqlite3.Error) -> bool:
        """Whether a statement outside a transaction met a lock while the busy timeout was 0 (left
        so by a write that did not wait): then the timeout is back, to run it again."""
        if self._busy_ms == BUSY_TIMEOUT_MS or self._depth or not _is_busy(exc):
            return False
        self._set_busy_timeout(BUSY_TIMEOUT_MS)
        return True

    def _rows(self, cursor: sqlite3.Cursor) -> list[Any]:
        """The rest of a cursor's rows (an error reading them becomes StoreError, as in execute)."""
        with self.lock:
            try:
                return cursor.fetchall()
            except sqlite3.Error as exc:
                raise self._error(exc, f"database error in {self.where}") from None

    def _query(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[Any]:
        """All the rows of one statement, read while no other thread's transaction runs."""
        with self.lock:
            return self._rows(self.execute(sql, params))

    def _query_one(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
        """The first row of one statement (or None), as `_query`."""
        with self.lock:
            try:
                return self.execute(sql, params).fetchone()
            except sqlite3.Error as exc:
                raise self._error(exc, f"database error in {self.where}") from None

    def _execute_now(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> sqlite3.Cursor:
        """Run one statement, leaving buffered inserts buffered."""
        with self.lock:
            try:
                return self.conn.execute(sql, params)
            except sqlite3.Error as exc:
                if not self._waits_again(exc):
                    raise self._error(exc, f"database error in {self.where}") from None
            try:
                return self.conn.execute(sql, params)
            except sqlite3.Error as exc:
                raise self._error(exc, f"database error in {self.where}") from None

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> sqlite3.Cursor:
        """Run one statement for each row (after any buffered inserts)."""
        with self.lock:
            if self._buffer:
                self._write_buffer()
            try:
                if not self._depth:  # (its rows may be an iterator: not run twice)
                    self._set_busy_timeout(BUSY_TIMEOUT_MS)
                return self.conn.executemany(sql, rows)
            except sqlite3.Error as exc:
                raise self._error(exc, f"database error in {self.where}") from None

    def _for_ids(
        self, sql: str, ids: Sequence[Any], params: Sequence[Any]
    ) -> Iterator[sqlite3.Cursor]:
        for start in range(0, len(ids), IDS_PER_STATEMENT):
            chunk = ids[start : start + IDS_PER_STATEMENT]
            yield self.execute(sql.format(ids=", ".join("?" * len(chunk))), (*params, *chunk))

    def rows_for_ids(
        self, sql: str, ids: Sequence[Any], params: Sequence[Any] = ()
    ) -> list[tuple[Any, ...]]:
        """The rows `sql` selects for many ids: it runs once per chunk of ids, its `{ids}` made the
        chunk's placeholders, bound after `params` (`... WHERE session_id = ? AND id IN ({ids})`)."""
        with self.lock:
            return [row for cursor in self._for_ids(sql, ids, params) for row in self._rows(cursor)]

    def execute_for_ids(self, sql: str, ids: Sequence[Any], params: Sequence[Any] = ()) -> int:
        """Change rows by many ids (as `rows_for_ids` reads them); return how many changed."""
        with self.lock:
            return sum(cursor.rowcount for cursor in self._for_ids(sql, ids, params))

    def close(self) -> None:
        self.conn.close()

    # -- sessions ---------------------------------------------------------------------------------

    def _session(self, row: sqlite3.Row | tuple[Any, ...]) -> SessionInfo:
        return SessionInfo(
            id=row[0],
            user_id=row[1],
            token_limit=row[2],
            chat_history_token_ratio=row[3],
            token_flush_size=row[4],
            created_at=parse_time(row[5]),
            updated_at=parse_time(row[6]),
            active_messages=row[7],
            archived_messages=row[8],
            active_tokens=row[9],
            flushes=row[10],
        )

    _SESSION_COLUMNS = (
        "id, user_id, token_limit, ratio, flush_size, created_at, updated_at, "
        "active_messages, archived_messages, active_tokens, flushes"
    )

    def get_session(self, session_id: str) -> SessionInfo | None:
        with self.lock:
            self._apply_touches()
            row = self._query_one(
                f"SELECT {self._SESSION_COLUMNS} FROM sessions WHERE id = ?", (session_id,)
            )
        return self._session(row) if row else None

    def create_session(
        self, session_id: str, user_id: str, token_limit: int, ratio: float, flush_size: int
    ) -> SessionInfo:
        stamp = format_time(now_utc())
        with self.transaction():
            self.execute(
                "INSERT INTO sessions (id, user_id, token_limit, ratio, flush_size, created_at,"
                " updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (session_id, user_id, token_limit, ratio, flush_size, stamp, stamp),
            )
        info = self.get_session(session_id)
        assert info is not None
        return info

    def update_session_budget(
        self, session_id: str, token_limit: int, ratio: float, flush_size: int
    ) -> None:
        with self.transaction():
            self.execute(
                "UPDATE sessions SET token_limit = ?, ratio = ?, flush_size = ? WHERE id = ?",
                (token_limit, ratio, flush_size, session_id),
            )

    def list_sessions(self, user_id: str | None = None) -> list[SessionInfo]:
        sql = f"SELECT {self._SESSION_COLUMNS} FROM sessions"
        params: tuple[Any, ...] = ()
        if user_id is not None:
            sql += " WHERE user_id = ?"
            params = (user_id,)
        sql += " ORDER BY updated_at DESC, id"
        with self.lock:
            self._apply_touches()
            rows = self._query(sql, params)
        return [self._session(row) for row in rows]

    def delete_session(self, session_id: str) -> int:
        with self.transaction():
            count = self.delete_messages(session_id)
            self.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
        return count

    def session_version(self, session_id: str) -> int:
        with self.lock:
            self._apply_touches()
            row = self._query_one("SELECT version FROM sessions WHERE id = ?", (session_id,))
        return row[0] if row else -1

    def _touch(self, session_id: str, **deltas: int) -> None:
        """Count a change to the session; written once, before the transaction commits."""
        pending = self._pending.setdefault(session_id, {})
        for column, delta in deltas.items():
            pending[column] = pending.get(column, 0) + delta

    def _apply_touches(self) -> None:
        if not self._pending:
            return
        now = self._stamp()
        for session_id, deltas in self._pending.items():
            sets = "".join(f", {column} = {column} + :{column}" for column in deltas)
            self.execute(
                f"UPDATE sessions SET version = version + 1, updated_at = :now{sets} WHERE id = :id",
                {"now": now, "id": session_id, **deltas},
            )
        self._pending.clear()

    # -- messages ---------------------------------------------------------------------------------

    def append_messages(self, session_id: str, messages: Sequence[NewMessage]) -> list[int]:
        if not messages:
            return []
        with self.transaction():
            stamp = self._stamp()
            seq = self._next_seq.get(session_id)
            if seq is None:
                row = self.execute(
                    "SELECT MAX(seq) FROM messages WHERE session_id = ?", (session_id,)
                ).fetchone()
                seq = 0 if row[0] is None else row[0] + 1
            if self._next_id is None:
                row = self.execute(
                    "SELECT MAX(COALESCE((SELECT MAX(id) FROM messages), 0),"
                    " COALESCE((SELECT value FROM counters WHERE name = 'message_id'), 0))"
                ).fetchone()
                self._next_id = row[0] + 1
            ids = []
            for item in messages:
                m = item.message
                message_id = self._next_id
                self._next_id += 1
                ids.append(message_id)
                self._buffer[message_id] = [
                    message_id,
                    session_id,
                    seq,
                    m.role,
                    m.content,
                    m.name,
                    metadata_json(m.metadata),
                    item.tokens,
                    "active",
                    None,
                    format_time(m.timestamp) if m.timestamp else None,
                    stamp,
                ]
                seq += 1
            self._next_seq[session_id] = seq
            self._touch(
                session_id,
                active_messages=len(messages),
                active_tokens=sum(item.tokens for item in messages),
            )
        return ids

    def active_window(self, session_id: str) -> list[WindowEntry]:
        rows = self._query(
            "SELECT id, role, tokens FROM messages WHERE session_id = ? AND status = 'active'"
            " ORDER BY seq",
            (session_id,),
        )
        return [WindowEntry(*row) for row in rows]

    #: The columns `message_from_row` reads, in its order.
    MESSAGE_COLUMNS = (
        "id, session_id, role, content, name, metadata, tokens, status, flush_id, timestamp"
    )

    @staticmethod
    def message_from_row(row: Sequence[Any]) -> Message:
        """The message of a row of `MESSAGE_COLUMNS`."""
        return Message(
            id=row[0],
            session_id=row[1],
            role=row[2],
            content=row[3],
            name=row[4],
            metadata=json.loads(row[5]) if row[5] else None,
            tokens=row[6],
            status=row[7],
            flush_id=row[8],
            timestamp=parse_time(row[9]) if row[9] else None,
        )

    def iter_messages(self, session_id: str, status: str | None = None) -> Iterator[Message]:
        # Page by seq, each page one statement read whole under the lock: no cursor stays open
        # across a yield, where another thread's transaction could run on this connection.
        sql = f"SELECT {self.MESSAGE_COLUMNS}, seq FROM messages WHERE session_id = ? AND seq > ?"
        if status is not None:
            sql += " AND status = ?"
        sql += " ORDER BY seq LIMIT 256"
        last = -1
        while True:
            params: tuple[Any, ...] = (session_id, last)
            if status is not None:
                params += (status,)
            with self.lock:
                try:
                    batch = self.execute(sql, params).fetchall()
                except sqlite3.Error as exc:
                    raise self._error(exc, f"cannot read session {session_id!r}") from None
            if not batch:
                return
            for row in batch:
                yield self.message_from_row(row)
            last = batch[-1][-1]

    def get_messages(
        self, session_id: str, status: str | None = None, ids: Sequence[int] | None = None
    ) -> list[Message]:
        if ids is None:
            sql = f"SELECT {self.MESSAGE_COLUMNS} FROM messages WHERE session_id = ?"
            params: tuple[Any, ...] = (session_id,)
            if status is not None:
                sql += " AND status = ?"
                params += (status,)
            rows = self._query(sql + " ORDER BY seq", params)
            return [self.message_from_row(row) for row in rows]
        # A session's ids grow with its seq: chunks of sorted ids come out in order.
        rows = self.rows_for_ids(
            f"SELECT {self.MESSAGE_COLUMNS} FROM messages WHERE session_id = ?"
            " AND id IN ({ids}) ORDER BY seq",
            sorted(ids),
            (session_id,),
        )
        return [self.message_from_row(row) for row in rows]

    def archive(self, session_id: str, message_ids: Sequence[int], tokens: int, reason: str) -> int:
        with self.transaction():
            # (Not self.execute: buffered messages stay buffered, archived in the buffer below.)
            cursor = self._execute_now(
                "INSERT INTO flushes (session_id, created_at, messages, tokens, first_message_id,"
                " last_message_id, reason) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    session_id,
                    self._stamp(),
                    len(message_ids),
                    tokens,
                    message_ids[0],
                    message_ids[-1],
                    reason,
                ),
            )
            flush_id = cursor.lastrowid
            assert flush_id is not None
            stored = []
            for message_id in message_ids:
                row = self._buffer.get(message_id)
                if row is None:
                    stored.append(message_id)
                elif row[1] != session_id or row[8] != "active":
                    raise StoreError(
                        f"message {message_id} is not active in {session_id!r}", "Try again"
                    )
                else:
                    row[8] = "archived"
                    row[9] = flush_id
            changed = self.execute_for_ids(
                "UPDATE messages SET status = 'archived', flush_id = ? WHERE session_id = ?"
                " AND status = 'active' AND id IN ({ids})",
                stored,
                (flush_id, session_id),
            )
            if changed != len(stored):
                raise StoreError(
                    f"session {session_id!r} changed while it was being flushed", "Try again"
                )
            self._touch(
                session_id,
                active_messages=-len(message_ids),
                archived_messages=len(message_ids),
                active_tokens=-tokens,
                flushes=1,
            )
        return flush_id

    def delete_active(self, session_id: str) -> int:
        with self.transaction():
            count = self.execute(
                "DELETE FROM messages WHERE session_id = ? AND status = 'active'", (session_id,)
            ).rowcount
            self.execute(
                "UPDATE sessions SET active_messages = 0, active_tokens = 0 WHERE id = ?",
                (session_id,),
            )
            self._touch(session_id)
        return count

    def delete_messages(self, session_id: str) -> int:
        with self.transaction():
            count = self.execute(
                "DELETE FROM messages WHERE session_id = ?", (session_id,)
            ).rowcount
            # Flush ids are given out again once deleted: what pointed at these flushes forgets them.
            self.execute(
                "DELETE FROM block_flushes WHERE flush_id IN"
                " (SELECT id FROM flushes WHERE session_id = ?)",
                (session_id,),
            )
            self.execute(
                "UPDATE facts SET flush_id = NULL WHERE flush_id IN"
                " (SELECT id FROM flushes WHERE session_id = ?)",
                (session_id,),
            )
            self.execute("DELETE FROM flushes WHERE session_id = ?", (session_id,))
            self.execute(
                "UPDATE sessions SET active_messages = 0, archived_messages = 0,"
                " active_tokens = 0, flushes = 0 WHERE id = ?",
                (session_id,),
            )
            self._touch(session_id)
        return count

    def list_flushes(self, session_id: str) -> list[FlushRecord]:
        rows = self._query(
            "SELECT id, session_id, created_at, messages, tokens, first_message_id,"
            " last_message_id, reason FROM flushes WHERE session_id = ? ORDER BY id",
            (session_id,),
        )
        return [
            FlushRecord(
                id=r[0],
                session_id=r[1],
                created_at=parse_time(r[2]),
                messages=r[3],
                tokens=r[4],
                first_message_id=r[5],
                last_message_id=r[6],
                reason=r[7] or "",
            )
            for r in rows
        ]

    # -- whole reads, checks, backups -------------------------------------------------------------

    def read_messages(self, session_id: str, status: str | None = None) -> Iterator[Message]:
        """A session's messages in order, as `iter_messages`, from one snapshot, every one read
        once before the first is given: a database that cannot be read whole raises StoreError
        here, before a caller has written anything (what an export needs). Memory stays flat: the
        rows are read twice, not kept. The store's lock is held until the iterator ends (or is
        closed): no other thread's statement runs inside the snapshot."""
        self.lock.acquire()
        try:
            if self._depth:
                raise StoreError("read_messages inside a write transaction", "A bug in memcli")
            self._execute_now("BEGIN")  # a read snapshot: a writer meanwhile changes neither pass
            try:
                for _ in self._checked_messages(session_id, status):
                    pass
            except BaseException:
                self._quiet_rollback()
                raise
        except BaseException:
            self.lock.release()
            raise
        return self._snapshot_messages(session_id, status)

    def _snapshot_messages(self, session_id: str, status: str | None) -> Iterator[Message]:
        try:
            yield from self._checked_messages(session_id, status)
        finally:
            self._quiet_rollback()  # ends the read snapshot
            self.lock.release()

    def _checked_messages(self, session_id: str, status: str | None) -> Iterator[Message]:
        rows = self.iter_messages(session_id, status)
        while True:
            try:
                message = next(rows)
            except StopIteration:
                return
            except (ValueError, TypeError) as exc:  # a row that does not decode
                self.damaged = True
                raise StoreDamaged(
                    f"the database {self.where} holds an unreadable message in session"
                    f" {session_id!r} ({exc})",
                    "Run `memcli check` to see what is wrong, and restore it from a backup",
                ) from None
            yield message

    def check(self) -> list[Problem]:
        """What is wrong with the database: SQLite's integrity check and memcli's own (counters,
        flush ids, vectors against messages); empty when it is sound. Reads one snapshot."""
        with self.lock:
            return self._check()

    def _check(self) -> list[Problem]:
        if self._depth:
            raise StoreError("check inside a write transaction", "A bug in memcli")
        try:
            self._set_busy_timeout(BUSY_TIMEOUT_MS)
            self.conn.execute("BEGIN")
        except sqlite3.Error as exc:
            return [Problem("integrity", f"the database cannot be read: {exc}")]
        try:
            problems = check_database(self.conn)
        finally:
            self._quiet_rollback()
        if any(p.check == "integrity" for p in problems):
            self.damaged = True
        return problems

    def backup(self, target: str | Path) -> list[Problem]:
        """Copy the database to `target` with SQLite's online backup (one consistent snapshot,
        while other processes go on writing), as one self-contained file (no WAL). The copy is
        made under a temporary name, checked, synced, then renamed; what the check found on the
        copy is returned (empty: a sound copy), and a damaged copy is not kept."""
        target = Path(target)
        temporary = target.with_name(f".{target.name}.{os.getpid()}.partial")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)  # `backup ~/backups/x.db` just works
            copy = sqlite3.connect(str(temporary), isolation_level=None)
            try:
                with self.lock:  # no other thread's transaction half done in the copy
                    self._set_busy_timeout(BUSY_TIMEOUT_MS)
                    self.conn.backup(copy)  # all pages in one step: one snapshot
                copy.execute("PRAGMA journal_mode = DELETE")
                problems = check_database(copy)
            finally:
                copy.close()
            if problems:
                temporary.unlink()
                return problems
            with temporary.open("rb+") as handle:
                os.fsync(handle.fileno())
            os.replace(temporary, target)
            _sync_directory(target.parent)
        except sqlite3.Error as exc:
            temporary.unlink(missing_ok=True)
            raise self._error(exc, f"cannot back up {self.where}") from None
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            raise StoreError(f"cannot write the backup {target}: {exc}", "Check the path") from None
        return []


def _sync_directory(directory: Path) -> None:
    """fsync a directory, so that a rename in it survives a crash (where the system allows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

"""Sessions, messages and flushes in portable SQL: the part of the Store protocol that every SQL
backend shares (`SQLiteStore`, `PostgresStore`), over the backend's connection, transactions and
error mapping.

The statements use `?` placeholders; a backend whose driver wants others translates them in its
`execute`. What differs between databases is a hook a backend implements:

- `_begin(wait)` / `_finish(failed)`: start and end an outermost transaction (nested ones join it).
- `_execute_now(sql, params)` / `_executemany_now(sql, rows)`: run statements, errors as StoreError.
- `_new_message_ids(count)`: ids for new messages, never given out before.
- `_lock_session(session_id)`: inside a write transaction, take the session's write lock (SQLite:
  nothing to do, its transaction holds the database's; PostgreSQL: an advisory lock per session).
- `_error(exc, what)`, `DATABASE_ERRORS`, `SNAPSHOT_BEGIN`, `_quiet_rollback()`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

from memcli.errors import StoreBusy, StoreDamaged, StoreError
from memcli.messages import (
    KEY_SEPARATOR,
    Message,
    format_time,
    metadata_json,
    parse_time,
    session_key,
    session_name,
)
from memcli.store.base import FlushPlan, FlushRecord, NewMessage, SessionInfo, WindowEntry

if TYPE_CHECKING:
    from memcli.store.base import SQLStore
    from memcli.store.check import Problem
    from memcli.store.forget import Forgotten

#: Ids per statement when rows are read or changed by many ids (SQLite allowed 999 parameters
#: before 3.32).
IDS_PER_STATEMENT = 500

#: The columns of a message row, in the order `_write_buffer` inserts them.
MESSAGE_ROW = (
    "id, session_id, seq, role, content, name, metadata, tokens, status, flush_id, timestamp,"
    " created_at"
)
_MESSAGE_INSERT = (
    f"INSERT INTO messages ({MESSAGE_ROW}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def now_utc() -> datetime:
    return datetime.now(tz=UTC)


class _Transaction:
    """The context manager behind `TableStore.transaction()` (a class: puts call it a lot)."""

    __slots__ = ("store", "wait")

    def __init__(self, store: TableStore, wait: bool = True) -> None:
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


class TableStore:
    """Sessions, messages and flushes, for a backend that provides the hooks named in the module
    docstring and these attributes: `lock` (a reentrant lock held by a transaction for its whole
    length and by each read outside one) and `where` (the database, as messages name it).

    New message rows wait in a buffer until any other statement runs (or the commit), then go in
    one `executemany`: a bulk import does not pay one INSERT per message. A flush of buffered
    messages marks them archived in the buffer itself.
    """

    #: "sqlite" or "postgresql" (the backend's `SQLStore.dialect`).
    dialect: str

    #: The columns `message_from_row` reads, in its order.
    MESSAGE_COLUMNS = (
        "id, session_id, role, content, name, metadata, tokens, status, flush_id, timestamp"
    )
    #: What the backend's driver raises (caught where rows are read, and made StoreError).
    DATABASE_ERRORS: tuple[type[Exception], ...] = ()
    #: The statement that starts a read snapshot (`read_messages`).
    SNAPSHOT_BEGIN = "BEGIN"

    lock: threading.RLock

    def _init_tables(self) -> None:
        self.lock = threading.RLock()
        self._depth = 0
        #: Counts outermost transactions: a cache made inside one is good until it ends.
        self.txn_serial = 0
        # Within a transaction: session counters not yet written, and each session's next seq.
        self._pending: dict[str, dict[str, int]] = {}
        self._next_seq: dict[str, int] = {}
        self._buffer: dict[int, list[Any]] = {}
        self._txn_stamp: str | None = None

    # -- what a backend provides ------------------------------------------------------------------

    @property
    def where(self) -> str:
        """The database, as messages name it."""
        raise NotImplementedError

    def _begin(self, wait: bool = True) -> None:
        raise NotImplementedError

    def _finish(self, failed: bool) -> None:
        raise NotImplementedError

    def _execute_now(self, sql: str, params: Sequence[Any] = ()) -> Any:
        raise NotImplementedError

    def _executemany_now(self, sql: str, rows: Iterable[Sequence[Any]]) -> Any:
        raise NotImplementedError

    def _new_message_ids(self, count: int) -> list[int]:
        raise NotImplementedError

    def _lock_session(self, session_id: str) -> None:
        """Inside a write transaction: hold the session's write lock until it ends."""

    def hold_lock(self, name: str) -> None:
        # Its own name space (were a hash shared with a session's, they would only take turns).
        self._lock_session("\0lock:" + name)

    def _error(self, exc: Exception, what: str) -> StoreError:
        raise NotImplementedError

    def _quiet_rollback(self) -> None:
        raise NotImplementedError

    # -- transactions and statements --------------------------------------------------------------

    @property
    def transaction_depth(self) -> int:
        return self._depth

    def transaction(self, wait: bool = True) -> _Transaction:
        """All writes inside happen together or not at all; nested calls join the outer one.

        An outermost one waits its turn where the backend makes writers take turns; with
        `wait=False` it raises StoreBusy at once instead (when the database is read-only too)."""
        return _Transaction(self, wait)

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

    def _write_buffer(self) -> None:
        if not self._buffer:
            return
        rows = list(self._buffer.values())
        self._buffer.clear()
        self._insert_messages(rows)

    def _insert_messages(self, rows: list[list[Any]]) -> None:
        """Insert message rows (columns as MESSAGE_ROW)."""
        self._executemany_now(_MESSAGE_INSERT, rows)

    def _first_seq_and_ids(self, session_id: str, count: int) -> tuple[int, list[int]]:
        """The session's next seq (first append of the transaction) and `count` new ids."""
        row = self._query_one("SELECT MAX(seq) FROM messages WHERE session_id = ?", (session_id,))
        return (0 if row[0] is None else row[0] + 1), self._new_message_ids(count)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run one statement (after any buffered inserts); database errors become StoreError."""
        with self.lock:
            if self._buffer:
                self._write_buffer()
            return self._execute_now(sql, params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Any:
        """Run one statement for each row (after any buffered inserts)."""
        with self.lock:
            if self._buffer:
                self._write_buffer()
            return self._executemany_now(sql, rows)

    def _rows(self, cursor: Any) -> list[Any]:
        """The rest of a cursor's rows (an error reading them becomes StoreError, as in execute)."""
        with self.lock:
            try:
                return list(cursor.fetchall())
            except self.DATABASE_ERRORS as exc:
                raise self._error(exc, f"database error in {self.where}") from None

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """All the rows of one statement, read while no other thread's transaction runs."""
        with self.lock:
            return self._rows(self.execute(sql, params))

    def _query_one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """The first row of one statement (or None), as `_query`."""
        with self.lock:
            try:
                return self.execute(sql, params).fetchone()
            except self.DATABASE_ERRORS as exc:
                raise self._error(exc, f"database error in {self.where}") from None

    def _for_ids(self, sql: str, ids: Sequence[Any], params: Sequence[Any]) -> Iterator[Any]:
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

    # -- sessions ---------------------------------------------------------------------------------

    def _session(self, row: Sequence[Any]) -> SessionInfo:
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
            source_id=row[11],
            title=row[12],
            metadata=json.loads(row[13]) if row[13] else None,
            first_at=_from_ms(row[14]),
            last_at=_from_ms(row[15]),
        )

    @property
    def _SESSION_COLUMNS(self) -> str:  # noqa: N802 (a constant per dialect)
        """A session's columns, then its messages' first and last time (from the per-session
        time index: its first and last entry)."""
        if self.dialect == "postgresql":
            from memcli.store.pg_migrations import TIME_MS
        else:
            from memcli.store.migrations import TIME_MS
        time = TIME_MS.format(m="m.") if "{m}" in TIME_MS else TIME_MS
        span = ", ".join(
            f"(SELECT {f}({time}) FROM messages m WHERE m.session_id = sessions.id)"
            for f in ("MIN", "MAX")
        )
        return (
            "id, user_id, token_limit, ratio, flush_size, created_at, updated_at, active_messages,"
            f" archived_messages, active_tokens, flushes, source_id, title, metadata, {span}"
        )

    def get_session(self, session_id: str) -> SessionInfo | None:
        with self.lock:
            self._apply_touches()
            row = self._query_one(
                f"SELECT {self._SESSION_COLUMNS} FROM sessions WHERE id = ?", (session_id,)
            )
        return self._session(row) if row else None

    def create_session(
        self, name: str, user_id: str, token_limit: int, ratio: float, flush_size: int
    ) -> SessionInfo:
        """Store a new session of `user_id` called `name`; the user's session of that name that
        another process stored meanwhile is kept as it is (and returned). Its key (`id`) is the
        name when no session has that key yet, else `messages.session_key(name, user_id)`:
        another user's session of the same name changes nothing the user sees (the key is
        never shown). Its times are the transaction's (an import's messages, written in the
        same transaction, do not make it updated before it was created)."""
        keys = (name, session_key(name, user_id))
        with self.transaction():
            stamp = self._stamp()
            for key in keys:
                self._lock_session(key)
            found = self.sessions_named(name, user_id)
            if found:
                return found[0]
            for key in keys:
                self.execute(
                    "INSERT INTO sessions (id, user_id, token_limit, ratio, flush_size,"
                    " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (id) DO NOTHING",
                    (key, user_id, token_limit, ratio, flush_size, stamp, stamp),
                )
                found = self.sessions_named(name, user_id)
                if found:
                    return found[0]
        raise AssertionError(f"session key {keys[1]!r} taken by another user")

    def sessions_named(self, name: str, user_id: str | None = None) -> list[SessionInfo]:
        """The sessions called `name`: the one of `user_id`, or with None every user's (oldest
        first). A name is its key, or the start of a key up to `messages.KEY_SEPARATOR`."""
        sql = f"SELECT {self._SESSION_COLUMNS} FROM sessions"
        if user_id is not None:
            sql += " WHERE id IN (?, ?) AND user_id = ?"
            params: tuple[Any, ...] = (name, session_key(name, user_id), user_id)
        else:  # (the keys from "name<sep>" up to "name<sep + 1>": a range of the primary key)
            sql += " WHERE id = ? OR (id > ? AND id < ?)"
            params = (name, name + KEY_SEPARATOR, name + chr(ord(KEY_SEPARATOR) + 1))
        with self.lock:
            self._apply_touches()
            rows = self._query(sql + " ORDER BY created_at, id", params)
        return [self._session(row) for row in rows]

    def update_session_budget(
        self, session_id: str, token_limit: int, ratio: float, flush_size: int
    ) -> None:
        with self.transaction():
            self._lock_session(session_id)
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

    def describe_session(
        self,
        session_id: str,
        *,
        source_id: str | None = None,
        title: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        values = {
            "source_id": source_id,
            "title": title,
            "metadata": json.dumps(metadata, ensure_ascii=False) if metadata else None,
        }
        given = {column: value for column, value in values.items() if value is not None}
        if not given:
            return
        sets = ", ".join(f"{column} = ?" for column in given)
        with self.transaction():
            self._lock_session(session_id)
            self.execute(f"UPDATE sessions SET {sets} WHERE id = ?", (*given.values(), session_id))

    def message_times(self, session_ids: Sequence[str]) -> dict[str, tuple[datetime, datetime]]:
        # Two lookups per session on its (session_id, seq) index: its first and last message.
        first_last = (
            "(SELECT COALESCE(timestamp, created_at) FROM messages WHERE session_id = s.id"
            " ORDER BY seq {} LIMIT 1)"
        )
        rows = self.rows_for_ids(
            f"SELECT s.id, {first_last.format('ASC')}, {first_last.format('DESC')}"
            " FROM sessions s WHERE s.id IN ({ids})",
            list(dict.fromkeys(session_ids)),
        )
        return {row[0]: (parse_time(row[1]), parse_time(row[2])) for row in rows if row[1]}

    def find_sources(self, user_id: str, source_id: str) -> list[str]:
        with self.lock:
            rows = self._query(
                "SELECT id FROM sessions WHERE user_id = ? AND source_id = ?"
                " ORDER BY created_at, id",
                (user_id, source_id),
            )
        return [row[0] for row in rows]

    def delete_session(self, session_id: str) -> int:
        import memcli.store.forget as forget

        with self.transaction():
            count = self.delete_messages(session_id)
            forget.forget_sources(self._sql, session_id)
            self.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
            forget.mark_unfinished(self._sql, self._stamp())
        return count

    def session_version(self, session_id: str) -> int:
        """The session's version; inside a write transaction, read once the session's write lock
        is held (what is read then stays the session's until the transaction ends)."""
        with self.lock:
            if self._depth:
                self._lock_session(session_id)
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
            sets = "".join(f", {column} = {column} + ?" for column in deltas)
            self.execute(
                f"UPDATE sessions SET version = version + 1, updated_at = ?{sets} WHERE id = ?",
                (now, *deltas.values(), session_id),
            )
        self._pending.clear()

    # -- messages ---------------------------------------------------------------------------------

    def append_messages(self, session_id: str, messages: Sequence[NewMessage]) -> list[int]:
        if not messages:
            return []
        with self.transaction():
            self._lock_session(session_id)
            stamp = self._stamp()
            seq = self._next_seq.get(session_id)
            if seq is None:
                seq, ids = self._first_seq_and_ids(session_id, len(messages))
            else:
                ids = self._new_message_ids(len(messages))
            for item, message_id in zip(messages, ids, strict=True):
                m = item.message
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

    def put_window(
        self,
        session_id: str,
        version: int,
        messages: Sequence[NewMessage],
        flushes: Sequence[FlushPlan],
    ) -> tuple[list[int], list[int], int] | None:
        """Append messages and archive flushes if the session is still at `version` (see the
        Store protocol), in one transaction; a backend may do it in one statement."""
        with self.transaction():
            if self.session_version(session_id) != version:
                return None
            ids = self.append_messages(session_id, messages)
            flush_ids = [
                self.archive(
                    session_id,
                    [ids[-1 - i] if i < 0 else i for i in f.message_ids],
                    f.tokens,
                    f.reason,
                )
                for f in flushes
            ]
            return ids, flush_ids, self.session_version(session_id)

    def active_window(self, session_id: str) -> list[WindowEntry]:
        rows = self._query(
            "SELECT id, role, tokens FROM messages WHERE session_id = ? AND status = 'active'"
            " ORDER BY seq",
            (session_id,),
        )
        return [WindowEntry(*row) for row in rows]

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
                except self.DATABASE_ERRORS as exc:
                    raise self._error(
                        exc, f"cannot read session {session_name(session_id)!r}"
                    ) from None
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
            self._lock_session(session_id)
            # (Not self.execute: buffered messages stay buffered, archived in the buffer below.)
            cursor = self._execute_now(
                "INSERT INTO flushes (session_id, created_at, messages, tokens, first_message_id,"
                " last_message_id, reason) VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
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
            flush_id = self._rows(cursor)[0][0]
            stored = []
            for message_id in message_ids:
                row = self._buffer.get(message_id)
                if row is None:
                    stored.append(message_id)
                elif row[1] != session_id or row[8] != "active":
                    raise StoreError(
                        f"message {message_id} is not active in {session_name(session_id)!r}",
                        "Try again",
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
                    f"session {session_name(session_id)!r} changed while it was being flushed",
                    "Try again",
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
            self._lock_session(session_id)
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
            self._lock_session(session_id)
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

    def delete_message(self, session_id: str, message_id: int) -> Message | None:
        """Delete one message of the session for good (see `memcli.store.forget`); return it as
        it was, or None when the session holds no message of that id."""
        import memcli.store.forget as forget

        self.prepare_delete()
        with self.transaction():
            self._lock_session(session_id)
            self._write_buffer()
            message = forget.find_message(self._sql, session_id, message_id)
            if message is None:
                return None
            forget.delete_message_rows(self._sql, message)
            forget.mark_unfinished(self._sql, self._stamp())
            tokens = message.tokens or 0
            if message.status == "active":
                self._touch(session_id, active_messages=-1, active_tokens=-tokens)
            else:
                self._touch(session_id, archived_messages=-1)
        self.purge()
        return message

    def survey_user(self, user_id: str) -> Forgotten:
        """What `forget_user` would delete, deleting nothing."""
        import memcli.store.forget as forget

        with self.lock:
            return forget.survey_user(self._sql, user_id)

    def forget_user(self, user_id: str) -> Forgotten:
        """Delete everything of a user for good (see `memcli.store.forget`), then `purge()`."""
        import memcli.store.forget as forget

        self.prepare_delete()
        with self.transaction():
            self.hold_lock(f"user {user_id}")
            found = forget.survey_user(self._sql, user_id)
            forget.forget_redo(self._sql, found.sessions)
            for session_id in found.sessions:
                self.delete_session(session_id)  # messages, flushes, their block records
            forget.forget_rows(self._sql, user_id, found.sessions)
            forget.mark_unfinished(self._sql, self._stamp())
        self.purge()
        return found

    @property
    def _sql(self) -> SQLStore:
        """This store, as the SQL helpers of memcli.store take it (a backend is one)."""
        return cast("SQLStore", self)

    def repair(self) -> list[Problem]:
        """Mend what `check()` finds that the backend can mend without loss; return what it
        mended (here: nothing; SQLite rebuilds a damaged full-text index)."""
        return []

    def prepare_delete(self) -> None:
        """Before a delete for good, outside a transaction: refuse one the backend could not
        complete (StoreDamaged, nothing deleted), and have it overwrite what it deletes, if it
        can."""

    def purge(self) -> None:
        """Make deletions physical: no copy of a deleted row left in the database's files."""
        raise NotImplementedError

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
            self._execute_now(
                self.SNAPSHOT_BEGIN
            )  # a read snapshot: a writer meanwhile changes neither pass
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
                    f" {session_name(session_id)!r} ({exc})",
                    "Run `memcli check` to see what is wrong, and restore it from a backup",
                ) from None
            yield message


def _from_ms(value: Any) -> datetime | None:
    """A time in unix milliseconds (`migrations.TIME_MS`) as a UTC datetime; None for none."""
    return None if value is None else datetime.fromtimestamp(int(value) / 1000, UTC)

"""The SQLite store: one file (or memory) holds sessions, messages, flushes and block state."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memcli.errors import StoreError
from memcli.messages import Message, format_time, metadata_json, parse_time
from memcli.store.base import FlushRecord, NewMessage, SessionInfo, WindowEntry
from memcli.store.longterm import forget_session_flushes, migration_2

if TYPE_CHECKING:
    import sqlite_utils

BUSY_TIMEOUT_MS = 10_000

Migration = Callable[["sqlite_utils.Database"], None]


def _migration_1(db: sqlite_utils.Database) -> None:
    db.table("sessions").create(
        {
            "id": str,
            "user_id": str,
            "token_limit": int,
            "ratio": float,
            "flush_size": int,
            "created_at": str,
            "updated_at": str,
            "version": int,
            "active_messages": int,
            "archived_messages": int,
            "active_tokens": int,
            "flushes": int,
        },
        pk="id",
        not_null={"user_id", "token_limit", "ratio", "flush_size", "created_at", "updated_at"},
        defaults={
            "version": 0,
            "active_messages": 0,
            "archived_messages": 0,
            "active_tokens": 0,
            "flushes": 0,
        },
    )
    db.table("flushes").create(
        {
            "id": int,
            "session_id": str,
            "created_at": str,
            "messages": int,
            "tokens": int,
            "first_message_id": int,
            "last_message_id": int,
            "reason": str,
        },
        pk="id",
        not_null={"session_id", "created_at", "messages", "tokens"},
        foreign_keys=[("session_id", "sessions", "id")],
    )
    db.table("messages").create(
        {
            "id": int,
            "session_id": str,
            "seq": int,
            "role": str,
            "content": str,
            "name": str,
            "metadata": str,
            "tokens": int,
            "status": str,
            "flush_id": int,
            "timestamp": str,
            "created_at": str,
        },
        pk="id",
        not_null={"session_id", "seq", "role", "content", "tokens", "status", "created_at"},
        foreign_keys=[("session_id", "sessions", "id"), ("flush_id", "flushes", "id")],
    )
    # The active window is read through this index alone: archived history is never scanned.
    db.table("messages").create_index(["session_id", "status", "seq"], index_name="messages_window")
    db.table("messages").create_index(
        ["session_id", "seq"], index_name="messages_order", unique=True
    )
    db.table("messages").create_index(["flush_id"], index_name="messages_flush")
    db.table("flushes").create_index(["session_id", "id"], index_name="flushes_session")
    db.table("sessions").create_index(["user_id"], index_name="sessions_user")


#: Numbered migrations; a database records the highest one applied. Append, never edit.
MIGRATIONS: list[tuple[int, Migration]] = [(1, _migration_1), (2, migration_2)]


def now_utc() -> datetime:
    return datetime.now(tz=UTC)


class SQLiteStore:
    """The Store protocol over SQLite, WAL mode, with a busy timeout.

    The schema is made and migrated with sqlite-utils; the statements the engine runs on every call
    are plain sqlite3, so that a command that only reads starts fast.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = None if path is None or str(path) == ":memory:" else Path(path)
        try:
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                str(self.path) if self.path else ":memory:",
                isolation_level=None,
                check_same_thread=False,
                timeout=BUSY_TIMEOUT_MS / 1000,
            )
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            if self.path is not None:
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(
                f"cannot open the database {self.where}: {exc}",
                "Check the path and its permissions (--db or MEMCLI_DB)",
            ) from None
        self.conn = conn
        self._depth = 0
        self._migrate()

    @property
    def where(self) -> str:
        return str(self.path) if self.path else ":memory:"

    # -- plumbing ---------------------------------------------------------------------------------

    def _migrate(self) -> None:
        with self.transaction():
            self.conn.execute(
                "CREATE TABLE IF NOT EXISTS migrations (version INTEGER PRIMARY KEY, applied_at TEXT)"
            )
            row = self.conn.execute("SELECT MAX(version) FROM migrations").fetchone()
            current = row[0] or 0
            pending = [(v, m) for v, m in MIGRATIONS if v > current]
            if not pending:
                return
            # sqlite-utils is slow to import (it pulls in numpy): only schema changes need it.
            import sqlite_utils

            db = sqlite_utils.Database(self.conn)
            for version, migrate in pending:
                if version > current:
                    migrate(db)
                    self.conn.execute(
                        "INSERT INTO migrations (version, applied_at) VALUES (?, ?)",
                        (version, format_time(now_utc())),
                    )

    @contextmanager
    def transaction(self) -> Iterator[None]:
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise StoreError(
                f"cannot write to {self.where}: {exc}",
                "Another process may hold the database; try again",
            ) from None
        self._depth = 1
        try:
            yield
        except BaseException:
            self._depth = 0
            self.conn.execute("ROLLBACK")
            raise
        self._depth = 0
        try:
            self.conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self.conn.execute("ROLLBACK")
            raise StoreError(f"cannot commit to {self.where}: {exc}", "Try again") from None

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> sqlite3.Cursor:
        """Run one statement, turning sqlite errors into StoreError."""
        try:
            return self.conn.execute(sql, params)
        except sqlite3.Error as exc:
            raise StoreError(
                f"database error in {self.where}: {exc}", "Check the database file"
            ) from None

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
        row = self.execute(
            f"SELECT {self._SESSION_COLUMNS} FROM sessions WHERE id = ?", (session_id,)
        ).fetchone()
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
        return [self._session(row) for row in self.execute(sql, params)]

    def delete_session(self, session_id: str) -> int:
        with self.transaction():
            count = self.delete_messages(session_id)
            self.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
        return count

    def session_version(self, session_id: str) -> int:
        row = self.execute("SELECT version FROM sessions WHERE id = ?", (session_id,)).fetchone()
        return row[0] if row else -1

    def _touch(self, session_id: str, **deltas: int) -> None:
        sets = ", ".join(f"{column} = {column} + :{column}" for column in deltas)
        self.execute(
            f"UPDATE sessions SET version = version + 1, updated_at = :now"
            f"{', ' + sets if sets else ''} WHERE id = :id",
            {"now": format_time(now_utc()), "id": session_id, **deltas},
        )

    # -- messages ---------------------------------------------------------------------------------

    def append_messages(self, session_id: str, messages: Sequence[NewMessage]) -> list[int]:
        if not messages:
            return []
        stamp = format_time(now_utc())
        with self.transaction():
            row = self.execute(
                "SELECT MAX(seq) FROM messages WHERE session_id = ?", (session_id,)
            ).fetchone()
            seq = -1 if row[0] is None else row[0]
            first_id_row = self.execute("SELECT MAX(id) FROM messages").fetchone()
            rows = []
            for item in messages:
                seq += 1
                m = item.message
                rows.append(
                    (
                        session_id,
                        seq,
                        m.role,
                        m.content,
                        m.name,
                        metadata_json(m.metadata),
                        item.tokens,
                        format_time(m.timestamp) if m.timestamp else None,
                        stamp,
                    )
                )
            self.conn.executemany(
                "INSERT INTO messages (session_id, seq, role, content, name, metadata, tokens,"
                " status, timestamp, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, 'active', ?, ?)",
                rows,
            )
            start = (first_id_row[0] or 0) + 1
            ids = list(range(start, start + len(rows)))
            self._touch(
                session_id,
                active_messages=len(rows),
                active_tokens=sum(item.tokens for item in messages),
            )
        return ids

    def active_window(self, session_id: str) -> list[WindowEntry]:
        rows = self.execute(
            "SELECT id, role, tokens FROM messages WHERE session_id = ? AND status = 'active'"
            " ORDER BY seq",
            (session_id,),
        )
        return [WindowEntry(*row) for row in rows]

    _MESSAGE_COLUMNS = (
        "id, session_id, role, content, name, metadata, tokens, status, flush_id, timestamp"
    )

    @staticmethod
    def _message(row: tuple[Any, ...]) -> Message:
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
        sql = f"SELECT {self._MESSAGE_COLUMNS} FROM messages WHERE session_id = ?"
        params: tuple[Any, ...] = (session_id,)
        if status is not None:
            sql += " AND status = ?"
            params += (status,)
        sql += " ORDER BY seq"
        for row in self.execute(sql, params):
            yield self._message(row)

    def get_messages(
        self, session_id: str, status: str | None = None, ids: Sequence[int] | None = None
    ) -> list[Message]:
        if ids is None:
            return list(self.iter_messages(session_id, status))
        out: list[Message] = []
        for chunk_start in range(0, len(ids), 500):
            chunk = list(ids[chunk_start : chunk_start + 500])
            marks = ", ".join("?" for _ in chunk)
            rows = self.execute(
                f"SELECT {self._MESSAGE_COLUMNS} FROM messages WHERE session_id = ?"
                f" AND id IN ({marks}) ORDER BY seq",
                (session_id, *chunk),
            )
            out.extend(self._message(row) for row in rows)
        return out

    def archive(self, session_id: str, message_ids: Sequence[int], tokens: int, reason: str) -> int:
        with self.transaction():
            cursor = self.execute(
                "INSERT INTO flushes (session_id, created_at, messages, tokens, first_message_id,"
                " last_message_id, reason) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    session_id,
                    format_time(now_utc()),
                    len(message_ids),
                    tokens,
                    message_ids[0],
                    message_ids[-1],
                    reason,
                ),
            )
            flush_id = cursor.lastrowid
            assert flush_id is not None
            for chunk_start in range(0, len(message_ids), 500):
                chunk = list(message_ids[chunk_start : chunk_start + 500])
                marks = ", ".join("?" for _ in chunk)
                changed = self.execute(
                    f"UPDATE messages SET status = 'archived', flush_id = ? WHERE session_id = ?"
                    f" AND status = 'active' AND id IN ({marks})",
                    (flush_id, session_id, *chunk),
                ).rowcount
                if changed != len(chunk):
                    raise StoreError(
                        f"session {session_id!r} changed while it was being flushed",
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
            forget_session_flushes(self, session_id)
            self.execute("DELETE FROM flushes WHERE session_id = ?", (session_id,))
            self.execute(
                "UPDATE sessions SET active_messages = 0, archived_messages = 0,"
                " active_tokens = 0, flushes = 0 WHERE id = ?",
                (session_id,),
            )
            self._touch(session_id)
        return count

    def list_flushes(self, session_id: str) -> list[FlushRecord]:
        rows = self.execute(
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

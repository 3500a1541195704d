"""Long-term block state in SQLite: which flushes each block processed, facts, vector entries.

Every statement here runs on a SQLiteStore (`store.execute`, `store.transaction`). Facts and vectors
are kept per block name; facts also per scope key (`user:ID` or `session:ID`).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from memcli.messages import format_time, parse_time
from memcli.store.sqlite import run_statements


def migration_2(conn: sqlite3.Connection) -> None:
    """Block state: processed flushes, facts with their history, vector entries and pieces."""
    run_statements(conn, _SCHEMA_2)


_SCHEMA_2 = (
    """CREATE TABLE "block_flushes" (
   "block" TEXT,
   "scope_key" TEXT,
   "flush_id" INTEGER,
   "status" TEXT NOT NULL,
   "error" TEXT,
   "updated_at" TEXT NOT NULL,
   PRIMARY KEY ("block", "scope_key", "flush_id")
)""",
    """CREATE TABLE "block_state" (
   "block" TEXT,
   "scope_key" TEXT,
   "value" TEXT NOT NULL,
   "updated_at" TEXT NOT NULL,
   PRIMARY KEY ("block", "scope_key")
)""",
    """CREATE TABLE "facts" (
   "id" INTEGER PRIMARY KEY,
   "block" TEXT NOT NULL,
   "scope_key" TEXT NOT NULL,
   "text" TEXT NOT NULL,
   "norm" TEXT NOT NULL,
   "origin" TEXT NOT NULL,
   "session_id" TEXT,
   "flush_id" INTEGER,
   "message_ids" TEXT,
   "created_at" TEXT NOT NULL,
   "updated_at" TEXT NOT NULL,
   "deleted_at" TEXT
)""",
    """CREATE INDEX "facts_scope"
    ON "facts" ("block", "scope_key", "deleted_at")""",
    """CREATE TABLE "fact_history" (
   "id" INTEGER PRIMARY KEY,
   "fact_id" INTEGER NOT NULL,
   "block" TEXT NOT NULL,
   "scope_key" TEXT NOT NULL,
   "action" TEXT NOT NULL,
   "text" TEXT,
   "old_text" TEXT,
   "flush_id" INTEGER,
   "at" TEXT NOT NULL
)""",
    """CREATE INDEX "fact_history_scope"
    ON "fact_history" ("block", "scope_key")""",
    """CREATE TABLE "vector_entries" (
   "id" INTEGER PRIMARY KEY,
   "block" TEXT NOT NULL,
   "user_id" TEXT NOT NULL,
   "session_id" TEXT NOT NULL,
   "flush_id" INTEGER,
   "text" TEXT NOT NULL,
   "message_ids" TEXT,
   "created_at" TEXT NOT NULL
)""",
    """CREATE UNIQUE INDEX "vector_entries_flush"
    ON "vector_entries" ("block", "flush_id")""",
    """CREATE TABLE "vector_pieces" (
   "id" INTEGER PRIMARY KEY,
   "entry_id" INTEGER NOT NULL REFERENCES "vector_entries"("id"),
   "block" TEXT NOT NULL,
   "piece" INTEGER NOT NULL,
   "dim" INTEGER NOT NULL,
   "embedding" BLOB NOT NULL
)""",
    """CREATE INDEX "vector_pieces_block"
    ON "vector_pieces" ("block", "id")""",
    """CREATE INDEX "vector_pieces_entry"
    ON "vector_pieces" ("entry_id")""",
)


def _now() -> str:
    return format_time(datetime.now(tz=UTC))


# -- which flushes a block has processed ----------------------------------------------------------


def mark_flushes(
    store: Any,
    block: str,
    scope_key: str,
    flush_ids: Sequence[int],
    status: str = "done",
    error: str | None = None,
) -> None:
    """Record that `block` processed these flushes (`done`) or must retry them (`pending`)."""
    stamp = _now()
    with store.transaction():
        store.conn.executemany(
            "INSERT INTO block_flushes (block, scope_key, flush_id, status, error, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (block, scope_key, flush_id)"
            " DO UPDATE SET status = excluded.status, error = excluded.error,"
            " updated_at = excluded.updated_at",
            [(block, scope_key, f, status, error, stamp) for f in flush_ids],
        )


def flush_statuses(store: Any, block: str, scope_key: str, session_id: str) -> dict[int, str]:
    """Each of the session's flushes that `block` has a record of, and its status."""
    rows = store.execute(
        "SELECT b.flush_id, b.status FROM block_flushes b JOIN flushes f ON f.id = b.flush_id"
        " WHERE b.block = ? AND b.scope_key = ? AND f.session_id = ?",
        (block, scope_key, session_id),
    )
    return {row[0]: row[1] for row in rows}


def pending_flushes(store: Any, block: str, scope_key: str) -> list[tuple[int, str]]:
    """(flush id, session id) of every flush `block` must retry, oldest first."""
    rows = store.execute(
        "SELECT b.flush_id, f.session_id FROM block_flushes b JOIN flushes f ON f.id = b.flush_id"
        " WHERE b.block = ? AND b.scope_key = ? AND b.status = 'pending' ORDER BY b.flush_id",
        (block, scope_key),
    )
    return [(row[0], row[1]) for row in rows]


def forget_session_flushes(store: Any, session_id: str) -> None:
    """Before a session's flushes are deleted: drop the records that point at them (ids are reused)."""
    store.execute(
        "DELETE FROM block_flushes WHERE flush_id IN (SELECT id FROM flushes WHERE session_id = ?)",
        (session_id,),
    )
    store.execute(
        "UPDATE vector_entries SET flush_id = NULL WHERE flush_id IN"
        " (SELECT id FROM flushes WHERE session_id = ?)",
        (session_id,),
    )
    store.execute(
        "UPDATE facts SET flush_id = NULL WHERE flush_id IN"
        " (SELECT id FROM flushes WHERE session_id = ?)",
        (session_id,),
    )


# -- a custom block's own state -----------------------------------------------------------------


def load_state(store: Any, block: str, scope_key: str) -> Any:
    """The JSON value a block saved for a scope, or None."""
    row = store.execute(
        "SELECT value FROM block_state WHERE block = ? AND scope_key = ?", (block, scope_key)
    ).fetchone()
    return json.loads(row[0]) if row else None


def save_state(store: Any, block: str, scope_key: str, value: Any) -> None:
    """Save a JSON-ready value for a block and scope (replacing the last one)."""
    with store.transaction():
        store.execute(
            "INSERT INTO block_state (block, scope_key, value, updated_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (block, scope_key) DO UPDATE SET value = excluded.value,"
            " updated_at = excluded.updated_at",
            (block, scope_key, json.dumps(value, ensure_ascii=False), _now()),
        )


# -- facts ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fact:
    """A stored fact and where it came from."""

    id: int
    block: str
    scope_key: str
    text: str
    origin: str  # extracted, condensed or manual
    session_id: str | None
    flush_id: int | None
    message_ids: list[int]
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None = None


@dataclass(frozen=True)
class FactChange:
    """One entry of a fact's history."""

    id: int
    fact_id: int
    action: str  # added, condensed, edited or deleted
    text: str | None
    old_text: str | None
    flush_id: int | None
    at: datetime


def normalize_fact(text: str) -> str:
    """The form duplicates are compared in: case folded, white space collapsed."""
    return " ".join(text.split()).casefold()


_FACT_COLUMNS = (
    "id, block, scope_key, text, origin, session_id, flush_id, message_ids, created_at,"
    " updated_at, deleted_at"
)


def _fact(row: Sequence[Any]) -> Fact:
    return Fact(
        id=row[0],
        block=row[1],
        scope_key=row[2],
        text=row[3],
        origin=row[4],
        session_id=row[5],
        flush_id=row[6],
        message_ids=json.loads(row[7]) if row[7] else [],
        created_at=parse_time(row[8]),
        updated_at=parse_time(row[9]),
        deleted_at=parse_time(row[10]) if row[10] else None,
    )


def list_facts(store: Any, block: str | None, scope_key: str) -> list[Fact]:
    """The live facts of a scope (of one block, or of every block), oldest first."""
    sql = f"SELECT {_FACT_COLUMNS} FROM facts WHERE scope_key = ? AND deleted_at IS NULL"
    params: tuple[Any, ...] = (scope_key,)
    if block is not None:
        sql += " AND block = ?"
        params += (block,)
    return [_fact(row) for row in store.execute(sql + " ORDER BY id", params)]


def get_fact(store: Any, fact_id: int) -> Fact | None:
    row = store.execute(f"SELECT {_FACT_COLUMNS} FROM facts WHERE id = ?", (fact_id,)).fetchone()
    return _fact(row) if row else None


def _history(
    store: Any,
    fact_id: int,
    block: str,
    scope_key: str,
    action: str,
    text: str | None,
    old_text: str | None,
    flush_id: int | None,
    stamp: str,
) -> None:
    store.execute(
        "INSERT INTO fact_history (fact_id, block, scope_key, action, text, old_text, flush_id, at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (fact_id, block, scope_key, action, text, old_text, flush_id, stamp),
    )


def add_facts(
    store: Any,
    block: str,
    scope_key: str,
    texts: Sequence[str],
    *,
    origin: str = "extracted",
    action: str = "added",
    session_id: str | None = None,
    flush_id: int | None = None,
    message_ids: Sequence[int] = (),
) -> list[Fact]:
    """Store the facts that are not already there (compared normalised); return those added."""
    stamp = _now()
    added = []
    with store.transaction():
        known = {normalize_fact(f.text) for f in list_facts(store, block, scope_key)}
        for text in texts:
            text = text.strip()
            norm = normalize_fact(text)
            if not norm or norm in known:
                continue
            known.add(norm)
            cursor = store.execute(
                "INSERT INTO facts (block, scope_key, text, norm, origin, session_id, flush_id,"
                " message_ids, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    block,
                    scope_key,
                    text,
                    norm,
                    origin,
                    session_id,
                    flush_id,
                    json.dumps(list(message_ids)),
                    stamp,
                    stamp,
                ),
            )
            fact_id = cursor.lastrowid
            _history(store, fact_id, block, scope_key, action, text, None, flush_id, stamp)
            fact = get_fact(store, fact_id)
            assert fact is not None
            added.append(fact)
    return added


def edit_fact(store: Any, fact_id: int, text: str) -> tuple[Fact, Fact] | None:
    """Change a fact's text; return (before, after), or None when there is no live fact of that id."""
    before = get_fact(store, fact_id)
    if before is None or before.deleted_at is not None:
        return None
    stamp = _now()
    with store.transaction():
        store.execute(
            "UPDATE facts SET text = ?, norm = ?, updated_at = ? WHERE id = ?",
            (text.strip(), normalize_fact(text), stamp, fact_id),
        )
        _history(
            store,
            fact_id,
            before.block,
            before.scope_key,
            "edited",
            text.strip(),
            before.text,
            None,
            stamp,
        )
    after = get_fact(store, fact_id)
    assert after is not None
    return before, after


def delete_fact(
    store: Any, fact_id: int, action: str = "deleted", flush_id: int | None = None
) -> Fact | None:
    """Mark a fact deleted (kept for its history); return it, or None when there is none."""
    fact = get_fact(store, fact_id)
    if fact is None or fact.deleted_at is not None:
        return None
    stamp = _now()
    with store.transaction():
        store.execute(
            "UPDATE facts SET deleted_at = ?, updated_at = ? WHERE id = ?",
            (stamp, stamp, fact_id),
        )
        _history(
            store, fact_id, fact.block, fact.scope_key, action, None, fact.text, flush_id, stamp
        )
    return fact


def fact_history(
    store: Any, scope_key: str, block: str | None = None, fact_id: int | None = None
) -> list[FactChange]:
    """The changes to a scope's facts (or to one fact), oldest first."""
    sql = (
        "SELECT id, fact_id, action, text, old_text, flush_id, at FROM fact_history"
        " WHERE scope_key = ?"
    )
    params: tuple[Any, ...] = (scope_key,)
    if block is not None:
        sql += " AND block = ?"
        params += (block,)
    if fact_id is not None:
        sql += " AND fact_id = ?"
        params += (fact_id,)
    return [
        FactChange(r[0], r[1], r[2], r[3], r[4], r[5], parse_time(r[6]))
        for r in store.execute(sql + " ORDER BY id", params)
    ]


# -- vector entries -------------------------------------------------------------------------------


@dataclass(frozen=True)
class NewEntry:
    """A flushed batch about to be stored with its pieces' embeddings (float32 rows)."""

    user_id: str
    session_id: str
    flush_id: int | None
    text: str
    message_ids: list[int]
    embeddings: Any  # numpy array (pieces, dim)


def entries_with_flush(store: Any, block: str, flush_ids: Sequence[int]) -> set[int]:
    """Which of these flushes already have a vector entry in `block`."""
    found: set[int] = set()
    for start in range(0, len(flush_ids), 500):
        chunk = list(flush_ids[start : start + 500])
        marks = ", ".join("?" for _ in chunk)
        rows = store.execute(
            f"SELECT flush_id FROM vector_entries WHERE block = ? AND flush_id IN ({marks})",
            (block, *chunk),
        )
        found.update(row[0] for row in rows)
    return found


def add_entries(store: Any, block: str, entries: Sequence[NewEntry]) -> list[int]:
    """Store entries and their pieces in one transaction; return the entry ids."""
    stamp = _now()
    ids = []
    with store.transaction():
        for entry in entries:
            cursor = store.execute(
                "INSERT INTO vector_entries (block, user_id, session_id, flush_id, text,"
                " message_ids, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    block,
                    entry.user_id,
                    entry.session_id,
                    entry.flush_id,
                    entry.text,
                    json.dumps(entry.message_ids),
                    stamp,
                ),
            )
            entry_id = cursor.lastrowid
            ids.append(entry_id)
            dim = int(entry.embeddings.shape[1])
            store.conn.executemany(
                "INSERT INTO vector_pieces (entry_id, block, piece, dim, embedding)"
                " VALUES (?, ?, ?, ?, ?)",
                [
                    (entry_id, block, i, dim, row.astype("float32").tobytes())
                    for i, row in enumerate(entry.embeddings)
                ],
            )
    return ids


def piece_stats(store: Any, block: str) -> tuple[int, int]:
    """(how many pieces `block` has, the highest piece id): what an index must cover."""
    row = store.execute(
        "SELECT COUNT(*), COALESCE(MAX(id), 0) FROM vector_pieces WHERE block = ?", (block,)
    ).fetchone()
    return int(row[0]), int(row[1])


def max_piece_id(store: Any, block: str) -> int:
    """The highest piece id of `block` (cheap: one index lookup)."""
    row = store.execute("SELECT MAX(id) FROM vector_pieces WHERE block = ?", (block,)).fetchone()
    return int(row[0] or 0)


def piece_embeddings(store: Any, piece_ids: Sequence[int]) -> dict[int, Any]:
    """The stored embeddings (float32 numpy rows) of these pieces."""
    import numpy as np

    out: dict[int, Any] = {}
    for start in range(0, len(piece_ids), 500):
        chunk = list(piece_ids[start : start + 500])
        marks = ", ".join("?" for _ in chunk)
        rows = store.execute(
            f"SELECT id, embedding FROM vector_pieces WHERE id IN ({marks})", chunk
        )
        for piece_id, blob in rows:
            out[piece_id] = np.frombuffer(blob, dtype=np.float32)
    return out


def iter_pieces(store: Any, block: str, after_id: int = 0) -> Any:
    """(piece id, entry id, user id, session id, dim, embedding bytes) rows, by piece id."""
    return store.execute(
        "SELECT p.id, p.entry_id, e.user_id, e.session_id, p.dim, p.embedding"
        " FROM vector_pieces p JOIN vector_entries e ON e.id = p.entry_id"
        " WHERE p.block = ? AND p.id > ? ORDER BY p.id",
        (block, after_id),
    )


@dataclass(frozen=True)
class Entry:
    """A stored vector entry: a flushed batch's text and provenance."""

    id: int
    user_id: str
    session_id: str
    flush_id: int | None
    text: str
    message_ids: list[int]


def get_entries(store: Any, entry_ids: Sequence[int]) -> dict[int, Entry]:
    out: dict[int, Entry] = {}
    for start in range(0, len(entry_ids), 500):
        chunk = list(entry_ids[start : start + 500])
        marks = ", ".join("?" for _ in chunk)
        rows = store.execute(
            "SELECT id, user_id, session_id, flush_id, text, message_ids FROM vector_entries"
            f" WHERE id IN ({marks})",
            chunk,
        )
        for r in rows:
            out[r[0]] = Entry(r[0], r[1], r[2], r[3], r[4], json.loads(r[5]) if r[5] else [])
    return out


def flush_messages(store: Any, flush_id: int) -> list[Any]:
    """The messages a flush archived, in order."""
    rows = store.execute(
        f"SELECT {store._MESSAGE_COLUMNS} FROM messages WHERE flush_id = ? ORDER BY seq",
        (flush_id,),
    )
    return [store._message(row) for row in rows]


def vector_blocks(store: Any) -> list[str]:
    """The names of the blocks that have vector entries."""
    return [r[0] for r in store.execute("SELECT DISTINCT block FROM vector_entries ORDER BY block")]

"""Running summaries of sessions (the summary block's state): every version kept, the highest one
current. Also the summary block's queue: the batches of a session it has not taken in yet.

Portable SQL only (`?` placeholders, no rowid, no INSERT OR ...): the same statements run on
every backend. Table `summaries` (migration 17): session_id, block, version, text, tokens,
flush_id, first_message_id, last_message_id, created_at; primary key (session_id, block, version).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from memcli.messages import format_time, parse_time, session_name

if TYPE_CHECKING:
    from memcli.store.base import SQLStore


@dataclass(frozen=True)
class Summary:
    """One version of a session's summary, and the batch it took in."""

    session_id: str
    block: str
    version: int
    text: str
    tokens: int
    flush_id: int | None
    first_message_id: int | None
    last_message_id: int | None
    created_at: datetime

    def to_dict(self) -> dict[str, Any]:
        return {
            "session": session_name(self.session_id),
            "block": self.block,
            "version": self.version,
            "created_at": self.created_at,
            "tokens": self.tokens,
            "flush_id": self.flush_id,
            "first_message_id": self.first_message_id,
            "last_message_id": self.last_message_id,
            "text": self.text,
        }


_COLUMNS = (
    "session_id, block, version, text, tokens, flush_id, first_message_id, last_message_id,"
    " created_at"
)


def _summary(row: Sequence[Any]) -> Summary:
    return Summary(
        session_id=row[0],
        block=row[1],
        version=row[2],
        text=row[3],
        tokens=row[4],
        flush_id=row[5],
        first_message_id=row[6],
        last_message_id=row[7],
        created_at=parse_time(row[8]),
    )


def add_summary(
    store: SQLStore,
    session_id: str,
    block: str,
    text: str,
    tokens: int,
    *,
    flush_id: int | None = None,
    message_ids: Sequence[int] = (),
    after: int | None = None,
) -> Summary | None:
    """Store a new version of the session's summary (the next version number); return it. With
    `after`, only when the current version is still that one (0: none yet), else None: the new
    text was made from a summary another writer has replaced since."""
    stamp = format_time(datetime.now(tz=UTC))
    with store.transaction():
        store.hold_lock(f"summary {session_id} {block}")  # one new version at a time
        row = store.execute(
            "SELECT COALESCE(MAX(version), 0) FROM summaries WHERE session_id = ? AND block = ?",
            (session_id, block),
        ).fetchone()
        if after is not None and int(row[0]) != after:
            return None
        version = int(row[0]) + 1
        store.execute(
            f"INSERT INTO summaries ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                session_id,
                block,
                version,
                text,
                tokens,
                flush_id,
                min(message_ids) if message_ids else None,
                max(message_ids) if message_ids else None,
                stamp,
            ),
        )
    return Summary(
        session_id,
        block,
        version,
        text,
        tokens,
        flush_id,
        min(message_ids) if message_ids else None,
        max(message_ids) if message_ids else None,
        parse_time(stamp),
    )


def latest_summary(store: SQLStore, session_id: str, block: str) -> Summary | None:
    """The session's current summary (its highest version) for `block`, or None."""
    row = store.execute(
        f"SELECT {_COLUMNS} FROM summaries WHERE session_id = ? AND block = ?"
        " ORDER BY version DESC LIMIT 1",
        (session_id, block),
    ).fetchone()
    return _summary(row) if row else None


def summary_history(store: SQLStore, session_id: str, block: str) -> list[Summary]:
    """Every version of the session's summary for `block`, oldest first."""
    rows = store.execute(
        f"SELECT {_COLUMNS} FROM summaries WHERE session_id = ? AND block = ? ORDER BY version",
        (session_id, block),
    )
    return [_summary(row) for row in rows]


def summary_blocks(store: SQLStore, session_id: str) -> list[str]:
    """The names of the blocks that hold a summary of the session, sorted."""
    rows = store.execute(
        "SELECT DISTINCT block FROM summaries WHERE session_id = ? ORDER BY block", (session_id,)
    )
    return [row[0] for row in rows]


def unsummarised(
    store: SQLStore,
    block: str,
    scope_key: str,
    session_id: str,
    *,
    before: int,
    after_message: int,
    limit: int,
) -> list[tuple[int, str | None]]:
    """The session's flushes older than flush `before` that `block` has not taken in (pending, or
    never handed to it), oldest first, at most `limit`: (flush id, status: "pending" or None).
    Only flushes after message id `after_message` (the last one the summary covers) are looked at:
    message ids are never given out again, flush ids may be."""
    rows = store.execute(
        "SELECT f.id, b.status FROM flushes f LEFT JOIN block_flushes b"
        " ON b.flush_id = f.id AND b.block = ? AND b.scope_key = ?"
        " WHERE f.session_id = ? AND f.id < ? AND f.last_message_id > ?"
        " AND (b.status IS NULL OR b.status <> 'done') ORDER BY f.id LIMIT ?",
        (block, scope_key, session_id, before, after_message, limit),
    )
    return [(row[0], row[1]) for row in rows]


def pending_batches(store: SQLStore, block: str, scope_key: str) -> list[tuple[int, str | None]]:
    """The batches `block` must still take in for a scope: (flush id, the last error), oldest
    first."""
    rows = store.execute(
        "SELECT flush_id, error FROM block_flushes WHERE block = ? AND scope_key = ?"
        " AND status = 'pending' ORDER BY flush_id",
        (block, scope_key),
    )
    return [(row[0], row[1]) for row in rows]

"""SQL of unfinished long-term work, for `memcli check` and `memcli info` (`memcli.health`):
batches a block failed on (pending), batches no block was handed (an import or a chat killed
before it fed its blocks), and fact condensations that failed.

A failed condensation is kept as a block's state under the scope key `condense:<scope key>`
(a `block_state` row: nothing new in the schema), cleared when a condensation succeeds. A
conversation a fact block is reading for its facts (an import's extraction, `facts extract`) is
marked the same way under `unread:session:<id>` before the first request and cleared once the
block has read all of it: a run killed on the way leaves the mark, which `check` lists.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from memcli.messages import format_time

if TYPE_CHECKING:
    from collections.abc import Iterable

    from memcli.store.base import SQLStore

CONDENSE = "condense:"
UNREAD = "unread:"


def unread_key(session_id: str) -> str:
    """The scope key of the mark of a conversation a fact block is reading."""
    return f"{UNREAD}session:{session_id}"


def mark_unread(store: SQLStore, marks: Iterable[tuple[str, str, str]]) -> None:
    """Mark (block, session, user) conversations as being read for facts, in one transaction."""
    now = format_time(datetime.now(UTC))
    with store.transaction():
        for block, session_id, user_id in marks:
            store.execute(
                "INSERT INTO block_state (block, scope_key, value, updated_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (block, scope_key) DO UPDATE SET value = excluded.value,"
                " updated_at = excluded.updated_at",
                (block, unread_key(session_id), json.dumps({"user": user_id}), now),
            )


def clear_unread(store: SQLStore, block: str, session_id: str) -> None:
    """The block has read all of the conversation: its mark goes."""
    with store.transaction():
        store.execute(
            "DELETE FROM block_state WHERE block = ? AND scope_key = ?",
            (block, unread_key(session_id)),
        )


def unread_conversations(store: SQLStore) -> dict[tuple[str, str], int]:
    """Per (block, user), the conversations still marked as being read for facts (of sessions
    that exist)."""
    rows = store.execute(
        "SELECT b.block, b.value FROM block_state b JOIN sessions s"
        f" ON b.scope_key = '{UNREAD}session:' || s.id WHERE b.scope_key LIKE ?",
        (UNREAD + "%",),
    ).fetchall()
    out: dict[tuple[str, str], int] = {}
    for block, value in rows:
        try:
            user = str(json.loads(value).get("user", ""))
        except (ValueError, AttributeError):
            user = ""
        out[block, user] = out.get((block, user), 0) + 1
    return out


@dataclass(frozen=True)
class PendingBatches:
    """A block's batches of one user that stay pending: how many, the last error, the most
    attempts, and from which flush id the first of them is due again (None: now)."""

    block: str
    user_id: str
    count: int
    attempts: int
    error: str | None
    updated_at: str
    due_after_flushes: int
    sessions: int


def pending_batches(store: SQLStore) -> list[PendingBatches]:
    """Per block and user, the batches left pending, with the latest error."""
    latest = int(store.execute("SELECT COALESCE(MAX(id), 0) FROM flushes").fetchone()[0])
    rows = store.execute(
        "SELECT b.block, s.user_id, COUNT(*), MAX(b.attempts), MIN(b.retry_after),"
        " MAX(b.updated_at), COUNT(DISTINCT f.session_id)"
        " FROM block_flushes b JOIN flushes f ON f.id = b.flush_id"
        " JOIN sessions s ON s.id = f.session_id WHERE b.status = 'pending'"
        " GROUP BY b.block, s.user_id ORDER BY b.block, s.user_id"
    ).fetchall()
    out = []
    for block, user, count, attempts, retry_after, updated, sessions in rows:
        error = store.execute(
            "SELECT b.error FROM block_flushes b JOIN flushes f ON f.id = b.flush_id"
            " JOIN sessions s ON s.id = f.session_id WHERE b.status = 'pending' AND b.block = ?"
            " AND s.user_id = ? ORDER BY b.updated_at DESC, b.flush_id DESC LIMIT 1",
            (block, user),
        ).fetchone()
        due = max(0, int(retry_after or 0) - latest)
        out.append(
            PendingBatches(
                block,
                user,
                int(count),
                int(attempts or 0),
                None if error is None else error[0],
                str(updated),
                due,
                int(sessions),
            )
        )
    return out


def unfed_count(
    store: SQLStore, block: str, scope_key: str, session_id: str, unembedded: bool = False
) -> int:
    """How many of the session's flushed batches `block` has no record of (never handed it);
    with `unembedded`, only those of them with a message (with text) that has no vector yet."""
    vectorless = (
        " AND EXISTS (SELECT 1 FROM messages m WHERE m.flush_id = f.id AND m.content <> ''"
        " AND NOT EXISTS (SELECT 1 FROM retrieval_vectors v WHERE v.message_id = m.id))"
        if unembedded
        else ""
    )
    row = store.execute(
        "SELECT COUNT(*) FROM flushes f WHERE f.session_id = ? AND NOT EXISTS (SELECT 1"
        " FROM block_flushes b WHERE b.block = ? AND b.scope_key = ? AND b.flush_id = f.id)"
        + vectorless,
        (session_id, block, scope_key),
    ).fetchone()
    return int(row[0])


def flushed_sessions(store: SQLStore) -> list[tuple[str, str]]:
    """(session id, user id) of every session that has flushed batches."""
    rows = store.execute(
        "SELECT s.id, s.user_id FROM sessions s"
        " WHERE EXISTS (SELECT 1 FROM flushes f WHERE f.session_id = s.id) ORDER BY s.id"
    )
    return [(r[0], r[1]) for r in rows]


# -- failed condensations -----------------------------------------------------------------------


def record_condense_failure(
    store: SQLStore, block: str, scope_key: str, error: str, facts: int, limit: int
) -> None:
    """Keep why the block's facts of a scope could not be condensed (`facts` over `limit`)."""
    value = {"error": error, "facts": facts, "max_facts": limit, "at": _now()}
    with store.transaction():
        store.execute(
            "INSERT INTO block_state (block, scope_key, value, updated_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (block, scope_key) DO UPDATE SET value = excluded.value,"
            " updated_at = excluded.updated_at",
            (block, CONDENSE + scope_key, json.dumps(value, ensure_ascii=False), value["at"]),
        )


def clear_condense_failure(store: SQLStore, block: str, scope_key: str) -> None:
    """Forget a failed condensation (one succeeded, or the facts fit again)."""
    row = store.execute(
        "SELECT 1 FROM block_state WHERE block = ? AND scope_key = ?",
        (block, CONDENSE + scope_key),
    ).fetchone()
    if row is None:
        return
    with store.transaction():
        store.execute(
            "DELETE FROM block_state WHERE block = ? AND scope_key = ?",
            (block, CONDENSE + scope_key),
        )


def condense_failures(
    store: SQLStore, block: str | None = None, scope_key: str | None = None
) -> list[tuple[str, str, Any]]:
    """(block, scope key, {error, facts, max_facts, at}) of every failed condensation (of a
    block, of a scope)."""
    sql = "SELECT block, scope_key, value FROM block_state WHERE scope_key LIKE 'condense:%'"
    params: tuple[Any, ...] = ()
    if block is not None:
        sql += " AND block = ?"
        params += (block,)
    if scope_key is not None:
        sql += " AND scope_key = ?"
        params += (CONDENSE + scope_key,)
    rows = store.execute(sql + " ORDER BY block, scope_key", params)
    return [(r[0], r[1][len(CONDENSE) :], json.loads(r[2])) for r in rows]


def _now() -> str:
    return format_time(datetime.now(tz=UTC))

"""Long-term block bookkeeping: which blocks a session uses, which flushes each block processed
(and which it must retry), a block's own state, and the messages of a flush. The facts' SQL is in
`memcli.store.facts`.

Every statement here runs on an SQLStore (`store.execute`, `store.transaction`), SQLite or
PostgreSQL: portable SQL with `?` placeholders. State is kept per block name and scope key
(`user:ID` or `session:ID`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from memcli.messages import format_time

if TYPE_CHECKING:
    from memcli.messages import Message
    from memcli.store.base import SQLStore


def _now() -> str:
    return format_time(datetime.now(tz=UTC))


# -- which blocks a session uses --------------------------------------------------------------------


def save_block_definitions(
    store: SQLStore, session_id: str, definitions: Sequence[dict[str, Any]]
) -> bool:
    """Record the session's block definitions (`[[blocks]]` tables), unless they are the ones
    recorded already; True when written."""
    text = json.dumps(list(definitions), sort_keys=True)
    row = store.execute(
        "SELECT definitions FROM block_definitions WHERE session_id = ?", (session_id,)
    ).fetchone()
    if row is not None and row[0] == text:
        return False
    with store.transaction():
        store.execute(
            "INSERT INTO block_definitions (session_id, definitions, updated_at) VALUES (?, ?, ?)"
            " ON CONFLICT (session_id) DO UPDATE SET definitions = excluded.definitions,"
            " updated_at = excluded.updated_at",
            (session_id, text, _now()),
        )
    return True


def block_definitions(
    store: SQLStore, session_id: str | None = None, user_id: str | None = None
) -> tuple[str, list[dict[str, Any]]] | None:
    """The block definitions recorded for a session, else for its user's (or `user_id`'s)
    session recorded last; with that session's id. None when none were recorded."""
    if session_id is not None:
        row = store.execute(
            "SELECT session_id, definitions FROM block_definitions WHERE session_id = ?",
            (session_id,),
        ).fetchone()
        if row is not None:
            return row[0], json.loads(row[1])
        owner = store.execute("SELECT user_id FROM sessions WHERE id = ?", (session_id,)).fetchone()
        user_id = owner[0] if owner is not None else user_id
    row = store.execute(
        "SELECT d.session_id, d.definitions FROM block_definitions d"
        " JOIN sessions s ON s.id = d.session_id WHERE s.user_id = ?"
        " ORDER BY d.updated_at DESC, d.session_id DESC LIMIT 1",
        (user_id,),
    ).fetchone()
    return None if row is None else (row[0], json.loads(row[1]))


# -- which flushes a block has processed ----------------------------------------------------------


def mark_flushes(
    store: SQLStore,
    block: str,
    scope_key: str,
    flush_ids: Sequence[int],
    status: str = "done",
    error: str | None = None,
) -> None:
    """Record that `block` processed these flushes (`done`) or failed on them (`pending`).

    A failure counts one more attempt and sets when the flush is due again: after 1, 2, 4, ...
    later flushes of the database (`retry_after` holds the flush id from which it is due).
    """
    stamp = _now()
    failed = status == "pending"
    with store.transaction():
        latest = store.execute("SELECT COALESCE(MAX(id), 0) FROM flushes").fetchone()[0]
        store.executemany(
            "INSERT INTO block_flushes (block, scope_key, flush_id, status, error, updated_at,"
            " attempts, retry_after) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (block, scope_key, flush_id) DO UPDATE SET status = excluded.status,"
            " error = excluded.error, updated_at = excluded.updated_at,"
            " attempts = block_flushes.attempts + excluded.attempts,"
            " retry_after = CASE WHEN excluded.status = 'pending' THEN ? + (1 << CAST(CASE"
            " WHEN block_flushes.attempts < 30 THEN block_flushes.attempts ELSE 30 END AS INTEGER))"
            " END",
            [
                (
                    block,
                    scope_key,
                    f,
                    status,
                    error,
                    stamp,
                    int(failed),
                    latest + 1 if failed else None,
                    latest,
                )
                for f in flush_ids
            ],
        )


def flush_statuses(store: SQLStore, block: str, scope_key: str, session_id: str) -> dict[int, str]:
    """Each of the session's flushes that `block` has a record of, and its status."""
    rows = store.execute(
        "SELECT b.flush_id, b.status FROM block_flushes b JOIN flushes f ON f.id = b.flush_id"
        " WHERE b.block = ? AND b.scope_key = ? AND f.session_id = ?",
        (block, scope_key, session_id),
    )
    return {row[0]: row[1] for row in rows}


def pending_flushes(
    store: SQLStore, block: str, scope_key: str, *, retries: int | None = None
) -> list[tuple[int, str]]:
    """(flush id, session id) of every flush `block` must retry, oldest first.

    With `retries`, only those due for an automatic retry: retried fewer than `retries` times
    since the first failure, and with their back-off passed (see `mark_flushes`).
    """
    sql = (
        "SELECT b.flush_id, f.session_id FROM block_flushes b JOIN flushes f ON f.id = b.flush_id"
        " WHERE b.block = ? AND b.scope_key = ? AND b.status = 'pending'"
    )
    params: tuple[Any, ...] = (block, scope_key)
    if retries is not None:
        sql += (
            " AND b.attempts <= ? AND b.retry_after <= (SELECT COALESCE(MAX(id), 0) FROM flushes)"
        )
        params += (retries,)
    return [(row[0], row[1]) for row in store.execute(sql + " ORDER BY b.flush_id", params)]


def pending_work(store: SQLStore, block: str, scope_key: str) -> tuple[int, str | None]:
    """How many flushes `block` must still process for a scope, and the newest failure's reason."""
    rows = store.execute(
        "SELECT error FROM block_flushes WHERE block = ? AND scope_key = ? AND status = 'pending'"
        " ORDER BY updated_at DESC, flush_id DESC",
        (block, scope_key),
    ).fetchall()
    return len(rows), next((row[0] for row in rows if row[0]), None)


# -- a custom block's own state -----------------------------------------------------------------


def load_state(store: SQLStore, block: str, scope_key: str) -> Any:
    """The JSON value a block saved for a scope, or None."""
    row = store.execute(
        "SELECT value FROM block_state WHERE block = ? AND scope_key = ?", (block, scope_key)
    ).fetchone()
    return json.loads(row[0]) if row else None


def save_state(store: SQLStore, block: str, scope_key: str, value: Any) -> None:
    """Save a JSON-ready value for a block and scope (replacing the last one)."""
    with store.transaction():
        store.execute(
            "INSERT INTO block_state (block, scope_key, value, updated_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (block, scope_key) DO UPDATE SET value = excluded.value,"
            " updated_at = excluded.updated_at",
            (block, scope_key, json.dumps(value, ensure_ascii=False), _now()),
        )


def flush_messages(store: SQLStore, flush_id: int) -> list[Message]:
    """The messages a flush archived, in order."""
    rows = store.execute(
        f"SELECT {store.MESSAGE_COLUMNS} FROM messages WHERE flush_id = ? ORDER BY seq",
        (flush_id,),
    )
    return [store.message_from_row(row) for row in rows]


# -- what a block read outside any flush --------------------------------------------------------


def record_read(
    store: SQLStore, block: str, scope_key: str, session_id: str, message_ids: Sequence[int]
) -> None:
    """Record that `block` read these messages of a session (active ones: no flush holds them),
    as the range of their ids."""
    if not message_ids:
        return
    with store.transaction():
        store.execute(
            "INSERT INTO block_reads (block, scope_key, session_id, first_message_id,"
            " last_message_id, messages, read_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (block, scope_key, session_id, first_message_id) DO UPDATE SET"
            " last_message_id = excluded.last_message_id, messages = excluded.messages,"
            " read_at = excluded.read_at",
            (
                block,
                scope_key,
                session_id,
                min(message_ids),
                max(message_ids),
                len(message_ids),
                _now(),
            ),
        )


def read_ranges(
    store: SQLStore, block: str, scope_key: str, session_id: str
) -> list[tuple[int, int]]:
    """The (first, last) message id ranges `block` read of a session outside any flush."""
    rows = store.execute(
        "SELECT first_message_id, last_message_id FROM block_reads"
        " WHERE block = ? AND scope_key = ? AND session_id = ? ORDER BY first_message_id",
        (block, scope_key, session_id),
    )
    return [(row[0], row[1]) for row in rows]

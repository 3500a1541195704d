"""Long-term block state: which flushes each block processed, a block's own state, facts.

Every statement here runs on an SQLStore (`store.execute`, `store.transaction`), SQLite or
PostgreSQL: portable SQL with `?` placeholders. Facts are kept per block name and scope key
(`user:ID` or `session:ID`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from memcli.messages import format_time, parse_time

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


# -- facts ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fact:
    """A stored fact and where it came from."""

    id: int
    block: str
    scope_key: str
    text: str
    origin: str  # see ORIGINS
    session_id: str | None
    flush_id: int | None
    message_ids: list[int]
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None = None
    topics: list[str] = field(default_factory=list)  # normalised, sorted


#: Where a fact, and each change to it, came from: the fact block's extraction (`extracted`)
#: and its condensing (`condensed`), `memcli facts add/edit/rm` (`manual`), the MCP server
#: (`mcp`), the chat's memory tools (`chat-tool`), or a Python caller that names none (`api`).
#: A fact's history also holds `unknown`, for edits made before memcli recorded origins.
ORIGINS = ("extracted", "condensed", "manual", "mcp", "chat-tool", "api")


@dataclass(frozen=True)
class FactChange:
    """One entry of a fact's history: what changed, by which path (`origin`, see ORIGINS), and
    the fact's text and topics after and before (None where the change has none, or the topics
    were not recorded: before memcli recorded them)."""

    id: int
    fact_id: int
    action: str  # added, condensed, edited or deleted
    text: str | None
    old_text: str | None
    flush_id: int | None
    at: datetime
    origin: str = "unknown"
    topics: list[str] | None = None
    old_topics: list[str] | None = None


def normalize_fact(text: str) -> str:
    """The form duplicates are compared in: case folded, white space collapsed."""
    return " ".join(text.split()).casefold()


#: The longest fact, in characters: every fact goes into every prompt of its scope. `add_facts`
#: leaves a longer text out (as it does an empty one: an extraction's runaway reply), `edit_fact`
#: refuses one, and the CLI and the memory tools refuse one with the limit
#: (`memcli.tools.check_fact_text`).
MAX_FACT_CHARS = 2000

#: The longest topic kept; a longer one is taken for a malformed reply and dropped.
MAX_TOPIC_CHARS = 60


def normalize_topics(topics: Sequence[str] | str | None) -> list[str]:
    """Topics as stored: each split at commas, lowercased, white space trimmed and collapsed;
    empty ones and ones over MAX_TOPIC_CHARS dropped; no duplicates; sorted."""
    if topics is None:
        return []
    if isinstance(topics, str):
        topics = [topics]
    found = set()
    for value in topics:
        for part in str(value).split(","):
            topic = " ".join(part.split()).lower()
            if topic and len(topic) <= MAX_TOPIC_CHARS:
                found.add(topic)
    return sorted(found)


_FACT_COLUMNS = (
    "id, block, scope_key, text, origin, session_id, flush_id, message_ids, created_at,"
    " updated_at, deleted_at,"
    " (SELECT json_group_array(topic) FROM fact_topics WHERE fact_id = facts.id)"
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
        topics=sorted(json.loads(row[11])) if row[11] else [],
    )


def _set_topics(store: SQLStore, fact_id: int, topics: Sequence[str]) -> None:
    store.execute("DELETE FROM fact_topics WHERE fact_id = ?", (fact_id,))
    store.executemany(
        "INSERT INTO fact_topics (fact_id, topic) VALUES (?, ?)",
        [(fact_id, t) for t in normalize_topics(topics)],
    )


def list_facts(
    store: SQLStore, block: str | None, scope_key: str, topic: str | None = None
) -> list[Fact]:
    """The live facts of a scope (of one block, or of every block; of one topic, normalised as
    stored, or of any), oldest first."""
    sql = f"SELECT {_FACT_COLUMNS} FROM facts WHERE scope_key = ? AND deleted_at IS NULL"
    params: tuple[Any, ...] = (scope_key,)
    if block is not None:
        sql += " AND block = ?"
        params += (block,)
    if topic is not None:
        sql += " AND id IN (SELECT fact_id FROM fact_topics WHERE topic = ?)"
        params += (" ".join(topic.split()).lower(),)
    return [_fact(row) for row in store.execute(sql + " ORDER BY id", params)]


def find_facts(
    store: SQLStore, block: str | None, scope_key: str, query: str, topic: str | None = None
) -> list[Fact]:
    """The live facts of a scope (and topic) whose text holds every word of `query`, ignoring
    case (as grep would: a word may be part of a longer one), oldest first; none for no words."""
    words = query.casefold().split()
    if not words:
        return []
    facts = list_facts(store, block, scope_key, topic)
    return [f for f in facts if all(w in f.text.casefold() for w in words)]


def get_fact(store: SQLStore, fact_id: int) -> Fact | None:
    """The fact of that id (deleted or not), or None; None too for an id SQLite cannot hold."""
    if not -(2**63) <= fact_id < 2**63:
        return None
    row = store.execute(f"SELECT {_FACT_COLUMNS} FROM facts WHERE id = ?", (fact_id,)).fetchone()
    return _fact(row) if row else None


def _history(
    store: SQLStore,
    fact: Fact,
    action: str,
    origin: str,
    stamp: str,
    *,
    before: Fact | None = None,
    after: Fact | None = None,
    flush_id: int | None = None,
) -> None:
    """Record a change to `fact`: its text and topics `after` and `before` it (None: none)."""

    def topics(f: Fact | None) -> str | None:
        return None if f is None else json.dumps(f.topics, ensure_ascii=False)

    store.execute(
        "INSERT INTO fact_history (fact_id, block, scope_key, action, text, old_text, flush_id,"
        " at, origin, topics, old_topics) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            fact.id,
            fact.block,
            fact.scope_key,
            action,
            None if after is None else after.text,
            None if before is None else before.text,
            flush_id,
            stamp,
            origin,
            topics(after),
            topics(before),
        ),
    )


def add_facts(
    store: SQLStore,
    block: str,
    scope_key: str,
    texts: Sequence[str],
    *,
    origin: str = "api",
    action: str = "added",
    session_id: str | None = None,
    flush_id: int | None = None,
    message_ids: Sequence[int] = (),
    topics: Sequence[Sequence[str]] | None = None,
) -> list[Fact]:
    """Store the facts that are not already there (compared normalised), none longer than
    MAX_FACT_CHARS; return those added.
    `topics`, when given, holds each text's topics (in the order of `texts`); `origin` (see
    ORIGINS) is the facts' and their history entries'."""
    stamp = _now()
    added = []
    if topics is not None and len(topics) != len(texts):
        raise ValueError("topics must give one list of topics per text")
    with store.transaction():
        store.hold_lock(f"facts {block} {scope_key}")  # two extractions at once add a fact once
        known = {normalize_fact(f.text) for f in list_facts(store, block, scope_key)}
        for i, text in enumerate(texts):
            text = text.strip()
            norm = normalize_fact(text)
            if not norm or norm in known or len(text) > MAX_FACT_CHARS:
                continue
            known.add(norm)
            cursor = store.execute(
                "INSERT INTO facts (block, scope_key, text, norm, origin, session_id, flush_id,"
                " message_ids, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " RETURNING id",
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
            fact_id = cursor.fetchall()[0][0]
            if topics is not None:
                _set_topics(store, fact_id, topics[i])
            fact = get_fact(store, fact_id)
            assert fact is not None
            _history(store, fact, action, origin, stamp, after=fact, flush_id=flush_id)
            added.append(fact)
    return added


def edit_fact(
    store: SQLStore,
    fact_id: int,
    text: str,
    topics: Sequence[str] | None = None,
    *,
    origin: str = "api",
) -> tuple[Fact, Fact] | None:
    """Change a fact's text (and its topics, when given; else they stay); return (before, after),
    or None when there is no live fact of that id. The history records both texts and both
    topic lists, with `origin` (see ORIGINS)."""
    if len(text.strip()) > MAX_FACT_CHARS:
        from memcli.errors import InputError

        raise InputError(
            f"the fact is {len(text.strip()):,} characters long; at most {MAX_FACT_CHARS:,}",
            "Keep a fact to a sentence or two",
        )
    before = get_fact(store, fact_id)
    if before is None or before.deleted_at is not None:
        return None
    stamp = _now()
    with store.transaction():
        store.execute(
            "UPDATE facts SET text = ?, norm = ?, updated_at = ? WHERE id = ?",
            (text.strip(), normalize_fact(text), stamp, fact_id),
        )
        if topics is not None:
            _set_topics(store, fact_id, topics)
        after = get_fact(store, fact_id)
        assert after is not None
        _history(store, after, "edited", origin, stamp, before=before, after=after)
    return before, after


def delete_fact(
    store: SQLStore,
    fact_id: int,
    action: str = "deleted",
    flush_id: int | None = None,
    *,
    origin: str = "api",
) -> Fact | None:
    """Mark a fact deleted (kept for its history, with `origin`: see ORIGINS); return it, or
    None when there is none."""
    fact = get_fact(store, fact_id)
    if fact is None or fact.deleted_at is not None:
        return None
    stamp = _now()
    with store.transaction():
        store.execute(
            "UPDATE facts SET deleted_at = ?, updated_at = ? WHERE id = ?",
            (stamp, stamp, fact_id),
        )
        _history(store, fact, action, origin, stamp, before=fact, flush_id=flush_id)
    return fact


def fact_history(
    store: SQLStore, scope_key: str, block: str | None = None, fact_id: int | None = None
) -> list[FactChange]:
    """The changes to a scope's facts (or to one fact), oldest first."""
    sql = (
        "SELECT id, fact_id, action, text, old_text, flush_id, at, origin, topics, old_topics"
        " FROM fact_history WHERE scope_key = ?"
    )
    params: tuple[Any, ...] = (scope_key,)
    if block is not None:
        sql += " AND block = ?"
        params += (block,)
    if fact_id is not None:
        sql += " AND fact_id = ?"
        params += (fact_id,)
    return [
        FactChange(
            id=r[0],
            fact_id=r[1],
            action=r[2],
            text=r[3],
            old_text=r[4],
            flush_id=r[5],
            at=parse_time(r[6]),
            origin=r[7],
            topics=None if r[8] is None else json.loads(r[8]),
            old_topics=None if r[9] is None else json.loads(r[9]),
        )
        for r in store.execute(sql + " ORDER BY id", params)
    ]


def flush_messages(store: SQLStore, flush_id: int) -> list[Message]:
    """The messages a flush archived, in order."""
    rows = store.execute(
        f"SELECT {store.MESSAGE_COLUMNS} FROM messages WHERE flush_id = ? ORDER BY seq",
        (flush_id,),
    )
    return [store.message_from_row(row) for row in rows]

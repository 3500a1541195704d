"""Deleting for good: one message, or everything of one user, in portable SQL on an SQLStore.

What these functions delete, and how the rest stays consistent:

- `delete_message`: the message's row (the store's triggers take its full-text entry and its
  vectors with it); the session's counters (active or archived messages and tokens) and version,
  so that a Memory reads its window again; the flush that archived it keeps its record (the
  blocks' work on it stays theirs), its `messages` and `tokens` reduced and its first and last
  message ids moved to the messages it still holds (an emptied flush keeps them as they were:
  it is the record that a flush happened); a fact whose `message_ids` name the message keeps its
  text, the id dropped from its provenance. Summaries are not rewritten.
  The message's source (`source_hash`: a hash of its id in the file it was imported from, or
  of its role and content, never its text) is kept in `deleted_sources`, so that importing
  that file again does not bring it back (`memcli.importing`).
- `forget_user`: the user's sessions with their messages, flushes, block definitions and
  summaries; the facts of the user's scope (`user:ID`) and of their sessions' (`session:ID`),
  with their topics and history; the blocks' state and processed flushes of those scopes; the
  messages' full-text entries, vectors and pending re-embeddings.

Both run inside a transaction; afterwards the backend's `purge()` makes the deletion physical
(SQLite: the full-text index merged, VACUUM, the WAL truncated; PostgreSQL: VACUUM), and the
retrieval index files are removed. Each delete records itself in `unfinished_deletes` in its own
transaction (`mark_unfinished`), and the cleanup removes the record once it is done, so that a
delete killed between its commit and its cleanup is seen (`memcli check`) and finished by the
next command that opens the index (`memcli.search.dense.finish_deletes`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memcli.messages import session_name

if TYPE_CHECKING:
    from collections.abc import Sequence

    from memcli.messages import Message
    from memcli.store.base import SQLStore


@dataclass(frozen=True)
class Forgotten:
    """What `forget_user` deleted (or, for a dry run, would delete) of a user."""

    user: str
    sessions: list[str] = field(default_factory=list)
    messages: int = 0
    facts: int = 0
    fact_changes: int = 0
    summaries: int = 0
    block_states: int = 0
    vectors: int = 0

    @property
    def is_empty(self) -> bool:
        """Nothing of the user is stored (a mistyped name, as often as not)."""
        counts = (self.messages, self.facts, self.fact_changes, self.summaries)
        return not self.sessions and not any(counts) and not (self.block_states or self.vectors)

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "forgotten",
            "user": self.user,
            "sessions": [session_name(key) for key in self.sessions],
            "messages": self.messages,
            "facts": self.facts,
            "fact_changes": self.fact_changes,
            "summaries": self.summaries,
            "block_states": self.block_states,
            "vectors": self.vectors,
        }


def _scope_keys(user: str, sessions: Sequence[str]) -> list[str]:
    """The user's scope keys, and the keys the blocks keep their failed work under (a failed
    condensation's `condense:<scope key>`, see `store.work`)."""
    from memcli.store.work import CONDENSE, unread_key

    keys = [f"user:{user}", *(f"session:{s}" for s in sessions)]
    return [*keys, *(CONDENSE + key for key in keys), *(unread_key(s) for s in sessions)]


def _count(store: SQLStore, sql: str, ids: Sequence[Any]) -> int:
    return sum(int(row[0]) for row in store.rows_for_ids(sql, ids)) if ids else 0


def user_sessions(store: SQLStore, user: str) -> list[str]:
    rows = store.execute("SELECT id FROM sessions WHERE user_id = ? ORDER BY id", (user,))
    return [row[0] for row in rows.fetchall()]


def _fact_ids(store: SQLStore, scopes: Sequence[str], sessions: Sequence[str]) -> list[int]:
    ids = {
        row[0]
        for row in store.rows_for_ids("SELECT id FROM facts WHERE scope_key IN ({ids})", scopes)
    }
    if sessions:
        ids.update(
            row[0]
            for row in store.rows_for_ids(
                "SELECT id FROM facts WHERE session_id IN ({ids})", sessions
            )
        )
    return sorted(ids)


def survey_user(store: SQLStore, user: str) -> Forgotten:
    """What `forget_user` would delete of `user`, deleting nothing."""
    sessions = user_sessions(store, user)
    scopes = _scope_keys(user, sessions)
    facts = _fact_ids(store, scopes, sessions)
    return Forgotten(
        user=user,
        sessions=sessions,
        messages=_count(
            store, "SELECT COUNT(*) FROM messages WHERE session_id IN ({ids})", sessions
        ),
        facts=len(facts),
        fact_changes=_count(
            store, "SELECT COUNT(*) FROM fact_history WHERE fact_id IN ({ids})", facts
        ),
        summaries=_count(
            store, "SELECT COUNT(*) FROM summaries WHERE session_id IN ({ids})", sessions
        ),
        block_states=_count(
            store, "SELECT COUNT(*) FROM block_state WHERE scope_key IN ({ids})", scopes
        ),
        vectors=_count(
            store,
            "SELECT COUNT(*) FROM retrieval_vectors v JOIN messages m ON m.id = v.message_id"
            " WHERE m.session_id IN ({ids})",
            sessions,
        ),
    )


def forget_rows(store: SQLStore, user: str, sessions: Sequence[str]) -> None:
    """Inside the caller's transaction, once the user's `sessions` are deleted with their
    messages and flushes (the backend's `delete_session`): delete the rest of `user` (see the
    module docstring)."""
    scopes = _scope_keys(user, sessions)
    facts = _fact_ids(store, scopes, sessions)
    # (The triggers on sessions took block definitions and summaries; said again here, so that
    # a database whose triggers were dropped by hand is forgotten all the same.)
    store.execute_for_ids("DELETE FROM summaries WHERE session_id IN ({ids})", sessions)
    store.execute_for_ids("DELETE FROM block_definitions WHERE session_id IN ({ids})", sessions)
    store.execute_for_ids("DELETE FROM fact_topics WHERE fact_id IN ({ids})", facts)
    store.execute_for_ids("DELETE FROM fact_history WHERE fact_id IN ({ids})", facts)
    store.execute_for_ids("DELETE FROM fact_history WHERE scope_key IN ({ids})", scopes)
    store.execute_for_ids("DELETE FROM facts WHERE id IN ({ids})", facts)
    store.execute_for_ids("DELETE FROM block_state WHERE scope_key IN ({ids})", scopes)
    store.execute_for_ids("DELETE FROM block_flushes WHERE scope_key IN ({ids})", scopes)


def forget_redo(store: SQLStore, sessions: Sequence[str]) -> None:
    """Inside the caller's transaction, before the sessions' messages go: their pending
    re-embeddings."""
    store.execute_for_ids(
        "DELETE FROM retrieval_redo WHERE message_id IN"
        " (SELECT id FROM messages WHERE session_id IN ({ids}))",
        sessions,
    )


def find_message(store: SQLStore, session_id: str, message_id: int) -> Message | None:
    rows = store.rows_for_ids(
        f"SELECT {store.MESSAGE_COLUMNS} FROM messages WHERE session_id = ? AND id IN ({{ids}})",
        [message_id],
        (session_id,),
    )
    return store.message_from_row(rows[0]) if rows else None


def delete_message_rows(store: SQLStore, message: Message) -> list[int]:
    """Inside the caller's transaction: delete a stored message's row and set its flush and the
    facts naming it right (see the module docstring); return the ids of the facts changed. The
    session's counters are the caller's (the backend's `_touch`)."""
    assert message.id is not None
    store.execute("DELETE FROM retrieval_redo WHERE message_id = ?", (message.id,))
    store.execute("DELETE FROM messages WHERE id = ?", (message.id,))
    if message.flush_id is not None:
        store.execute(
            "UPDATE flushes SET messages = messages - 1, tokens = tokens - ?,"
            " first_message_id = COALESCE((SELECT MIN(id) FROM messages WHERE flush_id = ?),"
            " first_message_id),"
            " last_message_id = COALESCE((SELECT MAX(id) FROM messages WHERE flush_id = ?),"
            " last_message_id) WHERE id = ?",
            (message.tokens or 0, message.flush_id, message.flush_id, message.flush_id),
        )
    store.execute(
        "INSERT INTO deleted_sources (session_id, message_id, source_hash) VALUES (?, ?, ?)",
        (message.session_id, message.id, source_hash(message)),
    )
    changed = []
    rows = store.execute(
        "SELECT id, message_ids FROM facts WHERE message_ids IS NOT NULL AND message_ids <> '[]'"
        " AND (session_id = ? OR session_id IS NULL)",
        (message.session_id,),
    ).fetchall()
    for fact_id, text in rows:
        ids = json.loads(text)
        if isinstance(ids, list) and message.id in ids:
            kept = [i for i in ids if i != message.id]
            store.execute(
                "UPDATE facts SET message_ids = ? WHERE id = ?", (json.dumps(kept), fact_id)
            )
            changed.append(fact_id)
    return changed


# -- what a re-import skips ----------------------------------------------------------------------

#: How a source hash of a message's id in its source starts (else it is of its content).
BY_ID = "id:"
BY_CONTENT = "content:"


def source_id(message: Message) -> str | None:
    """A message's id in the source it was imported from (`metadata["source_id"]`, set by the
    format readers), if it has one."""
    value = (message.metadata or {}).get("source_id")
    return value if isinstance(value, str) and value else None


def source_hash(message: Message) -> str:
    """What is kept of a deleted message to know it again: a hash of its id in its source when
    it has one (`id:`), else of its role and content (`content:`)."""
    ident = source_id(message)
    if ident is not None:
        return BY_ID + hashlib.sha256(ident.encode()).hexdigest()
    key = json.dumps([message.role, message.content], ensure_ascii=False)
    return BY_CONTENT + hashlib.sha256(key.encode()).hexdigest()


def deleted_sources(store: SQLStore, session_id: str) -> list[tuple[int, str]]:
    """(message id, source hash) of the session's messages deleted for good, in their order."""
    rows = store.execute(
        "SELECT message_id, source_hash FROM deleted_sources WHERE session_id = ?"
        " ORDER BY message_id",
        (session_id,),
    ).fetchall()
    return [(int(row[0]), str(row[1])) for row in rows]


def deleted_source_ids(store: SQLStore, user_id: str) -> set[str]:
    """The source-id hashes (`id:`) of the messages deleted for good from any session of the
    user: a conversation imported into another session of hers does not bring them back."""
    rows = store.execute(
        "SELECT d.source_hash FROM deleted_sources d JOIN sessions s ON s.id = d.session_id"
        " WHERE s.user_id = ? AND d.source_hash LIKE ?",
        (user_id, BY_ID + "%"),
    ).fetchall()
    return {str(row[0]) for row in rows}


def forget_sources(store: SQLStore, session_id: str) -> None:
    """Inside the caller's transaction, with the session: what its deleted messages left, and
    the marks of its reading for facts (`store.work.unread_key`)."""
    from memcli.store.work import unread_key

    store.execute("DELETE FROM deleted_sources WHERE session_id = ?", (session_id,))
    store.execute("DELETE FROM block_state WHERE scope_key = ?", (unread_key(session_id),))


# -- deletes whose cleanup has not run -----------------------------------------------------------


def mark_unfinished(store: SQLStore, stamp: str) -> None:
    """Inside the delete's transaction: a cleanup is owed (see the module docstring)."""
    store.execute("INSERT INTO unfinished_deletes (created_at) VALUES (?)", (stamp,))


def unfinished_deletes(store: SQLStore) -> list[int]:
    """The ids of the deletes whose cleanup has not run yet."""
    return [int(row[0]) for row in store.execute("SELECT id FROM unfinished_deletes ORDER BY id")]


def clear_unfinished(store: SQLStore, through: int) -> None:
    """The cleanup of the deletes up to `through` is done (later ones are another's)."""
    store.execute("DELETE FROM unfinished_deletes WHERE id <= ?", (through,))

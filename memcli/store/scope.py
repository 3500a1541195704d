"""Which messages a search may see (`Scope`), and the SQL that keeps rows within it, written once
for both dialects' search index (`memcli.store.sqlite_index`, `memcli.store.pg_index`) and the
face the search calls (`memcli.store.index`). A new field of `Scope` is a new condition in
`filters` (and in `owner`, when it says whose statistics a search uses): both dialects read their
conditions from there. (What short-term memory holds, `archived_only` and `except_window`, is
also left out by its ids where that is cheaper: `index.active_ids` for the FAISS files,
`pg_index.vector_search` for pgvector.)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memcli.store.base import SQLStore


@dataclass(frozen=True)
class Scope:
    """Which messages a search may return: a user's, a session's, within a time range."""

    user_id: str | None = None
    session_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    #: Only messages that have left short-term memory (LlamaIndex's long-term memory).
    archived_only: bool = False
    #: Leave out this session's messages still in short-term memory (its own window: what a
    #: block's long-term memory adds is everything else the user said).
    except_window: str | None = None


def unix_ms(value: datetime) -> int:
    return round(value.timestamp() * 1000)


def from_ms(row: Any) -> datetime | None:
    """A time from a row whose first value is unix milliseconds (None: no time)."""
    if row is None or row[0] is None:
        return None
    return datetime.fromtimestamp(int(row[0]) / 1000, tz=UTC)


def filters(scope: Scope, time_ms: str, user: str = "s.user_id") -> tuple[str, list[Any]]:
    """SQL conditions (and their parameters) that keep `messages m` rows within the scope: the
    user in `user`, the time in `time_ms` (the dialect's expression of a message's own time,
    its `TIME_MS`); pgvector's search reads both from the vectors' copies (`v.user_id`,
    `v.at_ms`)."""
    sql = ""
    params: list[Any] = []
    if scope.user_id is not None:
        sql += f" AND {user} = ?"
        params.append(scope.user_id)
    if scope.session_id is not None:
        sql += " AND m.session_id = ?"
        params.append(scope.session_id)
    if scope.archived_only:
        sql += " AND m.status = 'archived'"
    if scope.except_window is not None:
        sql += " AND NOT (m.session_id = ? AND m.status = 'active')"
        params.append(scope.except_window)
    if scope.since is not None:
        sql += f" AND {time_ms} >= ?"
        params.append(unix_ms(scope.since))
    if scope.until is not None:
        sql += f" AND {time_ms} < ?"
        params.append(unix_ms(scope.until))
    return sql, params


def messages_in(scope: Scope, time_ms: str) -> tuple[str, list[Any]]:
    """The FROM and WHERE clauses (and their parameters) of the messages in scope, as `m` (joined
    to their sessions, as `s`, for a user's)."""
    where, params = filters(scope, time_ms)
    join = " JOIN sessions s ON s.id = m.session_id" if scope.user_id is not None else ""
    return f" FROM messages m{join} WHERE TRUE{where}", params


def owner(scope: Scope) -> Scope | None:
    """The scope whose statistics a search of `scope` uses: its user's messages, or its
    session's (whatever its time range or status); None for the whole store."""
    if scope.user_id is None and scope.session_id is None:
        return None
    return Scope(user_id=scope.user_id, session_id=scope.session_id)


def scope_size(store: SQLStore, scope: Scope | None, counted: str = "all") -> int:
    """How many messages the user or session of `scope` holds (the sessions' counters), or the
    store (None): BM25's document count. `counted`: "all", or only those in short-term memory
    ("active") or out of it ("archived")."""
    column = {
        "all": "active_messages + archived_messages",
        "active": "active_messages",
        "archived": "archived_messages",
    }[counted]
    where, params = "", []
    if scope is not None and scope.user_id is not None:
        where += " AND user_id = ?"
        params.append(scope.user_id)
    if scope is not None and scope.session_id is not None:
        where += " AND id = ?"
        params.append(scope.session_id)
    row = store.execute(
        f"SELECT COALESCE(SUM({column}), 0) FROM sessions WHERE TRUE{where}", params
    ).fetchone()
    return int(row[0])

"""The search index as the search (`memcli.search`) calls it: one face over each dialect's own
index, chosen once by the store's `dialect` (`_dialect`): SQLite's FTS5 table
(`memcli.store.sqlite_index`), PostgreSQL's text search and pgvector (`memcli.store.pg_index`).
Here too, the SQL that is the same on both: the messages a scope's window holds, hits, spans,
speakers' names. (Which messages a search may see, and their conditions: `memcli.store.scope`;
BM25's parameters: `memcli.store.bm25`; the message vectors, which messages wait for theirs and
the embedding claims: `memcli.store.vectors`.)

A put pays nothing here: new messages reach the full-text index before the next search
(`catch_up`; PostgreSQL indexes each as it is stored), and their vectors later, in batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from memcli.fold import fold
from memcli.messages import parse_time
from memcli.store import pg_index, sqlite_index
from memcli.store.bm25 import RANKED_MAX
from memcli.store.scope import Scope, owner, scope_size, unix_ms

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from datetime import datetime

    import numpy as np

    from memcli.store.base import SQLStore

__all__ = [
    "MessageRow",
    "Scope",
    "active_ids",
    "catch_up",
    "fts_behind",
    "fts_through",
    "has_pgvector",
    "latest_time",
    "lexical_search",
    "message_names",
    "message_rows",
    "message_time_ms",
    "owner",
    "scope_size",
    "session_span",
    "speaker_names",
    "term_counts",
    "unix_ms",
    "vector_search",
]


class _Dialect(Protocol):
    """What each dialect's index module holds (the functions are documented there)."""

    #: A message's time in unix milliseconds (`messages m`): its timestamp, else when it was
    #: stored.
    TIME_MS: str
    #: The join that keeps its left table outside.
    JOIN_IN_ORDER: str

    def has_pgvector(self, store: SQLStore) -> bool: ...
    def catch_up(self, store: SQLStore) -> int: ...
    def fts_behind(self, store: SQLStore) -> int: ...
    def fts_through(self, store: SQLStore) -> int: ...
    def term_counts(
        self, store: SQLStore, terms: Sequence[str], cap: int, scope: Scope
    ) -> dict[str, int]: ...
    def lexical_search(
        self,
        store: SQLStore,
        terms: Sequence[str],
        scope: Scope,
        limit: int,
        recent: int | None,
        counts: Mapping[str, int],
        size: int,
    ) -> list[tuple[int, float]]: ...
    def latest_time(self, store: SQLStore, scope: Scope) -> datetime | None: ...
    def vector_search(
        self, store: SQLStore, model: str, vector: np.ndarray, scope: Scope, n: int
    ) -> list[tuple[int, float]]: ...


#: Each dialect's index, by the store's `dialect`.
_DIALECTS: dict[str, _Dialect] = {"sqlite": sqlite_index, "postgresql": pg_index}


def _dialect(store: SQLStore) -> _Dialect:
    return _DIALECTS[store.dialect]


def has_pgvector(store: SQLStore) -> bool:
    """Whether the database searches its vectors itself (PostgreSQL with pgvector)."""
    return _dialect(store).has_pgvector(store)


def catch_up(store: SQLStore) -> int:
    """Add the messages stored since the last call to the full-text index; return how many.
    A search must not wait for a writer, nor fail on a read-only database: what cannot be added
    now is searched all the same (SQLite: `sqlite_index.catch_up`; PostgreSQL indexes each
    message as it is stored: nothing to do)."""
    return _dialect(store).catch_up(store)


def fts_behind(store: SQLStore) -> int:
    """How many messages the next `catch_up` adds to the full-text index (0 on PostgreSQL)."""
    return _dialect(store).fts_behind(store)


def fts_through(store: SQLStore) -> int:
    """The highest message id up to which every message is in the full-text index."""
    return _dialect(store).fts_through(store)


def message_time_ms(store: SQLStore) -> str:
    """SQL of a message's time in unix milliseconds (`messages m`): its own timestamp, else when
    it was stored."""
    return _dialect(store).TIME_MS


def term_counts(
    store: SQLStore, terms: Sequence[str], cap: int, scope: Scope | None = None
) -> dict[str, int]:
    """In how many messages of the user or session of `scope` (`owner`; None: the store) each
    term occurs, counted up to cap + 1 (so it stays cheap)."""
    within = owner(scope) if scope is not None else None
    folded = {term: fold(term) for term in terms}  # the index holds the messages folded
    counts = _dialect(store).term_counts(
        store, list(dict.fromkeys(folded.values())), cap, within or Scope()
    )
    return {term: counts[f] for term, f in folded.items()}


def lexical_search(
    store: SQLStore,
    terms: Sequence[str],
    scope: Scope,
    limit: int,
    recent: int | None = None,
    counts: Mapping[str, int] | None = None,
) -> list[tuple[int, float]]:
    """(message id, BM25 score: higher is better) of the best `limit` messages in scope holding
    any of the terms; with `recent`, only their `recent` most recent matches in scope are ranked
    (a cost bounded by `recent`, whatever the term). BM25's statistics are those of the scope's
    user or session (`owner`): its number of messages, `counts` (in how many of its messages
    each term occurs, as `term_counts` gives them), and the mean length of the matches, so
    that what other users store changes nothing. How each dialect finds and scores the
    matches: `sqlite_index.lexical_search`, `pg_index.lexical_search`."""
    if not terms:
        return []
    counts = counts if counts is not None else term_counts(store, terms, RANKED_MAX, scope)
    size = scope_size(store, owner(scope))
    # The index holds the messages folded (`memcli.fold`): so are the terms.
    folded = {fold(t): counts.get(t, 0) for t in terms}
    return _dialect(store).lexical_search(store, list(folded), scope, limit, recent, folded, size)


def latest_time(store: SQLStore, scope: Scope) -> datetime | None:
    """The latest message's time in scope (its timestamp, else when it was stored), or None."""
    return _dialect(store).latest_time(store, scope)


def vector_search(
    store: SQLStore, model: str, vector: np.ndarray, scope: Scope, n: int
) -> list[tuple[int, float]]:
    """(message id, cosine) of the best `n` messages in scope, each once, best first, through
    the database's own vector search (a database where `has_pgvector`)."""
    return _dialect(store).vector_search(store, model, vector, scope, n)


# -- hits ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MessageRow:
    """A message as a hit shows it."""

    id: int
    session_id: str
    seq: int
    role: str
    name: str | None
    content: str
    tokens: int
    timestamp: datetime | None
    status: str


_ROW = "id, session_id, seq, role, name, content, tokens, timestamp, status"


def _row(r: tuple[Any, ...]) -> MessageRow:
    return MessageRow(
        id=r[0],
        session_id=r[1],
        seq=r[2],
        role=r[3],
        name=r[4],
        content=r[5],
        tokens=r[6],
        timestamp=parse_time(r[7]) if r[7] else None,
        status=r[8],
    )


def active_ids(store: SQLStore, scope: Scope) -> set[int]:
    """The messages still in short-term memory that the scope leaves out: with `except_window`,
    that session's; with `archived_only`, those of the scope's user or session (each session's
    window, found through its index: a few per session, whatever the archive holds)."""
    if not scope.archived_only:
        if scope.except_window is None:
            return set()
        scope = Scope(session_id=scope.except_window, archived_only=True)
    if scope.session_id is not None:
        rows = store.execute(
            "SELECT id FROM messages WHERE session_id = ? AND status = 'active'",
            (scope.session_id,),
        )
    elif scope.user_id is not None:
        rows = store.execute(
            "SELECT m.id FROM sessions s JOIN messages m ON m.session_id = s.id"
            " AND m.status = 'active' WHERE s.user_id = ?",
            (scope.user_id,),
        )
    else:
        # Sessions outside: one index search each, not a scan of every message.
        join = _dialect(store).JOIN_IN_ORDER
        rows = store.execute(
            f"SELECT m.id FROM sessions s {join} messages m ON m.session_id = s.id"
            " AND m.status = 'active'"
        )
    return {int(r[0]) for r in rows}


def message_rows(store: SQLStore, ids: Sequence[int]) -> dict[int, MessageRow]:
    rows = store.rows_for_ids(f"SELECT {_ROW} FROM messages WHERE id IN ({{ids}})", list(ids))
    return {r[0]: _row(r) for r in rows}


def message_names(store: SQLStore, ids: Sequence[int]) -> dict[int, str]:
    """Each message's speaker's name, lowercase ("" when it has none)."""
    rows = store.rows_for_ids("SELECT id, name FROM messages WHERE id IN ({ids})", list(ids))
    return {int(i): (name or "").lower() for i, name in rows}


def speaker_names(store: SQLStore, ids: Sequence[int]) -> set[str]:
    """The names (lowercase) of the speakers of the messages `ids` (which words of a query name
    them: `memcli.search.speakers`)."""
    return {name for name in message_names(store, ids).values() if name} if ids else set()


def session_span(store: SQLStore, session_id: str, first: int, last: int) -> list[MessageRow]:
    """A session's messages with seq in [first, last], in order."""
    rows = store.execute(
        f"SELECT {_ROW} FROM messages WHERE session_id = ? AND seq BETWEEN ? AND ? ORDER BY seq",
        (session_id, first, last),
    )
    return [_row(r) for r in rows]

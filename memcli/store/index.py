"""SQL of the search index over every message: the FTS5 table and the scoped queries the search
(`memcli.search`) runs. (The message vectors, which messages wait for theirs and the embedding
claims: `memcli.store.vectors`.)

A put pays nothing here: new messages reach the full-text index in one statement before the next
search (`catch_up`), and their vectors later, in batches. `retrieval_state` records how far the
full-text index has got (the highest message id up to which every message is indexed); triggers
take deleted or changed messages out of it. (The tables: migration 10, `memcli.store.migrations`.)

On PostgreSQL (a store whose `dialect` is "postgresql"), the full-text search and, with pgvector,
the vector search are PostgreSQL's own (`memcli.store.pg_index`, called from here); the
other statements are the same on both backends.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from memcli.errors import StoreBusy, StoreDamaged
from memcli.messages import parse_time
from memcli.store.migrations import FTS_TOKENIZER, TIME_MS

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    import numpy as np

    from memcli.store.base import SQLStore


def has_pgvector(store: SQLStore) -> bool:
    """Whether the database searches its vectors itself (PostgreSQL with pgvector)."""
    if store.dialect != "postgresql":
        return False
    from memcli.store import pg_index

    return pg_index.has_pgvector(store)


def catch_up(store: SQLStore) -> int:
    """Add the messages stored since the last call to the full-text index; return how many.

    A search must not wait for a writer, nor fail on a read-only database: when another process
    holds the write lock (or the file cannot be written, or is damaged), nothing is added here, and
    `lexical_search` scans the messages not yet indexed itself (`_tail`). (PostgreSQL indexes
    each message as it is stored: nothing to do.)"""
    if store.dialect == "postgresql":
        return 0
    row = store.execute(
        "SELECT (SELECT COALESCE(MAX(id), 0) FROM messages), COALESCE((SELECT CAST(value AS"
        " INTEGER) FROM retrieval_state WHERE key = 'fts_through'), 0)"
    ).fetchone()
    if row[0] <= row[1]:
        return 0
    try:
        return _catch_up(store)
    except (StoreBusy, StoreDamaged):  # a damaged file is read, never written
        return 0


def fts_behind(store: SQLStore) -> int:
    """How many messages the next `catch_up` adds to the full-text index (0 on PostgreSQL)."""
    if store.dialect == "postgresql":
        return 0
    row = store.execute(
        "SELECT COUNT(*) FROM messages WHERE id > COALESCE((SELECT CAST(value AS INTEGER)"
        " FROM retrieval_state WHERE key = 'fts_through'), 0)"
    ).fetchone()
    return int(row[0])


def _catch_up(store: SQLStore) -> int:
    with store.transaction(wait=False):
        top, mark = store.execute(
            "SELECT (SELECT COALESCE(MAX(id), 0) FROM messages), COALESCE((SELECT CAST(value AS"
            " INTEGER) FROM retrieval_state WHERE key = 'fts_through'), 0)"
        ).fetchone()
        if top <= mark:
            return 0
        count = store.execute(
            "INSERT INTO retrieval_fts (rowid, name, content)"
            " SELECT id, name, content FROM messages WHERE id > ? AND id <= ?",
            (mark, top),
        ).rowcount
        store.execute(
            "INSERT INTO retrieval_state (key, value) VALUES ('fts_through', ?)"
            " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (str(top),),
        )
    return int(count)


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


#: A message's time in unix milliseconds: its own timestamp, else when it was stored.
_TIME_MS = TIME_MS.format(m="m.")


def message_time_ms(store: SQLStore) -> str:
    if store.dialect == "postgresql":
        from memcli.store.pg_migrations import TIME_MS

        return TIME_MS
    return _TIME_MS


def unix_ms(value: datetime) -> int:
    return round(value.timestamp() * 1000)


def _filters(
    store: SQLStore, scope: Scope, user: str = "s.user_id", time_ms: str | None = None
) -> tuple[str, list[Any]]:
    """SQL conditions (and their parameters) that keep `messages m` rows within the scope: the
    user in `user`, the time in `time_ms` (by default the message's own, `message_time_ms`); pgvector's
    search reads both from the vectors' copies (`v.user_id`, `v.at_ms`)."""
    time_ms = time_ms or message_time_ms(store)
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


def _pg_filters(store: SQLStore, scope: Scope) -> tuple[str, list[Any], str | None]:
    """`_filters` for the full-text search of `messages m` on PostgreSQL, with no join, and the
    scope's user apart: the text query itself asks for the user's messages (each message's
    tsvector holds its user's lexeme, `pg_migrations.USER_LEXEME`), so that the text index
    intersects a word's messages with the user's (a common word of a 100,000-message user in a
    1,000,000-message store: 7 ms), where a filter on the user's sessions built the bitmap of
    every message of the user for each word (24 ms) and a join to `sessions` read every user's
    matches (580 ms)."""
    where, params = _filters(store, dataclasses.replace(scope, user_id=None))
    return where, params, scope.user_id


def fts_through(store: SQLStore) -> int:
    """The highest message id up to which every message is in the full-text index."""
    if store.dialect == "postgresql":
        return int(store.execute("SELECT COALESCE(MAX(id), 0) FROM messages").fetchone()[0])
    row = store.execute(
        "SELECT COALESCE((SELECT CAST(value AS INTEGER) FROM retrieval_state"
        " WHERE key = 'fts_through'), 0)"
    ).fetchone()
    return int(row[0])


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


def term_counts(
    store: SQLStore, terms: Sequence[str], cap: int, scope: Scope | None = None
) -> dict[str, int]:
    """In how many messages of the user or session of `scope` (`owner`; None: the store) each
    term occurs, counted up to cap + 1 (so it stays cheap)."""
    scope = owner(scope) if scope is not None else None
    if store.dialect == "postgresql":
        from memcli.store import pg_index

        return pg_index.term_counts(store, terms, cap, _pg_filters(store, scope or Scope()))
    join, where, params = _fts_scope(store, scope or Scope())
    sql = f"SELECT 1 FROM retrieval_fts f{join} WHERE retrieval_fts MATCH ?{where} LIMIT ?"
    counts = {}
    for term in terms:
        row = store.execute(f"SELECT COUNT(*) FROM ({sql})", (f'"{term}"', *params, cap + 1))
        counts[term] = int(row.fetchone()[0])
    return counts


def _fts_scope(store: SQLStore, scope: Scope) -> tuple[str, str, list[Any]]:
    """The joins, conditions and parameters that keep the rows of a full-text index (as `f`)
    within the scope (SQLite). A user's messages are looked up in a temporary table of
    their ids (`_user_ids`): a probe of a small table in memory per match, where reading each
    match's message and session would cost several times more."""
    join = user = ""
    params: list[Any] = []
    if scope.user_id is not None:
        _user_ids(store, scope.user_id)
        # CROSS JOIN: the matches outside (SQLite's planner may otherwise walk every id of
        # the user, one full-text query each).
        join = " CROSS JOIN temp.retrieval_user_ids u ON u.id = f.rowid"
        user = " AND u.user_id = ?"
        params.append(scope.user_id)
        scope = dataclasses.replace(scope, user_id=None)
    where, more = _filters(store, scope)
    if where:
        join += " CROSS JOIN messages m ON m.id = f.rowid"
    return join, user + where, params + more


def _user_ids(store: SQLStore, user_id: str) -> None:
    """Bring the connection's temporary table of the user's message ids up to date: the
    messages stored since it was last read are added (deleted ones may stay: they are in no
    index any more, so no match finds them)."""
    store.execute(
        "CREATE TEMP TABLE IF NOT EXISTS retrieval_user_ids (user_id TEXT NOT NULL, id INTEGER"
        " NOT NULL, PRIMARY KEY (user_id, id)) WITHOUT ROWID"
    )
    store.execute(
        "CREATE TEMP TABLE IF NOT EXISTS retrieval_user_through (user_id TEXT PRIMARY KEY,"
        " through INTEGER NOT NULL)"
    )
    top, through = store.execute(
        "SELECT (SELECT COALESCE(MAX(id), 0) FROM messages), COALESCE((SELECT through FROM"
        " temp.retrieval_user_through WHERE user_id = ?), 0)",
        (user_id,),
    ).fetchone()
    if top <= through:
        return
    store.execute(
        "INSERT OR IGNORE INTO temp.retrieval_user_ids (user_id, id) SELECT s.user_id, m.id"
        " FROM messages m JOIN sessions s ON s.id = m.session_id"
        " WHERE s.user_id = ? AND m.id > ? AND m.id <= ?",
        (user_id, through, top),
    )
    store.execute(
        "INSERT INTO temp.retrieval_user_through (user_id, through) VALUES (?, ?)"
        " ON CONFLICT (user_id) DO UPDATE SET through = excluded.through",
        (user_id, top),
    )


def fts_match(terms: Sequence[str]) -> str | None:
    """Terms as an FTS5 query: any of them (each quoted: a phrase of its words)."""
    if not terms:
        return None
    return " OR ".join('"{}"'.format(t.replace('"', '""')) for t in terms)


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
    that what other users store changes nothing.

    SQLite: messages not yet in the full-text index (`catch_up` could not write) are searched
    too, in a temporary index of them alone (`_tail`). Each match's term frequencies come from
    FTS5's `highlight` of it and its length from FTS5's docsize table (`_matches`), so ranking
    costs a read of the matches, not a new index of them (`_bm25`). PostgreSQL:
    `memcli.store.pg_index`."""
    if not terms:
        return []
    counts = counts if counts is not None else term_counts(store, terms, RANKED_MAX, scope)
    size = scope_size(store, owner(scope))
    if store.dialect == "postgresql":
        from memcli.store import pg_index

        where = _pg_filters(store, scope)
        return pg_index.lexical_search(store, terms, where, limit, recent, counts, size)
    match = fts_match(terms)
    if match is None:
        return []
    found = _matches(store, "retrieval_fts", match, scope, recent)
    if _tail(store):
        found = {**found, **_matches(store, "retrieval_tail", match, scope, recent)}
        if recent is not None:
            found = {i: found[i] for i in sorted(found)[-recent:]}
    return _bm25(store, found, terms, counts, size)[:limit]


#: The most matches BM25 ranks without a `recent` bound (the retriever's term choice keeps
#: them under its budget); BM25's parameters (FTS5's).
RANKED_MAX, K1, B = 20_000, 1.2, 0.75
#: What `highlight` puts around each match (characters no message is expected to hold).
_OPEN, _CLOSE = "\ue000", "\ue001"


def _matches(
    store: SQLStore, fts: str, match: str, scope: Scope, recent: int | None
) -> dict[int, tuple[list[str], int]]:
    """The messages in scope that match, each with the words that matched (FTS5's `highlight`
    of both columns: every occurrence of a term, as written) and its length in tokens (FTS5's
    own count, from its docsize table): the `recent` newest of them (FTS5 walks its lists by
    rowid, newest first here), else up to RANKED_MAX."""
    import re

    join, where, params = _fts_scope(store, scope)
    marks = f"'{_OPEN}', '{_CLOSE}'"
    sql = (
        f"SELECT f.rowid, highlight({fts}, 0, {marks}), highlight({fts}, 1, {marks}), d.sz"
        f" FROM {fts} f{join} CROSS JOIN {fts}_docsize d ON d.id = f.rowid"
        f" WHERE {fts} MATCH ?{where} ORDER BY f.rowid DESC LIMIT ?"
    )
    spans = re.compile(f"{_OPEN}(.*?){_CLOSE}", re.S)
    found = {}
    for rowid, name, content, size in store.execute(sql, (match, *params, recent or RANKED_MAX)):
        words = spans.findall(name or "") + spans.findall(content or "")
        found[int(rowid)] = (words, _tokens(size))
    return found


def _tokens(size: bytes | None) -> int:
    """A document's tokens, all columns: the sum of the varints of FTS5's docsize record."""
    total = value = 0
    for byte in size or b"":
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            total, value = total + value, 0
    return total


#: The tokens (FTS5's stems, in order) of words and terms already tokenized, kept for the next
#: searches (the tokenizer never changes); emptied when it holds more than STEMS_MAX.
_STEMS: dict[str, tuple[str, ...]] = {}
STEMS_MAX = 100_000


def _stems(store: SQLStore, texts: set[str]) -> dict[str, tuple[str, ...]]:
    """Each text's tokens as the full-text index reads them (FTS5's tokenizer, through a
    temporary index of the texts not seen before). The connection's temporary index is filled
    and read under the store's lock, so that two threads' searches never read each other's."""
    found = {t: _STEMS[t] for t in texts if t in _STEMS}
    missing = sorted(texts - found.keys())
    if not missing:
        return found
    with store.lock:
        store.execute(
            "CREATE VIRTUAL TABLE IF NOT EXISTS temp.retrieval_words USING fts5(content,"
            f" tokenize='{FTS_TOKENIZER}')"
        )
        store.execute(
            "CREATE VIRTUAL TABLE IF NOT EXISTS temp.retrieval_words_vocab"
            " USING fts5vocab('temp', 'retrieval_words', 'instance')"
        )
        store.execute("DELETE FROM temp.retrieval_words")
        store.executemany(
            "INSERT INTO temp.retrieval_words (rowid, content) VALUES (?, ?)",
            [(i + 1, text) for i, text in enumerate(missing)],
        )
        rows = store.execute("SELECT doc, offset, term FROM temp.retrieval_words_vocab").fetchall()
    tokens: dict[int, list[tuple[int, str]]] = {}
    for doc, offset, stem in rows:
        tokens.setdefault(int(doc), []).append((int(offset), str(stem)))
    if len(_STEMS) + len(missing) > STEMS_MAX:
        _STEMS.clear()
    for i, text in enumerate(missing):
        found[text] = _STEMS[text] = tuple(stem for _, stem in sorted(tokens.get(i + 1, [])))
    return found


def _bm25(
    store: SQLStore,
    found: Mapping[int, tuple[list[str], int]],
    terms: Sequence[str],
    counts: Mapping[str, int],
    size: int,
) -> list[tuple[int, float]]:
    """(id, BM25 score) of these messages (`_matches`), best first (ties: in id order, as
    FTS5's): each term's frequency in a message (the occurrences of its tokens among the words
    that matched), the message's length in tokens, its IDF from `counts` and `size` (the
    scope's), lengths against their mean over these messages."""
    import math

    if not found:
        return []
    stems = _stems(store, {w for words, _ in found.values() for w in words} | set(terms))
    mean = max(sum(length for _, length in found.values()) / len(found), 1.0)
    idf = []
    for term in terms:
        count = counts.get(term, 0)
        total = max(size, count)
        idf.append(max(math.log((total - count + 0.5) / (count + 0.5)), 1e-6))
    wanted = [(t, stems[term]) for t, term in enumerate(terms) if stems[term]]
    scores: dict[int, float] = {}
    for doc, (words, length) in found.items():
        tfs = [0] * len(terms)
        for word in words:
            tokens = stems[word]
            for t, phrase in wanted:
                width = len(phrase)
                tfs[t] += sum(
                    tokens[at : at + width] == phrase for at in range(len(tokens) - width + 1)
                )
        norm = K1 * (1 - B + B * length / mean)
        score = sum(idf[t] * tf * (K1 + 1) / (tf + norm) for t, tf in enumerate(tfs) if tf)
        if score:
            scores[doc] = score
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))


def _tail(store: SQLStore) -> bool:
    """Bring the connection's temporary full-text index of the messages past `fts_through` up to
    date; False when there are none (the usual case: `catch_up` indexed them)."""
    top = store.execute("SELECT COALESCE(MAX(id), 0) FROM messages").fetchone()[0]
    mark = fts_through(store)
    if top <= mark:
        return False
    store.execute(
        "CREATE VIRTUAL TABLE IF NOT EXISTS temp.retrieval_tail USING fts5(name, content,"
        f" tokenize='{FTS_TOKENIZER}')"
    )
    store.execute("DELETE FROM temp.retrieval_tail WHERE rowid <= ?", (mark,))
    store.execute(
        "INSERT INTO temp.retrieval_tail (rowid, name, content) SELECT id, name, content"
        " FROM messages WHERE id > MAX(?, (SELECT COALESCE(MAX(rowid), 0) FROM temp.retrieval_tail))",
        (mark,),
    )
    return True


def count_messages(store: SQLStore, scope: Scope, cap: int | None = None) -> int:
    """How many messages are in scope (with `cap`, counted up to it: a bounded cost)."""
    where, params = _filters(store, scope)
    join = " JOIN sessions s ON s.id = m.session_id" if scope.user_id is not None else ""
    sql = f"SELECT 1 FROM messages m{join} WHERE TRUE{where}"
    if cap is not None:
        sql += " LIMIT ?"
        params.append(cap)
    row = store.execute(f"SELECT COUNT(*) FROM ({sql}) AS t", params).fetchone()
    return int(row[0])


def latest_time(store: SQLStore, scope: Scope) -> datetime | None:
    """The latest message's time in scope (its timestamp, else when it was stored), or None.
    SQLite: a user's or a session's, whatever its messages, from the index of the messages'
    times per session (`migrations.TIME_MS`), the latest entry of each of its sessions."""
    if store.dialect == "sqlite" and scope == Scope(scope.user_id, scope.session_id):
        per_session = f"(SELECT MAX({_TIME_MS}) FROM messages m WHERE m.session_id = s.id)"
        where, params = "", []
        for column, value in (("s.user_id", scope.user_id), ("s.id", scope.session_id)):
            if value is not None:
                where += f" AND {column} = ?"
                params.append(value)
        row = store.execute(
            f"SELECT MAX({per_session}) FROM sessions s WHERE TRUE{where}", params
        ).fetchone()
        return _from_ms(row)
    where, params = _filters(store, scope)
    join = " JOIN sessions s ON s.id = m.session_id" if scope.user_id is not None else ""
    sql = f"SELECT MAX({message_time_ms(store)}) FROM messages m{join} WHERE TRUE{where}"
    if (
        store.dialect == "postgresql"
        and scope.session_id is None
        and not scope.archived_only
        and scope.except_window is None
    ):
        from memcli.store import pg_index

        if pg_index.has_pgvector(store):
            # The vectors' copies of their messages' times answer through an index, where the
            # messages' would be read one by one; the messages not embedded yet are read.
            vectors = _filters(store, scope, "v.user_id", "v.at_ms")
            return pg_index.latest_time(store, vectors, sql, params, scope.user_id)
    return _from_ms(store.execute(sql, params).fetchone())


def _from_ms(row: Any) -> datetime | None:
    """A time from a row whose first value is unix milliseconds (None: no time)."""
    if row is None or row[0] is None:
        return None
    return datetime.fromtimestamp(int(row[0]) / 1000, tz=UTC)


def vector_search(
    store: SQLStore, model: str, vector: np.ndarray, scope: Scope, n: int
) -> list[tuple[int, float]]:
    """(message id, cosine) of the best `n` messages in scope through pgvector (a database where
    `has_pgvector`), each once, best first."""
    from memcli.store import pg_index

    # The user and the time from the vectors' own copies; the session and the status from
    # their messages. What short-term memory holds (a session's window left out, `except_window`;
    # every window left out, `archived_only`, which takes the session's window with the rest) is
    # left out by its ids, read once, when they are few: joining every vector to its message
    # keeps the planner from the HNSW index (a 100,000-message user: 151-169 ms a search,
    # against 27 without).
    user = Scope(user_id=scope.user_id)
    plain = dataclasses.replace(scope, except_window=None, archived_only=False)
    # A user's size from the sessions' counters (the window left out is a few hundred messages
    # at most: close enough to choose between the index and exact search).
    size = None
    if scope.user_id is not None and plain == user:
        size = scope_size(store, user, "archived" if scope.archived_only else "all")
    if scope.session_id is not None or (
        scope.archived_only and scope_size(store, user, "active") > ACTIVE_IDS_MAX
    ):
        join = " JOIN messages m ON m.id = v.message_id"
        where = (join, *_filters(store, scope, "v.user_id", "v.at_ms"))
        return pg_index.vector_search(store, model, vector, scope, where, n, size)
    filters, params = _filters(store, plain, "v.user_id", "v.at_ms")
    active = " FROM messages m WHERE m.status = 'active' AND m.session_id"
    if scope.archived_only:
        owner = "" if scope.user_id is None else " WHERE user_id = ?"
        filters += (
            f" AND v.message_id NOT IN (SELECT m.id{active} IN (SELECT id FROM sessions{owner}))"
        )
        params += [] if scope.user_id is None else [scope.user_id]
    elif scope.except_window is not None:
        filters += f" AND v.message_id NOT IN (SELECT m.id{active} = ?)"
        params.append(scope.except_window)
    return pg_index.vector_search(store, model, vector, scope, ("", filters, params), n, size)


#: Up to this many messages in short-term memory (of the user, or of the store), a search of
#: archived messages leaves them out by their ids (see `vector_search`).
ACTIVE_IDS_MAX = 20_000


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
        # CROSS JOIN keeps sessions outside: one index search each, not a scan of every message
        # (SQLite's planner; PostgreSQL's finds that itself, and knows no CROSS JOIN ... ON).
        join = "JOIN" if store.dialect == "postgresql" else "CROSS JOIN"
        rows = store.execute(
            f"SELECT m.id FROM sessions s {join} messages m ON m.session_id = s.id"
            " AND m.status = 'active'"
        )
    return {int(r[0]) for r in rows}


def message_rows(store: SQLStore, ids: Sequence[int]) -> dict[int, MessageRow]:
    rows = store.rows_for_ids(f"SELECT {_ROW} FROM messages WHERE id IN ({{ids}})", list(ids))
    return {r[0]: _row(r) for r in rows}


def spoken_by(store: SQLStore, ids: Sequence[int], words: set[str]) -> list[int]:
    """The messages of `ids` (in that order) whose speaker's name is among `words` (lowercase):
    the whole name, or one of its words of three letters or more ("Ana" of "Ana Lopez")."""
    if not words or not ids:
        return []
    names = _names(store, ids)
    return [item for item in ids if _name_words(names.get(item, ""), words)]


def speaker_names(store: SQLStore, ids: Sequence[int]) -> set[str]:
    """The names (lowercase) of the speakers of the messages `ids` (see `naming_words`)."""
    return {name for name in _names(store, ids).values() if name} if ids else set()


def naming_words(names: Iterable[str], words: set[str]) -> set[str]:
    """The words of `words` (lowercase) that name one of `names` (lowercase), as `spoken_by`
    reads names."""
    out: set[str] = set()
    for name in names:
        out |= _name_words(name, words)
    return out


def _names(store: SQLStore, ids: Sequence[int]) -> dict[int, str]:
    rows = store.rows_for_ids("SELECT id, name FROM messages WHERE id IN ({ids})", list(ids))
    return {int(i): (name or "").lower() for i, name in rows}


def _name_words(name: str, words: set[str]) -> set[str]:
    """The words of `words` that name `name` (lowercase): the whole name, or its words of three
    letters or more."""
    if not name:
        return set()
    return ({name} & words) | {w for w in name.split() if len(w) >= 3 and w in words}


def session_span(store: SQLStore, session_id: str, first: int, last: int) -> list[MessageRow]:
    """A session's messages with seq in [first, last], in order."""
    rows = store.execute(
        f"SELECT {_ROW} FROM messages WHERE session_id = ? AND seq BETWEEN ? AND ? ORDER BY seq",
        (session_id, first, last),
    )
    return [_row(r) for r in rows]

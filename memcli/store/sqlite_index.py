"""SQLite's search index: the FTS5 table of every message and the scoped queries on it, behind
`memcli.store.index` (which calls these for a store whose `dialect` is "sqlite").

A put pays nothing here: new messages reach the full-text index in one statement before the next
search (`catch_up`). `retrieval_state` records how far the full-text index has got (the highest
message id up to which every message is indexed); triggers take deleted or changed messages out
of it. (The tables: migration 10, `memcli.store.migrations`; from 27 the index reads the messages
folded, through the view FOLDED: the terms come folded too, `memcli.fold`, so that accents and
letters such as ø or ß compare by one rule.) Messages the index has not reached
(`catch_up` could not write) are searched in a temporary index of their own (`_tail`). BM25 is
computed here over FTS5's matches (`_bm25`), as FTS5's `bm25()` would within the whole table, but
with the statistics of the scope's user or session. The vectors are searched in the index files
(`memcli.search.dense`), not in SQL.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from memcli.errors import StoreBusy, StoreDamaged, StoreError
from memcli.store.bm25 import K1, RANKED_MAX, B, idf
from memcli.store.migrations import FOLDED, FTS_TOKENIZER
from memcli.store.migrations import TIME_MS as _INDEXED_TIME_MS
from memcli.store.scope import Scope, filters, from_ms, messages_in

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from datetime import datetime

    import numpy as np

    from memcli.store.base import SQLStore

#: A message's time in unix milliseconds (`messages m`): its own timestamp, else when it was
#: stored.
TIME_MS = _INDEXED_TIME_MS.format(m="m.")
#: The join that keeps its left table outside (SQLite's planner may otherwise turn it around).
JOIN_IN_ORDER = "CROSS JOIN"


def has_pgvector(store: SQLStore) -> bool:
    """SQLite searches no vectors itself: the index files do (`memcli.search.dense`)."""
    return False


def vector_search(
    store: SQLStore, model: str, vector: np.ndarray, scope: Scope, n: int
) -> list[tuple[int, float]]:
    """SQLite has no vector search of its own (`has_pgvector` is False): its vectors are
    searched in the index files (`memcli.search.dense.MessageVectors`)."""
    raise StoreError("a SQLite database searches its vectors in the index files, not in SQL")


#: The last message's id, and the highest up to which every message is in the full-text index.
_LAST_AND_MARK = (
    "SELECT (SELECT COALESCE(MAX(id), 0) FROM messages), COALESCE((SELECT CAST(value AS"
    " INTEGER) FROM retrieval_state WHERE key = 'fts_through'), 0)"
)


def catch_up(store: SQLStore) -> int:
    """Add the messages stored since the last call to the full-text index; return how many.

    A search must not wait for a writer, nor fail on a read-only database: when another process
    holds the write lock (or the file cannot be written, or is damaged), nothing is added here, and
    `lexical_search` scans the messages not yet indexed itself (`_tail`)."""
    row = store.execute(_LAST_AND_MARK).fetchone()
    if row[0] <= row[1]:
        return 0
    try:
        return _catch_up(store)
    except (StoreBusy, StoreDamaged):  # a damaged file is read, never written
        return 0


def fts_behind(store: SQLStore) -> int:
    """How many messages the next `catch_up` adds to the full-text index."""
    row = store.execute(
        "SELECT COUNT(*) FROM messages WHERE id > COALESCE((SELECT CAST(value AS INTEGER)"
        " FROM retrieval_state WHERE key = 'fts_through'), 0)"
    ).fetchone()
    return int(row[0])


def _catch_up(store: SQLStore) -> int:
    with store.transaction(wait=False):
        top, mark = store.execute(_LAST_AND_MARK).fetchone()
        if top <= mark:
            return 0
        count = store.execute(
            "INSERT INTO retrieval_fts (rowid, name, content)"
            f" SELECT id, name, content FROM {FOLDED} WHERE id > ? AND id <= ?",
            (mark, top),
        ).rowcount
        store.execute(
            "INSERT INTO retrieval_state (key, value) VALUES ('fts_through', ?)"
            " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (str(top),),
        )
    return int(count)


def fts_through(store: SQLStore) -> int:
    """The highest message id up to which every message is in the full-text index."""
    row = store.execute(
        "SELECT COALESCE((SELECT CAST(value AS INTEGER) FROM retrieval_state"
        " WHERE key = 'fts_through'), 0)"
    ).fetchone()
    return int(row[0])


def term_counts(store: SQLStore, terms: Sequence[str], cap: int, scope: Scope) -> dict[str, int]:
    """In how many messages of the scope each term occurs, counted up to cap + 1."""
    join, where, params = _fts_scope(store, scope)
    sql = f"SELECT 1 FROM retrieval_fts f{join} WHERE retrieval_fts MATCH ?{where} LIMIT ?"
    counts = {}
    for term in terms:
        row = store.execute(f"SELECT COUNT(*) FROM ({sql})", (f'"{term}"', *params, cap + 1))
        counts[term] = int(row.fetchone()[0])
    return counts


def _fts_scope(store: SQLStore, scope: Scope) -> tuple[str, str, list[Any]]:
    """The joins, conditions and parameters that keep the rows of a full-text index (as `f`)
    within the scope. A user's messages are looked up in a temporary table of their ids
    (`_user_ids`): a probe of a small table in memory per match, where reading each match's
    message and session would cost several times more."""
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
    where, more = filters(scope, TIME_MS)
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
    recent: int | None,
    counts: Mapping[str, int],
    size: int,
) -> list[tuple[int, float]]:
    """(message id, BM25 score) of the best `limit` messages in scope holding any of the terms
    (see `memcli.store.index.lexical_search`). Messages not yet in the full-text index
    (`catch_up` could not write) are searched too, in a temporary index of them alone
    (`_tail`). Each match's term frequencies come from FTS5's `highlight` of it and its length
    from FTS5's docsize table (`_matches`), so ranking costs a read of the matches, not a new
    index of them (`_bm25`)."""
    match = fts_match(terms)
    if match is None:
        return []
    found = _matches(store, "retrieval_fts", match, scope, recent)
    if _tail(store):
        found = {**found, **_matches(store, "retrieval_tail", match, scope, recent)}
        if recent is not None:
            found = {i: found[i] for i in sorted(found)[-recent:]}
    return _bm25(store, found, terms, counts, size)[:limit]


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
    if not found:
        return []
    stems = _stems(store, {w for words, _ in found.values() for w in words} | set(terms))
    mean = max(sum(length for _, length in found.values()) / len(found), 1.0)
    idfs = [idf(size, counts.get(term, 0)) for term in terms]
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
        score = sum(idfs[t] * tf * (K1 + 1) / (tf + norm) for t, tf in enumerate(tfs) if tf)
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
        f" FROM {FOLDED} WHERE id > MAX(?, (SELECT COALESCE(MAX(rowid), 0) FROM temp.retrieval_tail))",
        (mark,),
    )
    return True


def latest_time(store: SQLStore, scope: Scope) -> datetime | None:
    """The latest message's time in scope (its timestamp, else when it was stored), or None.
    A user's or a session's, whatever its messages, from the index of the messages' times per
    session (`migrations.TIME_MS`), the latest entry of each of its sessions."""
    if scope == Scope(scope.user_id, scope.session_id):
        per_session = f"(SELECT MAX({TIME_MS}) FROM messages m WHERE m.session_id = s.id)"
        where, params = "", []
        for column, value in (("s.user_id", scope.user_id), ("s.id", scope.session_id)):
            if value is not None:
                where += f" AND {column} = ?"
                params.append(value)
        row = store.execute(
            f"SELECT MAX({per_session}) FROM sessions s WHERE TRUE{where}", params
        ).fetchone()
        return from_ms(row)
    rows, params = messages_in(scope, TIME_MS)
    return from_ms(store.execute(f"SELECT MAX({TIME_MS}){rows}", params).fetchone())

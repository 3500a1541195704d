"""PostgreSQL's search index: full-text ranking with its text search, and the vector search
through pgvector, behind `memcli.store.index` (which calls these for a store whose `dialect` is
"postgresql"); the claims on embedding (`lock_claim`) and pgvector's column (`fill_embeddings`)
for `memcli.store.vectors` and `memcli.search.dense`.

Full text. `messages.search` is a tsvector generated from the speaker's name and the text (the
schema: `memcli.store.pg_migrations`), so a message is searchable once committed: no catching up
as with SQLite's FTS5 table (generated at insert: an import pays about the time of
`to_tsvector`, measured in docs/performance.md). A query is the OR of the query's terms, each
through `plainto_tsquery` (its text bound as a parameter, never written into tsquery syntax);
within a user's messages, ANDed with the user's lexeme (each message's tsvector holds its user's,
`pg_migrations.USER_LEXEME`), so that the GIN index intersects the word's messages with the
user's and hands over only those (`_tsquery`). The score is BM25 computed in SQL over the matching messages, as FTS5's `bm25()` ranks them:
per term, IDF from the number of messages of the scope's user (or session) it occurs in (the
retriever's term counts) and how many messages that user holds; term frequency from the tsvector's positions; length from the tsvector's number
of words, against their mean over the matches. The retriever fuses ranks, not scores, so the
scores need only order the matches as BM25 would; they differ from SQLite's in value (another
stemmer, another length measure, an approximate mean length).

Vectors. With pgvector (the column `retrieval_vectors.embedding`), a query is `ORDER BY embedding
<=> query LIMIT n` under the scope's filters, through the HNSW index for 384-dimension vectors,
or exactly. Each vector row keeps its message's user and time (migration 23), so a user's or a
time window's vectors are filtered on the vectors alone (`retrieval_vectors_scope`), and the
vector stays in the row (no TOAST read per distance). pgvector filters after the index scan:
before 0.8 the scan returns at most `hnsw.ef_search` rows (at most 1,000), so a scope that holds
a small share of the store would be left with few of its messages among them, and not its best
ones. So:
- a session's vectors, and those of any scope of up to EXACT_MAX messages, are compared exactly;
- with pgvector 0.8, a bigger scope goes through the index with iterative scans (the scan goes
  on until it has the rows asked for) when that reads fewer rows than exact search would
  compare, a row of the index costing about ITERATIVE_COST exact comparisons;
- before 0.8, a bigger scope goes through the index at ef_search 1000 only when that many rows
  hold IN_SCOPE of its messages on average (a tenth of the store or more);
- a search of the whole store goes through the index at EF_WHOLE, widened once (ef_search 1000)
  if that found too few;
- any scope is compared exactly when the index found too few.
The answers of exact search are exact; the index's kept >= 0.99 of the exact top 10 at 1M
messages (benchmarks/pg_recall.py, docs/performance.md). The column is filled from the stored
bytes (`fill_embeddings`), so that vectors stored by any path (the retriever, a copy between
backends) are found: before a search that reads it over more than a small scope (the index, or
the whole store). A scope compared exactly waits for no fill, since filling a row is an insert
into the HNSW index (~20 ms a vector at 1M on 2 cores: 200 just imported, 1.4-4 s): its rows
that the column does not hold yet are compared from their bytes (`_unfilled_rows`), beside those
it holds, and left for the next search that reads the column (benchmarks/pg_small_user.py).
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from typing import TYPE_CHECKING, Any, cast

from memcli.store.bm25 import K1, B, idf
from memcli.store.pg_migrations import INDEXED_DIM, TIME_MS, has_embedding_column
from memcli.store.scope import Scope, filters, from_ms, messages_in, scope_size

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from datetime import datetime

    import numpy as np

    from memcli.store.base import SQLStore
    from memcli.store.postgres import PostgresStore

#: The join that keeps its left table outside: PostgreSQL's planner finds that itself (and
#: knows no CROSS JOIN ... ON).
JOIN_IN_ORDER = "JOIN"
#: Vectors copied from their bytes into pgvector's column per transaction.
FILL_BATCH = 2000
#: pgvector's largest `hnsw.ef_search`.
EF_MAX = 1000
#: A scope of up to this many messages (a user's, a time range's) is searched exactly.
EXACT_MAX = 5_000
#: A bigger scope goes through the HNSW index when its ef_search (EF_MAX) rows hold at least this
#: many of its messages on average (a tenth of the store); else it is searched exactly too.
IN_SCOPE = 100
#: The index's ef_search for a search of the whole store (EF_MAX if that finds too few).
EF_WHOLE = 200
#: With iterative scans (pgvector 0.8): a row the index reads costs about this many exact
#: comparisons of a scope's vectors (measured at 1M messages: 1,000 index rows in ~22 ms, a
#: 100,000-message user compared exactly in ~90 ms with two workers; docs/performance.md).
ITERATIVE_COST = 20.0

_vector_column: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
_versions: weakref.WeakKeyDictionary[Any, tuple[int, ...]] = weakref.WeakKeyDictionary()


def has_pgvector(store: SQLStore) -> bool:
    """Whether the database searches its vectors itself (pgvector's column exists: the schema
    records it, so every process agrees)."""
    known = _vector_column.get(store)
    if known is None:
        known = _vector_column[store] = has_embedding_column(store)
    return known


def database_key(store: Any) -> str:
    """A name for the database that stays the same across processes and URLs that reach it the
    same way: a hash of the server's host (or socket folder), port and database name."""
    import hashlib

    info = store.conn.info
    where = f"{info.host}:{info.port}/{info.dbname}"
    return hashlib.sha256(where.encode()).hexdigest()[:16]


#: The first key of the advisory locks on embedding claims (its own space: session locks take
#: one 64-bit key, these two 32-bit ones).
CLAIM_LOCK = 0x6D656D63  # "memc"


def lock_claim(store: SQLStore, key: str) -> None:
    """Inside a transaction: wait for any other process reading or taking the claim `key`, so
    that two cannot both find it free and both take it (held until the commit)."""
    store.execute("SELECT pg_advisory_xact_lock(?, hashtext(?))", (CLAIM_LOCK, key))


# -- full text -------------------------------------------------------------------------------------


def catch_up(store: SQLStore) -> int:
    """Nothing to add: PostgreSQL indexes each message as it is stored."""
    return 0


def fts_behind(store: SQLStore) -> int:
    """No message waits for the full-text index (see `catch_up`)."""
    return 0


def fts_through(store: SQLStore) -> int:
    """The highest message id up to which every message is in the full-text index: the last."""
    return int(store.execute("SELECT COALESCE(MAX(id), 0) FROM messages").fetchone()[0])


def _text_scope(scope: Scope) -> tuple[str, list[Any], str | None]:
    """The scope's conditions on `messages m` for the full-text search, with no join, and the
    scope's user apart: the text query itself asks for the user's messages (each message's
    tsvector holds its user's lexeme, `pg_migrations.USER_LEXEME`), so that the text index
    intersects a word's messages with the user's (a common word of a 100,000-message user in a
    1,000,000-message store: 7 ms), where a filter on the user's sessions built the bitmap of
    every message of the user for each word (24 ms) and a join to `sessions` read every user's
    matches (580 ms)."""
    where, params = filters(dataclasses.replace(scope, user_id=None), TIME_MS)
    return where, params, scope.user_id


def _tsquery(terms: Sequence[str], user: str | None) -> str:
    """SQL for the OR of the terms (one `?` each): each term's words, stemmed; within a user's
    messages (one more `?`, after the terms': the user) when `user` is not None."""
    match = " || ".join(["plainto_tsquery('memcli', ?)"] * len(terms))
    return match if user is None else f"memcli_user_query({match}, ?)"


#: A term PostgreSQL's statistics put in over this many times the cap is taken as over it,
#: without counting (see `term_counts`).
OVER_CAP = 4


def term_counts(store: SQLStore, terms: Sequence[str], cap: int, scope: Scope) -> dict[str, int]:
    """In how many messages of the scope each term occurs, counted up to cap + 1: a user's
    through the user's lexeme in the query (see `_tsquery`).

    Counting through the GIN index builds the whole bitmap of a term's messages, however low the
    cap (a common word in a million messages: 50-400 ms). So for the whole store, when ANALYZE
    has gathered the column's statistics (its most common words), a term they put in over
    OVER_CAP times the cap counts as cap + 1 without counting (PostgreSQL's estimate, about
    1 ms); the others, rare or unknown, are counted. A user's or a session's terms are always
    counted in it: the store's statistics would make one user's counts depend on the others'."""
    where, params, user = _text_scope(scope)
    counts = {}
    row = None
    if not where and user is None:
        row = store.execute(
            "SELECT 1 FROM pg_stats WHERE schemaname = current_schema()"
            " AND tablename = 'messages' AND attname = 'search' AND most_common_elems IS NOT NULL"
        ).fetchone()
    for term in terms:
        if row is not None:
            plan = store.execute(
                "EXPLAIN (FORMAT JSON) SELECT 1 FROM messages"
                " WHERE search @@ plainto_tsquery('memcli', ?)",
                (term,),
            ).fetchone()[0]
            if float(plan[0]["Plan"]["Plan Rows"]) > cap * OVER_CAP:
                counts[term] = cap + 1
                continue
        found = store.execute(
            "SELECT COUNT(*) FROM (SELECT 1 FROM messages m"
            f" WHERE m.search @@ {_tsquery([term], user)}{where} LIMIT ?) AS t",
            (term, *([] if user is None else [user]), *params, cap + 1),
        ).fetchone()
        counts[term] = int(found[0])
    return counts


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
    (see `memcli.store.index.lexical_search`), computed in SQL (see the module docstring)."""
    if not terms:
        return []
    filters, params, user = _text_scope(scope)
    idfs = [idf(int(size), counts.get(t, 0)) for t in terms]
    match = _tsquery(terms, user)
    scoped = [*terms, *([] if user is None else [user]), *params]
    if recent is not None:
        matches = (
            f"(SELECT m.id FROM messages m WHERE m.search @@ ({match}){filters}"
            f" ORDER BY m.id DESC LIMIT ?) AS r JOIN messages m ON m.id = r.id"
        )
        args: list[Any] = [*scoped, recent]
    else:
        matches = f"messages m WHERE m.search @@ ({match}){filters}"
        args = scoped
    rows = store.execute(
        "WITH q AS (SELECT w.lexeme, MAX(u.idf) AS idf FROM unnest(?::text[], ?::float8[])"
        " AS u(term, idf), unnest(tsvector_to_array(to_tsvector('memcli', u.term))) AS w(lexeme)"
        " GROUP BY w.lexeme),"
        # Each match's tsvector cut down to the query's words (weight A marks them: the
        # generated vectors carry D only), so that only those are unnested; its length
        # without the user's lexeme.
        " c AS (SELECT m.id, length(m.search) - 1 AS len, ts_filter(setweight(m.search, 'A',"
        f" (SELECT array_agg(lexeme) FROM q)), '{{a}}') AS found FROM {matches}),"
        " a AS (SELECT GREATEST(AVG(len), 1) AS mean FROM c)"
        " SELECT c.id, SUM(q.idf * t.tf * ? / (t.tf + ? * (1 - ? + ? * c.len / a.mean)))"
        " AS score FROM c CROSS JOIN a CROSS JOIN LATERAL (SELECT lexeme,"
        " COALESCE(array_length(positions, 1), 1) AS tf FROM unnest(c.found)) AS t"
        " JOIN q ON q.lexeme = t.lexeme GROUP BY c.id ORDER BY score DESC, c.id DESC LIMIT ?",
        (list(terms), idfs, *args, K1 + 1, K1, B, B, limit),
    )
    return [(int(r[0]), float(r[1])) for r in rows]


# -- vectors through pgvector ----------------------------------------------------------------------


#: A vector parameter, sent as an array of floats (psycopg's fast path), cast to pgvector's type.
VECTOR = "CAST(CAST(? AS float8[]) AS vector)"


#: Vectors a second that `fill_embeddings` adds to pgvector's column and its HNSW index (about
#: 1,500 measured at 1,000,000 vectors on 2 cores: 11 minutes for the million).
FILL_RATE = 1_500.0


def unfilled(store: SQLStore) -> int:
    """How many stored vectors pgvector's column does not hold yet (`fill_embeddings` adds them;
    a copy leaves them all: the partial index `retrieval_vectors_unfilled` counts them)."""
    return int(
        store.execute("SELECT COUNT(*) FROM retrieval_vectors WHERE embedding IS NULL").fetchone()[
            0
        ]
    )


def fill_embeddings(store: SQLStore) -> int:
    """Copy the vectors stored as bytes into pgvector's column where it is still empty; return
    how many. Nothing on a read-only database (its vectors stay unsearched until filled)."""
    import numpy as np

    if not store.can_write_now():
        return 0
    done = 0
    while True:
        rows = store.execute(
            "SELECT id, vector FROM retrieval_vectors WHERE embedding IS NULL ORDER BY id LIMIT ?",
            (FILL_BATCH,),
        ).fetchall()
        if not rows:
            return done
        values = [(np.frombuffer(bytes(v), dtype=np.float32).tolist(), int(i)) for i, v in rows]
        with store.transaction():
            store.executemany(
                f"UPDATE retrieval_vectors SET embedding = {VECTOR}"
                " WHERE id = ? AND embedding IS NULL",
                values,
            )
        done += len(rows)


#: Up to this many messages in short-term memory (of the user, or of the store), a search of
#: archived messages leaves them out by their ids (see `vector_search`).
ACTIVE_IDS_MAX = 20_000


def vector_search(
    store: SQLStore, model: str, vector: np.ndarray, scope: Scope, n: int
) -> list[tuple[int, float]]:
    """(message id, cosine) of the best `n` messages in scope, each once, best first."""
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
        where = (join, *filters(scope, time_ms="v.at_ms", user="v.user_id"))
        return _vectors_in(store, model, vector, scope, where, n, size)
    conditions, params = filters(plain, time_ms="v.at_ms", user="v.user_id")
    active = " FROM messages m WHERE m.status = 'active' AND m.session_id"
    if scope.archived_only:
        owner = "" if scope.user_id is None else " WHERE user_id = ?"
        conditions += (
            f" AND v.message_id NOT IN (SELECT m.id{active} IN (SELECT id FROM sessions{owner}))"
        )
        params += [] if scope.user_id is None else [scope.user_id]
    elif scope.except_window is not None:
        conditions += f" AND v.message_id NOT IN (SELECT m.id{active} = ?)"
        params.append(scope.except_window)
    return _vectors_in(store, model, vector, scope, ("", conditions, params), n, size)


def _vectors_in(
    store: SQLStore,
    model: str,
    vector: np.ndarray,
    scope: Scope,
    where: tuple[str, str, list[Any]],
    n: int,
    size: int | None = None,
) -> list[tuple[int, float]]:
    """(message id, cosine) of the best `n` messages in scope, each once (its best piece), best
    first: through the HNSW index, or exactly (see the module docstring). `where`: (join,
    conditions, parameters) that keep `retrieval_vectors v` rows within the scope; `size`, how
    many messages the scope holds when the caller knows (a user's: the sessions' counters),
    else they are counted (up to what decides between the index and exact search)."""
    dim = len(vector)
    want = n * 2  # a message's pieces are rows of their own
    iterative = pgvector_version(store) >= (0, 8)
    if dim != INDEXED_DIM or scope.session_id is not None:
        attempts: list[int | None] = [None]
    elif not where[1]:  # the whole store
        attempts = [max(EF_WHOLE, min(EF_MAX, want)), EF_MAX]
    else:
        cap = _exact_cap(store, want, iterative)
        size = size if size is not None else _scope_size(store, where, cap + 1)
        attempts = [EF_MAX, None] if size > cap else [None]
    if attempts == [None] and where[1]:
        # A scope compared exactly: its own rows, those pgvector's column does not hold yet
        # (just embedded) from their bytes and those it holds in SQL, so that its search waits
        # for no index insert. In that order: a row another process fills in between is read
        # twice (and kept once), never missed.
        rows = _unfilled_rows(store, model, vector, where, want)
        rows += _vector_rows(store, model, vector, where, want, None)
        return _best_once(rows)[:n]
    fill_embeddings(store)  # the index, and exact search of the store, read the column
    best: list[tuple[int, float]] = []
    for ef in attempts:
        best = _vector_rows(store, model, vector, where, want, ef, iterative)
        if len(best) >= n:
            break
    return best[:n]


def _exact_cap(store: SQLStore, want: int, iterative: bool) -> int:
    """The most messages a user's or a time window's scope holds that is compared exactly
    rather than through the HNSW index, for `want` rows."""
    total = int(store.execute("SELECT COALESCE(MAX(id), 0) FROM messages").fetchone()[0])
    if iterative:
        # The index reads ef_search rows, and goes on until it has `want` rows of the scope:
        # max(EF_MAX, want * total / size) rows, each ITERATIVE_COST times the cost of
        # comparing one vector of the scope exactly. It serves a scope whose exact search
        # (size comparisons) would cost more; else exact search, which misses nothing.
        return max(
            EXACT_MAX,
            int(ITERATIVE_COST * EF_MAX),
            math.isqrt(int(ITERATIVE_COST * want * max(total, 1))) + 1,
        )
    # The index serves a scope only when its ef_search rows hold enough of the scope's
    # messages (IN_SCOPE of them, on average) and the scope is too big to compare exactly.
    return max(EXACT_MAX, -(-total * IN_SCOPE // EF_MAX))


def searched_exactly(store: SQLStore, owner: Scope) -> bool:
    """Whether a search within a user's or a session's scope compares its vectors exactly
    (and so waits for no vector to be added to the index: see `vector_search`), whatever it
    asks for (the threshold for one row: the lowest)."""
    if owner.session_id is not None:
        return True
    if owner.user_id is None:
        return False
    cap = _exact_cap(store, 1, pgvector_version(store) >= (0, 8))
    return scope_size(store, Scope(user_id=owner.user_id), "all") <= cap


def _unfilled_rows(
    store: SQLStore, model: str, vector: np.ndarray, where: tuple[str, str, list[Any]], want: int
) -> list[tuple[int, float]]:
    """The best `want` of the scope's vectors that pgvector's column does not hold yet,
    compared from their bytes: (message id, cosine), best first (a piece each: see
    `_best_once`). Only for a scope compared exactly: it holds at most the threshold's rows."""
    import numpy as np

    join, filters, params = where
    rows = store.execute(
        f"SELECT v.message_id, v.vector FROM retrieval_vectors v{join}"
        f" WHERE v.model = ? AND v.dim = ? AND v.embedding IS NULL{filters}",
        (model, len(vector), *params),
    ).fetchall()
    if not rows:
        return []
    matrix = np.frombuffer(b"".join(bytes(r[1]) for r in rows), dtype=np.float32)
    matrix = matrix.reshape(len(rows), len(vector))
    query = np.asarray(vector, dtype=np.float32)
    # pgvector's cosine: each side's norm divided out (a zero vector scores 0, not NaN)
    norms = np.linalg.norm(matrix, axis=1) * max(float(np.linalg.norm(query)), 1e-30)
    scores = (matrix @ query) / np.maximum(norms, 1e-30)
    order = np.argsort(-scores, kind="stable")[:want]
    return [(int(rows[i][0]), float(scores[i])) for i in order.tolist()]


def _best_once(rows: Sequence[tuple[int, float]]) -> list[tuple[int, float]]:
    """(message id, cosine) of each message once (its best piece), best first."""
    best: dict[int, float] = {}
    for message_id, score in sorted(rows, key=lambda r: -r[1]):
        best.setdefault(message_id, score)
    return list(best.items())


def pgvector_version(store: SQLStore) -> tuple[int, ...]:
    """The version of the database's pgvector, as numbers ((0,) if it has none)."""
    known = _versions.get(store)
    if known is None:
        row = store.execute(
            "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
        ).fetchone()
        parts = [] if row is None else str(row[0]).split(".")
        known = _versions[store] = tuple(int(p) for p in parts if p.isdigit()) or (0,)
    return known


def latest_time(store: SQLStore, scope: Scope) -> datetime | None:
    """The latest message's time in scope (its timestamp, else when it was stored), or None."""
    rows, params = messages_in(scope, TIME_MS)
    messages = f"SELECT MAX({TIME_MS}){rows}"
    if (
        scope.session_id is None
        and not scope.archived_only
        and scope.except_window is None
        and has_pgvector(store)
    ):
        # The vectors' copies of their messages' times answer through an index, where the
        # messages' would be read one by one; the messages not embedded yet are read.
        vectors = filters(scope, time_ms="v.at_ms", user="v.user_id")
        return _latest_with_vectors(store, vectors, messages, params, scope.user_id)
    return from_ms(store.execute(messages, params).fetchone())


def _latest_with_vectors(
    store: SQLStore,
    vectors: tuple[str, list[Any]],
    messages: str,
    params: Sequence[Any],
    user: str | None = None,
) -> datetime | None:
    """The latest message's time within a user's messages, a time window or the store (not a
    session's, nor archived messages only): the latest of the vectors' times (`vectors`: the
    scope's conditions on `retrieval_vectors v`, through `retrieval_vectors_scope` or
    `retrieval_vectors_time`) and of the messages with no vectors yet (`messages`, the query on
    every message in scope with `params`, kept to those). A message that gets no vector (no
    text) is not counted once it is marked embedded. Embedded means: up to the store's mark or
    `user`'s (searches and blocks move a user's and a session's marks, seldom the store's),
    for every model."""
    filters, vector_params = vectors
    through = store.execute(
        "SELECT COALESCE(MIN(GREATEST(COALESCE(CAST(st.value AS BIGINT), 0),"
        " COALESCE(mk.through, 0))), 0)"
        " FROM (SELECT substr(key, 10) AS model FROM retrieval_state WHERE key LIKE 'embedded:%'"
        " UNION SELECT model FROM retrieval_marks WHERE scope_key = ?) models"
        " LEFT JOIN retrieval_state st ON st.key = 'embedded:' || models.model"
        " LEFT JOIN retrieval_marks mk ON mk.model = models.model AND mk.scope_key = ?",
        (key := None if user is None else f"user:{user}", key),  # (NULL: no user's mark)
    ).fetchone()[0]
    # The messages past the mark and those to embed again, each their own maximum: an OR of
    # the two would read every message of the store (no index serves it).
    row = store.execute(
        f"SELECT GREATEST((SELECT MAX(v.at_ms) FROM retrieval_vectors v WHERE TRUE{filters}),"
        f" ({messages} AND m.id > ?),"
        f" ({messages} AND m.id IN (SELECT message_id FROM retrieval_redo)))",
        (*vector_params, *params, int(through), *params),
    ).fetchone()
    return from_ms(row)


def _scope_size(store: SQLStore, where: tuple[str, str, list[Any]], cap: int) -> int:
    """How many vectors the scope holds, counted up to `cap` (a bounded cost)."""
    join, filters, params = where
    row = store.execute(
        f"SELECT COUNT(*) FROM (SELECT 1 FROM retrieval_vectors v{join} WHERE TRUE{filters}"
        " LIMIT ?) AS t",
        (*params, cap),
    ).fetchone()
    return int(row[0])


def _vector_rows(
    store: SQLStore,
    model: str,
    vector: np.ndarray,
    where: tuple[str, str, list[Any]],
    want: int,
    ef: int | None,
    iterative: bool = False,
) -> list[tuple[int, float]]:
    """The best `want` vectors' (message id, cosine), each message once: through the HNSW index
    at `ef` (ef_search; `iterative`: going on past it while it has found fewer than `want` rows
    of the scope, pgvector 0.8's iterative scan), or exactly (None)."""
    join, filters, params = where
    dim = len(vector)
    query = vector.tolist()
    # The cast makes the distance the index's expression; without it, the planner cannot use
    # the index and computes every distance in scope.
    column = f"CAST(v.embedding AS vector({dim}))" if ef is not None else "v.embedding"
    if ef is not None:
        store.execute("SELECT set_config('hnsw.ef_search', ?, false)", (str(ef),))
        if iterative:
            # (relaxed: the rows come nearly in order; they are sorted below)
            store.execute("SELECT set_config('hnsw.iterative_scan', 'relaxed_order', false)")
    rows = (
        cast("PostgresStore", store)
        .execute_unprepared(
            f"SELECT v.message_id, 1 - ({column} <=> {VECTOR}) AS score"
            f" FROM retrieval_vectors v{join}"
            f" WHERE v.model = ? AND v.dim = {dim} AND v.embedding IS NOT NULL{filters}"
            f" ORDER BY {column} <=> {VECTOR} LIMIT ?",
            (query, model, *params, query, want),
        )
        .fetchall()
    )
    return _best_once([(int(r[0]), float(r[1])) for r in rows])

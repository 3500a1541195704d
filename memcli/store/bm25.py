"""BM25 as FTS5's `bm25()` ranks, for both dialects' full-text search (SQLite computes it over
FTS5's matches, `memcli.store.sqlite_index`; PostgreSQL in SQL, `memcli.store.pg_index`): its
parameters, the inverse document frequency, and how many matches it ranks at the most."""

from __future__ import annotations

import math

#: The most matches BM25 ranks without a `recent` bound (the retriever's term choice keeps
#: them under its budget).
RANKED_MAX = 20_000
#: BM25's parameters (FTS5's).
K1, B = 1.2, 0.75


def idf(size: int, count: int) -> float:
    """BM25's inverse document frequency of a term in `count` of `size` messages (FTS5's
    formula, kept above zero)."""
    size = max(size, count)
    return max(math.log((size - count + 0.5) / (count + 0.5)), 1e-6)

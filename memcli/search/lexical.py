"""The lexical side of retrieval: BM25 over the store's full-text index (SQLite's FTS5, or
PostgreSQL's text search: `memcli.store.index`), its cost bounded whatever the store holds.

Scope first: the query's informative words are taken rarest first while the messages of the
scope's user (or session) they occur in add up to at most `budget` (a common word left out says
little); when even the rarest is in more of them, only its `budget` most recent matches in scope
are ranked; BM25's statistics are the scope's too. So one user's hits do not change when another
user writes. How many messages each word occurs in is kept between searches until
TERM_COUNTS_SLACK more messages are indexed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memcli.search.ranking import query_terms
from memcli.store import index as sql

if TYPE_CHECKING:
    from collections.abc import Sequence

    from memcli.store.index import Scope

#: Messages indexed after a word was counted before the count is taken again (see `counts`).
TERM_COUNTS_SLACK = 200


class Lexical:
    """BM25 over one store's messages, ranking at most about `budget` messages per query."""

    def __init__(self, store: Any, budget: int) -> None:
        self.store = store
        self.budget = budget
        self._counts: dict[tuple[Scope | None, str, int], int] = {}  # see `counts`
        self._counts_through = -1

    def search(self, query: str, scope: Scope, n: int) -> list[tuple[int, float]]:
        """(message id, BM25 score) of the best `n` messages in scope, best first."""
        owner = sql.owner(scope)
        terms, recent = self.terms(query, owner)
        return sql.lexical_search(
            self.store,
            terms,
            scope,
            n,
            recent=self.budget if recent else None,
            counts=self.counts(terms, self.budget, owner),
        )

    def terms(self, query: str, owner: Scope | None = None) -> tuple[list[str], bool]:
        """The query's terms that BM25 ranks within `budget` messages of `owner` (a user's or a
        session's scope, `sql.owner`; None: the whole store): rarest first while the messages
        they occur in add up to at most the budget (the rarest always), and whether that one
        alone is in more (then only its most recent matches are ranked)."""
        terms = query_terms(query)
        budget = self.budget
        counts = self.counts(terms, budget, owner)
        if terms and min(counts.values()) > budget:  # every word common: which is rarest?
            counts = self.counts(terms, budget * 8, owner)
        chosen: list[str] = []
        total = 0
        for term in sorted(terms, key=lambda t: counts[t]):
            if chosen and total + counts[term] > budget:
                break
            chosen.append(term)
            total += counts[term]
        # In the query's order (the FTS5 query is the same either way; easier to read).
        return [t for t in terms if t in chosen], total > budget

    def counts(self, terms: Sequence[str], cap: int, owner: Scope | None = None) -> dict[str, int]:
        """`sql.term_counts` within `owner`, kept between searches until TERM_COUNTS_SLACK more messages are
        indexed: counting a common word walks up to `cap` rows, and a chat's window repeats its
        words turn after turn. A count that is a little behind only shifts which words BM25 ranks."""
        through = sql.fts_through(self.store)
        cache = self._counts
        if not through - TERM_COUNTS_SLACK <= self._counts_through <= through:
            cache.clear()
            self._counts_through = through
        missing = [t for t in terms if (owner, t, cap) not in cache]
        if missing:
            if len(cache) > 50_000:
                cache.clear()
            for term, n in sql.term_counts(self.store, missing, cap, owner).items():
                cache[owner, term, cap] = n
        return {t: cache[owner, t, cap] for t in terms}

"""A small scope of a big store is searched over its own rows: exactly, on every backend, even
where the store-wide vector index would not reach them (pgvector filters after its scan)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import numpy as np

from memcli.messages import Message
from memcli.search.retriever import Retriever
from memcli.search.types import SearchOptions
from memcli.store import Store, open_store
from memcli.store.base import NewMessage

DIM = 384  # the dimension pgvector's HNSW index serves
T0 = datetime(2024, 3, 1, tzinfo=UTC)


class TableEmbedder:
    """Each text's vector looked up in a table (tests only): the vectors are the test's design.
    A stored message is embedded as "speaker: text": looked up by its text."""

    name = "table"
    dim = DIM
    max_tokens = 1000

    def __init__(self, table: dict[str, np.ndarray]) -> None:
        self.table = table

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self.table[t.split(": ")[-1]] for t in texts]).astype(np.float32)

    def split(self, texts: Sequence[str]) -> list[list[str]]:
        return [[t] for t in texts]


def add(store: Store, session: str, user: str, texts: Sequence[str]) -> list[int]:
    store.create_session(session, user, 1_000_000, 0.7, 1000)
    new = [
        NewMessage(Message("user", t, timestamp=T0 + timedelta(hours=i)), 3)
        for i, t in enumerate(texts)
    ]
    with store.transaction():
        return list(store.append_messages(session, new))


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=-1, keepdims=True)).astype(np.float32)


def test_a_small_users_vectors_are_searched_exactly_where_the_index_holds_others_nearer(
    vdb: str,
) -> None:
    """3,000 messages of other users all nearer the query than any of a 40-message user's: the
    store's 3,000 nearest (more than pgvector's widest HNSW scan, filtered after it, reads) hold
    none of the user's, yet the user's search returns the user's own 10 nearest, in order, with their
    cosines; a session's and a time window's of the user too; the other users' rows never."""
    rng = np.random.default_rng(11)
    query = unit(rng.standard_normal(DIM))
    crowd = unit(query + 0.25 * unit(rng.standard_normal((3000, DIM))))  # cosine ~0.97
    mine = unit(rng.standard_normal((40, DIM)))  # cosine ~0 +- 0.05
    table = {f"crowd {i}": v for i, v in enumerate(crowd)}
    table |= {f"mine {i}": v for i, v in enumerate(mine)}
    table["the question"] = query
    store = open_store(vdb)
    for s in range(3):
        texts = [f"crowd {i}" for i in range(s * 1000, (s + 1) * 1000)]
        add(store, f"c{s}", f"other{s}", texts)
    own = add(store, "m0", "small", [f"mine {i}" for i in range(20)])
    own += add(store, "m1", "small", [f"mine {i}" for i in range(20, 40)])
    retriever = Retriever(
        store,
        TableEmbedder(table),
        SearchOptions(context_before=0, context_after=0, vector_context=0),
    )
    retriever.index()

    # Every other user's message is nearer than any of the user's: a scan of the store's
    # nearest (at most 1,000 rows at pgvector's widest ef_search) meets none of the user's.
    assert (crowd @ query).min() > (mine @ query).max() + 0.5
    whole = retriever.search("the question", k=100, mode="vector").hits
    assert len(whole) == 100 and not {h.anchor_id for h in whole} & set(own)

    scores = mine @ query
    for scope, rows in (
        ({"user_id": "small"}, range(40)),
        ({"session_id": "m1"}, range(20, 40)),
        ({"user_id": "small", "since": T0 + timedelta(hours=5), "until": T0 + timedelta(hours=15)},
         [*range(5, 15), *range(25, 35)]),
    ):  # fmt: skip
        rows = list(rows)
        best = sorted(rows, key=lambda r: -scores[r])[:10]
        hits = retriever.search("the question", k=10, mode="vector", **scope).hits
        assert [h.anchor_id for h in hits] == [own[r] for r in best], scope
        assert np.allclose([h.vector_score for h in hits], scores[best], atol=1e-4)
    store.close()


def test_a_small_users_first_search_after_an_import_waits_for_no_index_insert(
    pgvector_url: str,
) -> None:
    """The first search of a user just imported into a store with pgvector embeds the user's
    messages and compares them from their bytes: it adds none to pgvector's column (an HNSW
    insert each, ~20 ms at a million vectors), yet finds them, exactly, beside those the column
    holds; the next search of the whole store adds them first, then finds them through the
    index. A session's search likewise."""
    from memcli.store import pg_index

    rng = np.random.default_rng(5)
    vectors = unit(rng.standard_normal((60, DIM)))
    table = {f"text {i}": v for i, v in enumerate(vectors)}
    query = unit(vectors[45] + 0.3 * vectors[12])
    table["the question"] = query
    store = open_store(pgvector_url)
    options = SearchOptions(context_before=0, context_after=0, vector_context=0)
    retriever = Retriever(store, TableEmbedder(table), options)
    first = add(store, "old", "ana", [f"text {i}" for i in range(40)])
    retriever.search("the question", k=3, mode="vector")  # embedded and in the index
    assert pg_index.unfilled(store) == 0
    second = add(store, "new", "ana", [f"text {i}" for i in range(40, 60)])  # the import
    ids = first + second
    scores = vectors @ query
    best = [ids[r] for r in np.argsort(-scores)[:5]]
    assert ids[45] in best and ids[12] in best  # one just imported, one filled before
    hits = retriever.search("the question", k=5, mode="vector", user_id="ana").hits
    assert [h.anchor_id for h in hits] == best
    assert np.allclose([h.vector_score for h in hits], np.sort(scores)[::-1][:5], atol=1e-4)
    assert pg_index.unfilled(store) == 20  # none added to the index
    hits = retriever.search("the question", k=3, mode="vector", session_id="new").hits
    assert [h.anchor_id for h in hits] == [ids[40 + r] for r in np.argsort(-scores[40:])[:3]]
    assert pg_index.unfilled(store) == 20
    hits = retriever.search("the question", k=5, mode="vector").hits  # the whole store
    assert pg_index.unfilled(store) == 0 and {h.anchor_id for h in hits} >= {ids[45], ids[12]}
    store.close()

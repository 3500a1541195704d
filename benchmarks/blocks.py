"""Speed of long-term memory: importing with the vector block, and vector queries.

    PYTHONPATH=. .venv/bin/python benchmarks/blocks.py [--messages 10000] [--batches 100000]

1. Import N messages (one put call per message, as `memcli import` does) with the vector block,
   against sentence-transformers alone embedding the same batch texts. The model is loaded before
   both timings. Goal: at most 1.3x.
2. A vector query over M stored batches in the batch-level index of `memcli.vectors` (synthetic
   random unit vectors; the query is embedded by the real model), once the model is loaded. Goal:
   under 20 ms. Since hybrid retrieval (#6) the vector block searches message units instead: that
   path is timed warm over 100,000 batches (1,000,000 messages) by `cold_search.py --warm N`.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

from memcli import Budget, Memory, Message, SQLiteStore, VectorBlock  # noqa: E402
from memcli.embeddings import SentenceTransformerEmbedder  # noqa: E402
from memcli.store import longterm  # noqa: E402
from memcli.transcripts import Record, import_records  # noqa: E402
from memcli.vectors import VectorIndex, batch_text, search  # noqa: E402

TOPICS = [
    "my sister's wedding in Lisbon",
    "the cello lessons on Tuesday",
    "a sourdough recipe that keeps failing",
    "the night shifts at the hospital",
    "training for a half marathon",
    "moving the servers to a new data centre",
    "my grandmother's garden",
    "a trip to Kyoto in the spring",
]


def message(i: int, rng: random.Random) -> Message:
    topic = rng.choice(TOPICS)
    if i % 2 == 0:
        words = rng.randint(8, 40)
        filler = " ".join(
            rng.choice(["really", "then", "also", "maybe", "today"]) for _ in range(words // 4)
        )
        return Message("user", f"Let me tell you about {topic}: it went {filler} well, number {i}.")
    return Message("assistant", f"Thanks for sharing that about {topic}. What happened next? ({i})")


def bench_import(n: int, embedder: SentenceTransformerEmbedder, limit: int, flush: int) -> None:
    rng = random.Random(7)
    records = [Record(i + 1, [message(i, rng)], "bench") for i in range(n)]
    folder = Path(tempfile.mkdtemp())

    def run(with_blocks: bool) -> tuple[float, SQLiteStore]:
        store = SQLiteStore(folder / f"import-{with_blocks}.db")
        blocks = [VectorBlock(embedder=embedder)] if with_blocks else []

        def open_memory(session_id: str) -> Memory:
            return Memory(store, session_id, budget=Budget(limit, 0.7, flush), memory_blocks=blocks)

        start = time.perf_counter()
        result = import_records(records, store=store, open_memory=open_memory, put="call")
        elapsed = time.perf_counter() - start
        print(
            f"  import {n:,} messages, blocks={'vector' if with_blocks else 'none'}: "
            f"{elapsed:.2f} s ({result.flushes} flushes)"
        )
        return elapsed, store

    print(f"1. Import {n:,} messages (token_limit {limit}, flush size {flush})")
    plain, _ = run(False)
    with_vectors, store = run(True)
    texts = [batch_text(longterm.flush_messages(store, f.id)) for f in store.list_flushes("bench")]
    # What the block really embeds since hybrid retrieval (#6): one unit per stored message, the
    # message before it and itself as `Name: text` lines, split to fit the model's window.
    from memcli.retrieval import unit_text

    stored = store.get_messages("bench")
    units = [
        "\n".join(unit_text(m.name, m.role, m.content) for m in stored[max(0, i - 1) : i + 1])
        for i in range(len(stored))
    ]
    pieces = [p for ps in embedder.split(units) for p in ps]
    model = embedder.model
    start = time.perf_counter()
    model.encode(texts, batch_size=64, normalize_embeddings=True, show_progress_bar=False)
    alone = time.perf_counter() - start
    start = time.perf_counter()
    model.encode(pieces, batch_size=64, normalize_embeddings=True, show_progress_bar=False)
    alone_pieces = time.perf_counter() - start
    print(
        f"  sentence-transformers alone, the {len(texts)} batch texts (cut at 256 tokens): {alone:.2f} s"
    )
    print(
        f"  sentence-transformers alone, the {len(pieces)} message units the block embeds: {alone_pieces:.2f} s"
    )
    print(f"  import with the vector block / ST alone on batch texts: {with_vectors / alone:.2f}x")
    print(
        f"  import with the vector block / ST alone on the same units: {with_vectors / alone_pieces:.2f}x"
    )
    print(f"  engine overhead (import without blocks): {plain:.2f} s")


def bench_query(m: int, embedder: SentenceTransformerEmbedder, queries: int = 50) -> None:
    print(f"2. Vector query over {m:,} stored batches (synthetic unit vectors, real query model)")
    folder = Path(tempfile.mkdtemp())
    store = SQLiteStore(folder / "query.db")
    rng = np.random.default_rng(0)
    dim = embedder.dim
    start = time.perf_counter()
    for chunk in range(0, m, 10_000):
        size = min(10_000, m - chunk)
        vectors = rng.normal(size=(size, dim)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        entries = [
            longterm.NewEntry(
                "default",
                f"s{(chunk + i) % 100}",
                None,
                f"batch {chunk + i}",
                [],
                vectors[i : i + 1],
            )
            for i in range(size)
        ]
        longterm.add_entries(store, "vector_memory", entries)
    print(f"  stored in SQLite: {time.perf_counter() - start:.1f} s")
    index = VectorIndex(store, "vector_memory")
    start = time.perf_counter()
    index.refresh()
    print(f"  FAISS index built from SQLite and written: {time.perf_counter() - start:.2f} s")
    start = time.perf_counter()
    cold = VectorIndex(store, "vector_memory")
    cold.refresh()
    print(
        f"  index loaded from its file (a new process): {(time.perf_counter() - start) * 1000:.0f} ms"
    )
    words = ["cello", "wedding", "hospital", "garden", "marathon", "Kyoto", "servers", "bread"]
    times = []
    for q in range(queries):
        text = f"what did I say about the {words[q % len(words)]} last time? ({q})"
        start = time.perf_counter()
        hits = search(store, embedder, text, user_id="default", k=2, index=index)
        times.append((time.perf_counter() - start) * 1000)
        assert len(hits) == 2
    print(
        f"  search(k=2), user filter: median {statistics.median(times):.1f} ms, "
        f"p90 {sorted(times)[int(queries * 0.9)]:.1f} ms, max {max(times):.1f} ms"
    )
    times = []
    for q in range(queries):
        start = time.perf_counter()
        search(store, embedder, f"the {words[q % len(words)]}", session_id="s7", k=2, index=index)
        times.append((time.perf_counter() - start) * 1000)
    print(
        f"  search(k=2), one session of 100 (1% of the batches): median {statistics.median(times):.1f} ms"
    )
    embed_times, rest_times = [], []
    for q in range(queries):
        start = time.perf_counter()
        vector = embedder.embed([f"what did I say about the {words[q % len(words)]}? ({q})"])[0]
        middle = time.perf_counter()
        found = index.search(vector, user_id="default", k=2)
        longterm.get_entries(store, [e for e, _ in found])
        end = time.perf_counter()
        embed_times.append((middle - start) * 1000)
        rest_times.append((end - middle) * 1000)
    print(
        f"  of which embedding the query (the model): median {statistics.median(embed_times):.1f} ms"
    )
    print(
        f"  of which FAISS search + SQLite fetch: median {statistics.median(rest_times):.1f} ms, "
        f"max {max(rest_times):.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=100_000)
    parser.add_argument("--token-limit", type=int, default=2000)
    parser.add_argument("--flush-size", type=int, default=200)
    args = parser.parse_args()
    embedder = SentenceTransformerEmbedder()
    start = time.perf_counter()
    embedder.embed(["load the model"])
    print(f"model loaded in {time.perf_counter() - start:.1f} s (not counted below)")
    if args.messages:
        bench_import(args.messages, embedder, args.token_limit, args.flush_size)
    if args.batches:
        bench_query(args.batches, embedder)


if __name__ == "__main__":
    main()

"""Speed of long-term memory: importing with the vector block, and vector queries.

    PYTHONPATH=. .venv/bin/python benchmarks/blocks.py [--messages 10000] [--batches 100000]
        [--engine st|onnx] [--options '{"vector_context": 1}']

1. Import N messages (one put call per message, as `memcli import` does) with the vector block,
   against sentence-transformers alone embedding the same batch texts (the issue's reference) and
   the message texts the block really embeds (each message once; `--engine onnx` also times ONNX
   Runtime alone on them). The models are loaded before the timings. Goal: at most 1.3x.
2. A vector query over M stored batches in the batch-level index of `memcli.vectors` (synthetic
   random unit vectors; the query is embedded by the real model), once the model is loaded. Since
   hybrid retrieval (#6) the vector block searches messages instead: that path (`VectorBlock.get`)
   is timed warm over 100,000 batches (1,000,000 messages) by `cold_search.py --warm N`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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


def bench_import(
    n: int,
    st: SentenceTransformerEmbedder,
    limit: int,
    flush: int,
    engine: Any = None,
    options: Any = None,
) -> None:
    """`engine`: the block's embedder (default: `st`); the reference is always `st` alone."""
    embedder = engine or st
    rng = random.Random(7)
    records = [Record(i + 1, [message(i, rng)], "bench") for i in range(n)]
    folder = Path(tempfile.mkdtemp())

    def run(with_blocks: bool) -> tuple[float, SQLiteStore]:
        store = SQLiteStore(folder / f"import-{with_blocks}.db")
        blocks = [VectorBlock(embedder=embedder, search_options=options)] if with_blocks else []

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
    # What the block really embeds: each stored message's `Name: text` once (its vector is then
    # summed with the previous message's, `Retriever._embed`), split to fit the model's window.
    from memcli.retrieval import Retriever
    from memcli.store import retrieval as sql

    retriever = Retriever(store, embedder, options)
    units = retriever.texts(sql.pending_units(store, "none", n + 1))
    texts_embedded = list(dict.fromkeys([t for own, before in units for t in (own, *before)]))
    pieces = [p for ps in st.split(texts_embedded) for p in ps]
    model = st.model
    start = time.perf_counter()
    model.encode(texts, batch_size=64, normalize_embeddings=True, show_progress_bar=False)
    alone = time.perf_counter() - start
    start = time.perf_counter()
    model.encode(pieces, batch_size=64, normalize_embeddings=True, show_progress_bar=False)
    alone_pieces = time.perf_counter() - start
    print(
        f"  sentence-transformers alone, the {len(texts)} batch texts (cut at 256 tokens):"
        f" {alone:.2f} s"
    )
    print(
        f"  sentence-transformers alone, the {len(pieces)} message texts the block embeds:"
        f" {alone_pieces:.2f} s"
    )
    if embedder is not st:
        start = time.perf_counter()
        embedder.embed(pieces)
        print(
            f"  {type(embedder).__name__} alone, the same units: {time.perf_counter() - start:.2f} s"
        )
    print(f"  import with the vector block / ST alone on batch texts: {with_vectors / alone:.2f}x")
    print(
        f"  import with the vector block / ST alone on the same units:"
        f" {with_vectors / alone_pieces:.2f}x"
    )
    print(f"  engine overhead (import without blocks): {plain:.2f} s")
    print(f"  load average after: {os.getloadavg()[0]:.2f}")


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
    parser.add_argument(
        "--engine",
        choices=["onnx", "st"],
        default="st",
        help="the block's embedder (the CLI's vector block uses sentence-transformers);"
        " the reference is always sentence-transformers alone",
    )
    parser.add_argument("--options", help="SearchOptions overrides as JSON")
    parser.add_argument(
        "--model-cache",
        default=os.environ.get("MEMCLI_MODEL_CACHE")
        or str(Path(os.environ.get("MEMCLI_HOME", Path.home() / ".cache" / "memcli")) / "models"),
        help="folder for the exported ONNX model",
    )
    args = parser.parse_args()
    embedder = SentenceTransformerEmbedder()
    start = time.perf_counter()
    embedder.embed(["load the model"])
    print(f"model loaded in {time.perf_counter() - start:.1f} s (not counted below)")
    engine = None
    if args.engine == "onnx":
        from memcli.onnx_embedder import OnnxEmbedder

        engine = OnnxEmbedder(args.model_cache)
        engine.embed(["load the model"])
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    if args.messages:
        from memcli.ranking import SearchOptions

        options = SearchOptions(**json.loads(args.options)) if args.options else None
        bench_import(args.messages, embedder, args.token_limit, args.flush_size, engine, options)
    if args.batches:
        bench_query(args.batches, embedder)


if __name__ == "__main__":
    main()

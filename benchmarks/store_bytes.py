"""Bytes on disk per message of a SQLite store with one vector per message: the database (its
tables and indexes, from SQLite's dbstat) and the FAISS index files beside it.

For each size (10k and 100k messages by default) a store is built through the store's own
functions: sessions of 40 messages over 10 users, the messages the LoCoMo development
conversations' turns (`/work/shared/data/locomo` or `--locomo`: real short chat messages, each
with its speaker's name and a time, repeated with a counter), archived by flushes of 10 as a chat
flushes them, their full-text index caught up, and one vector per message stored through
`store.vectors.add_vectors` under the default model's name (random unit vectors of 384
dimensions instead of embedding 100k texts: a vector's bytes are the same whatever it holds).
Then the dense index is built by a search (`search.dense.MessageVectors`), the WAL checkpointed,
and the files measured. Last, `--cold` fresh processes each open the store and run one dense
search of the whole store (the index loaded from its files, as `memcli search` does first),
then the whole store and a 40-message session again, warm: CPU (and wall) time of each
(medians; faiss and numpy are imported before the clock starts).

    PYTHONPATH=. python benchmarks/store_bytes.py --dir /tmp/bytes              # 10k, 100k
    PYTHONPATH=. python benchmarks/store_bytes.py --dir /tmp/bytes --sizes 100000

The stores are built again on each run (`--dir` is emptied of them first).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

MODEL = "all-MiniLM-L6-v2:onnx-int8/sum+1"
DIM = 384
PER_SESSION = 40
FLUSH = 10
USERS = 10


def turns(folder: Path) -> list[tuple[str, str]]:
    """(speaker, text) of every turn of the LoCoMo conversations in `folder`."""
    out = []
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        conversation = data.get("conversation", data)
        for key in sorted(k for k in conversation if k.startswith("session_") and k[8:].isdigit()):
            for turn in conversation[key]:
                out.append((str(turn["speaker"]), str(turn["text"])))
    return out


def build(db: Path, size: int, texts: list[tuple[str, str]]) -> float:
    import numpy as np

    from memcli.messages import Message
    from memcli.store import index as sql
    from memcli.store import vectors as vsql
    from memcli.store.base import NewMessage
    from memcli.store.sqlite import SQLiteStore

    started = time.perf_counter()
    store = SQLiteStore(db)
    rng = np.random.default_rng(size)
    start = datetime(2023, 1, 1, tzinfo=UTC)
    made = 0
    session = 0
    while made < size:
        count = min(PER_SESSION, size - made)
        session_id = f"s{session:06d}"
        store.create_session(session_id, f"user{session % USERS}", 30000, 0.7, 3000)
        new = []
        for n in range(count):
            name, text = texts[(made + n) % len(texts)]
            new.append(
                NewMessage(
                    Message(
                        role="user" if n % 2 == 0 else "assistant",
                        content=f"{text} ({(made + n) // len(texts)})",
                        name=name,
                        timestamp=start + timedelta(minutes=made + n),
                    ),
                    len(text) // 4 + 3,
                )
            )
        with store.transaction():
            ids = store.append_messages(session_id, new)
            for at in range(0, len(ids) - FLUSH + 1, FLUSH):
                store.archive(session_id, ids[at : at + FLUSH], FLUSH * 20, "budget")
        matrix = rng.standard_normal((len(ids), DIM)).astype(np.float32)
        matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
        vsql.add_vectors(
            store,
            MODEL,
            [(i, 0, DIM, v.tobytes()) for i, v in zip(ids, matrix, strict=True)],
            ids[-1],
        )
        made += count
        session += 1
    sql.catch_up(store)
    store.close()
    return time.perf_counter() - started


def index(db: Path) -> float:
    """Build the dense index as a search does; its seconds."""
    import numpy as np

    from memcli.search.dense import MessageVectors
    from memcli.store.index import Scope
    from memcli.store.sqlite import SQLiteStore

    store = SQLiteStore(db)
    started = time.perf_counter()
    vectors = MessageVectors(store, MODEL)
    vectors.search(np.ones(DIM, dtype=np.float32) / DIM**0.5, Scope(), 10)
    seconds = time.perf_counter() - started
    vectors.close()
    store.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    return seconds


def probe(db: Path) -> None:
    """In a fresh process: the first dense search (the index loaded) and a warm one, as JSON."""
    import faiss  # noqa: F401  (imported before the clock starts, as a search has it)
    import numpy as np

    from memcli.search.dense import MessageVectors
    from memcli.store.index import Scope
    from memcli.store.sqlite import SQLiteStore

    store = SQLiteStore(db)
    query = np.random.default_rng(7).standard_normal(DIM).astype(np.float32)
    query /= np.linalg.norm(query)
    vectors = MessageVectors(store, MODEL)
    cpu, wall = time.process_time(), time.perf_counter()
    vectors.search(query, Scope(), 10)
    first = (time.process_time() - cpu, time.perf_counter() - wall)
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(10):
        vectors.search(query, Scope(), 10)
    warm = ((time.process_time() - cpu) / 10, (time.perf_counter() - wall) / 10)
    cpu = time.process_time()
    for _ in range(10):
        vectors.search(query, Scope(session_id="s000007"), 10)
    session = (time.process_time() - cpu) / 10
    json.dump({"first": first, "warm": warm, "session": session, "rebuilt": vectors.rebuilt},
              sys.stdout)  # fmt: skip


def cold(db: Path, runs: int) -> dict[str, float]:
    found = []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, __file__, "--probe", str(db)], capture_output=True, text=True
        )
        if out.returncode:
            sys.exit(f"the probe failed:\n{out.stderr}")
        found.append(json.loads(out.stdout))
    assert not any(f["rebuilt"] for f in found), "the index was rebuilt, not loaded"
    return {
        "first_cpu": statistics.median(f["first"][0] for f in found),
        "first_wall": statistics.median(f["first"][1] for f in found),
        "warm_cpu": statistics.median(f["warm"][0] for f in found),
        "session_cpu": statistics.median(f["session"] for f in found),
    }


def measure(db: Path, size: int) -> dict[str, Any]:
    import sqlite3

    conn = sqlite3.connect(db)
    tables = dict(
        conn.execute(
            "SELECT name, SUM(pgsize) FROM dbstat GROUP BY name ORDER BY SUM(pgsize) DESC"
        ).fetchall()
    )
    conn.close()
    files = {p.name: p.stat().st_size for p in sorted(db.parent.glob(db.name + "*"))}
    database = sum(v for k, v in files.items() if ".retrieval." not in k)
    index_files = sum(v for k, v in files.items() if ".retrieval." in k)
    return {
        "tables": tables,
        "files": files,
        "database": database / size,
        "index": index_files / size,
        "total": (database + index_files) / size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, help="where the stores are built (required)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--locomo", type=Path, default=Path("/work/shared/data/locomo"))
    parser.add_argument("--cold", type=int, default=5, help="fresh processes searching")
    parser.add_argument("--probe", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        probe(args.probe)
        return
    if args.dir is None:
        parser.error("--dir is required")
    texts = turns(args.locomo)
    args.dir.mkdir(parents=True, exist_ok=True)
    for size in args.sizes:
        db = args.dir / f"bytes-{size}.db"
        for path in args.dir.glob(db.name + "*"):
            path.unlink()
        built = build(db, size, texts)
        indexed = index(db)
        figures = measure(db, size)
        print(
            f"{size:>8} messages: {figures['total']:6.0f} bytes per message"
            f" (database {figures['database']:.0f}, index files {figures['index']:.0f});"
            f" built in {built:.0f} s, index in {indexed:.1f} s",
            flush=True,
        )
        for name, pages in figures["tables"].items():
            if pages / size >= 5:
                print(f"    {name:<28} {pages / size:7.0f} bytes per message")
        for name, length in figures["files"].items():
            print(f"    {name:<28} {length / size:7.0f} bytes per message ({length:,} bytes)")
        if args.cold:
            times = cold(db, args.cold)
            print(
                f"    a fresh process's first dense search {times['first_cpu'] * 1000:.0f} ms"
                f" CPU ({times['first_wall'] * 1000:.0f} ms wall); then the whole store"
                f" {times['warm_cpu'] * 1000:.1f} ms CPU, a session"
                f" {times['session_cpu'] * 1000:.2f} ms CPU (medians of {args.cold} processes)",
                flush=True,
            )


if __name__ == "__main__":
    main()

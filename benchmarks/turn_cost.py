"""What a chat turn costs the dense index, and a small user's vector search, as the store grows.

For each size (10k, 100k, 1M messages by default) a SQLite store is built once through the
store's own functions (sessions of 100 messages over 10 users, random unit vectors of 384
dimensions: a search costs the same whatever the vectors hold), plus one small user of 200
messages, and the FAISS index files are built by a first search. Then, in this process:

- turn: two messages' vectors stored in the small user's session (as a chat turn embeds the
  user's input and the reply), then the index's refresh (adding them) and the user's next dense
  search; CPU (median of `--turns`) of each, and bytes written by the refresh (write calls of the
  process, /proc/self/io's wchar; the SQLite commit is excluded: it comes before the refresh);
  the CPU is user and system time (the fsync's share of the file system's journal is system
  time, and grows with what SQLite wrote before it); getrusage gives the user time alone;
- small user: the dense search of the 200-message user (warm, median CPU of 20 queries); and of
  a user holding a tenth of the store (median of 10), for comparison;
- import: 200 messages of a new user stored, then that user's first search (CPU, bytes written).

    PYTHONPATH=. python benchmarks/turn_cost.py --dir /tmp/turns                 # 10k, 100k
    PYTHONPATH=. python benchmarks/turn_cost.py --dir /tmp/turns --sizes 10000 100000 1000000

The stores are kept in `--dir` (built again only when missing); the index files are removed first
with `--fresh-index`, so that the code under test builds them.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

MODEL = "bench-model"
DIM = 384
PER_SESSION = 100
SMALL = 200


def _wchar() -> int:
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("wchar:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _unit(rng: Any, n: int) -> Any:
    import numpy as np

    matrix = rng.standard_normal((n, DIM)).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix


def add_session(store: Any, rng: Any, session_id: str, user_id: str, count: int) -> None:
    """A session of `count` messages of a user, each with a vector."""
    from memcli.messages import Message
    from memcli.store import vectors as vsql
    from memcli.store.base import NewMessage

    start = datetime(2023, 1, 1, tzinfo=UTC)
    if store.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is None:
        store.create_session(session_id, user_id, 30000, 0.7, 3000)
    new = [
        NewMessage(
            Message(
                role="user" if n % 2 == 0 else "assistant",
                content=f"message {n} of {session_id}",
                timestamp=start + timedelta(minutes=n),
            ),
            5,
        )
        for n in range(count)
    ]
    with store.transaction():
        ids = store.append_messages(session_id, new)
    vectors = _unit(rng, len(ids))
    vsql.add_vectors(
        store, MODEL, [(i, 0, DIM, v.tobytes()) for i, v in zip(ids, vectors, strict=True)], ids[-1]
    )


def build(db: Path, size: int) -> None:
    import numpy as np

    from memcli.store.sqlite import SQLiteStore

    started = time.perf_counter()
    db.parent.mkdir(parents=True, exist_ok=True)
    store = SQLiteStore(db)
    rng = np.random.default_rng(size)
    add_session(store, rng, "small-0", "small", SMALL)
    for s in range((size - SMALL) // PER_SESSION):
        add_session(store, rng, f"s{s:06d}", f"user{s % 10}", PER_SESSION)
    store.close()
    print(f"  built {db} ({size} messages) in {time.perf_counter() - started:.0f} s", flush=True)


def measure(db: Path, size: int, turns: int) -> dict[str, float]:
    import numpy as np

    from memcli.search.dense import MessageVectors
    from memcli.store.index import Scope
    from memcli.store.sqlite import SQLiteStore

    store = SQLiteStore(db)
    rng = np.random.default_rng(1)
    vectors = MessageVectors(store, MODEL)
    query = _unit(rng, 1)[0]
    started = time.process_time()
    vectors.search(query, Scope(), 10)  # loads (or builds) the index files
    load = time.process_time() - started
    cpu: list[float] = []
    user: list[float] = []
    searched: list[float] = []
    written: list[int] = []
    tag = time.time_ns()
    for _ in range(turns):
        add_session(store, rng, "small-0", "small", 2)
        before, started, own = (
            _wchar(),
            time.process_time(),
            resource.getrusage(resource.RUSAGE_SELF).ru_utime,
        )
        vectors.refresh()
        cpu.append(time.process_time() - started)
        user.append(resource.getrusage(resource.RUSAGE_SELF).ru_utime - own)
        written.append(_wchar() - before)
        started = time.process_time()
        vectors.search(_unit(rng, 1)[0], Scope(user_id="small"), 10)
        searched.append(time.process_time() - started)
    big: list[float] = []
    for _ in range(10):
        started = time.process_time()
        vectors.search(_unit(rng, 1)[0], Scope(user_id="user1"), 10)
        big.append(time.process_time() - started)
    small: list[float] = []
    for _ in range(20):
        q = _unit(rng, 1)[0]
        started = time.process_time()
        vectors.search(q, Scope(user_id="small"), 10)
        small.append(time.process_time() - started)
    add_session(store, rng, f"import-{tag}", f"new-{tag}", SMALL)
    before, started = _wchar(), time.process_time()
    vectors.search(_unit(rng, 1)[0], Scope(user_id=f"new-{tag}"), 10)
    imported = time.process_time() - started
    imported_bytes = _wchar() - before
    vectors.close()
    store.close()
    return {
        "load_s": load,
        "add_cpu_ms": statistics.median(cpu) * 1000,
        "add_cpu_max_ms": max(cpu) * 1000,
        "add_user_ms": statistics.median(user) * 1000,
        "turn_search_ms": statistics.median(searched) * 1000,
        "turn_cpu_ms": statistics.median([a + b for a, b in zip(cpu, searched, strict=True)])
        * 1000,
        "big_user_ms": statistics.median(big) * 1000,
        "turn_written_kb": statistics.median(written) / 1024,
        "small_user_ms": statistics.median(small) * 1000,
        "import_first_search_ms": imported * 1000,
        "import_written_kb": imported_bytes / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="where the stores are kept")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--turns", type=int, default=7)
    parser.add_argument("--fresh-index", action="store_true", help="remove the index files first")
    args = parser.parse_args()
    for size in args.sizes:
        db = args.dir / f"store-{size}.db"
        if not db.exists():
            build(db, size)
        if args.fresh_index:
            for path in args.dir.glob(f"{db.name}.retrieval.*"):
                path.unlink()
        figures = measure(db, size, args.turns)
        print(
            f"{size:>9} messages: turn {figures['turn_cpu_ms']:7.2f} ms CPU (adding the vectors"
            f" {figures['add_cpu_ms']:.2f} of which user {figures['add_user_ms']:.2f},"
            f" max {figures['add_cpu_max_ms']:.1f};"
            f" the search {figures['turn_search_ms']:.2f}), {figures['turn_written_kb']:9.1f} KB written;"
            f" small user's search {figures['small_user_ms']:6.2f} ms CPU;"
            f" a user of a tenth of the store {figures['big_user_ms']:6.2f} ms;"
            f" first search after a {SMALL}-message import {figures['import_first_search_ms']:7.1f}"
            f" ms CPU, {figures['import_written_kb']:9.1f} KB written"
            f" (index loaded in {figures['load_s']:.1f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()

"""Warm hybrid search latency on the PostgreSQL store of `pg_recall.py`, by the size of the user.

    PYTHONPATH=. python benchmarks/pg_hybrid.py --pgdata /tmp/pg1m --messages 1000000

`Retriever.search` (k 10, the default options) for users big0 (27% of the store), large0 (10%),
mid0 (2%), the first user of 500 messages, and no user, in hybrid, BM25 and vector modes, over
the first `--queries` shuffled LoCoMo questions; median and p95 per user and mode. Five searches
first warm the model and the connection; run it twice for a warm server (its buffers fill on
the first run). The store must exist: `pg_recall.py --pgdata DIR --messages N` builds it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pgdata", required=True, type=Path, help="the data folder of pg_recall.py"
    )
    parser.add_argument("--database", default="memcli_recall")
    parser.add_argument("--messages", type=int, default=150_000, help="as given to pg_recall.py")
    parser.add_argument("--queries", type=int, default=40)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    from locomo import DEFAULT_DATA
    from pg_recall import user_sizes
    from pg_search import server

    from memcli.config import default_home
    from memcli.search.onnx import OnnxEmbedder
    from memcli.search.retriever import Retriever
    from memcli.store import open_store

    if not (args.pgdata / "PG_VERSION").exists():
        parser.error(f"{args.pgdata} holds no database: build it with pg_recall.py first")
    pg = server(args.pgdata)
    store = open_store(str(pg.get_uri(args.database)))
    retriever = Retriever(store, OnnxEmbedder(default_home(os.environ) / "models"))
    questions: list[str] = []
    for path in sorted(DEFAULT_DATA.glob("*.json")):
        questions += [
            q["question"]
            for q in json.loads(path.read_text())["qa"]
            if q.get("category") in (1, 2, 3, 4)
        ]
    random.Random(5).shuffle(questions)
    questions = questions[: args.queries]
    sizes = user_sizes(args.messages)
    small = next(u for u, n in sizes.items() if n == 500)
    users: dict[str, str | None] = {
        f"big0 ({sizes['big0']:,})": "big0",
        f"large0 ({sizes['large0']:,})": "large0",
        f"mid0 ({sizes['mid0']:,})": "mid0",
        f"{small} (500)": small,
        "every message": None,
    }
    for q in questions[:5]:
        retriever.search(q, k=10, user_id="big0")
    print(f"load average {os.getloadavg()[0]:.2f}", flush=True)
    for label, user in users.items():
        for mode in ("hybrid", "lexical", "vector"):
            times = []
            for q in questions:
                started = time.perf_counter()
                retriever.search(q, k=10, user_id=user, mode=mode)
                times.append(time.perf_counter() - started)
            times.sort()
            p95 = times[min(len(times) - 1, int(len(times) * 0.95))]
            print(
                f"  {label:18} {mode:8} median {statistics.median(times) * 1000:6.1f} ms"
                f"  p95 {p95 * 1000:6.1f} ms",
                flush=True,
            )
    store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

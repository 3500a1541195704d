"""Scoped embedding: in a store where several users have messages with no vectors yet (as after
`import --no-blocks`), how many messages one user's first search embeds (it must be only that
user's), how long it takes, and the embedding rate behind the CLI's "about N s" estimate.

The store: USERS users of MESSAGES messages each (LoCoMo turns of the development
conversations, in sessions of 200), nothing embedded. Then, with the bundled model (ONNX):
one hybrid search of the last user (it embeds up to `embed_limit` of that user's pending
messages, never another user's), the vector rows per user before and after, and a second
search of the same user (nothing of its own left past the limit... or the rest of it).

    PYTHONPATH=. python benchmarks/scoped_embedding.py --users 4 --messages 2000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))


def vectors_per_user(store: object) -> dict[str, int]:
    rows = store.execute(  # type: ignore[attr-defined]
        "SELECT s.user_id, COUNT(DISTINCT v.message_id) FROM retrieval_vectors v"
        " JOIN messages m ON m.id = v.message_id JOIN sessions s ON s.id = m.session_id"
        " GROUP BY s.user_id ORDER BY 1"
    ).fetchall()
    return {str(u): int(n) for u, n in rows}


def main() -> int:
    from locomo import DEFAULT_DATA, transcript

    from memcli import Memory, Message
    from memcli.config import default_home
    from memcli.search.onnx import OnnxEmbedder
    from memcli.search.retriever import Retriever
    from memcli.search.types import EMBED_RATE
    from memcli.store import open_store
    from memcli.store.index import Scope

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--messages", type=int, default=2000, help="per user")
    parser.add_argument("--db", type=Path, help="default: a temporary file")
    parser.add_argument("--model-cache", default=os.environ.get("MEMCLI_MODEL_CACHE"))
    args = parser.parse_args()

    pool: list[dict[str, str]] = []
    for path in sorted(DEFAULT_DATA.glob("*.json")):
        pool.extend(transcript(json.loads(path.read_text()), "x")[0])
    folder = tempfile.mkdtemp()
    db = args.db or Path(folder) / "scoped.db"
    started = time.perf_counter()
    at = 0
    users = [f"u{i}" for i in range(args.users)]
    for user in users:
        for first in range(0, args.messages, 200):
            memory = Memory.from_defaults(
                session_id=f"{user}-{first // 200}",
                user_id=user,
                db=db,
                memory_blocks=[],
                token_limit=10_000_000,
            )
            batch = []
            for _ in range(min(200, args.messages - first)):
                turn = pool[at % len(pool)]
                at += 1
                batch.append(Message("user", turn["content"], name=turn.get("name")))
            memory.put_messages(batch, feed_blocks=False)
            memory.store.close()
    print(
        f"store: {len(users)} users x {args.messages:,} messages, none embedded"
        f" (built in {time.perf_counter() - started:.1f} s)"
    )

    store = open_store(db)
    embedder = OnnxEmbedder(args.model_cache or default_home(os.environ) / "models")
    retriever = Retriever(store, embedder)
    embedder.embed(["warm up"])  # the model's loading is not the embedding's time
    me = users[-1]
    print(
        f"pending: {retriever.pending():,} in the store, {retriever.pending(Scope(user_id=me)):,}"
        f" of {me}'s; vector rows per user before: {vectors_per_user(store)}"
    )
    for attempt in (1, 2):
        started = time.perf_counter()
        result = retriever.search("What instrument does she play?", k=5, user_id=me)
        took = time.perf_counter() - started
        after = vectors_per_user(store)
        others = sum(n for u, n in after.items() if u != me)
        rate = result.embedded / took if result.embedded else 0.0
        print(
            f"search {attempt} of {me}: embedded {result.embedded:,} messages ({others:,} of other"
            f" users'), {result.pending:,} of {me}'s left, {took:.1f} s"
            + (f" ({rate:.0f} messages/s; the estimate uses {EMBED_RATE})" if rate else "")
        )
    print(f"vector rows per user after: {vectors_per_user(store)}")
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

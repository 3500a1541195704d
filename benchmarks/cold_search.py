"""Cold-shell search latency on a big store: a fresh process per query, as a user types it.

The store is built synthetically but realistically: 100,000 flushed batches of 10 messages
(1,000,000 messages) in 1,000 sessions of 10 users. Each message is a LoCoMo turn (from the
development conversations) with two of its words swapped for words of other turns and a speaker
name drawn from a list; its vector is the real MiniLM vector of its source unit plus a little
noise (embedding a million messages on this machine would take hours, and a search costs the
same whatever the vectors hold). The FAISS index file is then built once, as the first search
after an import does.

    PYTHONPATH=. python benchmarks/cold_search.py --db /tmp/big/memcli.db      # build + measure
    PYTHONPATH=. python benchmarks/cold_search.py --db /tmp/big/memcli.db --command "python -m memcli search ..."

Each timed run is `python -c "<search>"` (or the given command) in a new process: interpreter
start, imports, loading the ONNX model and the index, the query. Reported: every run and the
median.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

NAMES = ["Ana", "Ben", "Chloe", "Dev", "Emma", "Farid", "Gus", "Hana", "Ivan", "Jade"]
QUERIES = [
    "When did Caroline go to the LGBTQ support group?",
    "What instrument does Melanie play?",
    "Where did they go camping last summer?",
    "what books has she been reading",
    "pottery class",
]


def build(db: Path, messages: int, per_batch: int, sessions: int, cache: str | None) -> None:
    import numpy as np
    from locomo import DEFAULT_DATA, transcript

    from memcli.messages import Message
    from memcli.search.onnx import OnnxEmbedder
    from memcli.search.retriever import Retriever
    from memcli.store import vectors as vsql
    from memcli.store.base import NewMessage
    from memcli.store.sqlite import SQLiteStore

    pool: list[dict[str, str]] = []
    for path in sorted(DEFAULT_DATA.glob("*.json")):
        records, _ = transcript(json.loads(path.read_text()), "x")
        pool.extend(records)
    from memcli.config import default_home

    embedder = OnnxEmbedder(cache or default_home(os.environ) / "models")
    started = time.perf_counter()
    # As Retriever._embed makes them: each turn's vector summed with the previous turn's, each
    # weighted by its words.
    texts = [f"{r['name']}: {r['content']}" for r in pool]
    own = embedder.embed(texts) * np.array([[len(t.split())] for t in texts], dtype=np.float32)
    pool_vectors = own.copy()
    pool_vectors[1:] += own[:-1]
    pool_vectors /= np.linalg.norm(pool_vectors, axis=1, keepdims=True)
    print(f"embedded {len(texts)} pool turns in {time.perf_counter() - started:.1f} s")
    vocabulary = sorted({w for r in pool for w in r["content"].split()})
    rng = random.Random(7)
    noise = np.random.default_rng(7)
    store = SQLiteStore(db)
    model = Retriever(store, embedder).model
    per_session = messages // sessions
    start_time = datetime(2023, 1, 1, tzinfo=UTC)
    started = time.perf_counter()
    next_id = 1
    for s in range(sessions):
        session_id = f"s{s:05d}"
        user_id = f"user{s % 10}"
        store.create_session(session_id, user_id, 30000, 0.7, 3000)
        picks = [rng.randrange(len(pool)) for _ in range(per_session)]
        new = []
        for n, j in enumerate(picks):
            words = pool[j]["content"].split()
            for _ in range(2):
                if words:
                    words[rng.randrange(len(words))] = rng.choice(vocabulary)
            text = " ".join(words)
            new.append(
                NewMessage(
                    Message(
                        role="user" if n % 2 == 0 else "assistant",
                        content=text,
                        name=NAMES[(s + n % 2) % len(NAMES)],
                        timestamp=start_time + timedelta(minutes=s * 1000 + n),
                    ),
                    max(1, len(text) // 4),
                )
            )
        with store.transaction():
            ids = store.append_messages(session_id, new)
            for b in range(0, len(ids), per_batch):
                chunk = ids[b : b + per_batch]
                store.archive(
                    session_id, chunk, sum(x.tokens for x in new[b : b + per_batch]), "size"
                )
        vectors = pool_vectors[picks] + noise.normal(0, 0.02, (len(picks), 384)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        vsql.add_vectors(
            store,
            model,
            [
                (i, 0, 384, v.astype(np.float32).tobytes())
                for i, v in zip(ids, vectors, strict=True)
            ],
            ids[-1],
        )
        next_id = ids[-1] + 1
        if s % 100 == 99:
            print(
                f"  {s + 1} sessions, {next_id - 1} messages, {time.perf_counter() - started:.0f} s",
                flush=True,
            )
    print(f"stored {next_id - 1} messages in {time.perf_counter() - started:.0f} s")
    started = time.perf_counter()
    retriever = Retriever(store, embedder)
    result = retriever.search("warm up the index file", k=5)
    print(
        f"built the index file in {time.perf_counter() - started:.0f} s"
        f" ({retriever.vectors.count} vectors, {len(result.hits)} hits)"
    )
    store.close()


SEARCH = """
import os, sys, time
from memcli.config import default_home
from memcli.search.onnx import OnnxEmbedder
from memcli.search.retriever import Retriever
from memcli.store.sqlite import SQLiteStore
store = SQLiteStore(sys.argv[1])
result = Retriever(store, OnnxEmbedder(sys.argv[2] or default_home(os.environ) / "models")).search(sys.argv[3], k=5, user_id="user3")
print(len(result.hits), result.pending)
"""


def measure(db: Path, cache: str | None, command: str | None, runs: int) -> list[float]:
    times = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for i in range(runs):
        query = QUERIES[i % len(QUERIES)]
        if command:
            argv = [*command.split(), query]
        else:
            argv = [sys.executable, "-c", SEARCH, str(db), cache or "", query]
        started = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, env=env)
        elapsed = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"search failed: {done.stderr[-2000:]}")
        times.append(elapsed)
        print(f"  {elapsed:.3f} s  {query!r} -> {done.stdout.strip()[:80]!r}", flush=True)
    return times


def warm(
    db: Path, cache: str | None, runs: int, threads: int | None, options: str | None = None
) -> dict[str, list[float]]:
    """The vector block's query in one process once the model and index are loaded (what a chat
    turn pays): `VectorBlock.get` as `Memory.get` calls it, for user3 (scope "user", k = 2,
    archived messages only), with two shapes of context: the input alone (a LoCoMo question), and
    a window of 5 messages (4 LoCoMo turns, then the question), the block's default."""
    from fakes import WordTokenizer
    from locomo import DEFAULT_DATA

    from memcli import Message, SQLiteStore, VectorBlock
    from memcli.blocks.base import BlockContext
    from memcli.search.onnx import OnnxEmbedder

    questions: list[str] = []
    turns: list[str] = []
    for path in sorted(DEFAULT_DATA.glob("*.json")):
        data = json.loads(path.read_text())
        conv = data.get("conversation", data)
        qas = data.get("qa", conv.get("qa", []))
        questions += [q["question"] for q in qas if q.get("category") in (1, 2, 3, 4)]
        turns += [t["text"] for n in range(1, 40) for t in conv.get(f"session_{n}", [])]
    random.Random(3).shuffle(questions)
    store = SQLiteStore(db)
    from memcli.config import default_home

    embedder = OnnxEmbedder(cache or default_home(os.environ) / "models", threads=threads)
    from memcli.search.types import SearchOptions

    search_options = SearchOptions(**json.loads(options)) if options else None
    block = VectorBlock(embedder=embedder, search_options=search_options)
    ctx = BlockContext("s00003", "user3", store, WordTokenizer())
    block.get([Message("user", QUERIES[0])], ctx)  # loads the model and the index
    times: dict[str, list[float]] = {
        "the input alone": [],
        "a window of 5 messages, none seen before": [],
        "a chat's window of 5, sliding a turn each time": [],
    }
    chat = [t for t in turns if t not in turns[: 4 * runs + 4]]  # turns the other shapes skip
    for i in range(runs):
        question = Message("user", questions[i % len(questions)])
        start = 4 * i % (len(turns) - 4)
        window = [
            Message("user" if j % 2 == 0 else "assistant", t)
            for j, t in enumerate(turns[start : start + 4])
        ]
        # A chat turn: the window moves on by a turn (the last reply and the new input are new;
        # here 2 turns and the question, 3 new messages of 5).
        sliding = [
            Message("user" if j % 2 == 0 else "assistant", t)
            for j, t in enumerate(chat[2 * i : 2 * i + 4])
        ]
        shapes = ([question], [*window, question], [*sliding, question])
        for shape, messages in zip(times, shapes, strict=True):
            started = time.perf_counter()
            block.get(messages, ctx)
            times[shape].append(time.perf_counter() - started)
            assert block.last_hits, "the block found nothing"
    return times


def scope(
    db: Path | str, cache: str | None, runs: int, only: str | None = None, k: int = 10
) -> None:
    """Scope first, in a store of several users (`db`: a SQLite file, or a `postgresql://` URL:
    the store copied there by `memcli copy`): for each user (or `only` that one), `runs`
    LoCoMo questions searched in lexical mode (how many lose their lexical hits to other users:
    the user's messages hold a query word, yet BM25 found none of them; must be 0), then timed
    warm in each mode (hybrid, lexical, vector, and hybrid leaving out a session's window as a
    chat's long-term memory does: p50/p95); and the dense search's recall@`k` of
    the exact top `k` (numpy over the user's stored vectors), as the index answers it."""
    import numpy as np
    from locomo import DEFAULT_DATA

    from memcli.config import default_home
    from memcli.search.onnx import OnnxEmbedder
    from memcli.search.retriever import Retriever
    from memcli.search.types import SearchOptions
    from memcli.store import index as sql
    from memcli.store import open_store

    questions: list[str] = []
    for path in sorted(DEFAULT_DATA.glob("*.json")):
        data = json.loads(path.read_text())
        conv = data.get("conversation", data)
        questions += [q["question"] for q in data.get("qa", conv.get("qa", []))]
    random.Random(5).shuffle(questions)
    store = open_store(db, create=False)
    embedder = OnnxEmbedder(cache or default_home(os.environ) / "models")
    retriever = Retriever(store, embedder, SearchOptions())
    users = [r[0] for r in store.execute("SELECT DISTINCT user_id FROM sessions ORDER BY 1")]
    if only is not None:
        users = [only]
    sizes = {u: sql.scope_size(store, sql.Scope(user_id=u)) for u in users}
    total = sql.scope_size(store, None)
    started = time.perf_counter()
    retriever.search(questions[0], k=5, user_id=users[0])  # loads the model and the index
    print(f"first search (model, index): {time.perf_counter() - started:.1f} s")
    lost = asked = 0
    times: dict[str, list[float]] = {"hybrid": [], "lexical": [], "vector": [], "chat": []}
    recall: list[float] = []
    cosines: tuple[list[float], list[float]] = ([], [])  # the exact top k's mean, the found's
    for at, user in enumerate(users):
        owner = sql.Scope(user_id=user)
        asking = questions[at * runs : (at + 1) * runs]
        # Hybrid first: its searches count each word in the user's messages for the first
        # time (the other modes find the counts kept, as a chat's next turns do).
        # "chat": hybrid, leaving out the window of the user's latest session, as a chat's
        # long-term memory searches (`except_window`).
        latest = store.execute(
            "SELECT id FROM sessions WHERE user_id = ? ORDER BY updated_at DESC, id DESC LIMIT 1",
            (user,),
        ).fetchone()[0]
        for mode, spent in times.items():
            for question in asking:
                window = latest if mode == "chat" else None
                started = time.perf_counter()
                retriever.search(
                    question,
                    k=5,
                    user_id=user,
                    mode="hybrid" if mode == "chat" else mode,
                    except_window=window,
                )
                spent.append(time.perf_counter() - started)
        for question in asking:
            terms = retriever.lexical.terms(question, owner)[0]
            has = any(sql.term_counts(store, terms, 1, owner).values())
            found = retriever.search(question, k=5, user_id=user, mode="lexical").hits
            asked += 1
            lost += bool(has and not found)
        exact = _user_vectors(store, retriever.model, user)
        for question in asking:
            vector = embedder.embed([question])[0].astype(np.float32)
            scores = exact[0] @ vector
            best = np.argsort(-scores)[:k]
            want = set(exact[1][best].tolist())
            found = retriever.vectors.search(vector, owner, k)
            recall.append(len(want & {i for i, _ in found}) / k)
            cosines[0].append(float(scores[best].mean()))
            cosines[1].append(statistics.mean(c for _, c in found) if found else 0.0)
    print(
        f"scope: {len(users)} user(s) of {', '.join(str(sizes[u]) for u in users)} messages"
        f" in a store of {total}; {asked} queries, {lost} lost their lexical hits to other users"
        f" (load average {os.getloadavg()[0]:.1f})"
    )
    for mode, spent in times.items():
        hot = sorted(spent)
        print(
            f"  {mode:8} warm p50 {statistics.median(hot) * 1000:6.1f} ms,"
            f" p95 {hot[min(len(hot) - 1, int(len(hot) * 0.95))] * 1000:6.1f} ms"
            f" over {len(hot)} queries"
        )
    print(
        f"  dense recall@{k} against exact search of the user's vectors:"
        f" {statistics.mean(recall):.3f} ({type(getattr(retriever.vectors, 'index', retriever.vectors)).__name__});"
        f" mean cosine of the top {k}: exact {statistics.mean(cosines[0]):.4f},"
        f" found {statistics.mean(cosines[1]):.4f}"
    )


def _user_vectors(store: Any, model: str, user: str) -> tuple[Any, Any]:
    """A user's stored vectors (first piece of each message) and their message ids."""
    import numpy as np

    rows = store.execute(
        "SELECT v.message_id, v.vector FROM retrieval_vectors v JOIN messages m"
        " ON m.id = v.message_id JOIN sessions s ON s.id = m.session_id"
        " WHERE s.user_id = ? AND v.model = ? AND v.piece = 0",
        (user, model),
    ).fetchall()
    from memcli.store import vectors as vsql

    ids = np.asarray([r[0] for r in rows], dtype=np.int64)
    dim = len(rows[0][1]) // (2 if store.dialect == "sqlite" else 4)  # (as stored: float16)
    matrix = vsql.to_matrix([bytes(r[1]) for r in rows], dim)
    return matrix, ids


def rekey(db: Path, cache: str | None) -> None:
    """Give a store built by an earlier version of this benchmark the current model key (its
    vectors are synthetic: only their number and layout matter to the timings). A real store of
    an older key is embedded again instead (the key names how its vectors were made)."""
    from memcli.search.onnx import OnnxEmbedder
    from memcli.search.retriever import Retriever
    from memcli.store.sqlite import SQLiteStore

    store = SQLiteStore(db)
    from memcli.config import default_home

    model = Retriever(store, OnnxEmbedder(cache or default_home(os.environ) / "models")).model
    with store.transaction():
        old = [r[0] for r in store.execute("SELECT DISTINCT model FROM retrieval_vectors")]
        store.execute("UPDATE retrieval_vectors SET model = ?", (model,))
        for prefix in ("embedded:", "vectors_added:"):
            for name in old:
                store.execute(
                    "UPDATE retrieval_state SET key = ? WHERE key = ?",
                    (prefix + model, prefix + name),
                )
    print(f"vectors of {old} now under {model!r}")
    store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--db", required=True, help="the SQLite file (or, for --scope alone, a postgresql:// URL)"
    )
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--per-batch", type=int, default=10)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--command", help="time this command (the query is appended) instead")
    parser.add_argument(
        "--warm", type=int, default=0, help="also time N vector block queries in a warm process"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="ONNX Runtime threads for the warm queries"
    )
    parser.add_argument(
        "--model-cache",
        default=os.environ.get("MEMCLI_MODEL_CACHE"),
        help="folder for the exported ONNX model (default: $MEMCLI_HOME/models, as the CLI)",
    )
    parser.add_argument("--options", help="SearchOptions overrides (JSON) for the warm queries")
    parser.add_argument(
        "--scope", type=int, default=0, help="also N queries per user: lost lexical hits, p95"
    )
    parser.add_argument("--user", help="with --scope: only this user")
    parser.add_argument(
        "--rekey", action="store_true", help="give an older store's vectors the current model key"
    )
    args = parser.parse_args()
    if not args.db.startswith(("postgresql://", "postgres://")):
        args.db = Path(args.db)
    elif args.runs or args.warm or args.rekey:
        parser.error("a postgresql:// --db takes --scope only (with --runs 0)")
    if args.rekey:
        rekey(args.db, args.model_cache)
    if isinstance(args.db, Path) and not args.db.exists():
        args.db.parent.mkdir(parents=True, exist_ok=True)
        build(args.db, args.messages, args.per_batch, args.sessions, args.model_cache)
    if args.runs:
        times = measure(args.db, args.model_cache, args.command, args.runs)
        print(f"cold search: median {statistics.median(times):.3f} s, max {max(times):.3f} s")
    if args.scope:
        scope(args.db, args.model_cache, args.scope, args.user)
    if args.warm:
        load = os.getloadavg()[0]
        shapes = warm(args.db, args.model_cache, args.warm, args.threads, args.options)
        for shape, times in shapes.items():
            hot = sorted(times)
            print(
                f"warm vector block query ({shape}): median {statistics.median(hot) * 1000:.1f} ms,"
                f" p90 {hot[int(len(hot) * 0.9)] * 1000:.1f} ms over {len(hot)} queries"
                f" (load average {load:.2f} before)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""PostgreSQL against SQLite on the same machine, in the same run: puts by one writer, puts by 8
writer processes at once (each into its own session, then all into one), and `get()` with a full
default window on PostgreSQL.

Run: .venv/bin/python benchmarks/postgres.py [--puts 2000] [--workers 8] [--worker-puts 300]
     [--url postgresql://...]

Without --url it starts Debian's PostgreSQL (initdb + pg_ctl, as tests/pg.py does) in a temporary
directory on a unix socket, with fsync on and `synchronous_commit = off`: a commit does not wait
for its WAL to reach the disk, as SQLite's WAL mode with `synchronous = NORMAL` (memcli's) does
not. SQLite runs on a file in a temporary directory. Puts are single messages through
`Memory.put` (a 2,000-token budget, so that flushes happen; the word tokenizer, so that the
figures are the store's); each process opens its own store. Nothing here is part of the test run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fakes import WordTokenizer, importing_fakes  # noqa: E402

from memcli import Memory, Message  # noqa: E402
from memcli.flush import Budget  # noqa: E402
from memcli.store import open_store  # noqa: E402

BUDGET = Budget(2000, 0.7, 200)
WORDS = "tell me about your day I went hiking with my dog and we saw a lake".split()

WORKER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from memcli import Memory, Message
    from fakes import WordTokenizer
    from memcli.flush import Budget

    from memcli.store import open_store

    db, session, puts, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    memory = Memory(open_store(db), session, budget=Budget(2000, 0.7, 200), tokenizer=WordTokenizer())
    while not Path(go).exists():
        time.sleep(0.001)
    for i in range(puts):
        memory.put(Message("user" if i % 2 == 0 else "assistant", f"{session} {i} " + "word " * (i % 13)))
    """
)


def text(i: int) -> str:
    return " ".join(WORDS[(i + k) % len(WORDS)] for k in range(3 + i % 12))


def one_writer(db: str, puts: int) -> float:
    """Puts per second of one writer into one session."""
    memory = Memory(open_store(db), "one", budget=BUDGET, tokenizer=WordTokenizer())
    start = time.perf_counter()
    for i in range(puts):
        memory.put(Message("user" if i % 2 == 0 else "assistant", text(i)))
    elapsed = time.perf_counter() - start
    memory.store.check() == [] or sys.exit(f"{db}: check found problems")
    return puts / elapsed


def many_writers(db: str, workers: int, puts: int, shared: bool, tmp: Path) -> float:
    """Puts per second of `workers` processes at once (from the moment all are ready)."""
    script = tmp / "worker.py"
    script.write_text(importing_fakes(WORKER))
    tag = f"{'shared' if shared else 'own'}-{time.monotonic_ns()}"
    go = tmp / f"go-{tag}"
    if shared:
        Memory(open_store(db), tag, budget=BUDGET, tokenizer=WordTokenizer())
    sessions = [tag if shared else f"{tag}-{w}" for w in range(workers)]
    procs = [
        subprocess.Popen([sys.executable, str(script), db, s, str(puts), str(go)]) for s in sessions
    ]
    time.sleep(3)  # (every process imported memcli and opened its store)
    start = time.perf_counter()
    go.touch()
    for proc in procs:
        if proc.wait() != 0:
            sys.exit("a worker failed")
    elapsed = time.perf_counter() - start
    store = open_store(db)
    total = sum(len(store.get_messages(s)) for s in set(sessions))
    assert total == workers * puts, (total, workers * puts)
    return workers * puts / elapsed


def full_window_gets(url: str, rounds: int = 200) -> tuple[float, float, int, int]:
    """`get()` on PostgreSQL with the default budget's window full (30,000 tokens x 0.7, real
    tiktoken counts): median ms of a get by a Memory that holds the window (one version check),
    and of a first get by a new Memory (the window read whole); the window's messages, tokens."""
    memory = Memory.from_defaults(session_id="window", db=url)
    i = 0
    while memory.active_tokens() < memory.threshold - 100:
        memory.put_messages([Message("user", text(i) * 3), Message("assistant", text(i + 1) * 3)])
        i += 2
    window = memory.get()
    warm = []
    for _ in range(rounds):
        start = time.perf_counter()
        memory.get()
        warm.append(time.perf_counter() - start)
    cold = []
    store = open_store(url)
    for _ in range(max(rounds // 10, 5)):
        fresh = Memory(store, "window", tokenizer=memory.tokenizer)
        start = time.perf_counter()
        fresh.get()
        cold.append(time.perf_counter() - start)
    ms = 1000
    tokens = memory.active_tokens()
    return statistics.median(warm) * ms, statistics.median(cold) * ms, len(window), tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--puts", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--worker-puts", type=int, default=300)
    parser.add_argument("--url", help="an existing PostgreSQL database (default: start a server)")
    args = parser.parse_args()
    server = None
    if args.url is None:
        from pg import DebianServer, new_database

        server = DebianServer(durable=True).start()
        urls = [new_database(server) for _ in range(3)]
        import psycopg

        for url in urls:  # commits do not wait for the disk, as SQLite's (see above)
            name = url.rsplit("/", 1)[1].split("?", 1)[0]
            with psycopg.connect(server.url(), autocommit=True) as conn:
                conn.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    else:
        urls = [args.url] * 3
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tmp_path = Path(tmp)
            sqlite = str(tmp_path / "memcli.db")
            print(f"puts/s, one writer ({args.puts} puts into one session):")
            print(f"  SQLite      {one_writer(sqlite, args.puts):8.0f}")
            print(f"  PostgreSQL  {one_writer(urls[0], args.puts):8.0f}")
            for shared in (False, True):
                what = "one session" if shared else "a session each"
                print(f"puts/s, {args.workers} writer processes x {args.worker_puts}, {what}:")
                for name, db in (("SQLite", sqlite), ("PostgreSQL", urls[1])):
                    rate = many_writers(db, args.workers, args.worker_puts, shared, tmp_path)
                    print(f"  {name:<10}  {rate:8.0f}")
            warm, cold, count, tokens = full_window_gets(urls[2])
            print(
                f"get() on PostgreSQL, default budget, window full ({count} messages, {tokens:,} tokens):"
            )
            print(f"  held window {warm:6.2f} ms    new Memory (reads it) {cold:6.2f} ms")
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()

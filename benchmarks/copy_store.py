"""`memcli copy`: SQLite -> PostgreSQL and back, as a user runs it (fresh CLI processes): wall
time and peak memory (RSS) of each copy, which includes its verification (row counts and every
session's export read on both sides).

    PYTHONPATH=. .venv/bin/python benchmarks/copy_store.py                  # 100,000 messages
    PYTHONPATH=. .venv/bin/python benchmarks/copy_store.py --messages 20000 --url postgresql://...

The source is a SQLite file of `--sessions` sessions (imported with `memcli import --no-blocks`,
so with their flushes), and one 384-dimension float32 vector per message stored as the vector
block stores them (random values: the copy does not look at them). Without --url, Debian's
PostgreSQL is started in a temporary directory on a unix socket (tests/pg.py: fsync off, as the
tests run it). CPU time is the memcli process's (not the server's). Nothing here is part of
the test run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

WORDS = "tell me about your day I went hiking with my dog and we saw a lake by the river".split()


def run(command: list[str], env: dict[str, str]) -> tuple[float, float, float, str]:
    """Wall seconds, CPU seconds and peak RSS in MB (the process's own, from wait4), and stderr
    of a command."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - start
        err.seek(0)
        text = err.read().decode()
    if os.waitstatus_to_exitcode(status):
        sys.exit(f"{' '.join(command)} failed:\n{text}")
    return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, text


def build(db: Path, messages: int, sessions: int, env: dict[str, str], tmp: Path) -> None:
    from memcli.store import open_store
    from memcli.store import vectors as vsql

    rng = random.Random(1)
    per = messages // sessions
    for s in range(sessions):
        path = tmp / f"s{s}.jsonl"
        with path.open("w") as f:
            for i in range(per):
                words = " ".join(rng.choices(WORDS, k=8 + i % 30))
                role = "user" if i % 2 == 0 else "assistant"
                f.write(json.dumps({"role": role, "content": f"{s}/{i} {words}"}) + "\n")
        command = [sys.executable, "-m", "memcli", "--db", str(db), "import", str(path)]
        run([*command, "--session", f"s{s}", "--user", f"u{s % 3}", "--no-blocks"], env)
    store = open_store(db)
    ids = [r[0] for r in store.execute("SELECT id FROM messages ORDER BY id").fetchall()]
    for start in range(0, len(ids), 5000):
        chunk = ids[start : start + 5000]
        rows = [(i, 0, 384, rng.randbytes(384 * 4)) for i in chunk]
        vsql.add_vectors(store, "bench", rows, chunk[-1])
    store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--url", help="an empty PostgreSQL database (default: start one)")
    args = parser.parse_args()
    server = None
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        env = {**os.environ, "MEMCLI_HOME": str(tmp / "home"), "MEMCLI_CONFIG": str(tmp / "c")}
        (tmp / "c").write_text("blocks = []\n")
        url = args.url
        if url is None:
            from pg import DebianServer, new_database

            server = DebianServer().start()
            url = new_database(server)
        try:
            src, back = tmp / "src.db", tmp / "back.db"
            started = time.perf_counter()
            build(src, args.messages, args.sessions, env, tmp)
            print(
                f"source: {args.messages:,} messages in {args.sessions} sessions, one vector"
                f" each, {src.stat().st_size / 1e6:.0f} MB (built in"
                f" {time.perf_counter() - started:.0f} s)"
            )
            for label, a, b in (
                ("SQLite -> PostgreSQL", str(src), url),
                ("PostgreSQL -> SQLite", url, str(back)),
            ):
                seconds, cpu, rss, text = run([sys.executable, "-m", "memcli", "copy", a, b], env)
                rate = args.messages / seconds
                print(
                    f"{label}: {seconds:.1f} s ({rate:,.0f} messages/s), memcli's CPU"
                    f" {cpu:.1f} s, peak RSS {rss:.0f} MB"
                )
                print(f"  {text.strip()}")
        finally:
            if server is not None:
                server.stop()


if __name__ == "__main__":
    main()

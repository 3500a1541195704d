"""What the index's folding (`memcli.fold`, issue 44) costs when a database is brought up to date
and when messages are indexed: SQLite's migration 27 (the FTS5 index made again through the
folding view: a 'rebuild' of it), PostgreSQL's 31 (the tsvector column made again through
`memcli_fold`), each against the same rebuild without folding, on N messages of a few
sentences with some accented words (--ascii: none).

Run: .venv/bin/python benchmarks/fold_rebuild.py [--messages 100000] [--ascii] [--url postgresql://...]

Without --url it starts Debian's PostgreSQL (tests/pg.py) in a temporary directory. Prints the
messages per second of each rebuild (PostgreSQL's figure is pg_migrations.REWRITES[31]).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from memcli.messages import Message  # noqa: E402
from memcli.store import open_store  # noqa: E402
from memcli.store.base import NewMessage  # noqa: E402
from memcli.store.pg_migrations import TSV_CHARS, USER_LEXEME  # noqa: E402

WORDS = (
    "tell me about your day I went hiking with my dog and we saw a lake near Tromsø"
    " then took the train from Gdańsk to Łódź and had a café crème on the Straße"
).split()
#: With --ascii: messages of ASCII words alone (the view leaves them as they are).
ASCII = [w for w in WORDS if w.isascii()]


def fill(url: str, n: int, words: list[str]) -> Any:
    store = open_store(url)
    rng = random.Random(1)
    store.create_session("s", "u", 10**9, 0.7, 10**6)
    batch = 2000
    for start in range(0, n, batch):
        rows = [
            NewMessage(Message("user", " ".join(rng.choices(words, k=40))), 40)
            for _ in range(min(batch, n - start))
        ]
        store.append_messages("s", rows)
    return store


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:,.0f} messages/s ({seconds:.1f} s)"


def sqlite(n: int, words: list[str]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        store = fill(str(Path(folder) / "b.db"), n, words)
        conn = store.conn
        for name, content in (("folded", "retrieval_folded"), ("plain", "messages")):
            conn.execute("DROP TABLE IF EXISTS bench_fts")
            conn.execute(
                f"CREATE VIRTUAL TABLE bench_fts USING fts5(name, content, content='{content}',"
                " content_rowid='id', tokenize='porter unicode61 remove_diacritics 2')"
            )
            began = time.perf_counter()
            conn.execute("INSERT INTO bench_fts (bench_fts) VALUES ('rebuild')")
            conn.commit()
            print(f"SQLite, FTS5 rebuild, {name}: {rate(n, time.perf_counter() - began)}")
        store.close()


def postgres(url: str, n: int, words: list[str]) -> None:
    store = fill(url, n, words)
    conn = store.conn
    text = f"left(COALESCE(name, '') || ' ' || content, {TSV_CHARS})"
    user = f"array_to_tsvector(ARRAY[{USER_LEXEME.format('user_id')}])"
    for name, source in (("folded", f"memcli_fold({text})"), ("plain", text)):
        began = time.perf_counter()
        with conn.transaction():
            conn.execute("DROP INDEX messages_search")
            conn.execute("ALTER TABLE messages DROP COLUMN search")
            conn.execute(
                "ALTER TABLE messages ADD COLUMN search tsvector GENERATED ALWAYS AS"
                f" (to_tsvector('memcli'::regconfig, {source}) || {user}) STORED"
            )
            conn.execute("CREATE INDEX messages_search ON messages USING gin (search)")
        print(f"PostgreSQL, tsvector column, {name}: {rate(n, time.perf_counter() - began)}")
    store.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--url")
    parser.add_argument("--ascii", action="store_true", help="messages of ASCII words alone")
    args = parser.parse_args()
    words = ASCII if args.ascii else WORDS
    sqlite(args.messages, words)
    if args.url:
        postgres(args.url, args.messages, words)
        return
    from pg import DebianServer, new_database

    server = DebianServer().start()
    try:
        postgres(new_database(server), args.messages, words)
    finally:
        server.stop()


if __name__ == "__main__":
    main()

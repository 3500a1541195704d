"""The stores: migrations, WAL, indexes, ids that are never reused (SQLite and PostgreSQL)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import WordTokenizer

from memcli import Memory, Message
from memcli.store import open_store
from memcli.store.migrations import MIGRATIONS
from memcli.store.sqlite import SQLiteStore


def test_migrations_recorded_once(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    SQLiteStore(db).close()
    store = SQLiteStore(db)
    versions = [r[0] for r in store.execute("SELECT version FROM migrations ORDER BY version")]
    assert versions == [v for v, _ in MIGRATIONS]


def test_a_new_database_has_the_recorded_schema(tmp_path: Path) -> None:
    """tests/data/schema.sql is the schema of a new database, statement for statement: a change
    to the schema must come as a new migration (and a new snapshot)."""
    store = SQLiteStore(tmp_path / "s.db")
    made = store.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY rowid")
    recorded = (Path(__file__).parent / "data" / "schema.sql").read_text()
    assert "".join(row[0] + ";\n" for row in made) == recorded


def test_a_deleted_sessions_marks_are_found_through_their_index(tmp_path: Path) -> None:
    """The trigger of a deleted session looks its embedding marks (and its user's) up by their
    scope, not through every mark: forgetting a user of 8,000 sessions read 64 million marks."""
    store = SQLiteStore(tmp_path / "s.db")
    plan = store.execute(
        "EXPLAIN QUERY PLAN DELETE FROM retrieval_marks WHERE scope_key = 'session:' || ?"
        " OR (scope_key = 'user:' || ? AND NOT EXISTS (SELECT 1 FROM sessions WHERE user_id = ?))",
        ("s", "u", "u"),
    ).fetchall()
    steps = " ".join(str(row[-1]) for row in plan)
    assert "retrieval_marks_scope" in steps and "SCAN retrieval_marks" not in steps, steps


def test_migrating_does_not_import_sqlite_utils_or_numpy(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys; from memcli.store.sqlite import SQLiteStore;"
        f" SQLiteStore({str(tmp_path / 'n.db')!r}).close();"
        " print(sorted(m for m in ('numpy', 'sqlite_utils') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_wal_and_busy_timeout(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    assert store.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.execute("PRAGMA busy_timeout").fetchone()[0] >= 1000


def test_many_open_a_new_database_at_once(tmp_path: Path) -> None:
    """Switching a new file to WAL mode answers "locked" at once (SQLite's busy timeout does not
    apply) while another connection opens it too: every opener still gets the database."""
    import threading

    failed: list[str] = []
    for n in range(30):
        path = tmp_path / f"m{n}.db"
        start = threading.Barrier(4)

        def open_it(path: Path = path, start: threading.Barrier = start) -> None:
            start.wait()
            try:
                SQLiteStore(path).close()
            except Exception as exc:  # (collected: the assertion names them)
                failed.append(f"{path.name}: {exc}")

        threads = [threading.Thread(target=open_it) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    assert failed == []
    store = SQLiteStore(tmp_path / "m0.db")
    assert store.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    store.close()


def test_active_window_does_not_scan_archive(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    plan = " ".join(
        str(row[-1])
        for row in store.execute(
            "EXPLAIN QUERY PLAN SELECT id, role, tokens FROM messages"
            " WHERE session_id = ? AND status = 'active' ORDER BY seq",
            ("s",),
        )
    )
    assert "USING INDEX messages_window" in plan and "SCAN" not in plan


def test_ids_of_deleted_messages_are_not_reused(db: str) -> None:
    store = open_store(db)
    memory = Memory(store, "a", tokenizer=WordTokenizer())
    memory.put_messages([Message("user", "one"), Message("assistant", "two")])
    last = memory.get_all()[-1].id
    memory.reset()
    memory.put(Message("user", "three"))
    assert memory.get_all()[0].id == last + 1


def test_delete_session(db: str) -> None:
    store = open_store(db)
    Memory(store, "a", tokenizer=WordTokenizer()).put(Message("user", "hi"))
    Memory(store, "b", tokenizer=WordTokenizer()).put(Message("user", "hi"))
    assert store.delete_session("a") == 1
    assert [s.id for s in store.list_sessions()] == ["b"]
    assert store.get_messages("a") == []


def test_ids_are_not_reused_after_reopening(db: str) -> None:
    memory = Memory(open_store(db), "a", tokenizer=WordTokenizer())
    memory.put_messages([Message("user", "one"), Message("assistant", "two")])
    last = memory.get_all()[-1].id
    memory.reset()
    memory.store.close()
    again = Memory(open_store(db), "a", tokenizer=WordTokenizer())
    again.put(Message("user", "three"))
    assert again.get_all()[0].id == last + 1


def test_a_rolled_back_transaction_leaves_nothing(db: str) -> None:
    store = open_store(db)
    memory = Memory(store, "a", tokenizer=WordTokenizer())
    memory.put(Message("user", "kept"))
    try:
        with store.transaction():
            memory.put(Message("user", "gone"))
            raise RuntimeError("stop")
    except RuntimeError:
        pass
    assert [m.content for m in memory.get_all()] == ["kept"]
    assert [m.content for m in Memory(open_store(db), "a").get_all()] == ["kept"]
    assert store.get_session("a").active_messages == 1
    assert store.check() == []


def test_nested_transactions_join_the_outer_one(db: str) -> None:
    store = open_store(db)
    a = Memory(store, "a", tokenizer=WordTokenizer())
    b = Memory(store, "b", tokenizer=WordTokenizer())
    with store.transaction():
        a.put(Message("user", "one"))
        with store.transaction():
            b.put(Message("user", "two"))
        assert store.transaction_depth == 1
        # Another connection sees nothing before the commit.
        assert open_store(db).get_messages("a") == []
    assert [m.content for m in open_store(db).get_messages("b")] == ["two"]


def test_rows_for_many_ids(db: str) -> None:
    store = open_store(db)
    memory = Memory(store, "a", tokenizer=WordTokenizer())
    memory.put_messages([Message("user", f"m{i}") for i in range(1200)])
    ids = [m.id for m in memory.get_all()]
    wanted = ids[::2]
    got = store.get_messages("a", ids=wanted)
    assert [m.id for m in got] == wanted
    changed = store.execute_for_ids(
        "UPDATE messages SET name = ? WHERE id IN ({ids})", wanted, ("even",)
    )
    assert changed == len(wanted)
    assert sum(1 for m in store.get_messages("a") if m.name == "even") == len(wanted)


def test_placeholders_inside_quotes_and_percent_signs(db: str) -> None:
    """`?` in a string literal is text, not a placeholder; `%` is text on every backend."""
    store = open_store(db)
    row = store.execute("SELECT 'is it 100% ?', ? || '%'", ("50",)).fetchone()
    assert tuple(row) == ("is it 100% ?", "50%")


def test_read_messages_reads_one_snapshot(db: str) -> None:
    store = open_store(db)
    memory = Memory(store, "a", tokenizer=WordTokenizer())
    memory.put_messages([Message("user", f"m{i}") for i in range(300)])
    read = store.read_messages("a")
    writer = Memory(open_store(db), "a", tokenizer=WordTokenizer())
    writer.put(Message("user", "later"))  # another connection writes meanwhile
    assert len(list(read)) == 300
    assert len(store.get_messages("a")) == 301


def test_check_finds_counters_that_disagree(db: str) -> None:
    store = open_store(db)
    Memory(store, "a", tokenizer=WordTokenizer()).put(Message("user", "hi there"))
    assert store.check() == []
    with store.transaction():
        store.execute("UPDATE sessions SET active_messages = 5 WHERE id = ?", ("a",))
    problems = store.check()
    assert [(p.check, p.session) for p in problems] == [("counters", "a")]
    assert "5 active messages, it holds 1" in problems[0].message


def test_open_store_picks_the_backend(db: str) -> None:
    from memcli.store.postgres import PostgresStore

    store = open_store(db)
    assert isinstance(store, PostgresStore) == db.startswith("postgresql://")
    assert isinstance(store, SQLiteStore) == (not db.startswith("postgresql://"))
    assert store.read_only is False


def test_opening_without_create_makes_nothing(tmp_path: Path) -> None:
    """`create=False` (what reading commands use): a missing file is a StoreError naming it,
    and neither the file nor its directory is made; an existing one opens as usual."""
    from memcli.errors import StoreError
    from memcli.store import open_store

    db = tmp_path / "typo" / "m.db"
    with pytest.raises(StoreError, match="no database at") as caught:
        open_store(db, create=False)
    assert str(db) in str(caught.value) and caught.value.exit_code == 1
    assert not (tmp_path / "typo").exists()
    open_store(db).close()
    store = open_store(db, create=False)
    assert store.list_sessions() == []
    store.close()

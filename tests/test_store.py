"""The SQLite store: migrations, WAL, indexes, ids that are never reused."""

from __future__ import annotations

from pathlib import Path

from memcli import Memory, Message, WordTokenizer
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


def test_ids_of_deleted_messages_are_not_reused(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    memory = Memory(store, "a", tokenizer=WordTokenizer())
    memory.put_messages([Message("user", "one"), Message("assistant", "two")])
    last = memory.get_all()[-1].id
    memory.reset()
    memory.put(Message("user", "three"))
    assert memory.get_all()[0].id == last + 1


def test_delete_session(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    Memory(store, "a", tokenizer=WordTokenizer()).put(Message("user", "hi"))
    Memory(store, "b", tokenizer=WordTokenizer()).put(Message("user", "hi"))
    assert store.delete_session("a") == 1
    assert [s.id for s in store.list_sessions()] == ["b"]
    assert store.get_messages("a") == []

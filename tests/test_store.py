"""The SQLite store: migrations, WAL, indexes, ids that are never reused."""

from __future__ import annotations

from pathlib import Path

from memcli import Memory, Message, WordTokenizer
from memcli.store.sqlite import MIGRATIONS, SQLiteStore


def test_migrations_recorded_once(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    SQLiteStore(db).close()
    store = SQLiteStore(db)
    versions = [r[0] for r in store.execute("SELECT version FROM migrations ORDER BY version")]
    assert versions == [v for v, _ in MIGRATIONS]


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

"""A damaged full-text index: `SQLiteStore.check()` names it (FTS5's integrity check), a delete
for good refuses to start on it, and `repair()` rebuilds it from the messages."""

from __future__ import annotations

import random
import shutil
import sqlite3
from pathlib import Path

import pytest

from memcli.errors import StoreDamaged
from memcli.messages import Message
from memcli.store import index
from memcli.store.base import NewMessage
from memcli.store.check import FULL_TEXT, REBUILD, check_full_text
from memcli.store.sqlite import SQLiteStore

#: Ways to damage the index's pages (`retrieval_fts_data`): each one is missed by SQLite's
#: `PRAGMA integrity_check` (the table's rows are sound as rows).
DAMAGE = ("flip", "garbage", "structure", "delete", "truncate", "term index", "version")


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database of 200 messages of two users, all in the full-text index (several pages)."""
    db = tmp_path_factory.mktemp("fts") / "m.db"
    store = SQLiteStore(db)
    for session, user in (("s", "ana"), ("t", "bo")):
        store.create_session(session, user, 100_000, 0.7, 10)
        texts = [f"message {i} about tea and word{i} w{i * 7} x{i * 13}" for i in range(100)]
        store.append_messages(session, [NewMessage(Message("user", t), 10) for t in texts])
    assert index.catch_up(store) == 200
    assert store.check() == []
    store.close()
    return db


def damage(db: Path, kind: str, seed: int) -> None:
    rng = random.Random(seed)
    conn = sqlite3.connect(db, isolation_level=None)
    if kind in ("term index", "version"):
        # The term index's rows gone: FTS5's own check passes, every word search finds nothing.
        # Another version of FTS5's file format: FTS5 refuses to read the index at all.
        conn.execute(
            "DELETE FROM retrieval_fts_idx"
            if kind == "term index"
            else "UPDATE retrieval_fts_config SET v = 5 WHERE k = 'version'"
        )
        conn.close()
        return
    rows = conn.execute("SELECT id, block FROM retrieval_fts_data WHERE id > 10").fetchall()
    assert len(rows) > 1
    row, block = rows[rng.randrange(len(rows))]
    if kind == "flip":
        changed = bytearray(block)
        for _ in range(8):
            changed[rng.randrange(len(changed))] ^= rng.randrange(1, 256)
        new: bytes | None = bytes(changed)
    elif kind == "garbage":
        new = rng.randbytes(len(block))
    elif kind == "structure":
        row, new = 10, rng.randbytes(40)
    elif kind == "truncate":
        new = block[: len(block) // 2]
    else:
        new = None
    if new is None:
        conn.execute("DELETE FROM retrieval_fts_data WHERE id = ?", (row,))
    else:
        conn.execute("UPDATE retrieval_fts_data SET block = ? WHERE id = ?", (new, row))
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    conn.close()


def counts(db: Path) -> tuple[int, int]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(
            "SELECT (SELECT COUNT(*) FROM messages), (SELECT COUNT(*) FROM sessions)"
        ).fetchone()
    finally:
        conn.close()


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("kind", DAMAGE)
def test_damaged_full_text_index_is_found_refuses_deletes_and_is_rebuilt(
    indexed: Path, tmp_path: Path, kind: str, seed: int
) -> None:
    db = tmp_path / "m.db"
    shutil.copy(indexed, db)
    damage(db, kind, seed)
    store = SQLiteStore(db)
    try:
        found = store.check()
        assert [(p.check, p.fix) for p in found] == [(FULL_TEXT, REBUILD)], found
        assert "damaged" in found[0].message

        with pytest.raises(StoreDamaged, match="nothing was deleted") as refused:
            store.delete_message("s", 5)
        assert "memcli check --repair" in refused.value.hint
        with pytest.raises(StoreDamaged, match="nothing was deleted"):
            store.forget_user("bo")
        assert counts(db) == (200, 2)

        assert [p.check for p in store.repair()] == [FULL_TEXT]
        assert store.check() == []
        hits = index.lexical_search(store, ["word42"], index.Scope(), 10)
        assert sorted(message for message, _ in hits) == [43, 143]
        assert store.delete_message("s", 5) is not None
        assert store.forget_user("bo").messages == 100
        assert counts(db) == (99, 1)
        assert store.check() == []
    finally:
        store.close()


def test_a_read_only_connection_reads_the_whole_index(indexed: Path, tmp_path: Path) -> None:
    """FTS5's check takes the write lock: a read-only connection reads every entry instead."""
    db = tmp_path / "m.db"
    shutil.copy(indexed, db)
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, isolation_level=None)
    try:
        assert check_full_text(conn, read_only=True) == []
    finally:
        conn.close()
    damage(db, "garbage", 0)
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, isolation_level=None)
    try:
        found = check_full_text(conn, read_only=True)
        assert [(p.check, p.fix) for p in found] == [(FULL_TEXT, REBUILD)]
    finally:
        conn.close()


def test_repair_leaves_a_database_with_other_damage_alone(indexed: Path, tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    shutil.copy(indexed, db)
    damage(db, "garbage", 1)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("UPDATE sessions SET active_messages = 7 WHERE id = 's'")
    conn.close()
    store = SQLiteStore(db)
    try:
        before = {p.check for p in store.check()}
        assert before == {FULL_TEXT, "counters"}
        assert store.repair() == []
        assert {p.check for p in store.check()} == before
    finally:
        store.close()

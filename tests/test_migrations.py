"""Migrations: an older database is brought to the current schema, its data kept; a database
already current is opened without the write lock."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from fakes import WordTokenizer

from memcli import Memory, Message
from memcli.errors import StoreError
from memcli.store import facts as fact_store
from memcli.store import longterm
from memcli.store.base import NewMessage
from memcli.store.migrations import MIGRATIONS
from memcli.store.sqlite import SQLiteStore

DATA = Path(__file__).parent / "data"
VERSIONS = [version for version, _ in MIGRATIONS]  # 1, 2, 10, 11, 13, ...


def statements(text: str) -> list[str]:
    return [s.strip() for s in text.split(";\n") if s.strip()]


def schema(db: Path) -> set[str]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL").fetchall()
    return {row[0] for row in rows}


def database_at_version_10(db: Path) -> None:
    """A database as memcli made it before migration 11: with the batch-level vector tables, the
    block tables' keys nullable, and a row of every kind."""
    conn = sqlite3.connect(db, isolation_level=None)
    for statement in statements((DATA / "schema_10.sql").read_text()):
        if not statement.startswith("CREATE TABLE 'retrieval_fts_"):  # made by the FTS5 table
            conn.execute(statement)
    stamp = "2026-01-02T03:04:05+00:00"
    conn.executescript(
        f"""
        INSERT INTO migrations VALUES (1, '{stamp}'), (2, '{stamp}'), (10, '{stamp}');
        INSERT INTO sessions (id, user_id, token_limit, ratio, flush_size, created_at, updated_at,
            active_messages, archived_messages, active_tokens, flushes)
            VALUES ('s', 'ana', 1000, 0.7, 100, '{stamp}', '{stamp}', 1, 1, 3, 1);
        INSERT INTO flushes VALUES (1, 's', '{stamp}', 1, 4, 1, 1, 'budget');
        INSERT INTO messages VALUES
            (1, 's', 0, 'user', 'my dog is Rex', NULL, NULL, 4, 'archived', 1, NULL, '{stamp}'),
            (2, 's', 1, 'user', 'hello again', NULL, NULL, 3, 'active', NULL, NULL, '{stamp}');
        INSERT INTO block_flushes VALUES ('facts', 'user:ana', 1, 'done', NULL, '{stamp}'),
            (NULL, 'user:ana', 1, 'done', NULL, '{stamp}');
        INSERT INTO block_state VALUES ('mine', 'user:ana', '{{"n": 1}}', '{stamp}');
        INSERT INTO facts (block, scope_key, text, norm, origin, session_id, flush_id,
            message_ids, created_at, updated_at)
            VALUES ('facts', 'user:ana', 'Dog: Rex', 'dog: rex', 'extracted', 's', 1, '[1]',
            '{stamp}', '{stamp}');
        INSERT INTO vector_entries VALUES (1, 'vector_memory', 'ana', 's', 1, 'my dog is Rex',
            '[1]', '{stamp}');
        INSERT INTO vector_pieces VALUES (1, 1, 'vector_memory', 0, 2, x'0000803f00000000');
        """
    )
    conn.close()


def test_an_older_database_loses_the_vector_tables_and_keeps_its_data(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    database_at_version_10(db)
    store = SQLiteStore(db)
    versions = [r[0] for r in store.execute("SELECT version FROM migrations ORDER BY version")]
    assert versions == VERSIONS and versions[:4] == [1, 2, 10, 11]
    # The schema of a new database (in another order: rebuilt tables come last).
    assert schema(db) == set(statements((DATA / "schema.sql").read_text()))
    info = store.get_session("s")
    assert info is not None and info.user_id == "ana" and info.flushes == 1
    assert [m.content for m in store.get_messages("s")] == ["my dog is Rex", "hello again"]
    assert [f.text for f in fact_store.list_facts(store, "facts", "user:ana")] == ["Dog: Rex"]
    assert longterm.load_state(store, "mine", "user:ana") == {"n": 1}
    # The row whose key held NULL (found by no lookup) is gone; an upsert replaces, not adds.
    assert longterm.flush_statuses(store, "facts", "user:ana", "s") == {1: "done"}
    longterm.mark_flushes(store, "facts", "user:ana", [1], status="pending")
    assert store.execute("SELECT COUNT(*) FROM block_flushes").fetchone()[0] == 1
    assert longterm.pending_flushes(store, "facts", "user:ana") == [(1, "s")]
    # The engine carries on where the old database left off.
    memory = Memory(store, "s", tokenizer=WordTokenizer())
    memory.put(Message("user", "and my cat is Tom"))
    assert [m.content for m in memory.get_all()][-1] == "and my cat is Tom"
    store.close()
    assert [r[0] for r in SQLiteStore(db).execute("SELECT version FROM migrations")] == VERSIONS


def test_opening_a_current_database_takes_no_write_lock(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    store = SQLiteStore(db)
    store.create_session("s", "ana", 1000, 0.7, 100)
    store.close()
    writer = sqlite3.connect(db, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # another process is writing
    try:
        # Were the open to begin a write transaction, it would wait out the busy timeout and fail.
        reader = SQLiteStore(db)
        assert [s.id for s in reader.list_sessions()] == ["s"]
        reader.close()
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def test_a_database_behind_is_migrated_by_the_first_open_only(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    database_at_version_10(db)
    first, second = SQLiteStore(db), SQLiteStore(db)
    applied = second.execute("SELECT version, applied_at FROM migrations").fetchall()
    assert applied == first.execute("SELECT version, applied_at FROM migrations").fetchall()
    assert [v for v, _ in applied] == VERSIONS


def test_a_batch_pending_before_the_back_off_is_due_at_the_next_flush(tmp_path: Path) -> None:
    """Migration 13: a batch already pending counts one failure and may be retried at once."""
    db = tmp_path / "old.db"
    database_at_version_10(db)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE block_flushes SET status = 'pending' WHERE block = 'facts'")
    store = SQLiteStore(db)
    row = store.execute("SELECT attempts, retry_after FROM block_flushes").fetchone()
    assert tuple(row) == (1, 0)
    assert longterm.pending_flushes(store, "facts", "user:ana", retries=1) == [(1, "s")]
    # Failing again (the latest flush is 1): one more attempt, due after 2 more flushes.
    longterm.mark_flushes(store, "facts", "user:ana", [1], status="pending", error="boom")
    row = store.execute("SELECT attempts, retry_after FROM block_flushes").fetchone()
    assert tuple(row) == (2, 3)
    assert longterm.pending_flushes(store, "facts", "user:ana", retries=3) == []
    assert longterm.pending_flushes(store, "facts", "user:ana") == [(1, "s")]
    store.close()


def test_a_migration_that_fails_changes_nothing(tmp_path: Path) -> None:
    """The migrations run in one transaction: the table rebuild included (sqlite-utils' transform
    joins it), so a failure leaves the database as it was."""
    db = tmp_path / "old.db"
    database_at_version_10(db)
    with sqlite3.connect(db) as conn:  # foreign keys off: a row pointing at no flush
        conn.execute("UPDATE messages SET flush_id = 99 WHERE id = 1")
    with pytest.raises(StoreError, match="current schema"):
        SQLiteStore(db)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT MAX(version) FROM migrations").fetchone()[0] == 10
        assert conn.execute("SELECT COUNT(*) FROM vector_entries").fetchone()[0] == 1
    assert "vector_pieces" in " ".join(schema(db))


def test_the_fact_history_gets_its_origins_where_they_are_known(tmp_path: Path) -> None:
    """Migration 18: an addition takes its fact's origin, a condensing is `condensed`, an edit
    or a deletion made before origins were recorded is `unknown`; topics were not recorded."""
    db = tmp_path / "old.db"
    database_at_version_10(db)
    stamp = "2026-01-02T03:04:05+00:00"
    with sqlite3.connect(db) as conn:
        conn.executescript(
            f"""
            INSERT INTO facts (block, scope_key, text, norm, origin, created_at, updated_at)
                VALUES ('facts', 'user:ana', 'Cat: Tom', 'cat: tom', 'manual', '{stamp}',
                '{stamp}');
            INSERT INTO fact_history (fact_id, block, scope_key, action, text, old_text, at)
                VALUES (1, 'facts', 'user:ana', 'added', 'Dog: Rex', NULL, '{stamp}'),
                (2, 'facts', 'user:ana', 'added', 'Cat: Tom', NULL, '{stamp}'),
                (2, 'facts', 'user:ana', 'edited', 'Cat: Tom!', 'Cat: Tom', '{stamp}'),
                (1, 'facts', 'user:ana', 'condensed', NULL, 'Dog: Rex', '{stamp}');
            """
        )
    store = SQLiteStore(db)
    history = fact_store.fact_history(store, "user:ana")
    assert [(c.action, c.origin, c.topics) for c in history] == [
        ("added", "extracted", None),
        ("added", "manual", None),
        ("edited", "unknown", None),
        ("condensed", "condensed", None),
    ]
    # New changes record theirs.
    fact_store.edit_fact(store, 2, "Cat: Tom the cat", origin="manual")
    assert fact_store.fact_history(store, "user:ana", fact_id=2)[-1].origin == "manual"


def test_vectors_stored_at_float32_are_kept_at_float16_and_stay_searchable(
    tmp_path: Path,
) -> None:
    """Migration 29: each stored float32 vector is written again at float16 (half the bytes) and
    the database packed (its file shrinks); the flat index's old vector file is gone after the
    next search, which finds the same messages."""
    import json

    import numpy as np

    from memcli.search.dense import MessageVectors
    from memcli.store.index import Scope

    db = tmp_path / "old.db"
    store = SQLiteStore(db)
    store.create_session("s", "ana", 1000, 0.7, 100)
    with store.transaction():
        ids = store.append_messages(
            "s", [NewMessage(Message("user", f"message {n}"), 2) for n in range(300)]
        )
    matrix = np.random.default_rng(1).standard_normal((300, 384)).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    store.close()
    with sqlite3.connect(db) as conn:  # as memcli stored them before: float32, beside a file
        conn.executemany(
            "INSERT INTO retrieval_vectors (message_id, piece, model, dim, vector)"
            " VALUES (?, 0, 'm', 384, ?)",
            [(i, v.tobytes()) for i, v in zip(ids, matrix, strict=True)],
        )
        conn.execute("INSERT INTO retrieval_state VALUES ('vectors_added:m', '300')")
        conn.execute("DELETE FROM migrations WHERE version = 29")
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    before = db.stat().st_size
    old_file = Path(f"{db}.retrieval.faiss")
    old_file.write_bytes(matrix.tobytes())
    Path(f"{db}.retrieval.json").write_text(json.dumps({"model": "m", "format": 5}))
    store = SQLiteStore(db)
    assert 29 in [r[0] for r in store.execute("SELECT version FROM migrations")]
    stored = store.execute("SELECT vector FROM retrieval_vectors ORDER BY id").fetchall()
    assert [len(r[0]) for r in stored] == [2 * 384] * 300
    assert np.allclose(
        np.frombuffer(b"".join(r[0] for r in stored), dtype=np.float16).reshape(300, 384),
        matrix,
        atol=1e-3,
    )
    store.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert db.stat().st_size < 0.7 * before  # packed: the half-empty pages are gone
    vectors = MessageVectors(store, "m")
    for at in range(0, 300, 23):
        assert vectors.search(matrix[at], Scope(), 1)[0][0] == ids[at]
    assert not old_file.exists()
    store.close()

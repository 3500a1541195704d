"""copy_store: every table, either backend to either, on real SQLite files and real PostgreSQL
servers (Debian's, and pgvector's); all or nothing, verified, refusing what it cannot copy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from copydata import build, memory

from memcli import Message
from memcli.copy import copy_store, export_digests
from memcli.errors import StoreError, UsageError
from memcli.store import open_store
from memcli.store import vectors as vsql
from memcli.store.copy import TABLES, catalogue, rows_present


def filled(request: pytest.FixtureRequest, tmp_path: Path, kind: str) -> str:
    """A database of `kind` holding `copydata`'s contents (on PostgreSQL: copied there)."""
    built = str(tmp_path / "built.db")
    build(built)
    if kind == "sqlite":
        return built
    url = _url(request, tmp_path, kind, "src")
    copy_store(built, url)
    return url


def _url(request: pytest.FixtureRequest, tmp_path: Path, kind: str, name: str) -> str:
    if kind == "sqlite":
        return str(tmp_path / f"{name}.db")
    return str(request.getfixturevalue("pg_url" if kind == "postgresql" else "pgvector_url"))


def contents(db: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table a copy moves, columns by name, rows in key order; a vector as
    its values at float16 (SQLite stores them so, PostgreSQL as float32)."""
    store: Any = open_store(db)
    try:
        columns = catalogue(store)
        out = {}
        for table in TABLES:
            names = sorted(columns[table.name])
            listed = ", ".join(f'"{c}"' for c in names)
            out[table.name] = [
                tuple(
                    half(v, row[names.index("dim")]) if name == "vector" else value(v)
                    for name, v in zip(names, row, strict=True)
                )
                for row in store._query(
                    f'SELECT {listed} FROM "{table.name}"{table.condition()} ORDER BY {table.key}'
                )
            ]
        return out
    finally:
        store.close()


def value(v: Any) -> Any:
    return bytes(v) if isinstance(v, memoryview) else v


def half(vector: Any, dim: int) -> bytes:
    import numpy as np

    from memcli.store import vectors as vsql

    assert vsql.fits(vector, dim)
    return bytes(vsql.to_matrix([bytes(vector)], dim).astype(np.float16).tobytes())


def digests(db: str) -> dict[str, str]:
    store = open_store(db)
    try:
        return export_digests(store)
    finally:
        store.close()


def problems(db: str) -> list[str]:
    store: Any = open_store(db)
    try:
        return [f"{p.check}: {p.message}" for p in store.check()]
    finally:
        store.close()


def present(db: str) -> dict[str, int]:
    store: Any = open_store(db)
    try:
        return rows_present(store)
    finally:
        store.close()


def put_and_flush(db: str) -> list[int]:
    """Put a few turns into session a1 (enough to flush); the new messages' ids."""
    m = memory(db, "ana", "a1", vectors=False)
    try:
        before = m.store.get_session("a1").flushes
        for i in range(6):
            m.put_messages(
                [Message("user", f"after the copy {i} " * 8), Message("assistant", "noted " * 8)]
            )
        ids = [msg.id for msg in m.store.get_messages("a1") if "after the copy" in msg.content]
        assert m.store.get_session("a1").flushes > before
        return ids
    finally:
        m.store.close()


@pytest.mark.parametrize("middle", ["postgresql", "pgvector"])
def test_round_trip_through_postgresql_keeps_every_row(
    tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, middle: str
) -> None:
    """SQLite -> PostgreSQL -> SQLite, in batches of 7 rows: every row of every table comes back
    the same (ids too), every session exports the same, no vector needs computing again, both
    copies check clean, and new puts on each get fresh ids and flush."""
    monkeypatch.setattr("memcli.store.copy.BATCH", 7)
    a, pg, b = str(tmp_path / "a.db"), _url(request, tmp_path, middle, "pg"), str(tmp_path / "b.db")
    build(a)
    there = copy_store(a, pg)
    back = copy_store(pg, b)
    assert there.counts == back.counts
    assert there.counts["messages"] == 70 and there.counts["retrieval_vectors"] > 0
    assert there.counts["retrieval_redo"] == 1 and there.counts["block_state"] == 2
    original = contents(a)
    assert contents(pg) == original
    assert contents(b) == original
    assert digests(a) == digests(pg) == digests(b)
    for db in (pg, b):
        assert problems(db) == []
        store: Any = open_store(db)
        try:  # only the edited message waits to be embedded again
            assert vsql.pending_count(store, "hash/sum+1") == 1
        finally:
            store.close()
    for db in (pg, b):
        new_ids = put_and_flush(db)
        assert min(new_ids) > 80  # above every id the source gave out, the deleted session's too
        assert problems(db) == []


@pytest.mark.parametrize(
    "kinds",
    [("sqlite", "sqlite"), ("postgresql", "postgresql"), ("postgresql", "sqlite")],
    ids=["sqlite-sqlite", "pg-pg", "pg-sqlite"],
)
def test_copy_between_any_two_backends(
    tmp_path: Path, request: pytest.FixtureRequest, kinds: tuple[str, str]
) -> None:
    src = filled(request, tmp_path, kinds[0])
    dst = str(tmp_path / "dst.db") if kinds[1] == "sqlite" else _second_pg(request)
    result = copy_store(src, dst)
    assert result.counts["sessions"] == 3
    assert contents(dst) == contents(src)
    assert digests(dst) == digests(src)
    assert problems(dst) == []
    assert min(put_and_flush(dst)) > 80


def _second_pg(request: pytest.FixtureRequest) -> str:
    from pg import drop_database, new_database

    server = request.getfixturevalue("pg_server")
    url = new_database(server)
    request.addfinalizer(lambda: drop_database(server, url))
    return url


def test_a_destination_that_holds_data_is_refused(db: str, tmp_path: Path) -> None:
    src = str(tmp_path / "src.db")
    build(src)
    m = memory(db, "zoe", "mine", vectors=False)
    m.put(Message("user", "already here"))
    m.store.close()
    before = contents(db)
    with pytest.raises(UsageError) as caught:
        copy_store(src, db)
    assert caught.value.exit_code == 2
    store: Any = open_store(db)
    where = store.where
    store.close()
    assert f"the destination {where} is not empty" in str(caught.value)
    assert contents(db) == before


def test_the_same_database_is_refused(tmp_path: Path) -> None:
    src = str(tmp_path / "a.db")
    build(src)
    with pytest.raises(UsageError):
        copy_store(src, str(tmp_path / "." / "a.db"))


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_table_the_copy_does_not_know_fails_before_writing(
    tmp_path: Path, request: pytest.FixtureRequest, kind: str
) -> None:
    """A table in the source that is neither copied nor skipped (one a newer memcli added): the
    copy fails naming it, and the destination stays empty."""
    db = filled(request, tmp_path, kind)
    store: Any = open_store(db)
    with store.transaction():
        store.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        store.execute("INSERT INTO notes (id, body) VALUES (1, 'keep me')")
    store.close()
    dst = str(tmp_path / "dst.db")
    with pytest.raises(StoreError, match="does not know: notes"):
        copy_store(db, dst)
    assert present(dst) == {}


def test_a_column_the_destination_lacks_fails_before_writing(tmp_path: Path) -> None:
    src, dst = str(tmp_path / "a.db"), str(tmp_path / "b.db")
    build(src)
    store: Any = open_store(src)
    with store.transaction():
        store.execute("ALTER TABLE fact_history ADD COLUMN provenance TEXT")
    store.close()
    with pytest.raises(StoreError, match="the table fact_history has columns"):
        copy_store(src, dst)
    assert present(dst) == {}


def test_a_counter_the_copy_does_not_know_fails(tmp_path: Path) -> None:
    src, dst = str(tmp_path / "a.db"), str(tmp_path / "b.db")
    build(src)
    store: Any = open_store(src)
    with store.transaction():
        store.execute("INSERT INTO counters (name, value) VALUES ('summary_id', 3)")
    store.close()
    with pytest.raises(StoreError, match="counters that `memcli copy` does not know: summary_id"):
        copy_store(src, dst)
    assert present(dst) == {}


@pytest.mark.parametrize(
    "kinds",
    [("sqlite", "sqlite"), ("sqlite", "postgresql"), ("postgresql", "sqlite")],
    ids=["sqlite-sqlite", "sqlite-pg", "pg-sqlite"],
)
def test_an_interrupted_copy_leaves_the_destination_empty(
    tmp_path: Path, request: pytest.FixtureRequest, kinds: tuple[str, str]
) -> None:
    """Interrupted after its first batch (Ctrl-C): nothing of it is in the destination, and the
    source is left as it was: a copy run again then fills the destination."""
    src = filled(request, tmp_path, kinds[0])
    dst = _url(request, tmp_path, kinds[1], "dst")

    def interrupt(done: int, total: int) -> None:
        if done:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        copy_store(src, dst, progress=interrupt)
    assert present(dst) == {}
    copy_store(src, dst)
    assert contents(dst) == contents(src)


def test_a_copy_that_differs_from_its_source_is_rolled_back(tmp_path: Path) -> None:
    """The destination changes what it is given (a trigger someone added): the verification
    sees a session export differently, and nothing is kept."""
    src, dst = str(tmp_path / "a.db"), str(tmp_path / "b.db")
    build(src)
    store: Any = open_store(dst)
    store.execute(
        "CREATE TRIGGER mangle AFTER INSERT ON messages WHEN new.seq = 0 BEGIN"
        " UPDATE messages SET content = 'mangled' WHERE id = new.id; END"
    )
    store.close()
    with pytest.raises(StoreError, match="session 'a1' exports differently") as caught:
        copy_store(src, dst)
    assert caught.value.exit_code == 1
    assert present(dst) == {}


def test_a_read_only_source_is_copied(pg_url: str, tmp_path: Path) -> None:
    """A database PostgreSQL serves read-only (a standby, a read-only role) is read in one
    read-only snapshot."""
    import psycopg

    built = str(tmp_path / "built.db")
    build(built)
    copy_store(built, pg_url)
    name = pg_url.rsplit("/", 1)[1].split("?", 1)[0]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    store: Any = open_store(pg_url)
    assert store.read_only
    store.close()
    dst = str(tmp_path / "b.db")
    copy_store(pg_url, dst)
    assert contents(dst) == contents(pg_url)


def test_a_missing_source_file_is_an_error_and_makes_nothing(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no database at"):
        copy_store(tmp_path / "nope.db", tmp_path / "b.db")
    assert not (tmp_path / "nope.db").exists()


def test_progress_moves_batch_by_batch_to_the_total(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("memcli.store.copy.BATCH", 7)
    src = str(tmp_path / "a.db")
    build(src)
    seen: list[tuple[int, int]] = []
    result = copy_store(src, str(tmp_path / "b.db"), progress=lambda d, t: seen.append((d, t)))
    total = sum(result.counts.values())
    assert seen[0] == (0, total) and seen[-1] == (total, total)
    assert all(t == total for _, t in seen)
    steps = [b - a for (a, _), (b, _) in zip(seen, seen[1:], strict=False)]
    assert all(0 < step <= 7 for step in steps) and len(steps) > total // 7

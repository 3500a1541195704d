"""The FAISS index's files. A flat index keeps no vector file: its vectors are read from the
database (the one copy), the rows added since its files grow it in memory, and its row file is
written again only at the fold. An IVF index's delta file: vectors added after the index file was
written go to a small file beside it (the index file untouched until the delta is folded in),
searched beside it, checked and rebuilt like the index files, and cleared of deleted messages'
vectors; a small scope of an IVF index is searched exactly over its own vectors."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from memcli import forgetting
from memcli.messages import Message
from memcli.search import dense
from memcli.search.dense import MessageVectors, index_health
from memcli.store import vectors as vsql
from memcli.store.base import NewMessage
from memcli.store.index import Scope
from memcli.store.sqlite import SQLiteStore

MODEL = "test-model"
DIM = 16


def add(
    store: SQLiteStore, session: str, user: str, count: int, seed: int
) -> list[tuple[int, np.ndarray]]:
    """`count` messages in a session, each with a random unit vector: (message id, vector)."""
    start = datetime(2024, 1, 1, tzinfo=UTC)
    if store.execute("SELECT 1 FROM sessions WHERE id = ?", (session,)).fetchone() is None:
        store.create_session(session, user, 30000, 0.7, 3000)
    new = [
        NewMessage(Message(role="user", content=f"m{n}", timestamp=start + timedelta(minutes=n)), 2)
        for n in range(count)
    ]
    with store.transaction():
        ids = store.append_messages(session, new)
    matrix = np.random.default_rng(seed).standard_normal((count, DIM)).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    matrix = matrix.astype(np.float16).astype(np.float32)  # (as SQLite stores them: exact)
    rows = [(i, 0, DIM, v.tobytes()) for i, v in zip(ids, matrix, strict=True)]
    vsql.add_vectors(store, MODEL, rows, ids[-1])
    return list(zip(ids, matrix, strict=True))


def files(db: Path) -> dict[str, Path]:
    return {s: Path(f"{db}.retrieval.{s}") for s in ("faiss", "npz", "json", "delta")}


def stamp(path: Path) -> tuple[int, bytes]:
    return path.stat().st_mtime_ns, path.read_bytes()


def exact(pairs: list[tuple[int, np.ndarray]], query: np.ndarray, n: int) -> list[int]:
    scores = np.stack([v for _, v in pairs]) @ query
    return [pairs[i][0] for i in np.argsort(-scores, kind="stable")[:n]]


def test_a_flat_index_reads_its_vectors_from_the_database_and_keeps_no_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "m.db"
    store = SQLiteStore(db)
    first = add(store, "s1", "u1", 100, 1)
    vectors = MessageVectors(store, MODEL)
    vectors.search(first[0][1], Scope(), 1)
    path = files(db)
    assert not path["faiss"].exists() and not path["delta"].exists()
    assert path["npz"].stat().st_size < 100 * 40  # the rows' ids, codes and times only
    for file in path.values():
        assert (
            not file.exists() or first[7][1].astype(np.float16).tobytes() not in file.read_bytes()
        )
    # The database row holds the vector once, at 2 bytes a dimension.
    stored = store.execute(
        "SELECT length(vector) FROM retrieval_vectors WHERE message_id = ?", (first[7][0],)
    ).fetchall()
    assert stored == [(2 * DIM,)]
    before = {s: stamp(path[s]) for s in ("npz", "json")}
    new = add(store, "s1", "u1", 2, 2)
    assert [i for i, _ in vectors.search(new[1][1], Scope(), 1)] == [new[1][0]]
    assert {s: stamp(path[s]) for s in ("npz", "json")} == before  # grown in memory only
    query = np.random.default_rng(9).standard_normal(DIM).astype(np.float32)
    assert [i for i, _ in vectors.search(query, Scope(), 20)] == exact(first + new, query, 20)
    assert not path["faiss"].exists() and not path["delta"].exists()
    assert index_health(store) is None
    # A fresh process reads the vectors from the database: nothing rebuilt, the new ones found.
    fresh = MessageVectors(SQLiteStore(db), MODEL)
    for message_id, vector in (first[50], new[0]):
        assert [i for i, _ in fresh.search(vector, Scope(), 1)] == [message_id]
    assert not fresh.rebuilt and fresh.count == 102
    # The row file is written again once a tenth of the rows are newer (DELTA_MIN lowered).
    monkeypatch.setattr(dense, "DELTA_MIN", 4)
    more = add(store, "s1", "u1", 8, 3)
    vectors.search(more[0][1], Scope(), 1)
    assert stamp(path["npz"]) == before["npz"]  # 10 newer
    last = add(store, "s1", "u1", 1, 4)
    assert [i for i, _ in vectors.search(last[0][1], Scope(), 1)] == [last[0][0]]
    assert stamp(path["npz"]) != before["npz"] and not path["faiss"].exists()
    again = MessageVectors(SQLiteStore(db), MODEL)
    again.search(last[0][1], Scope(), 1)
    assert not again.rebuilt and again.count == 111


def test_flat_files_that_do_not_match_the_database_are_rebuilt(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    store = SQLiteStore(db)
    pairs = add(store, "s1", "u1", 40, 1)
    MessageVectors(store, MODEL).refresh()
    path = files(db)
    other = SQLiteStore(tmp_path / "other.db")  # the same counts, other messages
    add(other, "x1", "u1", 3, 5)
    add(other, "x2", "u1", 37, 6)
    MessageVectors(other, MODEL).refresh()
    for suffix in ("npz", "json"):
        path[suffix].write_bytes(files(tmp_path / "other.db")[suffix].read_bytes())
    fresh = MessageVectors(SQLiteStore(db), MODEL)
    for message_id, vector in pairs[::7]:
        assert fresh.search(vector, Scope(user_id="u1"), 1)[0][0] == message_id
    assert fresh.rebuilt


def test_a_message_deleted_for_good_leaves_no_copy_of_its_vector(tmp_path: Path) -> None:
    """The vector's one copy is SQLite's row: deleted with the message, gone from the database,
    its WAL and the index files; a fresh process finds the rest as before."""
    db = tmp_path / "m.db"
    store = SQLiteStore(db)
    pairs = add(store, "s1", "u1", 30, 1)
    vectors = MessageVectors(store, MODEL)
    vectors.refresh()
    gone, vector = pairs[11]
    stored = vector.astype(np.float16).tobytes()
    assert stored in db.read_bytes() + Path(f"{db}-wal").read_bytes()
    plan = forgetting.plan(store, ["s1"], [gone])
    forgetting.delete(store, plan)
    assert vectors.search(vector, Scope(), 1)[0][0] != gone
    for file in [db, Path(f"{db}-wal"), *files(db).values()]:
        assert not file.exists() or stored not in file.read_bytes(), file
    fresh = MessageVectors(SQLiteStore(db), MODEL)
    for message_id, other in pairs[::5]:
        if message_id != gone:
            assert fresh.search(other, Scope(), 1)[0][0] == message_id
    assert fresh.count == 29


def test_adding_vectors_leaves_the_ivf_index_file_untouched_until_the_fold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dense, "IVF_FROM", 50)
    db = tmp_path / "m.db"
    store = SQLiteStore(db)
    first = add(store, "s1", "u1", 100, 1)
    vectors = MessageVectors(store, MODEL)
    vectors.search(first[0][1], Scope(), 1)
    path = files(db)
    before = {s: stamp(path[s]) for s in ("faiss", "npz", "json")}
    assert not path["delta"].exists()
    new = add(store, "s1", "u1", 2, 2)
    assert [i for i, _ in vectors.search(new[1][1], Scope(), 1)] == [new[1][0]]
    assert {s: stamp(path[s]) for s in ("faiss", "npz", "json")} == before
    assert new[1][1].tobytes() in path["delta"].read_bytes()
    assert path["delta"].stat().st_size < 1000  # the two new rows, not the index
    assert index_health(store) is None
    # A fresh process reads both files: nothing rebuilt, the new vectors found.
    fresh = MessageVectors(SQLiteStore(db), MODEL)
    assert [i for i, _ in fresh.search(new[0][1], Scope(), 1)] == [new[0][0]]
    assert not fresh.rebuilt and fresh.count == 102
    # Folded once the delta passes a tenth of the index (DELTA_MIN lowered to show it).
    monkeypatch.setattr(dense, "DELTA_MIN", 4)
    more = add(store, "s1", "u1", 8, 3)
    vectors.search(more[0][1], Scope(), 1)
    assert {s: stamp(path[s]) for s in ("faiss", "npz", "json")} == before  # 10 in the delta
    last = add(store, "s1", "u1", 1, 4)
    assert [i for i, _ in vectors.search(last[0][1], Scope(), 1)] == [last[0][0]]
    assert stamp(path["faiss"]) != before["faiss"] and not path["delta"].exists()
    assert index_health(store) is None
    again = MessageVectors(SQLiteStore(db), MODEL)
    again.search(last[0][1], Scope(), 1)
    assert not again.rebuilt and again.count == 111 and again._delta.n == 0


def test_the_delta_is_searched_beside_the_index_in_scope(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dense, "IVF_FROM", 50)
    monkeypatch.setattr(dense, "NPROBE", 1000)  # (every list: the IVF search is exact here)
    db = tmp_path / "m.db"
    store = SQLiteStore(db)
    pairs = add(store, "s1", "u1", 60, 1) + add(store, "s2", "u2", 40, 2)
    vectors = MessageVectors(store, MODEL)
    vectors.search(pairs[0][1], Scope(), 1)
    pairs += add(store, "s1", "u1", 5, 3) + add(store, "s3", "u2", 5, 4)
    users = {i: ("u2" if 60 <= n < 100 or n >= 105 else "u1") for n, (i, _) in enumerate(pairs)}
    query = np.random.default_rng(9).standard_normal(DIM).astype(np.float32)
    for fresh in (False, True):
        if fresh:
            vectors = MessageVectors(SQLiteStore(db), MODEL)
        # The index's vectors are 8-bit: the same messages as exact search, nearly the same order.
        found = vectors.search(query, Scope(), 20)
        assert len(set(i for i, _ in found) & set(exact(pairs, query, 20))) >= 18
        scoped = [p for p in pairs if users[p[0]] == "u2"]
        found = vectors.search(query, Scope(user_id="u2"), 7)
        assert {i for i, _ in found} <= {i for i, _ in scoped}
        assert len({i for i, _ in found} & set(exact(scoped, query, 7))) >= 6
        # The delta's rows are exact: a session of the delta alone, ranked exactly.
        assert [i for i, _ in vectors.search(query, Scope(session_id="s3"), 9)] == exact(
            pairs[105:], query, 9
        )
        for message_id, vector in pairs[100:]:
            assert vectors.search(vector, Scope(user_id=users[message_id]), 1)[0][0] == message_id
        assert vectors._delta.n == 10 and not vectors.rebuilt


@pytest.mark.parametrize("damage", ["flip", "cut", "foreign"])
def test_a_damaged_delta_is_found_and_rebuilt(
    tmp_path: Path, damage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dense, "IVF_FROM", 20)
    db = tmp_path / "m.db"
    store = SQLiteStore(db)
    add(store, "s1", "u1", 50, 1)
    MessageVectors(store, MODEL).search(np.ones(DIM, dtype=np.float32), Scope(), 1)
    path = files(db)
    main = stamp(path["faiss"])
    writer = MessageVectors(store, MODEL)
    writer.refresh()
    new = add(store, "s1", "u1", 3, 2)
    writer.refresh()
    newer = add(store, "s1", "u1", 2, 3)
    writer.refresh()
    data = bytearray(path["delta"].read_bytes())
    if damage == "flip":
        data[-5] ^= 0xFF
        path["delta"].write_bytes(bytes(data))
    elif damage == "cut":
        path["delta"].write_bytes(bytes(data[:-7]))
    else:  # another database's delta file: its rows are not this database's vectors
        other = SQLiteStore(tmp_path / "other.db")
        add(other, "s1", "u1", 50, 1)
        MessageVectors(other, MODEL).refresh()
        add(other, "s1", "u1", 5, 7)
        MessageVectors(other, MODEL).refresh()
        path["delta"].write_bytes(files(tmp_path / "other.db")["delta"].read_bytes())
    health = index_health(store)
    if damage == "foreign":
        assert health is not None and health[0] == "stale"  # its blocks extend another index
    else:
        assert health is not None and health[0] == "damaged" and health[2] == path["delta"]
        assert "m.db.retrieval.delta" in health[1]
    fresh = MessageVectors(SQLiteStore(db), MODEL)
    for message_id, vector in new + newer:
        assert fresh.search(vector, Scope(), 1)[0][0] == message_id
    assert not fresh.rebuilt and stamp(path["faiss"]) == main  # the index file kept
    assert index_health(store) is None  # the delta written again
    assert newer[1][1].tobytes() in path["delta"].read_bytes()


def test_a_deleted_messages_vector_leaves_the_delta_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dense, "IVF_FROM", 20)
    db = tmp_path / "m.db"
    store = SQLiteStore(db)
    add(store, "s1", "u1", 30, 1)
    vectors = MessageVectors(store, MODEL)
    vectors.refresh()
    [(gone, vector)] = add(store, "s2", "u1", 1, 2)
    [(kept, other)] = add(store, "s3", "u2", 1, 3)
    vectors.refresh()
    path = files(db)
    assert vector.tobytes() in path["delta"].read_bytes()
    store.delete_session("s2")
    assert vectors.search(vector, Scope(), 1)[0][0] != gone
    assert vectors.search(other, Scope(), 1)[0][0] == kept
    for file in path.values():
        assert not file.exists() or vector.tobytes() not in file.read_bytes(), file
    # Deleted for good: no index file is left at all.
    [(_, third)] = add(store, "s4", "u2", 1, 4)
    vectors.refresh()
    assert third.tobytes() in path["delta"].read_bytes()
    forgetting.forget_user(store, "u2")
    assert not any(file.exists() for file in path.values())


def test_a_small_scope_of_an_ivf_index_is_searched_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import faiss

    monkeypatch.setattr(dense, "IVF_FROM", 100)
    db = tmp_path / "m.db"
    store = SQLiteStore(db)
    add(store, "big", "many", 500, 1)
    small = add(store, "tiny", "few", 30, 2)
    vectors = MessageVectors(store, MODEL)
    vectors.refresh()
    small += add(store, "tiny", "few", 4, 3)  # in the delta
    calls: list[int] = []
    monkeypatch.setattr(MessageVectors, "_main_rows", lambda *a: calls.append(1))
    for fresh in (False, True):
        if fresh:
            vectors = MessageVectors(SQLiteStore(db), MODEL)
        for seed in range(5):
            query = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
            found = vectors.search(query, Scope(user_id="few"), 10)
            assert isinstance(vectors.index, faiss.IndexIVF)
            assert [i for i, _ in found] == exact(small, query, 10)
            scores = {i: float(v @ query) for i, v in small}
            assert all(abs(scores[i] - s) < 1e-5 for i, s in found)  # not 8-bit cosines
    assert calls == []  # the IVF index was not searched

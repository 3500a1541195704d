"""SQLite's BM25 over a scope: scores as FTS5's own `bm25()` gives them when the scope is the
whole table, and a user's new messages found by the next search of the same connection."""

from __future__ import annotations

from pathlib import Path

import pytest

from memcli.messages import Message
from memcli.store import index as sql
from memcli.store import sqlite_index
from memcli.store.base import NewMessage
from memcli.store.sqlite import SQLiteStore


def add(store: SQLiteStore, session: str, user: str, texts: list[tuple[str, str]]) -> list[int]:
    if store.get_session(session) is None:
        store.create_session(session, user, 30000, 0.7, 3000)
    new = [NewMessage(Message(role="user", content=text, name=name), 5) for name, text in texts]
    with store.transaction():
        return store.append_messages(session, new)


@pytest.fixture
def store(tmp_path: Path) -> SQLiteStore:
    return SQLiteStore(tmp_path / "memcli.db")


def test_bm25_scores_are_fts5s_own_when_the_scope_is_the_whole_store(store: SQLiteStore) -> None:
    # Every message matches (so the mean length over the matches is the table's), with
    # repeated words, stems ("apples", "Running"), a name that matches, and several columns.
    add(
        store,
        "s1",
        "u1",
        [
            ("Ana", "apple pie and a banana"),
            ("Ben", "apples apples apples"),
            ("Banana", "an apple a day keeps the doctor away, they say, every single day"),
            ("Ana", "Running with an apple and a banana, bananas everywhere"),
            ("Ben", "apple"),
        ],
    )
    sql.catch_up(store)
    terms = ["apple", "banana", "run"]
    counts = sql.term_counts(store, terms, 100, sql.Scope(user_id="u1"))
    assert counts == {"apple": 5, "banana": 3, "run": 1}
    ours = sql.lexical_search(store, terms, sql.Scope(user_id="u1"), 10, counts=counts)
    fts5 = store.execute(
        "SELECT rowid, -bm25(retrieval_fts) FROM retrieval_fts WHERE retrieval_fts MATCH ?",
        (sqlite_index.fts_match(terms),),
    ).fetchall()
    assert len(ours) == 5
    assert dict(ours) == pytest.approx(dict(fts5), rel=1e-9)
    assert [i for i, _ in ours] == [i for i, _ in sorted(fts5, key=lambda r: (-r[1], r[0]))]


def test_a_users_new_messages_are_found_by_the_next_search(store: SQLiteStore) -> None:
    first = add(store, "s1", "u1", [("Ana", "the cello lesson")])
    add(store, "s2", "u2", [("Ben", "cello for u2")])
    scope = sql.Scope(user_id="u1")
    sql.catch_up(store)
    assert [i for i, _ in sql.lexical_search(store, ["cello"], scope, 10)] == first
    later = add(store, "s3", "u1", [("Ana", "another cello")])  # a new session of u1
    add(store, "s2", "u2", [("Ben", "more cello for u2")])
    sql.catch_up(store)
    found = sql.lexical_search(store, ["cello"], scope, 10)
    assert sorted(i for i, _ in found) == first + later
    assert sql.term_counts(store, ["cello"], 10, scope) == {"cello": 2}


def test_two_threads_tokenize_query_words_on_one_connection(tmp_path: Path) -> None:
    """The stems of query words are read through one temporary index per connection: two
    threads' searches (asearch beside a block's get) never read each other's words, or break
    each other's statements."""
    import threading

    store = SQLiteStore(tmp_path / "s.db")
    sets = [
        [{f"running{i}", f"jumped{i}", f"apples{i}"} for i in range(200)],
        [{f"swimming{i}", f"houses{i}", f"walked{i}", f"cats{i}"} for i in range(200)],
    ]
    expected: dict[str, tuple[str, ...]] = {}
    for words in sets[0] + sets[1]:
        sqlite_index._STEMS.clear()
        expected.update(sqlite_index._stems(store, words))
    assert len(expected) == 1400 and all(len(stems) == 1 for stems in expected.values())
    wrong: list[object] = []

    def tokenize(each: list[set[str]]) -> None:
        for words in each:
            try:
                found = sqlite_index._stems(store, words)
            except Exception as exc:  # (collected: the assertion names them)
                wrong.append(repr(exc))
                continue
            wrong.extend(w for w in words if found[w] != expected[w])

    for _ in range(3):
        sqlite_index._STEMS.clear()
        threads = [threading.Thread(target=tokenize, args=(each,)) for each in sets]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    assert wrong == []

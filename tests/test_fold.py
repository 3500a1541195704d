"""One text rule for search (issue 44, item 5): accents and case fold the same way in message
search and fact search, on SQLite and PostgreSQL (`memcli.fold`). A table of texts and queries,
each found both ways round: the plain query finds the accented text, the accented query the
plain text."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from fakes import HashEmbedder
from helpers import memcli
from test_migrations import database_at_version_10

from memcli import Memory, Message
from memcli.fold import TABLE, fold, sqlite_rows
from memcli.search.facts import rank_facts
from memcli.search.ranking import lexical_excerpt, query_terms
from memcli.search.retriever import Retriever
from memcli.store.facts import FactText
from memcli.store.sqlite import SQLiteStore

#: (text as written, as typed without its letters): each finds the other.
PAIRS = [
    ("Tromsø", "tromso"),
    ("Gdańsk", "gdansk"),
    ("Łódź", "lodz"),
    ("Straße", "strasse"),
    ("Ærø", "aero"),
    ("İstanbul", "istanbul"),
    ("café", "CAFE"),
    ("naïve", "naive"),
    ("Œuvre", "oeuvre"),
]
#: Every pair both ways: (the word in the stored text, the query).
CASES = [(text, query) for a, b in PAIRS for text, query in ((a, b), (b, a))]


def test_the_rule() -> None:
    assert [fold(a) for a, _ in PAIRS] == [fold(b) for _, b in PAIRS]
    assert fold("cafe\u0301") == "cafe"  # an accent written apart
    assert fold("йогурт Ἀθῆναι") == "йогурт ἀθῆναι"  # other scripts keep their letters
    assert all(fold(fold(chr(c))) == fold(chr(c)) for c in TABLE)


def test_sqlite_folds_what_it_indexes_as_python_folds_a_query() -> None:
    """FTS5's tokenizer reads the view's text (SQLITE_LETTERS replaced, its remove_diacritics for
    the rest) as it reads the query's folded text: for every character the rule folds."""
    conn = sqlite3.connect(":memory:")
    conn.execute(
        "CREATE VIRTUAL TABLE t USING fts5(content, tokenize='unicode61 remove_diacritics 2')"
    )
    conn.execute("CREATE VIRTUAL TABLE v USING fts5vocab('t', 'instance')")

    def tokens(text: str) -> list[str]:
        conn.execute("DELETE FROM t")
        conn.execute("INSERT INTO t (rowid, content) VALUES (1, ?)", (text,))
        return [r[0] for r in conn.execute("SELECT term FROM v ORDER BY offset")]

    view = f"SELECT w FROM {sqlite_rows('(SELECT ? AS w)', ['w'])}"
    differ = []
    for code in TABLE:
        word = f"xa{chr(code)}bz"
        if tokens(conn.execute(view, (word,)).fetchone()[0]) != tokens(fold(word)):
            differ.append(chr(code))
    assert differ == []


@pytest.mark.slow
def test_message_search_folds_on_both_backends(db: str) -> None:
    memory = Memory.from_defaults(session_id="s", user_id="ana", db=db, memory_blocks=[])
    try:
        texts = [f"we met in {text} last spring" for text, _ in CASES[::2]]
        texts += [f"we met in {text} last spring" for text, _ in CASES[1::2]]
        memory.put_messages([Message("user", t) for t in texts])
        retriever = Retriever(memory.store, HashEmbedder(dim=16))
        for text, query in CASES:
            hits = retriever.search(query, user_id="ana", mode="lexical", k=20).hits
            found = {m.content for h in hits for m in h.messages if m.id == h.anchor_id}
            # Found as written (the hit shows the original text), with its twin, alone.
            assert f"we met in {text} last spring" in found, (text, query, found)
            assert len(found) == 2 and all(fold(query) in fold(t) for t in found), (query, found)
        # BM25 still ranks: the message holding the word twice comes first.
        memory.put_messages([Message("user", "Tromsø, Tromso and tromsø again")])
        hits = retriever.search("TROMSØ", user_id="ana", mode="lexical", k=5).hits
        best = {m.id: m.content for m in hits[0].messages}[hits[0].anchor_id]
        assert best == "Tromsø, Tromso and tromsø again"
    finally:
        memory.store.close()


@pytest.mark.slow
def test_a_store_check_reads_folded_words(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    memory = Memory.from_defaults(session_id="s", user_id="ana", db=db, memory_blocks=[])
    memory.put_messages([Message("user", "Tromsø and Łódź")])
    Retriever(memory.store, HashEmbedder(dim=16)).search("lodz", user_id="ana", mode="lexical")
    memory.store.close()
    run = memcli("--db", str(db), "check", "--json")
    assert run.code == 0, run.stdout + run.stderr


def test_fact_ranking_folds() -> None:
    facts = [FactText(i + 1, f"Ana lives in {text}", []) for i, (text, _) in enumerate(CASES)]
    for text, query in CASES:
        ranked = rank_facts(facts, query, 20, mode="lexical")
        assert f"Ana lives in {text}" in {f.text for f, _ in ranked}, (text, query)
    entity = [FactText(1, "a trip", ["Tromsø"]), FactText(2, "a walk", [])]
    assert rank_facts(entity, "tromso", 2)[0][0].id == 1  # an entity named, folded


@pytest.mark.slow
def test_fact_search_folds_on_both_backends(cli_db: str | None) -> None:
    for text, _ in CASES[::2]:
        assert memcli("facts", "add", f"Ana went to {text}").code == 0
    for text, _ in CASES[1::2]:
        assert memcli("facts", "add", f"Ana flew to {text}").code == 0
    for text, query in CASES:
        run = memcli("facts", "search", query, "--json")
        assert run.code == 0, run.stderr
        assert any(text in r["text"] for r in run.records()), (text, query, run.records())
        run = memcli("facts", "--query", query, "--mode", "lexical", "--json")
        assert run.code == 0, run.stderr
        assert any(text in r["text"] for r in run.records()), (text, query, run.records())


@pytest.mark.slow
def test_cli_search_folds_on_both_backends(cli_db: str | None, tmp_path: Path) -> None:
    where = cli_db or str(tmp_path / "m.db")
    memory = Memory.from_defaults(session_id="s", user_id="default", db=where, memory_blocks=[])
    memory.put_messages([Message("user", "The ferry to Tromsø leaves at nine")])
    memory.put_messages([Message("user", "Our hotel in gdansk was small")])
    memory.store.close()
    for query, word in (("tromso", "Tromsø"), ("GDAŃSK", "gdansk")):
        run = memcli("--db", where, "search", query, "--mode", "lexical", "--json")
        assert run.code == 0, run.stderr
        assert [word in r["text"] for r in run.records()] == [True], run.records()


def _lexical(store: SQLiteStore, query: str) -> list[str]:
    hits = Retriever(store, HashEmbedder(dim=16)).search(query, k=10, mode="lexical").hits
    return sorted({m.content for h in hits for m in h.messages if m.id == h.anchor_id})


def test_sqlite_index_stays_consistent_through_deletes_and_edits(tmp_path: Path) -> None:
    """The triggers take a deleted or edited message out of the index with its folded words (a
    word FTS5 was not given would damage the index: its integrity check says so)."""
    store = SQLiteStore(tmp_path / "m.db")
    memory = Memory(session_id="s1", user_id="u", store=store, memory_blocks=[])
    memory.put_messages([Message("user", "Tromsø in winter"), Message("user", "Ærø by bike")])
    other = Memory(session_id="s2", user_id="u", store=store, memory_blocks=[])
    other.put_messages([Message("user", "Łódź by train")])
    assert _lexical(store, "tromso") == ["Tromsø in winter"]
    store.delete_session("s1")
    (row,) = store.execute("SELECT id FROM messages").fetchall()
    store.execute("UPDATE messages SET content = 'Straße by train' WHERE id = ?", (row[0],))
    store.execute("INSERT INTO retrieval_fts (retrieval_fts) VALUES ('integrity-check')")
    assert _lexical(store, "tromso") == _lexical(store, "lodz") == []
    assert _lexical(store, "strasse") == ["Straße by train"]
    store.close()


def test_an_older_database_is_indexed_again_folded(tmp_path: Path) -> None:
    """Migration 27 makes the index again through the folding view: a message stored before
    it is found by its word without accents."""
    db = tmp_path / "old.db"
    database_at_version_10(db)
    conn = sqlite3.connect(db)
    conn.execute(
        "INSERT INTO messages VALUES (3, 's', 2, 'user', 'we sailed to Ærø', NULL, NULL, 4,"
        " 'active', NULL, NULL, '2026-01-02T03:04:05+00:00')"
    )
    conn.commit()
    conn.close()
    store = SQLiteStore(db)
    assert (
        store.execute("SELECT value FROM retrieval_state WHERE key = 'fts_through'").fetchone()[0]
        == "3"
    )
    store.execute("INSERT INTO retrieval_fts (retrieval_fts) VALUES ('integrity-check')")
    assert _lexical(store, "aero") == ["we sailed to Ærø"]
    assert _lexical(store, "rex") == ["my dog is Rex"]
    store.close()


def test_a_long_message_is_shown_where_its_folded_words_occur() -> None:
    """A hit on a long message shows the stretch holding the query's words, found folded: the
    positions are the text's even where a letter folds to two (ß) or an accent is apart."""
    filler = "lorem ipsum " * 400
    text = f"{filler}Straße, cafe\\u0301 and Tromsø, then Gdańsk {filler}"
    for query in ("tromso gdansk", "TROMSØ", "strasse", "café"):
        excerpt = lexical_excerpt(text, query_terms(query))
        assert excerpt is not None and "Tromsø, then Gdańsk" in excerpt, query

"""Embedding is scoped (issue 31): a search, `blocks backfill --user X` (or `SESSION`) and an
import embed the messages of their own scope only, never another user's; nothing is lost by
the scoped marks (the other user's later search finds its messages). On SQLite and PostgreSQL
(`cli_db`), with the real model."""

from __future__ import annotations

from pathlib import Path

import pytest
from clidata import BUDGET, write_chat
from fakes import HashEmbedder
from helpers import memcli

from memcli import Memory, Message, open_store
from memcli.search.retriever import Retriever
from memcli.store.index import Scope

pytestmark = pytest.mark.slow


def _vectors_per_user(db: str) -> dict[str, int]:
    """How many messages of each user have vectors, and (key "") how many have none."""
    store = open_store(db)
    try:
        rows = store.execute(
            "SELECT s.user_id, COUNT(DISTINCT v.message_id) FROM retrieval_vectors v"
            " JOIN messages m ON m.id = v.message_id JOIN sessions s ON s.id = m.session_id"
            " GROUP BY s.user_id"
        ).fetchall()
        return {str(user): int(n) for user, n in rows}
    finally:
        store.close()


def _messages_of(db: str, user: str) -> int:
    store = open_store(db)
    try:
        row = store.execute(
            "SELECT COUNT(*) FROM messages m JOIN sessions s ON s.id = m.session_id"
            " WHERE s.user_id = ?",
            (user,),
        ).fetchone()
        return int(row[0])
    finally:
        store.close()


@pytest.fixture
def two_users(
    tmp_path: Path, cli_db: str | None, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, list[str]]:
    """Users a (sessions a1, a2) and b (session b1) imported with --no-blocks: nothing embedded."""
    db = cli_db or str(tmp_path / "scope.db")
    monkeypatch.setenv("MEMCLI_DB", db)
    for user, session in (("a", "a1"), ("a", "a2"), ("b", "b1")):
        chat = write_chat(tmp_path / f"{session}.jsonl", session=session)
        run = memcli("import", chat, "--user", user, "--no-blocks", *BUDGET)
        assert run.code == 0, run.stderr
    assert _vectors_per_user(db) == {}
    return db, ["a1", "a2", "b1"]


def test_a_search_embeds_only_its_users_messages(two_users: tuple[str, list[str]]) -> None:
    db, _ = two_users
    run = memcli("search", "which instrument do I play", "--user", "a", "--json")
    assert run.code == 0, run.stderr
    assert "cello" in run.records()[0]["text"]
    counts = _vectors_per_user(db)
    assert counts.get("b", 0) == 0  # was: every search embedded pending messages of any user
    assert counts["a"] == _messages_of(db, "a")
    # Nothing of b's was lost by a's marks: b's search embeds b's and finds them by meaning.
    run = memcli(
        "search", "which instrument do I play", "--user", "b", "--mode", "vector", "--json"
    )
    assert run.code == 0, run.stderr
    assert "cello" in run.records()[0]["text"] and run.records()[0]["session"] == "b1"
    counts = _vectors_per_user(db)
    assert counts["b"] == _messages_of(db, "b") and counts["a"] == _messages_of(db, "a")


def test_backfill_of_a_user_or_session_embeds_only_it(two_users: tuple[str, list[str]]) -> None:
    db, _ = two_users
    run = memcli("blocks", "backfill", "a1", "--json")
    assert run.code == 0, run.stderr
    counts = _vectors_per_user(db)
    assert counts.get("b", 0) == 0
    assert 0 < counts["a"] < _messages_of(db, "a")  # a1's, not a2's
    run = memcli("blocks", "backfill", "--user", "a", "--json")
    assert run.code == 0, run.stderr
    counts = _vectors_per_user(db)
    assert counts.get("b", 0) == 0 and counts["a"] == _messages_of(db, "a")
    run = memcli("search", "where did I move", "--user", "b", "--mode", "vector", "--json")
    assert run.code == 0 and "Porto" in run.records()[0]["text"]
    assert _vectors_per_user(db)["b"] == _messages_of(db, "b")


def test_the_first_search_says_what_it_embeds(tmp_path: Path, monkeypatch) -> None:
    db = str(tmp_path / "many.db")
    monkeypatch.setenv("MEMCLI_DB", db)
    for user in ("a", "b"):
        chat = write_chat(tmp_path / f"{user}.jsonl", session=f"{user}1", small_talk=40)
        assert memcli("import", chat, "--user", user, "--no-blocks", *BUDGET).code == 0
    mine = _messages_of(db, "a")
    run = memcli("search", "cello", "--user", "a", "--json")
    assert run.code == 0, run.stderr
    # Only a's messages are counted and embedded, and it says so before it does.
    assert f"Embedding {mine:,} of {mine:,} messages not yet searchable" in run.stderr
    assert "about" in run.stderr
    run = memcli("search", "cello", "--user", "a", "--json")
    assert run.code == 0 and "Embedding" not in run.stderr


def test_the_store_mark_stays_true_and_scopes_settle(tmp_path: Path, monkeypatch) -> None:
    """Library: a scoped index leaves the store's other messages pending; an index of the store
    then embeds those only; a message put later in a's scope is a's next search's work."""
    from memcli.store import vectors

    for user in ("a", "b"):
        memory = Memory.from_defaults(
            session_id=f"{user}1", user_id=user, db=tmp_path / "lib.db", memory_blocks=[]
        )
        memory.put_messages([Message("user", f"{user} says {i}") for i in range(6)])
        memory.store.close()
    store = open_store(tmp_path / "lib.db")
    embedder = HashEmbedder(dim=16)
    retriever = Retriever(store, embedder)
    assert retriever.pending() == 12 and retriever.pending(Scope(user_id="a")) == 6
    assert retriever.index(scope=Scope(user_id="a")) == 6
    assert retriever.pending() == 6 and retriever.pending(Scope(user_id="b")) == 6
    assert vectors.embedded_through(store, retriever.model) == 0  # the store's mark stays
    assert retriever.index() == 6  # b's only: a's are not embedded twice
    assert retriever.pending() == 0
    before = len(embedder.calls)
    result = retriever.search("a says", user_id="a")
    assert result.embedded == 0 and len(embedder.calls) == before + 1  # the query alone
    locks: list[bool] = []
    can_write_now = store.can_write_now
    monkeypatch.setattr(store, "can_write_now", lambda: locks.append(True) or can_write_now())
    retriever.search("b says", user_id="b")
    retriever.search("a says", user_id="a")
    assert locks == []  # nothing past their marks: no write lock taken to find that out


def test_a_search_tells_what_it_builds_first(tmp_path: Path, monkeypatch) -> None:
    """`on_build` hears of the full-text index to catch up and of the scope's vectors, before
    the search builds them (the rates made tiny here, so that six messages take "seconds")."""
    from memcli.search import retriever as module

    memory = Memory.from_defaults(
        session_id="a1", user_id="a", db=tmp_path / "b.db", memory_blocks=[]
    )
    memory.put_messages([Message("user", f"apples {i}") for i in range(6)])
    other = Memory.from_defaults(
        session_id="b1", user_id="b", db=tmp_path / "b.db", memory_blocks=[]
    )
    other.put_messages([Message("user", f"pears {i}") for i in range(4)])
    monkeypatch.setattr(module, "FTS_RATE", 1)
    monkeypatch.setattr(module, "EMBED_RATE", 1)
    told: list = []
    retriever = Retriever(memory.store, HashEmbedder(dim=16), on_build=told.append)
    retriever.search("apples", user_id="a")
    assert [(b.what, b.count, b.pending) for b in told] == [("index", 10, 10), ("vectors", 6, 6)]
    assert told[1].describe().startswith("Embedding 6 of 6 messages not yet searchable")
    told.clear()
    retriever.search("apples", user_id="a")
    assert told == []


def test_hints_quote_a_user_name_as_a_shell_argument(tmp_path: Path) -> None:
    """A user name with a quote and a space is given back as one shell argument in the
    commands memcli suggests (search with no hits, a session of another user)."""
    import shlex

    db = str(tmp_path / "m.db")
    user = "o'brien smith"
    line = '{"role": "user", "content": "I collect antique harpsichords"}\n'
    run = memcli(
        "--db", db, "import", "-", "--user", user, "--session", "ob1", "--no-blocks", input=line
    )
    assert run.code == 0, run.stderr
    run = memcli("--db", db, "search", "harpsichords", "--user", "alice", "--mode", "lexical")
    said = " ".join(run.stderr.split())
    assert "Use --user 'o'\"'\"'brien smith'." in said, said
    assert shlex.split(said.split("Use --user ", 1)[1].rstrip("."))[0] == user
    run = memcli("--db", db, "inspect", "ob1", "--user", "alice")
    said = " ".join(run.stderr.split())
    assert run.code == 1 and "use --user 'o'\"'\"'brien smith'," in said, said

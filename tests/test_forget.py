"""Deleting for good: `memcli rm --message`, `memcli rm --user`, `Memory.delete_message`,
`Store.forget_user` (SQLite and PostgreSQL), and the MCP server's tool."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fakes import WordTokenizer
from helpers import memcli, no_blocks  # noqa: F401 (a fixture)

from memcli import Budget, Memory, Message, MessageNotFound, UsageError
from memcli.store import facts as fact_store
from memcli.store import longterm, open_store, work
from memcli.tools import AgentTools

pytestmark = pytest.mark.usefixtures("no_blocks")

#: Words no other test data holds: found in a file, they are alice's.
ALICE_WORDS = ("zanzibarflamingo", "quetzalcrumpet")


def write(path: Path, records: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def seed_users(tmp_path: Path) -> None:
    alice = [
        {"role": "user", "content": "My pet is a zanzibarflamingo called Rosa."},
        {"role": "assistant", "content": "A flamingo as a pet, how lovely!"},
        {"role": "user", "content": "She eats quetzalcrumpet every morning."},
        {"role": "assistant", "content": "What a breakfast."},
    ]
    bob = [
        {"role": "user", "content": "I restore old steam trains on weekends."},
        {"role": "assistant", "content": "Steam trains are wonderful machines."},
    ]
    for user, session, records in (("alice", "a1", alice), ("bob", "b1", bob)):
        path = write(tmp_path / f"{session}.jsonl", records)
        run = memcli("import", str(path), "--user", user, "--session", session)
        assert run.code == 0, run.stderr
    run = memcli("facts", "add", "Alice keeps a zanzibarflamingo", "--user", "alice")
    assert run.code == 0, run.stderr
    run = memcli("facts", "edit", "1", "Alice keeps a zanzibarflamingo named Rosa")
    assert run.code == 0, run.stderr


def files_holding(home: Path, word: str) -> list[Path]:
    """Every file under the store's home (not the shared model folder) holding `word`."""
    found = []
    for folder, dirs, files in os.walk(home):  # (does not follow the models symlink)
        dirs[:] = [d for d in dirs if not (Path(folder) / d).is_symlink()]
        for name in files:
            path = Path(folder) / name
            if word.encode() in path.read_bytes():
                found.append(path)
    return found


def index_files(home: Path) -> list[Path]:
    """The FAISS index files: beside the SQLite file, or under indexes/ for PostgreSQL."""
    return [*home.glob("memcli.db.retrieval.*"), *home.glob("indexes/*/retrieval.*")]


@pytest.mark.usefixtures("cli_db")  # on SQLite and on PostgreSQL without pgvector
def test_rm_user_leaves_no_trace_of_her_in_any_file(tmp_path: Path, isolated: Path) -> None:
    seed_users(tmp_path)
    # The hybrid search embeds every message and writes the FAISS index files.
    run = memcli("search", "pink bird pet", "--user", "alice", "-k", "1")
    assert run.code == 0 and "zanzibarflamingo" in run.stdout, run.stderr
    assert index_files(isolated)
    if os.environ.get("MEMCLI_DB") is None:
        assert files_holding(isolated, "zanzibarflamingo")

    run = memcli("rm", "--user", "alice", "--yes")
    assert run.code == 0, run.stderr
    [record] = run.records()
    assert record["type"] == "forgotten" and record["sessions"] == ["a1"]
    assert record["messages"] == 4 and record["facts"] == 1 and record["fact_changes"] == 2
    assert record["vectors"] >= 4
    assert "Forgot user 'alice'" in run.stderr

    assert index_files(isolated) == []  # rebuilt from the database by the next search
    for word in ALICE_WORDS:
        assert files_holding(isolated, word) == [], word
    assert [s["session"] for s in memcli("sessions").records()] == ["b1"]
    assert memcli("facts", "--user", "alice").records() == []
    assert memcli("check").code == 0
    for mode in ("lexical", "hybrid"):
        run = memcli("search", "steam trains", "--user", "bob", "--mode", mode, "-k", "1")
        assert run.code == 0 and "steam trains" in run.records()[0]["text"], run.stderr
        run = memcli("search", "zanzibarflamingo", "--user", "alice", "--mode", mode)
        assert run.code == 0 and run.records() == []


@pytest.mark.usefixtures("cli_db")  # on SQLite and on PostgreSQL
def test_rm_user_and_message_ask_first(tmp_path: Path) -> None:
    seed_users(tmp_path)
    for args in (["rm", "--user", "alice"], ["rm", "a1", "--message", "1"]):
        run = memcli(*args)
        assert run.code == 2 and "--yes" in run.stderr
    run = memcli("rm", "--user", "alice", "--dry-run")
    assert run.code == 0 and run.records()[0]["type"] == "would_forget"
    assert "Would delete user 'alice': 1 session (a1), 4 messages" in run.stderr
    run = memcli("rm", "a1", "--message", "3", "--dry-run")
    assert run.records() == [
        {
            "type": "would_delete",
            "session": "a1",
            "message": 3,
            "role": "user",
            "status": "active",
            "content": "She eats quetzalcrumpet every morning.",
        }
    ]
    info = {s["session"]: s for s in memcli("sessions").records()}
    assert info["a1"]["active_messages"] == 4  # nothing deleted
    # Usage: --message needs one session; nothing named at all.
    assert memcli("rm", "a1", "b1", "--message", "1", "--yes").code == 2
    assert memcli("rm", "--yes").code == 2
    run = memcli("rm", "a1", "--message", "99", "--yes")
    assert run.code == 1 and "no message 99 in session 'a1'" in run.stderr
    run = memcli("rm", "b1", "--user", "alice", "--yes")
    assert run.code == 1 and "no session 'b1' of user 'alice'" in run.stderr
    run = memcli("rm", "a1", "--message", "3", "--yes")
    assert run.code == 0 and run.records()[0]["message"] == 3
    assert (
        memcli("search", "quetzalcrumpet", "--mode", "lexical", "--user", "alice").records() == []
    )
    run = memcli("rm", "--user", "alice", "--yes")
    assert run.code == 0 and run.records()[0]["messages"] == 3
    assert [s["session"] for s in memcli("sessions").records()] == ["b1"]
    assert memcli("facts", "--user", "alice").records() == []
    assert memcli("check").code == 0


def terminal_rm(*args: str, answer: str) -> subprocess.CompletedProcess[str]:
    """memcli rm with stdin and stderr taken for a terminal, answering the question."""
    code = (
        "import sys; sys.stdin.isatty = lambda: True; sys.stderr.isatty = lambda: True;"
        f" sys.argv = ['memcli', 'rm', *{list(args)!r}];"
        " from memcli.cli.app import main; main()"
    )
    return subprocess.run(
        [sys.executable, "-c", code], input=answer, capture_output=True, text=True
    )


def test_rm_on_a_terminal_shows_what_goes_and_asks(tmp_path: Path) -> None:
    seed_users(tmp_path)
    proc = terminal_rm("--user", "alice", answer="n\n")
    assert proc.returncode == 1
    assert "Will delete user 'alice': 1 session (a1), 4 messages, 1 fact" in proc.stderr
    assert "Delete this for good?" in proc.stderr and "Nothing deleted." in proc.stderr
    assert len(memcli("sessions").records()) == 2
    proc = terminal_rm("a1", "--message", "2", answer="y\n")
    assert proc.returncode == 0, proc.stderr
    assert "Will delete message 2 of session a1 (assistant, active)" in proc.stderr
    assert "Deleted message 2 of session a1." in proc.stderr
    ids = [r["id"] for r in memcli("inspect", "a1", "--json").records() if r["type"] == "message"]
    assert ids == [1, 3, 4]


def seed_flushed(tmp_path: Path) -> None:
    """Session demo: 10 turns under a small budget, so that most are archived by flushes."""
    records = []
    for i in range(10):
        records.append({"role": "user", "content": f"user line {i} about the garden"})
        records.append({"role": "assistant", "content": f"assistant line {i} about roses"})
    records[4]["content"] = "the quetzalcrumpet recipe needs three eggs"
    path = write(tmp_path / "demo.jsonl", records)
    run = memcli(
        "import", str(path), "--session", "demo", "--token-limit", "60", "--flush-size", "10"
    )
    assert run.code == 0, run.stderr


def test_rm_message_keeps_the_session_consistent(tmp_path: Path, isolated: Path) -> None:
    seed_flushed(tmp_path)
    before = [r for r in memcli("inspect", "demo", "--all", "--json").records()]
    messages = {r["id"]: r for r in before if r["type"] == "message"}
    [summary] = [r for r in before if r["type"] == "summary"]
    target = next(m for m in messages.values() if "quetzalcrumpet" in m["content"])
    assert target["status"] == "archived" and target["flush_id"] is not None
    active = next(m for m in messages.values() if m["status"] == "active")
    store = open_store(isolated / "memcli.db")
    [fact] = fact_store.add_facts(
        store,
        "facts",
        "user:default",
        ["The recipe has eggs"],
        session_id="demo",
        flush_id=target["flush_id"],
        message_ids=[target["id"], target["id"] + 1],
    )
    flush = next(f for f in store.list_flushes("demo") if f.id == target["flush_id"])
    store.close()
    assert memcli("search", "quetzalcrumpet", "--mode", "lexical").records()

    run = memcli("rm", "demo", "--message", str(target["id"]), "--message", str(active["id"]))
    assert run.code == 2  # no terminal, no --yes
    run = memcli(
        "rm", "demo", "--message", str(target["id"]), "--message", str(active["id"]), "--yes"
    )
    assert run.code == 0, run.stderr
    assert [(r["type"], r["message"]) for r in run.records()] == [
        ("deleted", target["id"]),
        ("deleted", active["id"]),
    ]

    after = memcli("inspect", "demo", "--all", "--json").records()
    left = [r["id"] for r in after if r["type"] == "message"]
    assert left == [i for i in messages if i not in (target["id"], active["id"])]
    [new] = [r for r in after if r["type"] == "summary"]
    assert new["archived_messages"] == summary["archived_messages"] - 1
    assert new["active_messages"] == summary["active_messages"] - 1
    assert new["active_tokens"] == summary["active_tokens"] - active["tokens"]
    assert new["flushes"] == summary["flushes"]  # the flush keeps its record
    store = open_store(isolated / "memcli.db")
    kept = next(f for f in store.list_flushes("demo") if f.id == flush.id)
    assert kept.messages == flush.messages - 1
    assert kept.tokens == flush.tokens - target["tokens"]
    changed = fact_store.get_fact(store, fact.id)
    assert changed is not None and changed.text == "The recipe has eggs"
    assert changed.message_ids == [target["id"] + 1]  # provenance without the deleted id
    store.close()

    run = memcli("check")
    assert run.code == 0 and run.records() == [
        {"type": "summary", "problems": 0, "attention": 0}
    ], run.stderr
    assert memcli("search", "quetzalcrumpet", "--mode", "lexical").records() == []
    assert memcli("search", "garden", "--mode", "lexical").records()
    assert files_holding(isolated, "quetzalcrumpet") == []


# -- the library, on both backends -----------------------------------------------------------


def fill(store: object, session: str, user: str, texts: list[str]) -> Memory:
    memory = Memory(
        store,  # type: ignore[arg-type]
        session,
        user_id=user,
        budget=Budget(60, 0.5, 10),
        tokenizer=WordTokenizer(),
    )
    for i, text in enumerate(texts):
        memory.put(Message("user" if i % 2 == 0 else "assistant", text))
    return memory


def test_store_forget_user(db: str) -> None:
    store = open_store(db)
    words = [f"alice says zanzibarflamingo number {i} again and again" for i in range(12)]
    fill(store, "a1", "alice", words)
    fill(store, "a2", "alice", ["quetzalcrumpet for breakfast", "noted"])
    fill(store, "b1", "bob", [f"bob talks about steam trains {i}" for i in range(12)])
    fact_store.add_facts(store, "facts", "user:alice", ["Alice has a flamingo"], session_id="a1")
    fact_store.add_facts(store, "facts", "session:a2", ["Crumpets daily"], session_id="a2")
    fact_store.add_facts(store, "facts", "user:bob", ["Bob restores trains"], session_id="b1")
    longterm.save_state(store, "custom", "user:alice", {"mood": "flamingo"})
    longterm.save_state(store, "custom", "user:bob", {"mood": "trains"})
    work.record_condense_failure(store, "facts", "user:alice", "HTTP 500", 120, 100)
    work.record_condense_failure(store, "facts", "user:bob", "HTTP 500", 120, 100)
    assert store.list_flushes("a1")  # her archived messages and flushes go too

    survey = store.survey_user("alice")
    assert survey.sessions == ["a1", "a2"] and survey.messages == 14 and survey.facts == 2
    gone = store.forget_user("alice")
    assert gone == survey

    assert [s.id for s in store.list_sessions()] == ["b1"]
    for table, where in (
        ("messages", "session_id IN ('a1', 'a2')"),
        ("flushes", "session_id IN ('a1', 'a2')"),
        ("facts", "scope_key IN ('user:alice', 'session:a2')"),
        ("fact_history", "scope_key IN ('user:alice', 'session:a2')"),
        ("block_state", "scope_key IN ('user:alice', 'condense:user:alice')"),
    ):
        assert store.execute(f"SELECT COUNT(*) FROM {table} WHERE {where}").fetchone()[0] == 0
    assert [f.text for f in fact_store.list_facts(store, "facts", "user:bob")] == [
        "Bob restores trains"
    ]
    assert longterm.load_state(store, "custom", "user:bob") == {"mood": "trains"}
    assert [key for _, key, _ in work.condense_failures(store)] == ["user:bob"]
    assert len(store.get_messages("b1")) == 12
    assert store.check() == []
    assert store.forget_user("nobody").sessions == []
    store.close()


def test_delete_message(db: str) -> None:
    store = open_store(db)
    memory = fill(store, "s", "ana", [f"line {i} of the talk about roses" for i in range(12)])
    everything = memory.get_all()
    archived = next(m for m in everything if m.status == "archived")
    active = next(m for m in everything if m.status == "active")
    assert archived.id is not None and active.id is not None
    window = memory.get()
    deleted = memory.delete_message(active.id)
    assert deleted.content == active.content
    assert [m.id for m in memory.get()] == [m.id for m in window if m.id != active.id]
    memory.delete_message(archived.id)
    assert [m.id for m in memory.get_all()] == [
        m.id for m in everything if m.id not in (active.id, archived.id)
    ]
    info = memory.session()
    assert info.active_messages + info.archived_messages == len(everything) - 2
    with pytest.raises(MessageNotFound):
        memory.delete_message(archived.id)
    last = memory.get_all()[-1]
    assert last.id is not None
    assert asyncio.run(memory.adelete_message(last.id)).content == last.content
    assert last.id not in [m.id for m in memory.get_all()]
    other = fill(store, "t", "ana", ["hello", "hi"])
    with pytest.raises(MessageNotFound):  # another session's message
        other.delete_message(everything[-1].id or 0)
    assert store.check() == []
    store.close()


def test_agent_tool_forgets_its_user_when_confirmed(tmp_path: Path, isolated: Path) -> None:
    from memcli.config import load_settings
    from memcli.input_history import SHARED, history_path

    seed_users(tmp_path)
    # What alice typed in the chat: her own history file, and the file every user shared before.
    mine = history_path(isolated, "alice")
    mine.parent.mkdir(parents=True, exist_ok=True)
    mine.write_text("\n# 2024-01-01 10:00:00\n+Rosa the zanzibarflamingo\n")
    shared = isolated / SHARED
    shared.write_text(
        "\n# 2024-01-01 10:00:00\n+She eats quetzalcrumpet every morning.\n"
        "\n# 2024-01-01 10:01:00\n+I restore old steam trains on weekends.\n"
    )
    assert files_holding(isolated, "quetzalcrumpet") and files_holding(isolated, "zanzibarflamingo")
    store = open_store(isolated / "memcli.db")
    tools = AgentTools(store, load_settings({"MEMCLI_HOME": str(isolated)}, {}), "alice")
    with pytest.raises(UsageError, match="not confirmed"):
        tools.forget_user()
    assert len(store.list_sessions("alice")) == 1 and mine.exists()
    record = tools.forget_user(confirm=True)
    assert record["type"] == "forgotten" and record["sessions"] == ["a1"]
    assert store.list_sessions("alice") == [] and len(store.list_sessions("bob")) == 1
    store.close()
    for word in ALICE_WORDS:
        assert files_holding(isolated, word) == [], word
    assert not mine.exists() and "steam trains" in shared.read_text()  # bob's line stays


def test_rm_session_deletes_its_text_for_good(tmp_path: Path, isolated: Path) -> None:
    seed_users(tmp_path)
    assert files_holding(isolated, "quetzalcrumpet")
    run = memcli("rm", "a1")  # sessions: no question in a script, as before
    assert run.code == 0 and run.records() == [{"type": "deleted", "session": "a1", "messages": 4}]
    assert files_holding(isolated, "quetzalcrumpet") == []
    # What the blocks learned stays (the fact), until the user is forgotten.
    assert files_holding(isolated, "zanzibarflamingo")
    assert memcli("rm", "--user", "alice", "--yes").code == 0
    assert files_holding(isolated, "zanzibarflamingo") == []


def test_rm_user_takes_her_chat_input_history(tmp_path: Path, isolated: Path) -> None:
    from memcli.input_history import history_path

    seed_users(tmp_path)
    mine, bobs = history_path(isolated, "alice"), history_path(isolated, "bob")
    assert mine != bobs and mine.parent == bobs.parent
    for path, text in ((mine, "My pet is a zanzibarflamingo called Rosa."), (bobs, "trains")):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"\n# 2026-01-01 10:00:00.000000\n+{text}\n")
    # The file every user shared before: her sent lines go, the others' stay.
    shared = isolated / "chat_history"
    shared.write_text(
        "\n# 2026-01-01 10:00:00.000000\n+She eats quetzalcrumpet every morning.\n"
        "\n# 2026-01-01 10:00:01.000000\n+I restore old steam trains on weekends.\n"
        "\n# 2026-01-01 10:00:02.000000\n+/facts\n+two lines\n"
        # typed with spaces around it (the message is stored stripped): hers too
        "\n# 2026-01-01 10:00:03.000000\n+  She eats quetzalcrumpet every morning. \n"
        # a line separator inside a line is no end of line in the file
        "\n# 2026-01-01 10:00:04.000000\n+steam\u2028trains\x0cand\rmore\n"
    )
    run = memcli("rm", "--user", "alice", "--yes")
    assert run.code == 0, run.stderr
    assert not mine.exists() and bobs.read_text().endswith("+trains\n")
    assert shared.read_bytes().decode() == (
        "\n# 2026-01-01 10:00:01.000000\n+I restore old steam trains on weekends.\n"
        "\n# 2026-01-01 10:00:02.000000\n+/facts\n+two lines\n"
        "\n# 2026-01-01 10:00:04.000000\n+steam\u2028trains\x0cand\rmore\n"
    )
    for word in ALICE_WORDS:
        assert files_holding(isolated, word) == []

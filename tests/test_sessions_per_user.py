"""Sessions belong to their users: two users may each own `main` (CLI, MCP over HTTP, the library;
SQLite and PostgreSQL), every command and tool addresses a session by (user, name), and nothing
a user is shown tells them whether another user's session of that name exists."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import memcli, no_blocks  # noqa: F401 (a fixture)

from memcli import Memory, Message
from memcli.messages import KEY_SEPARATOR
from memcli.store import open_store

pytestmark = pytest.mark.usefixtures("no_blocks")

ALICE = [
    {"role": "user", "content": "My dog is called Biscuit."},
    {"role": "assistant", "content": "What a nice name."},
]
BOB = [
    {"role": "user", "content": "My cat is called Pepper."},
    {"role": "assistant", "content": "Cats are great."},
]


def jsonl(messages: list[dict[str, str]]) -> str:
    return "".join(json.dumps(m) + "\n" for m in messages)


def ok(*args: str, input: str | None = None) -> Any:
    run = memcli(*args, input=input)
    assert run.code == 0, (args, run.stderr)
    return run


def contents(records: list[dict[str, Any]]) -> list[str]:
    return [r["content"] for r in records if "content" in r and r.get("type") != "session"]


def test_two_users_each_own_main_on_the_cli(cli_db: str | None, tmp_path: Path) -> None:
    """`import --session main --user bob` after alice's `main` is bob's own `main`; every
    command takes (user, name); export, import, copy and rm follow; without --user the name
    is ambiguous (exit 2, naming the users)."""
    ok("import", "-", "--session", "main", "--user", "alice", input=jsonl(ALICE))
    run = ok("import", "-", "--session", "main", "--user", "bob", input=jsonl(BOB))
    assert "main" in run.stderr
    for user, mine, theirs in (("alice", ALICE, "Pepper"), ("bob", BOB, "Biscuit")):
        listed = ok("sessions", "--user", user, "--json").records()
        assert [(r["session"], r["user"]) for r in listed] == [("main", user)]
        shown = ok("inspect", "main", "--user", user, "--json").records()
        assert contents(shown) == [m["content"] for m in mine]
        exported = ok("export", "main", "--user", user, "--all").records()
        assert exported[0]["id"] == "main" and exported[0]["user"] == user
        assert contents(exported) == [m["content"] for m in mine]
        found = ok("search", theirs, "--user", user, "--mode", "lexical", "--json").records()
        assert found == []  # the other user's words are not theirs
        found = ok("search", "called", "--user", user, "--session", "main", "--json").records()
        assert {r["session"] for r in found} == {"main"}
        assert all(theirs not in r["text"] for r in found)
        context = ok("dump", "context", "main", "--user", user, "--json").records()
        assert theirs not in json.dumps(context)
    run = memcli("inspect", "main")
    assert run.code == 2 and "2 users have a session 'main': alice, bob" in run.stderr
    # An export of bob's `main` imported again into bob's stores nothing twice; into carl's, a
    # new session of carl's.
    exported_bob = ok("export", "main", "--user", "bob", "--all").stdout
    assert "0 new" in ok("import", "-", "--user", "bob", input=exported_bob).stderr
    ok("import", "-", "--user", "carl", input=exported_bob)
    assert contents(ok("inspect", "main", "--user", "carl", "--json").records()) == [
        m["content"] for m in BOB
    ]
    # A copy keeps every user's session of the name.
    if cli_db is None:
        target = tmp_path / "copy.db"
        ok("copy", str(Path(os.environ["MEMCLI_HOME"]) / "memcli.db"), str(target))
        copied = open_store(str(target))
        assert sorted((i.name, i.user_id) for i in copied.list_sessions()) == [
            ("main", "alice"),
            ("main", "bob"),
            ("main", "carl"),
        ]
        copied.close()
    # rm takes (user, name): bob's main goes, alice's and carl's stay.
    ok("rm", "main", "--user", "bob", "--yes")
    assert ok("sessions", "--user", "bob", "--json").records() == []
    assert contents(ok("inspect", "main", "--user", "alice", "--json").records()) == [
        m["content"] for m in ALICE
    ]
    everything = ok("sessions", "--json").stdout
    assert KEY_SEPARATOR not in everything and "\\u001f" not in everything


def test_the_library_gives_each_user_their_own_session_of_a_name(db: str) -> None:
    alice = Memory.from_defaults(session_id="main", user_id="alice", db=db)
    alice.put_messages([Message(**m) for m in ALICE])
    bob = Memory.from_defaults(session_id="main", user_id="bob", db=db)
    assert bob.get_all() == []
    bob.put_messages([Message(**m) for m in BOB])
    assert [m.content for m in bob.get_all()] == [m["content"] for m in BOB]
    assert [m.content for m in alice.get_all()] == [m["content"] for m in ALICE]
    assert bob.search("Biscuit", mode="lexical").hits == []
    assert [h.to_dict()["session"] for h in bob.search("Pepper", mode="lexical").hits] == ["main"]
    assert bob.session().name == "main" and bob.session_id == "main"
    alice.close()
    bob.close()


# -- MCP over HTTP: two users, one name -----------------------------------------------------------


def mcp_users(db: str, *users: str) -> dict[str, str]:
    tokens = {}
    for user in users:
        run = memcli("--db", db, "mcp", "token", "add", "--user", user)
        assert run.code == 0, run.stderr
        tokens[user] = run.stdout.strip()
    return tokens


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_two_users_each_own_main_over_mcp_http(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Alice takes `main` first; then bob's tools see no `main` of his (the same words as for a
    name nobody has), his put makes his own, and from then on each reads, searches and lists
    only their own; nothing bob is sent names alice or shows the store's key."""
    from test_mcp_http import as_user, result, serve

    db = str(tmp_path / "http.db") if backend == "sqlite" else str(request.getfixturevalue("pg_url"))
    tokens = mcp_users(db, "alice", "bob")
    for url, _ in serve(db):  # type: ignore[arg-type]

        async def alice_puts(s: Any) -> Any:
            return result(await s.call_tool("put_messages", {"messages": ALICE, "session": "main"}))

        async def bob_session(s: Any) -> dict[str, Any]:
            out: dict[str, Any] = {}
            for name in ("main", "nobody"):
                out[f"read {name}"] = await s.call_tool("read_session", {"session": name})
                out[f"context {name}"] = await s.call_tool("get_context", {"session": name})
                out[f"search {name}"] = await s.call_tool(
                    "search_memory", {"query": "dog", "session": name, "mode": "lexical"}
                )
            out["put"] = await s.call_tool("put_messages", {"messages": BOB, "session": "main"})
            out["solo"] = await s.call_tool("put_messages", {"messages": BOB, "session": "solo"})
            out["sessions"] = await s.call_tool("list_sessions", {})
            out["read"] = await s.call_tool("read_session", {"session": "main"})
            out["search"] = await s.call_tool("search_memory", {"query": "Biscuit", "mode": "lexical"})
            out["own"] = await s.call_tool("search_memory", {"query": "Pepper", "mode": "lexical"})
            out["context"] = await s.call_tool("get_context", {"session": "main"})
            return out

        async def alice_reads(s: Any) -> dict[str, Any]:
            return {
                "read": result(await s.call_tool("read_session", {"session": "main"})),
                "sessions": result(await s.call_tool("list_sessions", {})),
                "search": result(
                    await s.call_tool("search_memory", {"query": "Pepper", "mode": "lexical"})
                ),
            }

        assert anyio.run(as_user, url, tokens["alice"], alice_puts)["session"] == "main"
        bob = anyio.run(as_user, url, tokens["bob"], bob_session)
        alice = anyio.run(as_user, url, tokens["alice"], alice_reads)

    def said(call: Any) -> str:
        return " ".join(getattr(c, "text", "") for c in call.content)

    # Before his put: alice's `main` is to bob what a name nobody has is.
    for tool in ("read", "context", "search"):
        assert bob[f"{tool} main"].is_error and bob[f"{tool} nobody"].is_error
        assert said(bob[f"{tool} main"]) == said(bob[f"{tool} nobody"]).replace("nobody", "main")
    put, solo = result(bob["put"]), result(bob["solo"])
    assert put["session"] == "main" and put["stored"] == 2
    assert {k: v for k, v in put.items() if k != "session"} == {
        k: v for k, v in solo.items() if k != "session"
    }
    assert sorted(s["session"] for s in result(bob["sessions"])) == ["main", "solo"]
    read = result(bob["read"])
    assert (read["session"], read["user"]) == ("main", "bob")
    assert [m["content"] for m in read["messages"]] == [m["content"] for m in BOB]
    assert {m["session"] for m in read["messages"]} == {"main"}
    assert result(bob["search"]) == []
    own = result(bob["own"])
    assert {h["session"] for h in own} == {"main", "solo"}
    assert all("Biscuit" not in h["text"] for h in own)
    assert "Biscuit" not in json.dumps(result(bob["context"]))
    everything_bob_saw = json.dumps([said(v) for v in bob.values()])
    assert "alice" not in everything_bob_saw
    assert KEY_SEPARATOR not in everything_bob_saw and "\\u001f" not in everything_bob_saw
    assert [m["content"] for m in alice["read"]["messages"]] == [m["content"] for m in ALICE]
    assert [s["session"] for s in alice["sessions"]] == ["main"]
    assert alice["search"] == []

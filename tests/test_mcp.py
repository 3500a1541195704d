"""`memcli mcp`: the server started as a subprocess and driven over stdio by the MCP SDK's client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import no_blocks  # noqa: F401 (a fixture)

pytest.importorskip("mcp")

from mcp import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402

from memcli import Memory, Message  # noqa: E402
from memcli.store import facts as fact_store  # noqa: E402
from memcli.store.sqlite import SQLiteStore  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_blocks")  # no model loads: search runs lexical

CHAT = [
    {"role": "user", "content": "My dog is called Biscuit and he loves the beach."},
    {"role": "assistant", "content": "Biscuit sounds like a happy dog!"},
    {"role": "user", "content": "I moved to Lisbon last spring."},
    {"role": "assistant", "content": "Lisbon is lovely in spring."},
]


@asynccontextmanager
async def client(db: Path, *args: str) -> AsyncIterator[ClientSession]:
    """An initialised client session with `memcli --db DB mcp ARGS` as its server."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "memcli", "--db", str(db), "mcp", *args],
        env=dict(os.environ),  # MEMCLI_HOME, MEMCLI_CONFIG and PYTHONPATH of the test
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def drive(db: Path, script: Callable[[ClientSession], Awaitable[Any]], *args: str) -> Any:
    async def main() -> Any:
        async with client(db, *args) as session:
            with anyio.fail_after(120):
                return await script(session)

    return anyio.run(main)


def attr(obj: Any, name: str) -> Any:
    """A field of an SDK type: snake_case in mcp 2, camelCase in mcp 1."""
    if hasattr(obj, name):
        return getattr(obj, name)
    head, *rest = name.split("_")
    return getattr(obj, head + "".join(w.capitalize() for w in rest))


def is_error(result: Any) -> bool:
    return bool(attr(result, "is_error"))


def text(result: Any) -> str:
    return "".join(c.text for c in result.content if getattr(c, "type", "") == "text")


def data(result: Any) -> Any:
    """A tool's result as JSON: its structured content, else its text."""
    assert not is_error(result), text(result)
    structured = attr(result, "structured_content")
    if structured is not None:
        return structured.get("result", structured) if isinstance(structured, dict) else structured
    return json.loads(text(result))


async def failure(call: Awaitable[Any]) -> str:
    """The message of the protocol error a request gets (the test fails if it succeeds)."""
    try:
        await call
    except Exception as error:  # McpError in mcp 1, MCPError in mcp 2
        return str(error)
    raise AssertionError("the request succeeded")


def resource_json(result: Any) -> Any:
    return json.loads(result.contents[0].text)


def test_tools_and_resources_over_stdio(tmp_path: Path) -> None:
    db = tmp_path / "mcp.db"

    async def script(s: ClientSession) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out["tools"] = sorted(t.name for t in (await s.list_tools()).tools)
        out["put"] = data(await s.call_tool("put_messages", {"messages": CHAT, "session": "s1"}))
        out["context"] = data(await s.call_tool("get_context", {"session": "s1"}))
        out["search"] = data(
            await s.call_tool("search_memory", {"query": "Lisbon", "mode": "lexical", "k": 2})
        )
        added = data(await s.call_tool("add_fact", {"text": "Ana has a dog called Biscuit"}))
        out["added"] = added
        fact_id = added["fact"]["id"]
        out["again"] = data(
            await s.call_tool("add_fact", {"text": "ana has a dog  called biscuit"})
        )
        out["updated"] = data(
            await s.call_tool("update_fact", {"fact_id": fact_id, "text": "Ana's dog is Biscuit"})
        )
        out["listed"] = data(await s.call_tool("list_facts", {}))
        out["deleted"] = data(await s.call_tool("delete_fact", {"fact_id": fact_id}))
        out["after"] = data(await s.call_tool("list_facts", {}))
        out["resources"] = [str(r.uri) for r in (await s.list_resources()).resources]
        templates = attr(await s.list_resource_templates(), "resource_templates")
        out["templates"] = [attr(t, "uri_template") for t in templates]
        out["sessions"] = resource_json(await s.read_resource("memcli://sessions"))
        out["session"] = resource_json(await s.read_resource("memcli://sessions/s1"))
        return out

    out = drive(db, script, "--user", "ana")

    assert out["tools"] == sorted(
        [
            "add_fact",
            "delete_all_facts",
            "delete_fact",
            "forget_user",
            "fact_history",
            "get_context",
            "get_fact",
            "list_entities",
            "list_facts",
            "list_sessions",
            "put_messages",
            "read_session",
            "remember",
            "restore_fact",
            "search_facts",
            "search_memory",
            "update_fact",
        ]
    )
    assert out["put"]["session"] == "s1" and out["put"]["stored"] == 4
    assert out["put"]["active_messages"] == 4
    assert [(m["role"], m["content"]) for m in out["context"]] == [
        (m["role"], m["content"]) for m in CHAT
    ]
    assert out["search"] and "Lisbon" in out["search"][0]["text"]
    assert out["search"][0]["session"] == "s1"
    assert out["added"]["added"] is True and out["added"]["fact"]["origin"] == "mcp"
    assert out["again"] == {"added": False, "fact": out["added"]["fact"]}
    assert out["updated"]["before"]["text"] == "Ana has a dog called Biscuit"
    assert [f["text"] for f in out["listed"]] == ["Ana's dog is Biscuit"]
    assert out["deleted"]["deleted"]["id"] == out["added"]["fact"]["id"]
    assert out["after"] == []
    assert out["resources"] == ["memcli://sessions"]
    assert out["templates"] == ["memcli://sessions/{session_id}"]
    assert [(r["session"], r["user"], r["active_messages"]) for r in out["sessions"]] == [
        ("s1", "ana", 4)
    ]
    assert [m["content"] for m in out["session"]["messages"]] == [m["content"] for m in CHAT]

    # What the server stored, read through the library on the same database.
    store = SQLiteStore(db)
    info = store.get_session("s1")
    assert info is not None and info.user_id == "ana"
    history = fact_store.fact_history(store, "user:ana")
    assert [(c.action, c.text, c.old_text, c.origin) for c in history] == [
        ("added", "Ana has a dog called Biscuit", None, "mcp"),
        ("edited", "Ana's dog is Biscuit", "Ana has a dog called Biscuit", "mcp"),
        ("deleted", None, "Ana's dog is Biscuit", "mcp"),
    ]
    fact = fact_store.get_fact(store, history[0].fact_id)
    assert fact is not None and fact.origin == "mcp" and fact.deleted_at is not None


def test_bad_input_is_a_tool_error_and_stores_nothing(tmp_path: Path) -> None:
    db = tmp_path / "mcp.db"
    store = SQLiteStore(db)
    from memcli import Memory, Message

    Memory(store, "bobs", user_id="bob").put(Message("user", "Bob's secret plan"))
    fact_store.add_facts(store, "facts", "user:bob", ["Bob likes chess"], origin="manual")
    bob_fact = fact_store.list_facts(store, None, "user:bob")[0].id
    store.close()

    async def script(s: ClientSession) -> dict[str, Any]:
        bad = [{"role": "user", "content": "fine"}, {"role": "robot", "content": "nope"}]
        return {
            "put": await s.call_tool("put_messages", {"messages": bad, "session": "new"}),
            "empty": await s.call_tool("add_fact", {"text": "   "}),
            "other_fact": await s.call_tool("delete_fact", {"fact_id": bob_fact}),
            "other_session": await s.call_tool("get_context", {"session": "bobs"}),
            "other_search": await s.call_tool(
                "search_memory", {"query": "secret plan", "mode": "lexical"}
            ),
            "mode": await s.call_tool("search_memory", {"query": "plan", "mode": "psychic"}),
            "missing": await s.call_tool("put_messages", {"session": "new"}),
            "sessions": resource_json(await s.read_resource("memcli://sessions")),
            "other_resource": await failure(s.read_resource("memcli://sessions/bobs")),
        }

    out = drive(db, script, "--user", "ana")

    put = out["put"]
    assert is_error(put)
    assert "messages.1.role: Input should be 'system', 'user'" in text(put)
    assert is_error(out["empty"]) and "the fact is empty" in text(out["empty"])
    assert is_error(out["other_fact"]) and f"no fact {bob_fact} of user 'ana'" in text(
        out["other_fact"]
    )
    assert is_error(out["other_session"]) and "no session 'bobs'" in text(out["other_session"])
    assert data(out["other_search"]) == []  # bob's messages are not ana's memory
    assert is_error(out["mode"]) and "'hybrid', 'lexical' or 'vector'" in text(out["mode"])
    assert is_error(out["missing"])
    assert out["sessions"] == []
    assert "no session 'bobs'" in out["other_resource"]

    store = SQLiteStore(db)
    assert store.get_session("new") is None
    assert [s.id for s in store.list_sessions()] == ["bobs"]
    assert [f.text for f in fact_store.list_facts(store, None, "user:bob")] == ["Bob likes chess"]
    assert fact_store.list_facts(store, None, "user:ana") == []


def test_stdout_carries_only_the_protocol(tmp_path: Path) -> None:
    """Raw JSON-RPC over the pipes: every line on stdout is a JSON-RPC message, even when a call
    fails; memcli's notes go to stderr."""
    requests = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "test", "version": "0"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {
                "name": "put_messages",
                "arguments": {"messages": CHAT, "session": "raw"},
            },
        },
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "get_context", "arguments": {"session": "nope"}},
        },
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "memcli", "--db", str(tmp_path / "raw.db"), "mcp"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    replies = []
    for request in requests:
        proc.stdin.write((json.dumps(request) + "\n").encode())
        proc.stdin.flush()
        if "id" in request:
            replies.append(json.loads(proc.stdout.readline()))
    rest, _ = proc.communicate(timeout=60)  # closes stdin: the server ends
    assert proc.returncode == 0
    for line in rest.decode().splitlines():  # anything after the replies is protocol too
        assert json.loads(line)["jsonrpc"] == "2.0"
    assert [r["id"] for r in replies] == [1, 2, 3]
    assert replies[0]["result"]["serverInfo"]["name"] == "memcli"
    assert not replies[1]["result"].get("isError")
    assert replies[2]["result"]["isError"] is True
    assert "no session 'nope'" in replies[2]["result"]["content"][0]["text"]


def test_forget_user_needs_confirm(tmp_path: Path) -> None:
    db = tmp_path / "mcp.db"

    async def script(s: ClientSession) -> dict[str, Any]:
        out: dict[str, Any] = {}
        await s.call_tool("put_messages", {"messages": CHAT, "session": "s1"})
        out["refused"] = await s.call_tool("forget_user", {"confirm": False})
        out["sessions"] = resource_json(await s.read_resource("memcli://sessions"))
        out["forgotten"] = data(await s.call_tool("forget_user", {"confirm": True}))
        out["after"] = resource_json(await s.read_resource("memcli://sessions"))
        return out

    out = drive(db, script, "--user", "ana")
    assert is_error(out["refused"]) and "not confirmed" in text(out["refused"])
    assert [s["session"] for s in out["sessions"]] == ["s1"]
    assert out["forgotten"]["sessions"] == ["s1"] and out["forgotten"]["messages"] == 4
    assert out["after"] == []
    assert b"Biscuit" not in db.read_bytes()


def test_fact_tools_search_get_history_entities_forget(tmp_path: Path) -> None:
    """The fact tools at mem0's level: search, get (any state), history, entities, expiry,
    forget all (with or without the history); schemas with descriptions, enums and bounds;
    unknown arguments and unknown blocks refused."""
    db = tmp_path / "mcp.db"
    store = SQLiteStore(db)
    [home] = fact_store.add_facts(
        store, "extracted_info", "user:ana", ["Ana lives in Bern"], entities=[["Bern"]]
    )
    changes = fact_store.change_facts(
        store,
        "extracted_info",
        "user:ana",
        [fact_store.NewFact("Ana lives in Zurich", entities=["Zurich"], replaces=[home.id])],
    )
    zurich = changes.added[0].id
    fact_store.add_facts(store, "extracted_info", "user:bob", ["Bob lives in Bern"])
    store.close()

    async def script(s: ClientSession) -> dict[str, Any]:
        out: dict[str, Any] = {}
        tools = {t.name: t for t in (await s.list_tools()).tools}
        out["schema"] = attr(tools["search_facts"], "input_schema")
        add = lambda args: s.call_tool("add_fact", args)  # noqa: E731
        out["added"] = data(
            await add({"text": "Ana's sister is Eva", "entities": ["Eva"], "topics": ["family"]})
        )
        out["expiring"] = data(await add({"text": "Ana is in Rome", "expires": "2000-01-01"}))
        out["unknown_block"] = await add({"text": "x", "block": "nope"})
        out["unknown_arg"] = await add({"text": "x", "colour": "red"})
        out["big_k"] = await s.call_tool("search_facts", {"query": "lives", "k": 1000})
        out["search"] = data(
            await s.call_tool("search_facts", {"query": "where does Ana live", "mode": "lexical"})
        )
        out["entity"] = data(await s.call_tool("list_facts", {"entity": "eva"}))
        out["all"] = data(await s.call_tool("list_facts", {"include_old": True}))
        out["get"] = data(await s.call_tool("get_fact", {"fact_id": home.id}))
        out["history"] = data(await s.call_tool("fact_history", {"fact_id": zurich}))
        out["entities"] = data(await s.call_tool("list_entities", {}))
        out["forget"] = data(await s.call_tool("delete_all_facts", {}))
        out["after"] = data(await s.call_tool("list_facts", {"include_old": True}))
        return out

    out = drive(db, script, "--user", "ana")
    schema = out["schema"]
    assert schema["additionalProperties"] is False
    assert schema["properties"]["k"]["maximum"] == 100 and schema["properties"]["k"]["minimum"] == 1
    assert schema["properties"]["mode"]["enum"] == ["hybrid", "lexical", "vector"]
    assert all(p.get("description") for p in schema["properties"].values())
    assert out["added"]["fact"]["entities"] == ["Eva"]
    assert out["expiring"]["fact"]["state"] == "expired"
    assert out["expiring"]["fact"]["expires_at"] == "2000-01-01T00:00:00Z"
    assert is_error(out["unknown_block"]) and "no fact block 'nope'" in text(out["unknown_block"])
    assert is_error(out["unknown_arg"]) and "colour" in text(out["unknown_arg"])
    assert is_error(out["big_k"]) and "less than or equal to 100" in text(out["big_k"])
    assert out["search"][0]["text"] == "Ana lives in Zurich"  # Bern is superseded: not found
    assert "Ana lives in Bern" not in [f["text"] for f in out["search"]]
    assert out["search"][0]["score"] > out["search"][-1]["score"]
    assert [f["text"] for f in out["entity"]] == ["Ana's sister is Eva"]
    states = {f["text"]: f["state"] for f in out["all"]}
    assert states == {
        "Ana lives in Bern": "superseded",
        "Ana lives in Zurich": "current",
        "Ana's sister is Eva": "current",
        "Ana is in Rome": "expired",
    }
    assert out["get"]["state"] == "superseded" and out["get"]["superseded_by"] == zurich
    assert [v["text"] for v in out["history"]["versions"]] == [
        "Ana lives in Bern",
        "Ana lives in Zurich",
    ]
    assert [(c["fact_id"], c["action"]) for c in out["history"]["changes"]] == [
        (home.id, "added"),
        (zurich, "added"),
        (home.id, "superseded"),
    ]
    assert out["entities"] == [{"entity": "Eva", "facts": 1}, {"entity": "Zurich", "facts": 1}]
    assert out["forget"] == {"forgotten": 4, "history_kept": False}
    assert out["after"] == []
    store = SQLiteStore(db)
    assert fact_store.fact_history(store, "user:ana") == []
    assert [f.text for f in fact_store.list_facts(store, None, "user:bob")] == ["Bob lives in Bern"]


def test_unreadable_requests_get_an_error_reply(tmp_path: Path) -> None:
    """A request holding a lone surrogate (`\\ud800`: JSON allows the escape, the SDK's parser
    does not) or a line that is not JSON gets a JSON-RPC parse error with the request's id (null
    when none is found), and the server goes on answering; an over-long fact is refused."""
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"},
        },
    }
    lines = [
        json.dumps(init),
        json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        '{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "add_fact",'
        ' "arguments": {"text": "Ana \\ud800 likes tea"}}}',
        "this is not json",
        json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 3,
                "method": "tools/call",
                "params": {"name": "add_fact", "arguments": {"text": "x" * 2001}},
            }
        ),
        json.dumps({"jsonrpc": "2.0", "id": 4, "method": "tools/list"}),
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "memcli", "--db", str(tmp_path / "raw.db"), "mcp"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(("\n".join(lines) + "\n").encode())
    proc.stdin.flush()
    replies = []  # read before stdin closes, as a client waits for its answers
    while len(replies) < 5:
        line = proc.stdout.readline()
        assert line, replies
        replies.append(json.loads(line))
    proc.stdin.close()
    proc.wait(timeout=60)
    by_id = {r["id"]: r for r in replies}
    assert sorted(by_id, key=str) == sorted([1, 2, None, 3, 4], key=str), replies
    assert by_id[2]["error"]["code"] == -32700
    assert "not valid Unicode" in by_id[2]["error"]["message"]
    assert by_id[None]["error"]["code"] == -32700
    assert by_id[3]["result"]["isError"] is True
    assert "at most 2000 characters" in by_id[3]["result"]["content"][0]["text"]
    assert by_id[4]["result"]["tools"]
    store = SQLiteStore(tmp_path / "raw.db")
    assert fact_store.list_facts(store, None, "user:default") == []


def test_strict_arguments_annotations_schemas_and_agent_words(tmp_path: Path) -> None:
    """A guard is JSON true and nothing else, an id a JSON integer; every tool carries MCP
    annotations; the schemas are complete; refusals speak in tool terms, without pydantic's
    URL; another user's session is "no session" on every tool (a put into its name makes the
    user's own session of that name); an empty result says so."""
    db = tmp_path / "mcp.db"
    store = SQLiteStore(db)
    from memcli import Memory, Message

    Memory(store, "bobs", user_id="bob").put(Message("user", "Bob's secret plan"))
    store.close()

    async def script(s: ClientSession) -> dict[str, Any]:
        out: dict[str, Any] = {}
        await s.call_tool("put_messages", {"messages": CHAT, "session": "s1"})
        out["tools"] = {t.name: t for t in (await s.list_tools()).tools}
        out["guards"] = [
            await s.call_tool("forget_user", {"confirm": v}) for v in ("yes", "on", 1, "true")
        ]
        out["string_id"] = await s.call_tool("get_fact", {"fact_id": "1"})
        out["sessions"] = data(await s.call_tool("list_sessions", {}))
        out["others"] = [
            await s.call_tool(name, args)
            for name, args in [
                ("get_context", {"session": "bobs"}),
                ("read_session", {"session": "bobs"}),
                ("search_memory", {"query": "plan", "session": "bobs", "mode": "lexical"}),
            ]
        ]
        out["own"] = data(
            await s.call_tool("put_messages", {"session": "bobs", "messages": CHAT[:1]})
        )
        out["own_read"] = data(await s.call_tool("read_session", {"session": "bobs"}))
        out["typo"] = await s.call_tool("get_context", {"session": "s11"})
        out["empty"] = await s.call_tool("list_facts", {})
        return out

    out = drive(db, script, "--user", "ana")
    tools = out["tools"]
    for name, tool in tools.items():
        notes = attr(tool, "annotations")
        assert notes is not None, name
        assert attr(notes, "read_only_hint") is not None, name
        schema = attr(tool, "input_schema")
        assert all(p.get("description") for p in schema["properties"].values()), name
    forget = attr(tools["forget_user"], "annotations")
    assert attr(forget, "destructive_hint") is True and attr(forget, "read_only_hint") is False
    assert attr(attr(tools["search_memory"], "annotations"), "read_only_hint") is True
    put = attr(tools["put_messages"], "input_schema")
    item = put["$defs"][put["properties"]["messages"]["items"]["$ref"].split("/")[-1]]
    assert item["properties"]["role"]["enum"] == [
        "system",
        "user",
        "assistant",
        "tool",
        "developer",
    ]
    assert item["required"] == ["role", "content"]
    assert {"name", "metadata", "timestamp"} <= set(item["properties"])
    add = attr(tools["add_fact"], "input_schema")
    assert add["properties"]["text"]["maxLength"] == fact_store.MAX_FACT_CHARS
    for refused in out["guards"]:
        assert is_error(refused) and "confirm: Input should be a valid boolean" in text(refused)
    assert is_error(out["string_id"]) and "valid integer" in text(out["string_id"])
    assert [r["session"] for r in out["sessions"]] == ["s1"]  # nothing was forgotten
    for refused in out["others"]:
        assert is_error(refused)
        assert "no session 'bobs' of user 'ana'" in text(refused), text(refused)
        assert "bob'" not in text(refused).replace("'bobs'", "")  # the owner is not named
    assert "Did you mean s1? Call list_sessions" in text(out["typo"])
    everything = [text(r) for r in [*out["guards"], out["string_id"], *out["others"], out["typo"]]]
    for said in everything:
        assert "pydantic" not in said and "memcli " not in said and "--" not in said, said
    assert not is_error(out["empty"]) and "No facts" in text(out["empty"])
    store = SQLiteStore(db)
    assert [m.content for m in store.get_messages("bobs")] == ["Bob's secret plan"]
    assert out["own"]["session"] == "bobs" and out["own"]["stored"] == 1
    assert [m["content"] for m in out["own_read"]["messages"]] == [CHAT[0]["content"]]
    assert (out["own_read"]["session"], out["own_read"]["user"]) == ("bobs", "ana")


def test_sessions_paging_time_bounds_and_restore(tmp_path: Path) -> None:
    db = tmp_path / "mcp.db"
    old = [{**m, "timestamp": f"2020-01-0{i + 1}T10:00:00Z"} for i, m in enumerate(CHAT)]

    async def script(s: ClientSession) -> dict[str, Any]:
        out: dict[str, Any] = {}
        await s.call_tool("put_messages", {"messages": old, "session": "s1"})
        out["page1"] = data(await s.call_tool("read_session", {"session": "s1", "limit": 3}))
        out["page2"] = data(
            await s.call_tool("read_session", {"session": "s1", "offset": 3, "limit": 3})
        )
        search = {"query": "Lisbon OR Biscuit", "mode": "lexical", "k": 1}
        out["first"] = data(await s.call_tool("search_memory", search))
        out["second"] = data(await s.call_tool("search_memory", {**search, "offset": 1}))
        out["until"] = data(
            await s.call_tool("search_memory", {**search, "k": 5, "until": "2020-01-02"})
        )
        out["since"] = data(
            await s.call_tool("search_memory", {**search, "k": 5, "since": "2020-01-03"})
        )
        first = data(await s.call_tool("add_fact", {"text": "Ana lives in Bern"}))["fact"]
        await s.call_tool("update_fact", {"fact_id": first["id"], "text": "Ana lives in Zurich"})
        out["facts_page"] = data(await s.call_tool("list_facts", {"limit": 1, "offset": 0}))
        await s.call_tool("add_fact", {"text": "Ana has a dog"})
        out["facts_page2"] = data(await s.call_tool("list_facts", {"limit": 1, "offset": 1}))
        await s.call_tool("delete_fact", {"fact_id": first["id"]})
        out["restored"] = data(await s.call_tool("restore_fact", {"fact_id": first["id"]}))
        out["after"] = data(await s.call_tool("list_facts", {}))
        out["future"] = await s.call_tool("list_facts", {"since": "2999-01-01"})
        return out

    out = drive(db, script, "--user", "ana")
    assert [m["content"] for m in out["page1"]["messages"]] == [m["content"] for m in CHAT[:3]]
    assert out["page1"]["next_offset"] == 3
    assert [m["content"] for m in out["page2"]["messages"]] == [CHAT[3]["content"]]
    assert out["page2"]["next_offset"] is None
    assert len(out["first"]) == len(out["second"]) == 1
    assert out["first"][0]["text"] != out["second"][0]["text"]
    assert len(out["until"]) == 1 and CHAT[0]["content"] in out["until"][0]["text"]
    assert len(out["since"]) == 1 and CHAT[2]["content"] in out["since"][0]["text"]
    assert [f["text"] for f in out["facts_page"]] == ["Ana lives in Zurich"]
    assert [f["text"] for f in out["facts_page2"]] == ["Ana has a dog"]
    assert out["restored"]["fact"]["state"] == "current"
    assert sorted(f["text"] for f in out["after"]) == ["Ana has a dog", "Ana lives in Zurich"]
    assert "No facts" in text(out["future"])


def test_deep_odd_and_huge_requests_get_error_replies(tmp_path: Path) -> None:
    """Bounds before parsing: a line nested 10,000 deep, a request whose id is an object and a
    line over the size cap each get an error reply with id null; the server goes on."""
    from memcli.cli.mcp_http import MAX_REQUEST_BYTES

    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"},
        },
    }
    deep = '{"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": ' + "[" * 10_000
    lines = [
        json.dumps(init),
        json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        deep + "]" * 10_000 + "}",
        json.dumps({"jsonrpc": "2.0", "id": {"a": 1}, "method": "tools/list"}),
        '{"jsonrpc": "2.0", "id": 5, "pad": "' + "x" * MAX_REQUEST_BYTES + '"}',
        json.dumps({"jsonrpc": "2.0", "id": 4, "method": "tools/list"}),
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "memcli", "--db", str(tmp_path / "raw.db"), "mcp"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(("\n".join(lines) + "\n").encode())
    proc.stdin.flush()
    replies = []
    while len(replies) < 5:
        line = proc.stdout.readline()
        assert line, (replies, proc.stderr.read() if proc.poll() is not None else "")
        replies.append(json.loads(line))
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0
    assert [r["id"] for r in replies] == [1, None, None, None, 4]
    assert "nested more than" in replies[1]["error"]["message"]
    assert replies[2]["error"]["code"] == -32600
    assert "bytes" in replies[3]["error"]["message"]
    assert replies[4]["result"]["tools"]


def test_the_request_check_reads_an_unclosed_string_once() -> None:
    """A string that never closes, full of escaped quotes, is read once (the pattern that
    started again at each quote took minutes for a megabyte); brackets inside strings, escaped
    quotes included, are not counted."""
    import threading

    from memcli.cli.mcp_http import MAX_REQUEST_DEPTH, request_problem

    answers: list[object] = []
    body = '{"jsonrpc": "2.0", "id": 1, "x": "' + '\\"' * 500_000
    worker = threading.Thread(target=lambda: answers.append(request_problem(body)), daemon=True)
    worker.start()
    worker.join(120)
    assert answers == [None]  # not JSON: the SDK's parse error answers it
    inside = '{"id": 1, "a": "[[[\\"{{{", "b": ["\\\\"]}'
    assert request_problem(inside) is None
    deep = (
        '{"id": 1, "a": "\\"", "b": '
        + "[" * (MAX_REQUEST_DEPTH + 1)
        + "]" * (MAX_REQUEST_DEPTH + 1)
        + "}"
    )
    assert request_problem(deep) is not None and "nested" in request_problem(deep)[1]


def test_put_messages_takes_what_memcli_reads_in_a_message(tmp_path: Path) -> None:
    """Tool calls with null content, content as text parts, Unix-time timestamps: the tool's
    schema takes what `Message.from_dict` reads (it refused them before memcli could)."""
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Weather in Bern?"}],
            "timestamp": 1717243200,
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Bern"}'},
                }
            ],
            "timestamp": 1717243201.5,
        },
        {"role": "tool", "tool_call_id": "c1", "content": "12 C, rain"},
        {
            "role": "assistant",
            "content": "12 degrees and rain.",
            "timestamp": "2024-06-01T12:00:03Z",
        },
    ]

    async def script(s: ClientSession) -> dict[str, Any]:
        put = data(await s.call_tool("put_messages", {"messages": messages, "session": "w"}))
        return {"put": put, "context": data(await s.call_tool("get_context", {"session": "w"}))}

    out = drive(tmp_path / "mcp.db", script, "--user", "ana")
    assert out["put"]["stored"] == 4
    context = out["context"]
    assert [(m["role"], m["content"]) for m in context] == [
        ("user", "Weather in Bern?"),
        ("assistant", ""),
        ("tool", "12 C, rain"),
        ("assistant", "12 degrees and rain."),
    ]
    assert context[1]["metadata"]["extra"]["tool_calls"][0]["function"]["name"] == "weather"
    assert context[0]["timestamp"].startswith("2024-06-01T12:00:00")


def test_sessions_give_their_title_and_the_conversations_time_span(tmp_path: Path) -> None:
    """list_sessions, read_session and the sessions resources give each session's title and
    its conversation's own time span (its first and last message's time: the timestamps given,
    else when the messages were stored), beside the session's own created_at/updated_at."""
    db = tmp_path / "mcp.db"
    store = SQLiteStore(db)
    dated = [
        Message("user", "We moved to Lisbon.", timestamp=datetime(2021, 3, 1, 9, tzinfo=UTC)),
        Message("assistant", "How is it?", timestamp=datetime(2021, 3, 1, 9, 0, 5, tzinfo=UTC)),
        Message("user", "Lovely.", timestamp=datetime(2021, 4, 2, 18, 30, tzinfo=UTC)),
    ]
    Memory(store, "moving", user_id="ana").put_messages(dated)
    store.describe_session("moving", title="Moving to Lisbon")
    Memory(store, "empty", user_id="ana")  # a session without messages
    store.close()

    async def script(s: ClientSession) -> dict[str, Any]:
        await s.call_tool("put_messages", {"messages": CHAT[:2], "session": "now"})
        return {
            "listed": data(await s.call_tool("list_sessions", {})),
            "read": data(await s.call_tool("read_session", {"session": "moving", "limit": 1})),
            "resource": resource_json(await s.read_resource("memcli://sessions")),
            "one": resource_json(await s.read_resource("memcli://sessions/moving")),
        }

    out = drive(db, script, "--user", "ana")
    spans = {
        r["session"]: (r["title"], r["first_message_at"], r["last_message_at"])
        for r in out["listed"]
    }
    assert spans["moving"] == ("Moving to Lisbon", "2021-03-01T09:00:00Z", "2021-04-02T18:30:00Z")
    assert spans["empty"] == (None, None, None)
    title, first, last = spans["now"]  # no timestamps given: when they were stored
    now = next(r for r in out["listed"] if r["session"] == "now")
    assert title is None and first == last == now["updated_at"]
    moving = next(r for r in out["listed"] if r["session"] == "moving")
    assert moving["updated_at"] >= moving["created_at"] > moving["last_message_at"]
    read = out["read"]
    assert (read["title"], read["first_message_at"], read["last_message_at"]) == spans["moving"]
    assert len(read["messages"]) == 1 and read["next_offset"] == 1
    assert out["resource"] == out["listed"]
    assert {k: v for k, v in out["one"].items() if k != "messages"} == moving

"""`memcli mcp --http`: a real server in a subprocess, driven by the MCP SDK's streamable HTTP
client; the bearer token decides the user, and a request without a stored token gets 401."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import no_blocks  # noqa: F401 (a fixture)

pytest.importorskip("mcp")
pytest.importorskip("uvicorn")

import httpx2  # noqa: E402
from mcp import ClientSession  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_blocks")

CHAT = [
    {"role": "user", "content": "My dog is called Biscuit."},
    {"role": "assistant", "content": "What a nice name."},
]


def memcli(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memcli", "--db", str(db), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A running `memcli mcp --http` on a free port: (its /mcp URL, its database)."""
    db = tmp_path / "http.db"
    assert memcli(db, "mcp", "token", "list").returncode == 1  # no database yet: nothing made
    yield from serve(db)


def serve(db: Path, *options: str, stop_wait: float = 30) -> Iterator[tuple[str, Path]]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "memcli", *options, "--db", str(db), "mcp", "--http"]
        + ["--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(os.environ),
    )
    try:
        while True:  # until it listens (or the test's timeout)
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                anyio.run(anyio.sleep, 0.1)
        yield f"http://127.0.0.1:{port}/mcp", db
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=stop_wait)
        except subprocess.TimeoutExpired:  # (a tool call still waits for its LLM)
            proc.kill()
            proc.wait(timeout=30)


async def as_user(url: str, token: str, script: Any) -> Any:
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        return await script(session)


def result(call: Any) -> Any:
    assert not call.is_error, call.content
    structured = call.structured_content
    return structured.get("result", structured)


def test_tokens_decide_the_user_and_no_token_is_401(server: tuple[str, Path]) -> None:
    url, db = server
    made = {}
    for user in ("ana", "bo"):
        done = memcli(db, "mcp", "token", "add", "--user", user)
        assert done.returncode == 0, done.stderr
        made[user] = done.stdout.strip()
        assert made[user].startswith("memcli_")
    listed = memcli(db, "mcp", "token", "list", "--json")
    t = "token"  # a typed record, as every command's
    records = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [(r["type"], r["id"], r["user"]) for r in records] == [(t, 1, "ana"), (t, 2, "bo")]
    assert made["ana"] not in listed.stdout and made["ana"] not in db.read_bytes().decode("latin-1")

    async def ana(s: ClientSession) -> dict[str, Any]:
        put = result(await s.call_tool("put_messages", {"messages": CHAT, "session": "a1"}))
        fact = result(await s.call_tool("add_fact", {"text": "Ana has a dog called Biscuit"}))
        return {
            "put": put,
            "fact": fact,
            "sessions": result(await s.call_tool("list_sessions", {})),
        }

    async def bo(s: ClientSession) -> dict[str, Any]:
        return {
            "sessions": await s.call_tool("list_sessions", {}),
            "facts": await s.call_tool("list_facts", {}),
            "search": await s.call_tool("search_memory", {"query": "Biscuit", "mode": "lexical"}),
            "read": await s.call_tool("read_session", {"session": "a1"}),
        }

    out_ana = anyio.run(as_user, url, made["ana"], ana)
    out_bo = anyio.run(as_user, url, made["bo"], bo)
    assert out_ana["put"]["session"] == "a1" and out_ana["fact"]["added"] is True
    assert [s["session"] for s in out_ana["sessions"]] == ["a1"]
    assert result(out_bo["sessions"]) == [] and result(out_bo["facts"]) == []
    assert result(out_bo["search"]) == []
    assert out_bo["read"].is_error
    assert "no session 'a1' of user 'bo'" in out_bo["read"].content[0].text

    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    with httpx2.Client(timeout=30) as http:
        none = http.post(url, json=body)
        wrong = http.post(url, json=body, headers={"Authorization": "Bearer memcli_nope"})
        deep = http.post(
            url,
            content='{"jsonrpc": "2.0", "id": 1, "method": "x", "params": ' + "[" * 5000,
            headers={"Authorization": f"Bearer {made['ana']}"},
        )
    assert none.status_code == 401 and wrong.status_code == 401
    assert "Bearer" in none.headers["www-authenticate"]
    assert deep.status_code == 400 and deep.json()["id"] is None

    assert memcli(db, "mcp", "token", "rm", "2").returncode == 0
    assert memcli(db, "mcp", "token", "rm", "2").returncode == 1
    with httpx2.Client(timeout=30) as http:
        gone = http.post(url, json=body, headers={"Authorization": f"Bearer {made['bo']}"})
    assert gone.status_code == 401


def test_token_list_on_a_terminal_shows_times_as_the_other_tables(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    assert memcli(db, "mcp", "token", "add", "--user", "ana").returncode == 0
    code = (
        "import sys; sys.stdout.isatty = lambda: True;"
        f" sys.argv = ['memcli', '--db', {str(db)!r}, 'mcp', 'token', 'list'];"
        "from memcli.cli.app import main; main()"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    header, row = (line for line in proc.stdout.splitlines() if "user" in line or "ana" in line)
    assert "created" in header and "created_at" not in header
    assert "ana" in row and "T" not in row.split("ana")[1] and "Z" not in row  # local, no ISO


def test_signing_in_does_not_wait_for_another_users_tool_call(tmp_path: Path, llm: Any) -> None:
    """A tool call waiting for a slow LLM (remember) keeps no other request waiting: tokens
    are read on a connection of their own, and remember asks the model on its own too."""
    db = tmp_path / "http.db"
    config = tmp_path / "config.toml"
    config.write_text(
        f'[llm]\nmodel = "openai/test"\napi_base = "{llm.api_base}"\ntimeout = 600\n\n'
        '[[blocks]]\nkind = "facts"\n'
    )
    token = memcli(db, "mcp", "token", "add", "--user", "ana").stdout.strip()
    bos = memcli(db, "mcp", "token", "add", "--user", "bo").stdout.strip()
    llm.default = {"delay": 300, "content": "<facts><fact>Ana rows</fact></facts>"}
    servers = serve(db, "--config", str(config), stop_wait=1)  # (remember waits 5 minutes)
    url, _ = next(servers)
    try:
        remembered: list[Any] = []

        async def slow(s: ClientSession) -> Any:
            remembered.append(await s.call_tool("remember", {"text": "I row on Sundays."}))

        async def listed(s: ClientSession) -> Any:
            return result(await s.call_tool("list_sessions", {}))

        async def both() -> tuple[int, Any, bool]:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(as_user, url, token, slow)
                while not llm.requests:  # the remember call holds the store now
                    await anyio.sleep(0.05)
                body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
                async with httpx2.AsyncClient(timeout=120) as http:
                    wrong = await http.post(
                        url, json=body, headers={"Authorization": "Bearer memcli_nope"}
                    )
                sessions = await as_user(url, bos, listed)  # another user's call goes on
                still = not remembered  # (its model has not answered: 5 minutes)
                tasks.cancel_scope.cancel()
            return wrong.status_code, sessions, still

        status, sessions, still_waiting = anyio.run(both)
        assert status == 401 and sessions == [] and still_waiting
    finally:
        servers.close()


def test_the_first_request_after_a_postgresql_restart_is_answered(pg_url: str) -> None:
    """Every connection of the server closed (as a PostgreSQL restart does): the next request
    is answered as usual (the token is read again on a new connection), never a bare 500."""
    import psycopg

    made = memcli(pg_url, "mcp", "token", "add", "--user", "ana")  # type: ignore[arg-type]
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    for url, _ in serve(pg_url):  # type: ignore[arg-type]

        async def sessions(s: ClientSession) -> Any:
            return result(await s.call_tool("list_sessions", {}))

        assert anyio.run(as_user, url, token, sessions) == []
        database = pg_url.rsplit("/", 1)[1].split("?")[0]
        with psycopg.connect(pg_url, autocommit=True) as admin:
            cut = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (database,),
            ).fetchall()
        assert cut, "the server held no connection"
        reply = httpx2.post(
            url,
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"},
            json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
            timeout=60,
        )
        assert reply.status_code < 500, reply.text
        assert anyio.run(as_user, url, token, sessions) == []


def test_the_docs_client_lists_sessions_with_titles_and_time_spans(
    server: tuple[str, Path],
) -> None:
    """docs/mcp.md's client, run as written but for its URL and token: over HTTP, list_sessions
    gives each session's title and its conversation's first and last message time."""
    from datetime import UTC, datetime

    from memcli import Memory, Message
    from memcli.store.sqlite import SQLiteStore

    url, db = server
    token = memcli(db, "mcp", "token", "add", "--user", "ana").stdout.strip()
    store = SQLiteStore(db)
    dated = [
        Message("user", "We moved to Lisbon.", timestamp=datetime(2021, 3, 1, 9, tzinfo=UTC)),
        Message("assistant", "Lovely.", timestamp=datetime(2021, 4, 2, 18, 30, tzinfo=UTC)),
    ]
    Memory(store, "moving", user_id="ana").put_messages(dated)
    store.describe_session("moving", title="Moving to Lisbon")
    store.close()

    doc = (Path(__file__).resolve().parents[1] / "docs" / "mcp.md").read_text()
    (example,) = re.findall(r"^```python\n(.*?)^```$", doc, re.M | re.S)
    assert 'TOKEN = "memcli_..."' in example and "http://127.0.0.1:8765/mcp" in example
    assert "read=600" in example  # minutes for a local model, not httpx's 5 s
    script = example.replace('"memcli_..."', repr(token)).replace("http://127.0.0.1:8765/mcp", url)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "moving Moving to Lisbon 2021-03-01T09:00:00Z 2021-04-02T18:30:00Z"
    ]

    async def read(s: ClientSession) -> Any:
        return result(await s.call_tool("read_session", {"session": "moving"}))

    page = anyio.run(as_user, url, token, read)
    assert (page["title"], page["first_message_at"], page["last_message_at"]) == (
        "Moving to Lisbon",
        "2021-03-01T09:00:00Z",
        "2021-04-02T18:30:00Z",
    )

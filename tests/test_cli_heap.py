"""The long-running commands give their C heap's free pages back to the system after each call
(`memcli.cli.common.trim_heap`: glibc's malloc_trim); the library never does it to its host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from helpers import no_blocks  # noqa: F401 (a fixture)

from memcli.cli import common
from memcli.cli.mcp import build_server, user_tools
from memcli.config import load_settings

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.usefixtures("no_blocks")
def test_the_mcp_server_trims_the_heap_after_each_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trims: list[int] = []
    monkeypatch.setattr(common, "trim_heap", lambda: trims.append(1))
    s = load_settings(os.environ, {"db": str(tmp_path / "m.db")}, None)
    store = common.open_store(s)
    server = build_server(user_tools(s, store, s.user))

    async def calls() -> None:
        await server.call_tool(
            "put_messages", {"messages": [{"role": "user", "content": "hi"}], "session": "a"}
        )
        assert len(trims) == 1
        await server.call_tool("list_sessions", {})
        assert len(trims) == 2
        with pytest.raises(Exception, match="no session"):  # refused: trimmed all the same
            await server.call_tool("read_session", {"session": "nope"})
        assert len(trims) == 3

    try:
        anyio.run(calls)
    finally:
        store.close()


def test_trim_heap_runs_here() -> None:
    common.trim_heap()  # (glibc here: malloc_trim; elsewhere nothing)


APP = r"""
import ctypes, json, sys
asked = []
real = ctypes.CDLL


class Recording(real):
    def __getattr__(self, name):
        asked.append(name)
        return super().__getattr__(name)


ctypes.CDLL = Recording
import memcli
from memcli import Memory, Message

with Memory.from_defaults(session_id="s", user_id="ana", db=sys.argv[1], memory_blocks=[]) as m:
    for i in range(30):
        m.put(Message("user", f"message {i} about bees"))
    m.get("bees?")
    hits = m.search("bees", k=2, mode="lexical").hits
print(json.dumps({"asked": asked, "cli": sorted(n for n in sys.modules if n.startswith("memcli.cli")), "hits": len(hits)}))
"""


def test_the_library_never_trims_its_hosts_heap(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", APP, str(tmp_path / "m.db")],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["hits"] == 2
    assert "malloc_trim" not in seen["asked"] and seen["cli"] == []


@pytest.mark.usefixtures("no_blocks")
def test_the_plain_chat_trims_the_heap_after_each_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from memcli.cli import output
    from memcli.cli.app import app

    trims: list[int] = []
    monkeypatch.setattr(common, "trim_heap", lambda: trims.append(1))
    args = ["--db", str(tmp_path / "m.db"), "chat", "--plain", "--session", "s"]
    for console in (output.out, output.err):  # (consoles made here are the runner's)
        console.cache_clear()
    try:
        done = CliRunner().invoke(app, args, input="hello\nhow are you?\n")
    finally:
        for console in (output.out, output.err):
            console.cache_clear()
    assert done.exit_code == 0, done.output
    assert len(trims) == 2


def test_the_full_screen_chats_worker_trims_the_heap_after_each_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from memcli.cli.chat import ui

    trims: list[int] = []
    monkeypatch.setattr(ui, "trim_heap", lambda: trims.append(1))
    worker = ui.Worker(on_error=lambda _: None)
    worker.start()
    worker.submit(lambda: None)
    worker.submit(lambda: 1 / 0)  # (a failed job: trimmed all the same)
    worker.submit(None)  # type: ignore[arg-type]  # (the end)
    worker.thread.join(600)
    assert len(trims) == 2

"""One retriever (one loaded index) per store in a process: the MCP server's sessions and its
search share it (`memcli.search.retriever.Retrievers`, `memcli.cli.common.retrievers`)."""

from __future__ import annotations

import os
from pathlib import Path

from memcli import Memory
from memcli.blocks.vector import VectorBlock
from memcli.cli import common
from memcli.cli.mcp import user_tools
from memcli.config import load_settings
from memcli.search.retriever import Retrievers
from memcli.search.types import SearchOptions
from memcli.store.sqlite import SQLiteStore


class Named:
    """An embedder that is never asked to embed here: only its name counts."""

    def __init__(self, name: str) -> None:
        self.name = name


def test_retrievers_are_one_per_store_embedder_options_and_folder(tmp_path: Path) -> None:
    retrievers = Retrievers()
    one, two = SQLiteStore(tmp_path / "a.db"), SQLiteStore(tmp_path / "a.db")
    model = Named("m")
    first = retrievers.get(one, model, None, tmp_path)
    assert retrievers.get(one, Named("m"), SearchOptions(), tmp_path) is first
    assert retrievers.get(two, model, None, tmp_path) is not first  # another connection
    assert retrievers.get(one, Named("other"), None, tmp_path) is not first
    assert retrievers.get(one, model, SearchOptions(rrf_k=60), tmp_path) is not first
    assert retrievers.get(one, model, None, tmp_path / "x") is not first
    one.close()
    again = SQLiteStore(tmp_path / "a.db")
    assert retrievers.get(again, model, None, tmp_path).store is again
    for store in (two, again):
        store.close()


def test_an_mcp_servers_sessions_and_search_share_one_retriever(tmp_path: Path) -> None:
    """Each session's vector block searched through a retriever of its own, each loading the
    store's index: a server held a copy per session it served (and one for its search)."""
    db = tmp_path / "m.db"
    s = load_settings(os.environ, {"db": str(db)}, None)
    store = common.open_store(s)
    for session in ("a", "b"):
        with Memory(store, session, user_id=s.user, memory_blocks=[]) as memory:
            memory.put_messages([{"role": "user", "content": f"hello from {session}"}])
    tools = user_tools(s, store, s.user)
    blocks = [
        next(b for b in tools.blocks(session) if isinstance(b, VectorBlock))
        for session in ("a", "b")
    ]
    assert blocks[0] is not blocks[1]  # each session its own blocks,
    shared = blocks[0].retriever(store)
    assert blocks[1].retriever(store) is shared  # one retriever for them,
    assert common.retriever(s, store) is shared  # and for the search tool
    other = common.open_store(s)  # (the background thread's own connection: its own)
    try:
        assert blocks[0].retriever(other) is blocks[1].retriever(other) is not shared
    finally:
        other.close()
        store.close()

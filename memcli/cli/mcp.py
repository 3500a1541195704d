"""`memcli mcp`: memcli's memory served over MCP's stdio transport (the official `mcp` SDK).

The tools and resources are `memcli.agent_tools.AgentTools`; this module only registers them.
stdout carries the protocol alone: memcli's notes and the SDK's log go to stderr.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any, cast

import typer

from memcli.cli import common

if TYPE_CHECKING:
    from memcli.agent_tools import AgentTools
    from memcli.store.sqlite import SQLiteStore

INSTRUCTIONS = (
    "memcli keeps the memory of LLM conversations: sessions of messages (a short-term window that "
    "flushes to long-term memory), facts about the user, and a search over everything stored. "
    "Put a conversation's messages with put_messages; get_context returns what to send the model."
)


def mcp_command(ctx: typer.Context, user: common.User = None) -> None:
    """Serve memcli's memory to an MCP client over stdio: tools to search memory, list, add,
    update and delete facts, read a session's context and put messages; the sessions as
    resources (memcli://sessions, memcli://sessions/ID). Runs until the client closes stdin.

    Client configuration: {"mcpServers": {"memcli": {"command": "memcli", "args": ["mcp"]}}}
    """
    from memcli.agent_tools import AgentTools

    s = common.settings(ctx, user=user)
    store = common.open_store(s)
    built: dict[str | None, list[Any]] = {}

    def blocks(session: str | None) -> list[Any]:
        # Built once per session: a block's model loads on first use, and stays loaded.
        if session not in built:
            built[session] = common.make_blocks(s, store, session=session)
        return built[session]

    # (AgentTools runs SQL on any store; its annotation still names SQLiteStore.)
    tools = AgentTools(
        cast("SQLiteStore", store), s, s.user, blocks=blocks, retriever=lambda: _retriever(s, store)
    )
    try:
        build_server(tools).run("stdio")
    finally:
        if sys.stdout.closed:  # mcp 1's stdio transport closes stdout as it ends
            sys.stdout = open(os.devnull, "w")  # for the flush on the way out


def _retriever(s: Any, store: Any) -> Any:
    from memcli.ranking import SearchOptions
    from memcli.retrieval import Retriever

    return Retriever(store, common.embedder(s), SearchOptions.from_settings(s))


def build_server(tools: AgentTools) -> Any:
    """The MCP server (MCPServer in mcp 2, FastMCP in mcp 1) with memcli's tools and resources."""
    from memcli.errors import MemcliError

    try:
        from mcp.server.mcpserver import MCPServer as Server
        from mcp.server.mcpserver.exceptions import ResourceError, ToolError
    except ImportError:  # mcp 1.x
        from mcp.server.fastmcp import FastMCP as Server  # type: ignore[no-redef,attr-defined]
        from mcp.server.fastmcp.exceptions import (  # type: ignore[no-redef]
            ResourceError,
            ToolError,
        )

    from inspect import signature

    from memcli import __version__

    options: dict[str, Any] = {"instructions": INSTRUCTIONS, "log_level": "WARNING"}
    if "version" in signature(Server).parameters:  # mcp 2 says which version serves
        options["version"] = __version__
    server = Server("memcli", **options)

    def tool_call(call: Any) -> Any:
        try:
            return call()
        except MemcliError as error:  # the message and the hint, for the model to act on
            raise ToolError(str(error)) from None

    @server.tool()
    def search_memory(
        query: str, k: int = 5, session: str | None = None, mode: str = "hybrid"
    ) -> list[dict[str, Any]]:
        """Search the user's stored messages (or one session's) by words and meaning, best
        first. mode: hybrid (words and meaning), lexical (words only) or vector (meaning only)."""
        return tool_call(lambda: tools.search(query, k=k, session=session, mode=mode))  # type: ignore[no-any-return]

    @server.tool()
    def list_facts(block: str | None = None, topic: str | None = None) -> list[dict[str, Any]]:
        """The facts long-term memory holds about the user, oldest first (with their ids and
        topics); with `topic`, only the facts of that topic."""
        return tool_call(lambda: tools.list_facts(block, topic))  # type: ignore[no-any-return]

    @server.tool()
    def add_fact(
        text: str, block: str | None = None, topics: list[str] | None = None
    ) -> dict[str, Any]:
        """Remember a fact about the user, with its topics (a duplicate is not added twice)."""
        return tool_call(lambda: tools.add_fact(text, block, topics))  # type: ignore[no-any-return]

    @server.tool()
    def update_fact(fact_id: int, text: str) -> dict[str, Any]:
        """Change the text of one of the user's facts (the old text stays in its history)."""
        return tool_call(lambda: tools.update_fact(fact_id, text))  # type: ignore[no-any-return]

    @server.tool()
    def delete_fact(fact_id: int) -> dict[str, Any]:
        """Forget one of the user's facts (kept in the fact history as deleted)."""
        return tool_call(lambda: tools.delete_fact(fact_id))  # type: ignore[no-any-return]

    @server.tool()
    def get_context(session: str, input: str | None = None) -> list[dict[str, Any]]:
        """The messages to send the model for a session: its short-term window with long-term
        memory inserted (for `input`, the next user message, if given). Nothing is stored."""
        return tool_call(lambda: tools.context(session, input))  # type: ignore[no-any-return]

    @server.tool()
    def put_messages(messages: list[dict[str, Any]], session: str | None = None) -> dict[str, Any]:
        """Store messages ({"role": "user"|"assistant"|"system"|"tool", "content": "..."},
        optional name, metadata, timestamp) in a session (none given: a new one); the window
        flushes to long-term memory when over budget. A bad message stores nothing."""
        return tool_call(lambda: tools.put_messages(messages, session))  # type: ignore[no-any-return]

    def resource_read(call: Any) -> str:
        try:
            return json.dumps(call(), ensure_ascii=False)
        except MemcliError as error:
            raise ResourceError(str(error)) from None

    @server.resource("memcli://sessions", name="sessions", mime_type="application/json")
    def sessions() -> str:
        """The user's sessions with their counts and budgets."""
        return resource_read(tools.sessions)

    @server.resource("memcli://sessions/{session_id}", name="session", mime_type="application/json")
    def session(session_id: str) -> str:
        """One session: its info and its active messages."""
        return resource_read(lambda: tools.session(session_id))

    return server

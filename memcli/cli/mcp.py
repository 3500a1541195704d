"""`memcli mcp`: memcli's memory served over MCP's stdio transport (the official `mcp` SDK).

The tools and resources are `memcli.tools.AgentTools`; this module only registers them.
stdout carries the protocol alone: memcli's notes and the SDK's log go to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

import typer

from memcli.cli import common

if TYPE_CHECKING:
    from memcli.tools import AgentTools

INSTRUCTIONS = (
    "memcli keeps the memory of LLM conversations: sessions of messages (a short-term window that "
    "flushes to long-term memory), facts about the user, and a search over everything stored. "
    "Put a conversation's messages with put_messages; get_context returns what to send the model."
)


def mcp_command(ctx: typer.Context, user: common.User = None) -> None:
    """Serve memcli's memory to an MCP client over stdio: tools to search memory, list, search,
    get, add, update and delete facts (one or all), see a fact's history and the entities, read
    a session's context, put messages, and forget the user for good (forget_user, which needs
    confirm=true); the sessions as
    resources (memcli://sessions, memcli://sessions/ID). Runs until the client closes stdin.

        Client configuration: {"mcpServers": {"memcli": {"command": "memcli", "args": ["mcp"]}}}
    """
    from memcli.blocks.background import Background
    from memcli.tools import AgentTools

    s = common.settings(ctx, user=user)
    store = common.open_store(s)
    built: dict[str | None, list[Any]] = {}

    def blocks(session: str | None) -> list[Any]:
        # Built once per session: a block's model loads on first use, and stays loaded.
        if session not in built:
            built[session] = common.make_blocks(s, store, session=session)
        return built[session]

    # put_messages hands flushed batches to a thread with its own connection: a call never
    # waits for fact extraction or embedding; what a closing client leaves stays for a backfill.
    background = Background(store, reopen=lambda: common.open_store(s))
    tools = AgentTools(
        store,
        s,
        s.user,
        blocks=blocks,
        retriever=lambda: common.retriever(s, store),
        origin="mcp",
        background=background,
    )
    # The embedding model is loaded (exported once: seconds) while the client starts, not at its
    # first search; `initialize` is answered meanwhile.
    threading.Thread(target=_prepare, args=(tools,), name="memcli-prepare", daemon=True).start()
    try:
        import anyio

        anyio.run(serve_stdio, build_server(tools))
    finally:
        background.close()
        if sys.stdout.closed:  # mcp 1's stdio transport closes stdout as it ends
            sys.stdout = open(os.devnull, "w")  # for the flush on the way out


def _prepare(tools: AgentTools) -> None:
    """Load the search's model ahead of the first search; a failure is the search's to say."""
    from memcli.errors import MemcliError

    try:
        tools.prepare()
    except MemcliError:
        pass


async def serve_stdio(server: Any) -> None:
    """Run the server over stdio as the SDK's `run("stdio")` does, but answer a line the SDK
    cannot read (invalid JSON, text that is not Unicode: a lone surrogate such as `\\ud800`)
    with a JSON-RPC error, where the SDK would drop it and leave the client waiting."""
    from mcp.server.stdio import stdio_server

    low = getattr(server, "_lowlevel_server", None) or server._mcp_server  # mcp 2, mcp 1
    async with stdio_server() as (read_stream, write_stream):
        replying = _Replying(read_stream, write_stream)
        await low.run(replying, write_stream, low.create_initialization_options())


class _Replying:
    """The transport's read stream, with each line it could not read answered (`parse_error`)
    instead of handed on; everything else as the stream it wraps."""

    def __init__(self, inner: Any, write_stream: Any) -> None:
        self._inner = inner
        self._write = write_stream

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __aiter__(self) -> _Replying:
        return self

    async def __anext__(self) -> Any:
        while True:
            item = await self._inner.__anext__()
            if not isinstance(item, Exception):
                return item
            reply = parse_error(item)
            if reply is not None:
                await self._write.send(reply)

    async def receive(self) -> Any:
        return await self.__anext__()

    async def __aenter__(self) -> _Replying:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._inner.__aexit__(*exc)


#: JSON-RPC's code for a request that could not be parsed.
PARSE_ERROR = -32700


def parse_error(error: Exception) -> Any:
    """The JSON-RPC error reply (a SessionMessage) to a line the SDK could not read: with the
    request's id when Python's JSON parser finds one (it reads lone surrogates), else id null;
    None for a notification (no id: JSON-RPC answers none)."""
    from mcp.shared.message import SessionMessage

    line = None
    errors = getattr(error, "errors", None)
    if callable(errors):
        found = errors()
        line = found[0].get("input") if found else None
    request: Any = None
    if isinstance(line, str | bytes):
        try:
            request = json.loads(line)
        except ValueError:
            request = None
    if isinstance(request, dict) and "method" in request and "id" not in request:
        return None
    ident = request.get("id") if isinstance(request, dict) else None
    if not isinstance(ident, int | str) or isinstance(ident, bool):
        ident = None
    text = str(line or "")
    bad_text = any(0xD800 <= ord(c) <= 0xDFFF for c in text) or "\\ud" in text.lower()
    message = (
        "Parse error: the request holds text that is not valid Unicode (a lone surrogate such"
        " as \\ud800); send UTF-8 text"
        if bad_text
        else "Parse error: the request is not a valid JSON-RPC message"
    )
    data = {"jsonrpc": "2.0", "id": ident, "error": {"code": PARSE_ERROR, "message": message}}
    try:
        import mcp_types

        reply = mcp_types.jsonrpc_message_adapter.validate_python(data)
    except ImportError:  # mcp 1.x
        from mcp import types

        reply = types.JSONRPCMessage.model_validate(data)  # type: ignore[attr-defined]
    return SessionMessage(reply)


def _refusals_as(tool_error: type[Exception], function: Any) -> Any:
    """`function`, raising a MemcliError as the SDK's ToolError: the message and the hint, for
    the model to act on. It keeps the function's name and signature (`functools.wraps`), from
    which the SDK derives the tool's schema."""
    from functools import wraps

    from memcli.errors import MemcliError

    @wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except MemcliError as error:
            raise tool_error(str(error)) from None

    return call


def build_server(tools: AgentTools) -> Any:
    """The MCP server (MCPServer in mcp 2, FastMCP in mcp 1) with memcli's tools and resources
    (the tools: `memcli.tools.tool_functions`)."""
    from memcli.errors import MemcliError
    from memcli.tools import description, strict, tool_functions

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
    for function in tool_functions(tools):
        server.add_tool(_refusals_as(ToolError, function), description=description(function))
        tool: Any = server._tool_manager.get_tool(function.__name__)
        tool.fn_metadata.arg_model = strict(tool.fn_metadata.arg_model)  # unknown arguments refused
        tool.parameters = tool.fn_metadata.arg_model.model_json_schema(by_alias=True)

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

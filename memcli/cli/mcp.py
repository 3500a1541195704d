"""`memcli mcp`: memcli's memory served over MCP (the official `mcp` SDK): on stdio for one
user, or with `--http` over streamable HTTP for the users of its tokens (`memcli.cli.mcp_http`);
`memcli mcp token add/list/rm` manage those tokens.

The tools and resources are `memcli.tools.AgentTools`; this module only registers them.
stdout carries the protocol alone: memcli's notes and the SDK's log go to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from memcli.cli import common
from memcli.cli.mcp_http import (
    MAX_REQUEST_BYTES,
    PARSE_ERROR,
    request_problem,
)
from memcli.words import shell_arg

if TYPE_CHECKING:
    from memcli.config import Settings
    from memcli.tools import AgentTools

INSTRUCTIONS = (
    "memcli keeps the memory of LLM conversations: sessions of messages (a short-term window that "
    "flushes to long-term memory), facts about the user, and a search over everything stored. "
    "Put a conversation's messages with put_messages; get_context returns what to send the model."
)


app = typer.Typer(
    help="Serve memcli's memory to MCP clients (stdio, or HTTP with --http); manage the HTTP"
    " server's tokens (token add, list, rm).",
    invoke_without_command=True,
    rich_markup_mode=None,
)
token_app = typer.Typer(
    help="The HTTP server's bearer tokens: each acts as one user.", rich_markup_mode=None
)
app.add_typer(token_app, name="token")


@app.callback()
def mcp_command(
    ctx: typer.Context,
    user: common.User = None,
    model: common.Model = None,
    api_base: common.ApiBase = None,
    http: Annotated[
        bool,
        typer.Option(
            "--http",
            help="Serve MCP's streamable HTTP at /mcp instead of stdio: every request needs"
            " `Authorization: Bearer TOKEN` (see `memcli mcp token add`), whose user it acts as.",
        ),
    ] = False,
    host: Annotated[
        str, typer.Option("--host", metavar="HOST", help="With --http: the address to bind.")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", metavar="N", min=0, max=65535, help="With --http: the port.")
    ] = 8765,
) -> None:
    """Serve memcli's memory to an MCP client over stdio: tools to search memory, list and
    read sessions, list, search, get, add, update, delete and restore facts, extract facts from
    a text (remember), see a fact's history and the entities, read a session's context, put
    messages, and forget the user for good (forget_user, which needs confirm=true); the
    sessions as resources (memcli://sessions, memcli://sessions/ID). Runs until the client
    closes stdin. With --http, one server for many users, each request acting as its token's.

        Client configuration: {"mcpServers": {"memcli": {"command": "memcli", "args": ["mcp"]}}}
    """
    if ctx.invoked_subcommand is not None:
        return
    from memcli.blocks.background import Background

    s = common.settings(ctx, user=user, model=model, api_base=api_base)
    store = common.open_store(s)
    # put_messages hands flushed batches to a thread with its own connection: a call never
    # waits for fact extraction or embedding; what a closing server leaves stays for a backfill.
    background = Background(
        store, reopen=lambda: common.open_store(s), on_fed=lambda _: common.trim_heap()
    )
    try:
        if http:
            if user is not None:
                from memcli.errors import UsageError

                raise UsageError(
                    "--user does not go with --http: each request acts as its token's user",
                    "Make a token for the user: memcli mcp token add --user NAME",
                )
            serve_http(s, store, host, port, background)
            return
        tools = user_tools(s, store, s.user, background=background)
        # The embedding model is loaded (exported once: seconds) while the client starts, not
        # at its first search; `initialize` is answered meanwhile.
        threading.Thread(target=_prepare, args=(tools,), name="memcli-prepare", daemon=True).start()
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


def serve_http(s: Settings, store: Any, host: str, port: int, background: Any) -> None:
    """`--http`: serve until interrupted (uvicorn) on `host` and `port`, each request's tools
    those of its token's user (`user_tools`, made on a user's first request). The users share
    one search (one retriever and embedding model, loaded at start) and one background thread."""
    import uvicorn

    from memcli.cli import output
    from memcli.cli.mcp_http import Bearer, request_user
    from memcli.errors import MemcliError

    lock = threading.Lock()  # one store connection: one call at a time, whoever's
    made = threading.Lock()
    tools: dict[str, AgentTools] = {}

    def tools_of() -> AgentTools:
        user = request_user()
        if user is None:  # (Bearer lets no request without a user through)
            raise MemcliError("no user for this request", "Send a bearer token")
        with made:
            if user not in tools:
                tools[user] = user_tools(s, store, user, lock, background)
            return tools[user]

    app = build_server(tools_of).streamable_http_app(
        stateless_http=True, max_request_body_size=MAX_REQUEST_BYTES, host=host
    )
    warm = user_tools(s, store, s.user, lock, background)
    threading.Thread(target=_prepare, args=(warm,), name="memcli-prepare", daemon=True).start()
    output.info(f"memcli MCP server on http://{host}:{port}/mcp (Ctrl-C stops it)")
    # Tokens are read on a connection of their own: a request's sign-in never waits for a
    # tool call (one holding the shared connection through an LLM call, say).
    tokens = common.open_store(s)
    try:
        uvicorn.run(
            Bearer(app, tokens, threading.Lock()), host=host, port=port, log_level="warning"
        )
    finally:
        tokens.close()


def user_tools(
    s: Settings, store: Any, user: str, lock: Any = None, background: Any = None
) -> AgentTools:
    """The tools of one user (their blocks built once per session: a block's model loads on
    first use, and stays loaded); `lock` shared by the users of one store connection, and
    `background` by the users of one server. The search and every session's vector block, of
    every user, search through the process's one retriever over `store` (`common.retrievers`):
    its index is loaded once, not once per session served."""
    from memcli.tools import AgentTools

    built: dict[str | None, list[Any]] = {}

    def blocks(session: str | None) -> list[Any]:
        if session not in built:
            built[session] = common.make_blocks(s, store, session=session, user=user)
        return built[session]

    extra = {} if lock is None else {"_lock": lock}
    return AgentTools(
        store,
        s,
        user,
        blocks=blocks,
        retriever=lambda: common.retriever(s, store),
        origin="mcp",
        background=background,
        # (an in-memory database has no second connection to it)
        reopen=None if getattr(store, "path", "") is None else lambda: common.open_store(s),
        **extra,
    )


@token_app.command("add")
def token_add(
    ctx: typer.Context,
    user: Annotated[
        str, typer.Option("--user", metavar="NAME", help="The user the token acts as.")
    ],
) -> None:
    """Make a token for `memcli mcp --http` and print it (shown this once: only its hash is
    stored). A client sends it as `Authorization: Bearer TOKEN`."""
    from memcli.cli import output
    from memcli.messages import validate_user
    from memcli.store import tokens

    user = validate_user(user, "--user")
    s = common.settings(ctx)
    token, secret = tokens.add_token(common.open_store(s), user)
    output.write(secret + "\n")
    output.info(
        f"Token {token.id} acts as user {shell_arg(user)}; remove it with"
        f" `memcli mcp token rm {token.id}`."
    )


@token_app.command("list")
def token_list(ctx: typer.Context, json_: common.Json = False) -> None:
    """The tokens: their ids, users and times (never the tokens themselves)."""
    from memcli.cli import output
    from memcli.messages import format_time
    from memcli.store import tokens

    s = common.settings(ctx)
    found = tokens.list_tokens(common.open_store(s, must_exist=True))
    if not found:
        output.info("No tokens: make one with `memcli mcp token add --user NAME`.")
    records = [
        {"type": "token", "id": t.id, "user": t.user_id, "created_at": format_time(t.created_at)}
        for t in found
    ]  # typed, as every command's records are
    if output.wants_json(json_):
        output.emit_all(records)
    elif records:
        output.table(
            None,
            ["id", "user", "created"],
            [[t.id, t.user_id, t.created_at.astimezone()] for t in found],  # as other tables
        )


@token_app.command("rm")
def token_rm(
    ctx: typer.Context,
    token_id: Annotated[int, typer.Argument(metavar="ID", help="The token's id (token list).")],
) -> None:
    """Remove a token for good: requests with it get 401 from then on."""
    from memcli.cli import output
    from memcli.errors import MemcliError
    from memcli.store import tokens

    s = common.settings(ctx)
    removed = tokens.remove_token(common.open_store(s, must_exist=True), token_id)
    if removed is None:
        raise MemcliError(f"no token {token_id}", "Run `memcli mcp token list` to see the ids")
    output.info(f"Removed token {token_id} (user {removed.user_id!r}).")


async def serve_stdio(server: Any) -> None:
    """Run the server over stdio as the SDK's `run("stdio")` does, but with each line read
    within bounds (`_Lines`) and a line the SDK cannot read (invalid JSON, text that is not
    Unicode: a lone surrogate such as `\\ud800`) answered with a JSON-RPC error, where the SDK
    would drop it and leave the client waiting."""
    from mcp.server.stdio import stdio_server

    low = getattr(server, "_lowlevel_server", None) or server._mcp_server  # mcp 2, mcp 1
    lines = _Lines(sys.stdin.buffer)
    async with stdio_server(stdin=lines) as (read_stream, write_stream):  # type: ignore[arg-type]
        lines.reply = write_stream.send
        replying = _Replying(read_stream, write_stream)
        await low.run(replying, write_stream, low.create_initialization_options())


class _Lines:
    """stdin's lines for the SDK's stdio transport, each checked before the SDK parses it: a
    line over MAX_REQUEST_BYTES (read no further than that), nested deeper than
    MAX_REQUEST_DEPTH, or whose `id` is neither a number nor a string (JSON-RPC's error, id
    null) is answered through `reply` and not handed on."""

    def __init__(self, stdin: Any) -> None:
        self._stdin = stdin
        self.reply: Any = None

    def __aiter__(self) -> _Lines:
        return self

    async def _read(self, size: int) -> bytes:
        import anyio.to_thread

        return await anyio.to_thread.run_sync(self._stdin.readline, size)

    async def __anext__(self) -> str:
        while True:
            raw = await self._read(MAX_REQUEST_BYTES + 1)
            if not raw:
                raise StopAsyncIteration
            if len(raw) > MAX_REQUEST_BYTES:
                while raw and not raw.endswith(b"\n"):  # the rest of the line, unread
                    raw = await self._read(MAX_REQUEST_BYTES)
                problem = (PARSE_ERROR, f"the request is over {MAX_REQUEST_BYTES:,} bytes")
            else:
                line = raw.decode("utf-8", "replace")
                found = request_problem(line)
                if found is None:
                    return line
                problem = found
            if self.reply is not None:
                await self.reply(error_reply(None, *problem))


def error_reply(ident: Any, code: int, message: str) -> Any:
    """A JSON-RPC error reply, as the SDK's SessionMessage."""
    from mcp.shared.message import SessionMessage

    data = {"jsonrpc": "2.0", "id": ident, "error": {"code": code, "message": message}}
    try:
        import mcp_types

        reply = mcp_types.jsonrpc_message_adapter.validate_python(data)
    except ImportError:  # mcp 1.x
        from mcp import types

        reply = types.JSONRPCMessage.model_validate(data)  # type: ignore[attr-defined]
    return SessionMessage(reply)


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


def parse_error(error: Exception) -> Any:
    """The JSON-RPC error reply (a SessionMessage) to a line the SDK could not read: with the
    request's id when Python's JSON parser finds one (it reads lone surrogates), else id null;
    None for a notification (no id: JSON-RPC answers none)."""
    line = None
    errors = getattr(error, "errors", None)
    if callable(errors):  # the whole message: a JSON error's line, or a message model's input
        line = next(
            (
                e.get("input")
                for e in errors()
                if len(e.get("loc", ())) <= 1 or (e.get("type") == "missing" and len(e["loc"]) == 2)
            ),
            None,
        )
    request: Any = line if isinstance(line, dict | list) else None
    if isinstance(line, str | bytes) and request_problem(line) is None:
        try:
            request = json.loads(line)
        except (ValueError, RecursionError):
            request = None
    if isinstance(request, dict) and "method" in request and "id" not in request:
        return None
    ident = request.get("id") if isinstance(request, dict) else None
    if not isinstance(ident, int | str) or isinstance(ident, bool):
        ident = None
    text = line if isinstance(line, str) else ""
    bad_text = any(0xD800 <= ord(c) <= 0xDFFF for c in text) or "\\ud" in text.lower()
    message = (
        "Parse error: the request holds text that is not valid Unicode (a lone surrogate such"
        " as \\ud800); send UTF-8 text"
        if bad_text
        else "Parse error: the request is not a valid JSON-RPC message"
    )
    return error_reply(ident, PARSE_ERROR, message)


def _as_tool(tool_error: type[Exception], function: Any, meta: Any) -> Any:
    """`function` as the server calls it: its arguments checked by its strict model (`meta`:
    `memcli.tool_params.check_arguments`, as the chat's tools are) and a MemcliError raised as the
    SDK's ToolError (the message and the hint, for the model to act on); an empty result as a
    sentence saying so (`EMPTY_RESULTS`); after each call, the C heap's free pages go back to
    the system (`common.trim_heap`). It keeps the function's name and signature
    (`functools.wraps`), from which the SDK derives the tool."""
    from functools import wraps

    from mcp.types import CallToolResult, TextContent

    from memcli.errors import MemcliError, StoreError
    from memcli.tool_params import EMPTY_RESULTS, TOOL_HINTS, check_arguments

    empty = EMPTY_RESULTS.get(function.__name__, "Nothing: the result is empty.")

    reads = TOOL_HINTS[function.__name__].read_only if function.__name__ in TOOL_HINTS else False

    @wraps(function)
    def call(**arguments: Any) -> Any:
        try:
            checked = check_arguments(meta, arguments)
            try:
                result = function(**checked)
            except StoreError:
                if not reads:
                    raise
                # (a tool that only reads is asked once more: the database's server closed the
                # connection, a restart, and the store makes a new one for the next statement)
                result = function(**checked)
        except MemcliError as error:
            raise tool_error(str(error)) from None
        finally:
            common.trim_heap()  # what the call let go goes back to the system
        if result == []:
            return CallToolResult(
                content=[TextContent(type="text", text=empty)], structured_content={"result": []}
            )
        return result

    return call


def build_server(tools: AgentTools | Callable[[], AgentTools]) -> Any:
    """The MCP server (MCPServer in mcp 2, FastMCP in mcp 1) with memcli's tools and resources
    (the tools: `memcli.tool_calls.tool_functions`, over `tools`, or over the AgentTools `tools()`
    gives for each call: the HTTP server's, of the request's user)."""
    from memcli.errors import MemcliError
    from memcli.tool_calls import description, tool_functions
    from memcli.tool_params import TOOL_HINTS, strict
    from memcli.tools import AgentTools

    try:
        from mcp.server.mcpserver import MCPServer as Server
        from mcp.server.mcpserver.exceptions import ResourceError, ToolError
        from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, func_metadata
    except ImportError:  # mcp 1.x
        from mcp.server.fastmcp import FastMCP as Server  # type: ignore[no-redef,attr-defined]
        from mcp.server.fastmcp.exceptions import (  # type: ignore[no-redef]
            ResourceError,
            ToolError,
        )
        from mcp.server.fastmcp.utilities.func_metadata import (  # type: ignore[no-redef]
            ArgModelBase,
            func_metadata,
        )
    from inspect import signature

    from mcp.types import ToolAnnotations
    from pydantic import ConfigDict

    from memcli import __version__

    class Raw(ArgModelBase):  # type: ignore[misc,valid-type]
        """The arguments as sent, for `_as_tool` to check (the SDK's own check is lax)."""

        model_config = ConfigDict(extra="allow")

        def model_dump_one_level(self) -> dict[str, Any]:
            return dict(self.__pydantic_extra__ or {})

    at: Callable[[], AgentTools] = (
        (lambda: tools) if isinstance(tools, AgentTools) else tools  # type: ignore[assignment]
    )
    options: dict[str, Any] = {"instructions": INSTRUCTIONS, "log_level": "WARNING"}
    if "version" in signature(Server).parameters:  # mcp 2 says which version serves
        options["version"] = __version__
    server = Server("memcli", **options)
    for function in tool_functions(at):
        meta = func_metadata(function)
        meta.arg_model = strict(meta.arg_model)
        hints = TOOL_HINTS[function.__name__]
        annotations = ToolAnnotations(
            read_only_hint=hints.read_only,
            destructive_hint=hints.destructive,
            idempotent_hint=hints.idempotent,
            open_world_hint=hints.open_world,
        )
        server.add_tool(
            _as_tool(ToolError, function, meta),
            description=description(function),
            annotations=annotations,
        )
        tool: Any = server._tool_manager.get_tool(function.__name__)
        tool.fn_metadata.arg_model = Raw
        tool.parameters = meta.arg_model.model_json_schema(by_alias=True)

    def resource_read(call: Any) -> str:
        try:
            return json.dumps(call(), ensure_ascii=False)
        except MemcliError as error:
            raise ResourceError(str(error)) from None

    @server.resource("memcli://sessions", name="sessions", mime_type="application/json")
    def sessions() -> str:
        """The user's sessions with their counts and budgets."""
        return resource_read(lambda: at().sessions())

    @server.resource("memcli://sessions/{session_id}", name="session", mime_type="application/json")
    def session(session_id: str) -> str:
        """One session: its info and its active messages."""
        return resource_read(lambda: at().session(session_id))

    return server

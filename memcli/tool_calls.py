"""The agent tools (`memcli.tools.AgentTools`) as a model or an MCP client calls them.

`tool_functions` gives them as plain functions whose names, signatures and docstrings are the one
definition of the tools, from which the MCP SDK derives the schemas `memcli mcp` serves and
`ToolSet` the same schemas in OpenAI's format; `ToolSet.call` runs a model's tool call, its JSON
arguments checked first (`memcli chat --memory-tools` offers CHAT_TOOLS so)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, get_type_hints

from memcli.errors import MemcliError
from memcli.tools import AgentTools

if TYPE_CHECKING:
    from pydantic import Field

    from memcli.tool_params import (
        BlockArg,
        Confirm,
        EntitiesArg,
        EntityArg,
        ExpiresArg,
        FactId,
        FactText,
        Hits,
        Limit,
        Messages,
        Mode,
        Offset,
        Query,
        RememberText,
        SessionArg,
        SessionId,
        Since,
        TopicsArg,
        Until,
    )


#: The tools a chat's model is offered (`memcli chat --memory-tools`): its own session is the
#: chat, so reading a context and putting messages are left to the MCP server.
CHAT_TOOLS = (
    "search_memory",
    "list_facts",
    "search_facts",
    "add_fact",
    "update_fact",
    "delete_fact",
)


def tool_functions(tools: AgentTools | Callable[[], AgentTools]) -> list[Callable[..., Any]]:
    """The tools, as functions over `tools` (or over the AgentTools `tools()` gives on each call:
    the HTTP server's, one per user): each one's name, signature and docstring define the tool
    (its JSON schema is derived from them: the parameters' descriptions, enums and bounds are
    in their annotations). They raise MemcliError on a refusal."""
    at: Callable[[], AgentTools] = (
        (lambda: tools) if isinstance(tools, AgentTools) else tools  # type: ignore[assignment]
    )

    def search_memory(
        query: Query,
        k: Hits = 5,
        session: SessionArg = None,
        mode: Mode = "hybrid",
        since: Since = None,
        until: Until = None,
        offset: Offset = 0,
    ) -> list[dict[str, Any]]:
        """Search the user's stored messages (or one session's) by words and meaning, best
        first. mode: hybrid (words and meaning), lexical (words only) or vector (meaning only).
        For the next page, call again with offset increased by k (offset + k at most 100)."""
        return at().search(
            query, k=k, session=session, mode=mode, since=since, until=until, offset=offset
        )

    def list_facts(
        block: BlockArg = None,
        topic: Annotated[str | None, Field(description="Only the facts of this topic.")] = None,
        entity: EntityArg = None,
        include_old: Annotated[
            bool,
            Field(description="Also the superseded, retired, expired and deleted facts."),
        ] = False,
        since: Since = None,
        until: Until = None,
        offset: Offset = 0,
        limit: Limit = 100,
    ) -> list[dict[str, Any]]:
        """The facts long-term memory holds about the user, oldest first (with their ids,
        topics, entities and state); with `topic`, `entity`, `since` or `until`, only those
        facts. For the next page, call again with offset increased by limit."""
        return at().list_facts(
            block,
            topic,
            entity,
            everything=include_old,
            since=since,
            until=until,
            offset=offset,
            limit=limit,
        )

    def search_facts(
        query: Query, k: Hits = 10, mode: Mode = "hybrid", entity: EntityArg = None
    ) -> list[dict[str, Any]]:
        """The user's current facts that best match the query by words and meaning (such as
        "where does the user live"), best first; facts about an entity the query names first."""
        return at().search_facts(query, k=k, mode=mode, entity=entity)

    def get_fact(fact_id: FactId) -> dict[str, Any]:
        """One of the user's facts by id, whatever its state (current, superseded, retired,
        expired, deleted), with what superseded it."""
        return at().get_fact(fact_id)

    def fact_history(fact_id: FactId) -> dict[str, Any]:
        """A fact's versions (the facts it replaced and that replaced it) and every change to
        them, oldest first, each with its reason."""
        return at().fact_history(fact_id)

    def list_entities() -> list[dict[str, Any]]:
        """The people, places, organisations and things the user's facts are about, each with
        its number of facts, most first."""
        return at().list_entities()

    def add_fact(
        text: FactText,
        block: BlockArg = None,
        topics: TopicsArg = None,
        entities: EntitiesArg = None,
        expires: ExpiresArg = None,
    ) -> dict[str, Any]:
        """Remember a fact about the user, with its topics, entities and expiry (a duplicate is
        not added twice)."""
        return at().add_fact(text, block, topics, entities, expires)

    def remember(text: RememberText) -> dict[str, Any]:
        """Extract the facts in a text now (what the user said, in their words), as memory
        does when a conversation's window flushes: new facts are added, the ones they replace
        superseded. Returns the facts added and changed. Needs a model on the server; else add
        facts with add_fact."""
        return at().remember(text)

    def update_fact(fact_id: FactId, text: FactText, topics: TopicsArg = None) -> dict[str, Any]:
        """Change the text of one of the user's facts, and its topics when given (the old text
        and topics stay in its history)."""
        return at().update_fact(fact_id, text, topics)

    def delete_fact(fact_id: FactId) -> dict[str, Any]:
        """Forget one of the user's facts (kept in the fact history as deleted: restore_fact
        brings it back)."""
        return at().delete_fact(fact_id)

    def restore_fact(
        fact_id: Annotated[
            int,
            Field(ge=1, description="The id of an older version (from fact_history or get_fact)."),
        ],
    ) -> dict[str, Any]:
        """Make an older version of one of the user's facts current again (a new change in its
        history); the fact that replaced it is superseded by it in turn."""
        return at().restore_fact(fact_id)

    def delete_all_facts(
        keep_history: Annotated[
            bool,
            Field(description="Keep the facts in the history, marked deleted (default: gone)."),
        ] = False,
    ) -> dict[str, Any]:
        """Forget every fact about the user. Without keep_history, the facts and their history
        are gone for good."""
        return at().delete_all_facts(keep_history)

    def list_sessions(offset: Offset = 0, limit: Limit = 100) -> list[dict[str, Any]]:
        """The user's sessions (conversations), most recently updated first, each with its
        title (null: none), when its conversation began and ended (first_message_at,
        last_message_at: its first and last message's time), its message counts and budget.
        For the next page, call again with offset increased by limit."""
        return at().sessions(offset, limit)

    def read_session(session: SessionId, offset: Offset = 0, limit: Limit = 50) -> dict[str, Any]:
        """A page of one of the user's sessions: its info (title, first_message_at and
        last_message_at, counts) and its messages, active and archived, oldest first, each with
        its status; next_offset is the offset of the next page (null: the last page)."""
        return at().read_session(session, offset, limit)

    def get_context(
        session: SessionId,
        input: Annotated[str | None, Field(description="The next user message, if any.")] = None,
    ) -> list[dict[str, Any]]:
        """The messages to send the model for a session: its short-term window with long-term
        memory inserted (for `input`, the next user message, if given). Nothing is stored."""
        return at().context(session, input)

    def put_messages(
        messages: Messages,
        session: Annotated[
            str | None,
            Field(min_length=1, description="The session's id (default: a new session)."),
        ] = None,
    ) -> dict[str, Any]:
        """Store messages in a session (none given: a new one); the window flushes to long-term
        memory when over budget. A bad message stores nothing."""
        return at().put_messages(messages, session)

    def forget_user(confirm: Confirm) -> dict[str, Any]:
        """Forget everything stored about the user, for good: every session and message,
        every fact and its history, summaries and search index entries. Cannot be undone: ask
        the user first, then call with confirm=true."""
        return at().forget_user(confirm)

    functions: list[Callable[..., Any]] = [
        search_memory,
        list_facts,
        search_facts,
        get_fact,
        fact_history,
        list_entities,
        add_fact,
        remember,
        update_fact,
        delete_fact,
        restore_fact,
        delete_all_facts,
        list_sessions,
        read_session,
        get_context,
        put_messages,
        forget_user,
    ]
    # The annotations are strings (postponed evaluation), and the schemas are derived from them:
    # resolved here against the parameter types, imported now rather than with this module.
    from memcli import tool_params

    for function in functions:
        hints = get_type_hints(function, localns=vars(tool_params), include_extras=True)
        function.__annotations__ = hints
    return functions


def chat_tools(tools: AgentTools) -> ToolSet:
    """The tools a chat's model is offered (CHAT_TOOLS), over `tools` (give it origin chat-tool)."""
    return ToolSet([f for f in tool_functions(tools) if f.__name__ in CHAT_TOOLS])


def description(function: Callable[..., Any]) -> str:
    """A tool's description: its function's docstring, cleaned of indentation."""
    from inspect import cleandoc

    return cleandoc(function.__doc__ or "")


@dataclass(frozen=True)
class ToolResult:
    """One tool call a model made, and what came of it: `value` is the tool's JSON-ready result,
    or (when not `ok`) the reason it was refused, for the model to read and act on."""

    call_id: str
    name: str
    arguments: Any
    ok: bool
    value: Any

    def content(self) -> str:
        """The text given back to the model as the tool message."""
        import json

        data = self.value if self.ok else {"error": self.value}
        return json.dumps(data, ensure_ascii=False)


class ToolSet:
    """Tool functions as a model calls them: their schemas in OpenAI's format, derived by the MCP
    SDK's `func_metadata` (so the same as `memcli mcp` serves), and each call's arguments parsed
    from JSON and validated by the same model before the function runs."""

    def __init__(self, functions: Sequence[Callable[..., Any]]) -> None:
        self.functions = list(functions)
        self._loaded: dict[str, tuple[Callable[..., Any], Any]] | None = None
        self._schemas: list[dict[str, Any]] | None = None

    @property
    def _tools(self) -> dict[str, tuple[Callable[..., Any], Any]]:
        """Each tool's function and argument model, made on first use (importing the SDK's
        `func_metadata` takes a second)."""
        if self._loaded is None:
            try:
                from mcp.server.mcpserver.utilities.func_metadata import func_metadata
            except ImportError:  # mcp 1.x
                from mcp.server.fastmcp.utilities.func_metadata import (  # type: ignore[no-redef]
                    func_metadata,
                )

            from memcli.tool_params import strict

            loaded = {}
            for function in self.functions:
                meta = func_metadata(function)
                meta.arg_model = strict(meta.arg_model)
                loaded[function.__name__] = (function, meta)
            self._loaded = loaded
        return self._loaded

    def schemas(self) -> list[dict[str, Any]]:
        """The `tools` of a chat completion request (derived once)."""
        if self._schemas is None:
            self._schemas = [
                {
                    "type": "function",
                    "function": {
                        "name": name,
                        "description": description(function),
                        "parameters": meta.arg_model.model_json_schema(by_alias=True),
                    },
                }
                for name, (function, meta) in self._tools.items()
            ]
        return self._schemas

    def call(self, call_id: str, name: str, arguments: str) -> ToolResult:
        """Run one call (`arguments`: the JSON text the model wrote). An unknown tool, arguments
        that are not a JSON object or do not fit the tool, and a refusal (MemcliError) are a
        result that is not `ok`, with the reason: the model reads it, the chat goes on."""
        import json

        def refused(reason: str, parsed: Any = None) -> ToolResult:
            return ToolResult(call_id, name, parsed, False, reason)

        if name not in self._tools:
            return refused(f"unknown tool {name!r}; the tools are: {', '.join(self._tools)}")
        function, meta = self._tools[name]
        try:
            parsed = json.loads(arguments or "{}")
        except ValueError as error:
            return refused(f"the arguments are not JSON ({error}); give a JSON object")
        if not isinstance(parsed, dict):
            return refused("the arguments must be a JSON object", parsed)
        from memcli.tool_params import check_arguments

        try:
            value = function(**check_arguments(meta, parsed))
        except MemcliError as error:
            return refused(str(error), parsed)
        return ToolResult(call_id, name, parsed, True, value)

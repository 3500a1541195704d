"""The agent tools (memcli.agent_tools) as tools a model calls: `tool_functions` gives them as
plain functions whose names, signatures and docstrings are the one definition of the tools, from
which the MCP SDK derives the schemas `memcli mcp` serves and `ToolSet` the same schemas in
OpenAI's format; `ToolSet.call` runs a model's tool call, its JSON arguments checked first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memcli.errors import MemcliError

if TYPE_CHECKING:
    from memcli.agent_tools import AgentTools

#: The tools a chat's model is offered (`memcli chat --memory-tools`): its own session is the
#: chat, so reading a context and putting messages are left to the MCP server.
CHAT_TOOLS = ("search_memory", "list_facts", "add_fact", "update_fact", "delete_fact")


def tool_functions(tools: AgentTools) -> list[Callable[..., Any]]:
    """The tools, as functions over `tools`: each one's name, signature and docstring define the
    tool (its JSON schema is derived from them). They raise MemcliError on a refusal."""

    def search_memory(
        query: str, k: int = 5, session: str | None = None, mode: str = "hybrid"
    ) -> list[dict[str, Any]]:
        """Search the user's stored messages (or one session's) by words and meaning, best
        first. mode: hybrid (words and meaning), lexical (words only) or vector (meaning only)."""
        return tools.search(query, k=k, session=session, mode=mode)

    def list_facts(block: str | None = None, topic: str | None = None) -> list[dict[str, Any]]:
        """The facts long-term memory holds about the user, oldest first (with their ids and
        topics); with `topic`, only the facts of that topic."""
        return tools.list_facts(block, topic)

    def add_fact(
        text: str, block: str | None = None, topics: list[str] | None = None
    ) -> dict[str, Any]:
        """Remember a fact about the user, with its topics (a duplicate is not added twice)."""
        return tools.add_fact(text, block, topics)

    def update_fact(fact_id: int, text: str, topics: list[str] | None = None) -> dict[str, Any]:
        """Change the text of one of the user's facts, and its topics when given (the old text
        and topics stay in its history)."""
        return tools.update_fact(fact_id, text, topics)

    def delete_fact(fact_id: int) -> dict[str, Any]:
        """Forget one of the user's facts (kept in the fact history as deleted)."""
        return tools.delete_fact(fact_id)

    def get_context(session: str, input: str | None = None) -> list[dict[str, Any]]:
        """The messages to send the model for a session: its short-term window with long-term
        memory inserted (for `input`, the next user message, if given). Nothing is stored."""
        return tools.context(session, input)

    def put_messages(messages: list[dict[str, Any]], session: str | None = None) -> dict[str, Any]:
        """Store messages ({"role": "user"|"assistant"|"system"|"tool", "content": "..."},
        optional name, metadata, timestamp) in a session (none given: a new one); the window
        flushes to long-term memory when over budget. A bad message stores nothing."""
        return tools.put_messages(messages, session)

    return [
        search_memory,
        list_facts,
        add_fact,
        update_fact,
        delete_fact,
        get_context,
        put_messages,
    ]


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

            self._loaded = {f.__name__: (f, func_metadata(f)) for f in self.functions}
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

        from pydantic import ValidationError

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
        try:
            bound = meta.arg_model.model_validate(meta.pre_parse_json(parsed))
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in error.errors()
            )
            return refused(f"invalid arguments: {problems}", parsed)
        try:
            value = function(**bound.model_dump_one_level())
        except MemcliError as error:
            return refused(str(error), parsed)
        return ToolResult(call_id, name, parsed, True, value)

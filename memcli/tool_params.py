"""The agent tools' parameter types, with what their schemas show: descriptions, enums and bounds
(pydantic's `Field`). `memcli.tool_calls` resolves its tool functions' annotations against this
module when it makes the tools; it is apart because importing pydantic costs about 65 ms, which
the commands that only use the fact helpers of `memcli.tools` (`memcli facts`) do not pay.
It also holds what the served tools share beyond their parameters: the strict argument check
(`strict`, `check_arguments`, used by the MCP server and the chat's ToolSet), each tool's MCP
annotations (`TOOL_HINTS`) and what an empty result says (`EMPTY_RESULTS`).

Every argument is validated strictly (`strict`): a boolean is JSON true or false
and nothing else, an id a JSON integer, a text a JSON string."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, NotRequired

from pydantic import ConfigDict, Field, with_config
from typing_extensions import TypedDict

from memcli.errors import UsageError
from memcli.search.types import MAX_HITS
from memcli.store.facts import MAX_ENTITY_CHARS, MAX_FACT_CHARS, MAX_TOPIC_CHARS

#: The most messages one put_messages call takes, and the longest page read_session gives.
MAX_PUT_MESSAGES = 1_000
MAX_PAGE = 200

Query = Annotated[str, Field(description="What to look for, in words.")]
Hits = Annotated[int, Field(ge=1, le=MAX_HITS, description="How many hits at most (1 to 100).")]
Mode = Annotated[
    Literal["hybrid", "lexical", "vector"],
    Field(description="hybrid: words and meaning; lexical: words only; vector: meaning only."),
]
SessionArg = Annotated[
    str | None,
    Field(
        min_length=1, description="A session id of the user's, from list_sessions (default: all)."
    ),
]
SessionId = Annotated[
    str, Field(min_length=1, description="A session id of the user's, from list_sessions.")
]
FactId = Annotated[int, Field(ge=1, description="A fact's id (from list_facts or search_facts).")]
FactText = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_FACT_CHARS,
        description=f"The fact, one short sentence (at most {MAX_FACT_CHARS:,} characters).",
    ),
]
BlockArg = Annotated[
    str | None, Field(description="A configured fact block's name (default: the first).")
]
TopicsArg = Annotated[
    list[Annotated[str, Field(max_length=MAX_TOPIC_CHARS)]] | None,
    Field(
        description=f"Short lowercase topics, such as food or work (each at most"
        f" {MAX_TOPIC_CHARS} characters)."
    ),
]
EntitiesArg = Annotated[
    list[Annotated[str, Field(max_length=MAX_ENTITY_CHARS)]] | None,
    Field(
        description="The people, places, organisations or things the fact is about (each at"
        f" most {MAX_ENTITY_CHARS} characters)."
    ),
]
ExpiresArg = Annotated[
    str | None,
    Field(
        description="When the fact stops holding: a date (YYYY-MM-DD, midnight UTC) or an ISO"
        " 8601 time; none: it holds until changed."
    ),
]
EntityArg = Annotated[str | None, Field(description="Only the facts about this entity.")]
Since = Annotated[
    str | None,
    Field(
        description="Only what is from this time on: a date (YYYY-MM-DD, UTC) or an ISO 8601"
        " time (default: no bound)."
    ),
]
Until = Annotated[
    str | None,
    Field(
        description="Only what is from before this time (excluded): a date (YYYY-MM-DD, UTC) or"
        " an ISO 8601 time (default: no bound)."
    ),
]
Offset = Annotated[
    int,
    Field(
        ge=0,
        description="How many results to skip: give the next_offset of the previous page"
        " (default 0, the first page).",
    ),
]
Limit = Annotated[
    int,
    Field(ge=1, le=MAX_PAGE, description=f"How many results at most (1 to {MAX_PAGE})."),
]
Confirm = Annotated[
    bool,
    Field(
        description="true, and nothing else, once the user has agreed that everything of theirs"
        " is deleted for good."
    ),
]


@with_config(ConfigDict(extra="allow"))
class MessageItem(TypedDict):
    """A message to store. Other keys of OpenAI's chat format (tool_calls, tool_call_id) are
    kept with it."""

    role: Annotated[
        Literal["system", "user", "assistant", "tool", "developer"],
        Field(description="Who wrote it (developer is stored as system)."),
    ]
    content: Annotated[
        str | list[dict[str, Any]] | None,
        Field(
            description="The message's text, or OpenAI's text parts; null for an assistant"
            " message with tool_calls."
        ),
    ]
    name: NotRequired[Annotated[str, Field(description="The speaker's name.")]]
    metadata: NotRequired[
        Annotated[dict[str, Any], Field(description="Any JSON object, kept with the message.")]
    ]
    timestamp: NotRequired[
        Annotated[
            str | int | float,
            Field(description="When it was written: an ISO 8601 time, or Unix seconds."),
        ]
    ]


Messages = Annotated[
    list[MessageItem],
    Field(
        min_length=1,
        max_length=MAX_PUT_MESSAGES,
        description=f"The messages, oldest first (1 to {MAX_PUT_MESSAGES:,}).",
    ),
]
RememberText = Annotated[
    str,
    Field(
        min_length=1,
        max_length=20_000,
        description="What the user said or what to remember, in their words (at most 20,000"
        " characters); the facts in it are extracted now.",
    ),
]


@dataclass(frozen=True)
class Hints:
    """A tool's MCP annotations (`mcp.types.ToolAnnotations`): whether it only reads, whether
    what it changes is lost (deleted or replaced), whether calling it twice with the same
    arguments does no more than once, and whether it reaches beyond memcli's store (a model)."""

    read_only: bool
    destructive: bool = False
    idempotent: bool = False
    open_world: bool = False


_READ = Hints(read_only=True, idempotent=True)

#: Every tool's annotations, by name.
TOOL_HINTS: dict[str, Hints] = {
    "search_memory": _READ,
    "list_facts": _READ,
    "search_facts": _READ,
    "get_fact": _READ,
    "fact_history": _READ,
    "list_entities": _READ,
    "list_sessions": _READ,
    "read_session": _READ,
    "get_context": _READ,
    "add_fact": Hints(read_only=False, idempotent=True),  # a duplicate is not added
    "remember": Hints(read_only=False, open_world=True),  # asks the configured model
    "update_fact": Hints(read_only=False, destructive=True, idempotent=True),
    "delete_fact": Hints(read_only=False, destructive=True, idempotent=False),
    "restore_fact": Hints(read_only=False, destructive=True, idempotent=True),
    "delete_all_facts": Hints(read_only=False, destructive=True, idempotent=True),
    "put_messages": Hints(read_only=False),
    "forget_user": Hints(read_only=False, destructive=True, idempotent=True),
}

#: What an empty result says, by tool (an agent reads words, not an empty list).
EMPTY_RESULTS = {
    "search_memory": "No stored message matches (none of the user's, in that session or time).",
    "list_facts": "No facts: none of the user's matches (or the page is past the last).",
    "search_facts": "No facts match: the user has no current fact that fits the query.",
    "list_entities": "No entities: the user's current facts name none.",
    "list_sessions": "No sessions: the user has none stored (or the page is past the last).",
    "get_context": "The session's context is empty: it holds no active messages.",
}


def strict(arg_model: Any) -> Any:
    """A tool's argument model that refuses arguments the tool does not take (the SDK's ignores
    them; its schema says so: `additionalProperties: false`) and takes each argument only in its
    own JSON type (pydantic's strict mode: `"yes"` or `1` is no boolean, `"1"` no fact id)."""
    from pydantic import ConfigDict

    config = ConfigDict(**{**arg_model.model_config, "extra": "forbid", "strict": True})  # type: ignore[typeddict-item]
    return type(arg_model.__name__, (arg_model,), {"model_config": config, "__module__": __name__})


#: pydantic's words for text that is not Unicode, said as memcli says them.
_UNICODE = {
    "string_unicode": "the text holds a lone surrogate (such as \\ud800): not valid Unicode"
}


def check_arguments(meta: Any, arguments: dict[str, Any]) -> dict[str, Any]:
    """A call's arguments validated by a tool's strict argument model (`meta`: the SDK's
    FuncMetadata with `strict`'s model), as keyword arguments; UsageError naming each problem
    (no pydantic URL) otherwise. The one check of the MCP server and the chat's ToolSet."""
    from pydantic import ValidationError

    try:
        bound = meta.arg_model.model_validate(meta.pre_parse_json(arguments))
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {_UNICODE.get(e['type'], e['msg'])}"
            for e in error.errors()
        )
        raise UsageError(
            f"invalid arguments: {problems}",
            "Call again with arguments as the tool's input schema gives them",
        ) from None
    return dict(bound.model_dump_one_level())

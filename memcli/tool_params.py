"""The agent tools' parameter types, with what their schemas show: descriptions, enums and bounds
(pydantic's `Field`). `memcli.tools` resolves its tool functions' annotations against this
module when it makes the tools; it is apart because importing pydantic costs about 65 ms, which
the commands that only use the fact helpers of `memcli.tools` (`memcli facts`) do not pay.

Every argument is validated strictly (`memcli.tools.strict`): a boolean is JSON true or false
and nothing else, an id a JSON integer, a text a JSON string."""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired

from pydantic import ConfigDict, Field, with_config
from typing_extensions import TypedDict

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
    content: Annotated[str, Field(description="The message's text.")]
    name: NotRequired[Annotated[str, Field(description="The speaker's name.")]]
    metadata: NotRequired[
        Annotated[dict[str, Any], Field(description="Any JSON object, kept with the message.")]
    ]
    timestamp: NotRequired[
        Annotated[str, Field(description="When it was written: an ISO 8601 time.")]
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

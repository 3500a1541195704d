"""The agent tools' parameter types, with what their schemas show: descriptions, enums and bounds
(pydantic's `Field`). `memcli.tools` resolves its tool functions' annotations against this
module when it makes the tools; it is apart because importing pydantic costs about 65 ms, which
the commands that only use the fact helpers of `memcli.tools` (`memcli facts`) do not pay."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from memcli.search.types import MAX_HITS

Query = Annotated[str, Field(description="What to look for, in words.")]
Hits = Annotated[int, Field(ge=1, le=MAX_HITS, description="How many hits at most (1 to 100).")]
Mode = Annotated[
    Literal["hybrid", "lexical", "vector"],
    Field(description="hybrid: words and meaning; lexical: words only; vector: meaning only."),
]
SessionArg = Annotated[str | None, Field(description="A session id of the user's (default: all).")]
FactId = Annotated[int, Field(ge=1, description="A fact's id (from list_facts or search_facts).")]
FactText = Annotated[str, Field(description="The fact, one short sentence.")]
BlockArg = Annotated[
    str | None, Field(description="A configured fact block's name (default: the first).")
]
TopicsArg = Annotated[
    list[str] | None, Field(description="Short lowercase topics, such as food or work.")
]
EntitiesArg = Annotated[
    list[str] | None,
    Field(description="The people, places, organisations or things the fact is about."),
]
ExpiresArg = Annotated[
    str | None,
    Field(
        description="When the fact stops holding: a date (YYYY-MM-DD, midnight UTC) or an ISO"
        " 8601 time; none: it holds until changed."
    ),
]
EntityArg = Annotated[str | None, Field(description="Only the facts about this entity.")]

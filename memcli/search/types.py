"""The search's public types: what a search is asked (SearchOptions, the `[search]` settings, and
its MODES) and what it answers (Hit, SearchResult)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from memcli.errors import UsageError
from memcli.messages import format_time, session_name
from memcli.words import duration

if TYPE_CHECKING:
    from memcli.search.when import TimeWindow
    from memcli.store.index import MessageRow


MODES = ("hybrid", "lexical", "vector")
#: The most hits one search of the memory tools (MCP, chat) returns.
MAX_HITS = 100


@dataclass(frozen=True)
class SearchOptions:
    """How retrieval weighs and shapes its results (the `[search]` settings)."""

    lexical_weight: float = 1.0
    vector_weight: float = 1.0
    rrf_k: int = 10
    #: How many messages each of the two searches hands to the fusion.
    candidates: int = 100
    #: Neighbouring messages a hit may carry before and after the one that matched.
    context_before: int = 1
    context_after: int = 1
    #: A hit grows by neighbours only while it stays within this many tokens.
    context_tokens: int = 60
    #: BM25 ranks at most this many messages per query, so that its cost stays bounded (5-10 us
    #: each with the scope's filter) however big the store: the query's words are taken rarest
    #: first while the messages they occur in add up to at most this; a common word left out says
    #: little. When even the rarest word is in more messages, its most recent this many matches
    #: in the store are ranked, and those in scope kept. Below this many messages in the store,
    #: nothing is left out.
    lexical_budget: int = 1_000
    #: At most this many messages are embedded at search time; more are left to `index`.
    embed_limit: int = 1000
    #: Earlier messages of the session put before a message when its vector is made.
    vector_context: int = 1
    #: When a query names a time ("in May 2023", "last week"), a search restricted to that time
    #: window is fused with the plain one at this weight (0: times in queries are not read).
    window_weight: float = 1.0
    #: Messages of a speaker the query names ("What did Caroline say ...") join the fusion again,
    #: in their fused order, at this weight (0: speaker names in queries are not read).
    speaker_weight: float = 1.0

    def __post_init__(self) -> None:
        if (
            min(self.lexical_weight, self.vector_weight, self.window_weight, self.speaker_weight)
            < 0
        ):
            raise UsageError("search weights must not be negative", "Use 0 to switch one off")
        if self.lexical_weight == 0 and self.vector_weight == 0:
            raise UsageError("both search weights are 0", "Give one of them a positive weight")
        if self.rrf_k < 0 or self.candidates < 1:
            raise UsageError("rrf_k must be >= 0 and candidates >= 1", "See config.example.toml")
        if self.lexical_budget < 1:
            raise UsageError("lexical_budget must be >= 1", "See config.example.toml")
        if min(self.context_before, self.context_after, self.context_tokens) < 0 or (
            self.vector_context < 0
        ):
            raise UsageError("context settings must not be negative", "See config.example.toml")

    @classmethod
    def from_settings(cls, settings: Any) -> SearchOptions:
        """The options of resolved Settings (the `[search]` table of the config file)."""
        return cls(
            lexical_weight=settings.search_lexical_weight,
            vector_weight=settings.search_vector_weight,
            rrf_k=settings.search_rrf_k,
            candidates=settings.search_candidates,
            context_before=settings.search_context_before,
            context_after=settings.search_context_after,
            context_tokens=settings.search_context_tokens,
            vector_context=settings.search_vector_context,
        )


@dataclass(frozen=True)
class Hit:
    """A retrieved stretch of one session: the message that matched plus any neighbours."""

    rank: int
    score: float
    session_id: str
    messages: list[MessageRow]
    anchor_id: int
    lexical_rank: int | None = None
    lexical_score: float | None = None
    vector_rank: int | None = None
    vector_score: float | None = None

    @property
    def message_ids(self) -> list[int]:
        return [m.id for m in self.messages]

    @property
    def tokens(self) -> int:
        return sum(m.tokens for m in self.messages)

    @property
    def text(self) -> str:
        return "\n".join(f"{m.name or m.role}: {m.content}" for m in self.messages)

    @property
    def first_time(self) -> datetime | None:
        return next((m.timestamp for m in self.messages if m.timestamp), None)

    @property
    def last_time(self) -> datetime | None:
        return next((m.timestamp for m in reversed(self.messages) if m.timestamp), None)

    def to_dict(self, explain: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": "hit",
            "rank": self.rank,
            "score": round(self.score, 6),
            "text": self.text,
            "session": session_name(self.session_id),
            "message_ids": self.message_ids,
            "tokens": self.tokens,
            "first_time": format_time(self.first_time) if self.first_time else None,
            "last_time": format_time(self.last_time) if self.last_time else None,
        }
        if explain:
            out.update(
                matched_id=self.anchor_id,
                lexical_rank=self.lexical_rank,
                lexical_score=None if self.lexical_score is None else round(self.lexical_score, 4),
                vector_rank=self.vector_rank,
                vector_score=None if self.vector_score is None else round(self.vector_score, 4),
            )
        return out


@dataclass
class SearchResult:
    """The hits of one query, and how many messages in the store had no vectors yet."""

    hits: list[Hit]
    #: The time window the query named, searched besides the plain ranking (None: it named none).
    window: TimeWindow | None = None
    pending: int = 0
    embedded: int = 0
    notes: list[str] = field(default_factory=list)


#: Rough rates of a search's catching up on a small shared machine: messages added to SQLite's
#: full-text index per second (86 s for 1M messages), and messages embedded per second by the
#: bundled model with one earlier message of context (benchmarks/scoped_embedding.py prints the
#: measured rate: 89-114 a second for LoCoMo's short turns on 2 shared cores; longer messages
#: take longer). A `Building`'s time is an estimate from these, no more.
FTS_RATE = 11_000
EMBED_RATE = 80


@dataclass(frozen=True)
class Building:
    """What a search is about to build before it answers (told to `Retriever(on_build=...)`):
    the full-text index of `count` messages not in it yet, the vectors of `count` of the
    `pending` messages of the search's scope that have none, or pgvector's index of `count`
    stored vectors not in it yet (after `memcli copy`: `what` "index", "vectors" or "pgvector");
    `seconds`, roughly how long that takes."""

    what: str
    count: int
    pending: int
    seconds: float

    def describe(self) -> str:
        """One sentence for people: what is built, of how many, and about how long it takes."""
        about = f"about {duration(self.seconds)}"
        if self.what == "index":
            return f"Adding {self.count:,} messages to the full-text index ({about})..."
        if self.what == "pgvector":
            return f"Adding {self.count:,} stored vectors to pgvector's index ({about})..."
        return (
            f"Embedding {self.count:,} of {self.pending:,} messages not yet searchable by"
            f" meaning ({about})..."
        )

"""What a search is asked and what it answers, and the pure parts of ranking: SearchOptions (the
`[search]` settings), Hit and SearchResult, a query's terms, and weighted
reciprocal rank fusion. `memcli.retrieval.Retriever` runs the search itself."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from memcli.errors import UsageError
from memcli.messages import format_time

if TYPE_CHECKING:
    from collections.abc import Sequence

    from memcli.store.retrieval import MessageRow


MODES = ("hybrid", "lexical", "vector")

# Words that say nothing about what a question is after; left out of the BM25 query.
STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further
    had has have having he her here hers herself him himself his how i if in into is it its itself
    just me might more most my myself no nor not now of off on once only or other our ours
    ourselves out over own same she should so some such than that the their theirs them themselves
    then there these they this those through to too under until up very was we were what when
    where which while who whom why will with would you your yours yourself yourselves s t d ll m
    re ve kind sort type likely""".split()
)


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

    def __post_init__(self) -> None:
        if self.lexical_weight < 0 or self.vector_weight < 0:
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
            "session": self.session_id,
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
    pending: int = 0
    embedded: int = 0
    notes: list[str] = field(default_factory=list)


def query_terms(text: str) -> list[str]:
    """A natural-language query's informative words (all its words when none is), once each."""
    words = [w for w in re.findall(r"\w+", text.lower()) if w]
    kept = [w for w in words if w not in STOPWORDS and len(w) > 1] or words
    return list(dict.fromkeys(kept))


#: A message longer than this many characters is shown in a hit as the stretch that matched: about
#: EXCERPT_CHARS characters (a few hundred tokens) where the query's words occur most, else the
#: piece whose vector matched best; "…" marks what is left out.
LONG_CHARS = 3_000
EXCERPT_CHARS = 1_500
ELLIPSIS = "…"
#: Occurrences of the query's words looked at in one message (bounds the time on a huge one).
EXCERPT_MATCHES = 100_000


def excerpt_at(text: str, start: int, end: int) -> str:
    """text[start:end] widened or narrowed to word boundaries nearby, "…" where text is left out."""
    if start > 0:
        space = text.find(" ", start, min(start + 100, end))
        start = space + 1 if space >= 0 else start
    if end < len(text):
        space = text.rfind(" ", max(end - 100, start), end)
        end = space if space > start else end
    return f"{ELLIPSIS if start > 0 else ''}{text[start:end].strip()}{ELLIPSIS if end < len(text) else ''}"


def lexical_excerpt(text: str, terms: Sequence[str], width: int = EXCERPT_CHARS) -> str | None:
    """The stretch of about `width` characters of a long text where the most of the query's terms
    occur (then the most occurrences), or None when none occurs."""
    if not terms:
        return None
    pattern = re.compile(r"\b(?:" + "|".join(re.escape(t) for t in terms) + r")\b", re.IGNORECASE)
    found: list[tuple[int, str]] = []
    for match in pattern.finditer(text):
        found.append((match.start(), match.group(0).lower()))
        if len(found) >= EXCERPT_MATCHES:
            break
    if not found:
        return None
    best = (0, 0, 0)  # (distinct terms, occurrences, first index)
    low = 0
    inside: dict[str, int] = {}
    for high, (at, term) in enumerate(found):  # windows starting at an occurrence
        inside[term] = inside.get(term, 0) + 1
        while at - found[low][0] > width * 3 // 4:
            old = found[low][1]
            inside[old] -= 1
            if not inside[old]:
                del inside[old]
            low += 1
        score = (len(inside), high - low + 1, low)
        if score[:2] > best[:2]:
            best = score
    first = found[best[2]][0]
    start = max(0, first - width // 4)
    return excerpt_at(text, start, min(len(text), start + width))


def fuse(ranked: Sequence[tuple[float, Sequence[int]]], rrf_k: int = 60) -> list[tuple[int, float]]:
    """Weighted reciprocal rank fusion: each list is (weight, ids best first); an id scores
    sum(weight / (rrf_k + rank)) with ranks from 1. Best first; ties keep first-seen order."""
    scores: dict[int, float] = {}
    for weight, ids in ranked:
        if weight == 0:
            continue
        for rank, item in enumerate(ids, start=1):
            scores[item] = scores.get(item, 0.0) + weight / (rrf_k + rank)
    return sorted(scores.items(), key=lambda pair: -pair[1])

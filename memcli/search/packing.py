"""What a chat's memory gives the model from search hits: the query for the turn (the input, with
the turn before only for a follow-up), and the hits packed into a token budget, each with its
turn partner when it fits, in time order, nothing twice. Pure functions over hits and counts:
`memcli.blocks.vector.VectorBlock` searches, fetches the partners and renders.

How the rules were chosen (benchmarks/chat_recall.py, LoCoMo's development conversations asked
one question per turn in a new chat): querying the last 5 messages of the window put the
evidence of 21-27% of the questions in the requests; the input alone, packed into 600 tokens,
puts it there for most of them (docs/architecture.md has the figures).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from memcli.search.ranking import STOPWORDS

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from memcli.store.index import MessageRow


#: Words that point back at something said before ("and her brother?", "when did it happen?").
REFERRING = frozenset(
    "he she him her his hers they them their theirs it its that this those these there then"
    " one ones same".split()
)
#: How a follow-up may start ("And the dog?", "What about Lisbon?").
OPENERS = ("and", "also", "but", "or", "so", "then", "what about", "how about")
#: A follow-up is short: at most this many words.
FOLLOW_UP_WORDS = 8


def is_follow_up(text: str) -> bool:
    """Whether `text` leans on the turn before to say what it is about: a short message (at most
    FOLLOW_UP_WORDS words) with no informative word, or that starts like a follow-up ("and ...",
    "what about ..."), or that refers back (her, it, that, there ...) with at most two informative
    words. "What is my cat called?" is not one; "and her brother?" is."""
    words = re.findall(r"\w+", text.lower())
    if not words or len(words) > FOLLOW_UP_WORDS:
        return False
    informative = [w for w in words if w not in STOPWORDS and len(w) > 1]
    if not informative:
        return True
    if words[0] in OPENERS or " ".join(words[:2]) in OPENERS:
        return True
    return len(informative) <= 2 and any(w in REFERRING for w in words)


def partner_of(anchor: MessageRow, span: Sequence[MessageRow]) -> MessageRow | None:
    """The other half of the anchor's turn among its neighbours `span`: the reply after a user
    message (the next message, when it is not the user's), the user message before a reply (the
    previous one, when it is the user's). None when there is none."""
    by_seq = {m.seq: m for m in span}
    if anchor.role == "user":
        after = by_seq.get(anchor.seq + 1)
        return after if after is not None and after.role != "user" else None
    before = by_seq.get(anchor.seq - 1)
    return before if before is not None and before.role == "user" else None


#: A turn partner joins its hit when it is this short (in tokens, as stored): a line such as
#: "Yes, last May!" or "Where did you go?", which says what the matched message is about. On
#: LoCoMo (benchmarks/chat_recall.py), longer partners cost more hits than they bring: evidence
#: recall of the requests 0.73 with every partner that fits, 0.77 without any, 0.77-0.78 with
#: those of 10-15 tokens.
PARTNER_TOKENS = 16


@dataclass(frozen=True)
class Candidate:
    """A hit as packing sees it: its rank (1 = best), the message that matched, and that
    message's turn partner (`partner_of`), if any."""

    rank: int
    anchor: MessageRow
    partner: MessageRow | None = None


def pack(
    candidates: Sequence[Candidate],
    budget: int,
    cost: Callable[[Sequence[MessageRow]], int],
    *,
    repeated: Callable[[MessageRow], bool] = lambda m: False,
    partner_tokens: int = PARTNER_TOKENS,
) -> list[tuple[int, list[MessageRow]]]:
    """The candidates that fit `budget` (what `cost` says a group of messages takes), best rank
    first: each as the matched message with its partner when the partner is short (at most
    `partner_tokens`) and both fit, else the matched message alone; a candidate that does not
    fit is passed over for smaller ones after it. A message is taken once, and never when
    `repeated` says the window holds it. Returns (rank, messages in order) per group, ordered by
    time: groups of a session that meet are joined (their rank the best of them)."""
    taken: set[int] = set()
    chosen: list[tuple[int, list[MessageRow]]] = []
    used = 0
    for c in candidates:
        if c.anchor.id in taken or repeated(c.anchor):
            continue
        options = [[c.anchor]]
        if c.partner is not None and c.partner.tokens <= partner_tokens:
            options.insert(0, [c.anchor, c.partner])
        for option in options:
            rows = _fresh(option, taken, repeated)
            spent = cost(rows)
            if used + spent <= budget:
                chosen.append((c.rank, rows))
                taken.update(m.id for m in rows)
                used += spent
                break
    return _in_time_order(chosen)


def _fresh(
    rows: Sequence[MessageRow], taken: set[int], repeated: Callable[[MessageRow], bool]
) -> list[MessageRow]:
    """The rows not taken yet nor repeating the window, once each, in session order."""
    seen: dict[int, MessageRow] = {}
    for m in rows:
        if m.id not in taken and m.id not in seen and not repeated(m):
            seen[m.id] = m
    return sorted(seen.values(), key=lambda m: m.seq)


_NO_TIME = datetime.min.replace(tzinfo=UTC)


def _when(m: MessageRow) -> datetime:
    t = m.timestamp
    if t is None:
        return _NO_TIME
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def _in_time_order(
    groups: Sequence[tuple[int, list[MessageRow]]],
) -> list[tuple[int, list[MessageRow]]]:
    """Groups sorted by their first message's time (then session and place in it); groups of one
    session whose messages follow each other are joined."""
    ordered = sorted(groups, key=lambda g: (_when(g[1][0]), g[1][0].session_id, g[1][0].seq))
    out: list[tuple[int, list[MessageRow]]] = []
    for rank, rows in ordered:
        if out:
            last_rank, last = out[-1]
            if last[-1].session_id == rows[0].session_id and rows[0].seq == last[-1].seq + 1:
                out[-1] = (min(rank, last_rank), [*last, *rows])
                continue
        out.append((rank, list(rows)))
    return out

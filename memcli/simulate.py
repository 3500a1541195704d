"""Replay a transcript through the flush policy without a store: what a token budget would do.

The replay calls `memcli.flush.plan_flush` on the active window after every put call, exactly as
`Memory.put_messages` does, so the batches it reports are the ones the engine would archive. It
calls no LLM, embeds nothing and writes nothing.

    from memcli.simulate import simulate
    sim = simulate([[Message("user", "hi")], ...], Budget(4000), tokenizer)
    sim.summary.flushes, [e for e in sim.events if isinstance(e, FlushEvent)]
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from memcli.flush import REASON_FLUSH_SIZE, Budget, plan_flush
from memcli.tokens import Tokenizer, message_tokens

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from memcli.messages import Message


@dataclass(frozen=True, slots=True)
class PutEvent:
    """One put call: its messages (0-based positions in the source) and the window around it.

    `active_tokens` is the window right after the put, before any flush; `kept_tokens` and
    `kept_messages` what stays active after the call's flushes; `over_threshold` says the window
    stayed over the threshold (a turn larger than the budget cannot be flushed).
    """

    call: int
    first: int
    last: int
    messages: int
    tokens: int
    active_tokens: int
    flushes: int
    kept_tokens: int
    kept_messages: int
    over_threshold: bool

    def to_dict(self) -> dict[str, Any]:
        return {"type": "put", **asdict(self)}


@dataclass(frozen=True, slots=True)
class FlushEvent:
    """One flush batch: the source positions `first`..`last` (inclusive) left short-term memory."""

    call: int
    first: int
    last: int
    messages: int
    tokens: int
    reason: str
    reached_flush_size: bool
    extended: int
    kept_turn: bool

    def to_dict(self) -> dict[str, Any]:
        return {"type": "flush", **asdict(self)}


Event = PutEvent | FlushEvent


@dataclass(frozen=True)
class Summary:
    """What a replay did under one budget."""

    token_limit: int
    ratio: float
    flush_size: int
    threshold: float
    messages: int
    tokens: int
    puts: int
    flushes: int
    archived_messages: int
    archived_tokens: int
    average_batch_messages: float
    average_batch_tokens: float
    largest_batch_messages: int
    largest_batch_tokens: int
    largest_active_tokens: int
    largest_active_messages: int
    largest_kept_tokens: int
    active_messages: int
    active_tokens: int
    over_threshold_puts: int
    first_over_threshold: int | None

    @property
    def stayed_over(self) -> bool:
        """The window stayed over the threshold after some put (a turn larger than the budget)."""
        return self.over_threshold_puts > 0

    def to_dict(self) -> dict[str, Any]:
        return {"type": "summary", **asdict(self), "stayed_over": self.stayed_over}


@dataclass(frozen=True)
class Simulation:
    """A replay under one budget: the events in order (puts and their flushes) and a summary."""

    budget: Budget
    events: list[Event]
    summary: Summary

    @property
    def puts(self) -> list[PutEvent]:
        return [e for e in self.events if isinstance(e, PutEvent)]

    @property
    def flushes(self) -> list[FlushEvent]:
        return [e for e in self.events if isinstance(e, FlushEvent)]

    def active_positions(self) -> range:
        """Source positions of the messages still active at the end."""
        return range(self.summary.messages - self.summary.active_messages, self.summary.messages)


@dataclass(frozen=True)
class Replay:
    """A transcript ready to replay: every message's role and tokens, and the size of each call."""

    roles: list[str]
    tokens: list[int]
    calls: list[int] = field(default_factory=list)

    @classmethod
    def from_calls(
        cls,
        messages_by_call: Iterable[Sequence[Message]],
        tokenizer: Tokenizer,
        *,
        stored_tokens: bool = False,
    ) -> Replay:
        """Count every message's tokens once (in bulk when the tokenizer can).

        With `stored_tokens`, a message read from a store keeps the token count it was stored with.
        """
        calls = [list(call) for call in messages_by_call]
        messages = [m for call in calls for m in call]
        if stored_tokens and all(m.tokens is not None for m in messages):
            tokens = [m.tokens or 0 for m in messages]
        else:
            tokens = count_tokens(messages, tokenizer)
        return cls([m.role for m in messages], tokens, [len(c) for c in calls if c])


def count_tokens(messages: Sequence[Message], tokenizer: Tokenizer) -> list[int]:
    """Each message's tokens, as `memcli.tokens.message_tokens` counts them, in one pass."""
    count_many = getattr(tokenizer, "count_many", None)
    if count_many is None:
        return [message_tokens(m, tokenizer) for m in messages]
    tokens: list[int] = count_many([m.content for m in messages])
    with_metadata = [i for i, m in enumerate(messages) if m.metadata]
    if with_metadata:
        extra = count_many([str(messages[i].metadata) for i in with_metadata])
        for i, more in zip(with_metadata, extra, strict=True):
            tokens[i] += more
    return tokens


def run(replay: Replay, budget: Budget) -> Simulation:
    """Replay the calls under one budget, flushing after each call as `Memory.put_messages` does."""
    roles, tokens = replay.roles, replay.tokens
    threshold, flush_size = budget.threshold, budget.flush_size
    events: list[Event] = []
    stats = _Stats()
    total = 0  # active tokens
    start = 0  # the active window is the positions start..end-1: flushes take the oldest
    end = 0
    for call, size in enumerate(replay.calls):
        first = end
        end += size
        added = sum(tokens[first:end])
        total += added
        active = total
        stats.see_active(active, end - start)
        flushes: list[FlushEvent] = []
        if total > threshold:
            batches = plan_flush(roles[start:end], tokens[start:end], threshold, flush_size)
            for batch in batches:
                flushes.append(
                    FlushEvent(
                        call,
                        start + batch.start,
                        start + batch.end - 1,
                        batch.count,
                        batch.tokens,
                        batch.describe(),
                        batch.reason == REASON_FLUSH_SIZE,
                        batch.extended,
                        batch.kept_turn,
                    )
                )
                total -= batch.tokens
            if batches:
                start += batches[-1].end
        over = total > threshold
        events.append(
            PutEvent(
                call, first, end - 1, size, added, active, len(flushes), total, end - start, over
            )
        )
        events.extend(flushes)
        for event in flushes:
            stats.see_flush(event)
        stats.see_kept(total, over, end - 1)
    return Simulation(budget, events, stats.summary(budget, replay, total, end - start))


@dataclass
class _Stats:
    flushes: int = 0
    archived_messages: int = 0
    archived_tokens: int = 0
    largest_batch_messages: int = 0
    largest_batch_tokens: int = 0
    largest_active_tokens: int = 0
    largest_active_messages: int = 0
    largest_kept_tokens: int = 0
    over_threshold_puts: int = 0
    first_over_threshold: int | None = None

    def see_active(self, tokens: int, messages: int) -> None:
        self.largest_active_tokens = max(self.largest_active_tokens, tokens)
        self.largest_active_messages = max(self.largest_active_messages, messages)

    def see_flush(self, event: FlushEvent) -> None:
        self.flushes += 1
        self.archived_messages += event.messages
        self.archived_tokens += event.tokens
        self.largest_batch_messages = max(self.largest_batch_messages, event.messages)
        self.largest_batch_tokens = max(self.largest_batch_tokens, event.tokens)

    def see_kept(self, tokens: int, over: bool, position: int) -> None:
        self.largest_kept_tokens = max(self.largest_kept_tokens, tokens)
        if over:
            self.over_threshold_puts += 1
            if self.first_over_threshold is None:
                self.first_over_threshold = position

    def summary(self, budget: Budget, replay: Replay, active: int, kept: int) -> Summary:
        n = self.flushes
        return Summary(
            token_limit=budget.token_limit,
            ratio=budget.chat_history_token_ratio,
            flush_size=budget.flush_size,
            threshold=budget.threshold,
            messages=len(replay.roles),
            tokens=sum(replay.tokens),
            puts=len(replay.calls),
            flushes=n,
            archived_messages=self.archived_messages,
            archived_tokens=self.archived_tokens,
            average_batch_messages=round(self.archived_messages / n, 2) if n else 0.0,
            average_batch_tokens=round(self.archived_tokens / n, 2) if n else 0.0,
            largest_batch_messages=self.largest_batch_messages,
            largest_batch_tokens=self.largest_batch_tokens,
            largest_active_tokens=self.largest_active_tokens,
            largest_active_messages=self.largest_active_messages,
            largest_kept_tokens=self.largest_kept_tokens,
            active_messages=kept,
            active_tokens=active,
            over_threshold_puts=self.over_threshold_puts,
            first_over_threshold=self.first_over_threshold,
        )


def simulate(
    messages_by_call: Iterable[Sequence[Message]], budget: Budget, tokenizer: Tokenizer
) -> Simulation:
    """Replay put calls (each a list of messages) under one budget."""
    return run(Replay.from_calls(messages_by_call, tokenizer), budget)


def budgets(
    token_limits: Sequence[int],
    ratios: Sequence[float],
    flush_sizes: Sequence[int | None],
) -> list[Budget]:
    """Every combination of the values, in order (limits vary slowest); None is 10% of the limit."""
    return [
        Budget(limit, ratio, size)
        for limit, ratio, size in itertools.product(token_limits, ratios, flush_sizes)
    ]


def simulate_many(replay: Replay, budget_list: Iterable[Budget]) -> list[Simulation]:
    """Replay one transcript under several budgets (its tokens are counted once)."""
    return [run(replay, budget) for budget in budget_list]

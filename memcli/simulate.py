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
from typing import TYPE_CHECKING, Any, NamedTuple

from memcli.flush import REASON_FLUSH_SIZE, Budget, BudgetOverride, plan_flush
from memcli.tokens import Tokenizer, count_contents, count_messages
from memcli.transcripts import call_sizes, parse_columns, read_source

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from pathlib import Path
    from typing import IO

    from memcli.messages import Message


class PutEvent(NamedTuple):
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
        return {"type": "put", **self._asdict()}


def events_json(events: Sequence[Event], run: int | None = None) -> str:
    """The events as JSON Lines, each line `json.dumps({**event.to_dict(), "run": run})` (no "run"
    when None), every line ending in a newline."""
    import json

    lines = []
    for event in events:
        if isinstance(event, PutEvent):
            lines.append(_put_json(event, run))
        else:
            record = event.to_dict()
            if run is not None:
                record["run"] = run
            lines.append(json.dumps(record, ensure_ascii=False))
    lines.append("")
    return "\n".join(lines)


def _put_json(p: PutEvent, run: int | None) -> str:
    """`json.dumps({**p.to_dict(), "run": run})`, written field by field: a replay has one put
    event per call (100,000 for a long transcript), and this is four times faster than json.dumps.
    The tests check it against json.dumps."""
    line = (
        f'{{"type": "put", "call": {p.call}, "first": {p.first}, "last": {p.last},'
        f' "messages": {p.messages}, "tokens": {p.tokens}, "active_tokens": {p.active_tokens},'
        f' "flushes": {p.flushes}, "kept_tokens": {p.kept_tokens},'
        f' "kept_messages": {p.kept_messages},'
        f' "over_threshold": {"true" if p.over_threshold else "false"}'
    )
    return line + ("}" if run is None else f', "run": {int(run)}}}')


class FlushEvent(NamedTuple):
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
        return {"type": "flush", **self._asdict()}


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
        """Count every message's tokens, as the engine does (`memcli.tokens.count_messages`).

        With `stored_tokens`, a message read from a store keeps the token count it was stored with.
        """
        calls = [list(call) for call in messages_by_call]
        messages = [m for call in calls for m in call]
        if stored_tokens and all(m.tokens is not None for m in messages):
            tokens = [m.tokens or 0 for m in messages]
        else:
            tokens = count_messages(messages, tokenizer)
        return cls([m.role for m in messages], tokens, [len(c) for c in calls if c])

    @classmethod
    def from_source(
        cls, source: str | Path, put: str, tokenizer: Tokenizer, stdin: IO[bytes] | None = None
    ) -> tuple[Replay, set[str]]:
        """Read a transcript (a path, or `-` for stdin) and count its tokens; also the sessions it
        names. It is read as columns (`memcli.transcripts.parse_columns`), no Message per line; an
        export (any format of `memcli.formats.READERS` but the transcript) is refused with what to
        do instead."""
        from memcli.errors import InputError
        from memcli.formats import export_kind

        data, name = read_source(source, stdin)
        try:
            columns = parse_columns(data, name)
        except InputError:
            kind = export_kind(data, name)
            if kind is None:
                raise
            what = {"chatgpt": "a ChatGPT", "claude": "a Claude.ai", "llm": "an llm"}.get(
                kind, f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"
            )
            raise InputError(
                f"{name} is {what} export: simulate replays one transcript (JSON Lines of"
                " messages) or a stored session",
                f"Import it first (`memcli import {name}`), then replay a session it made:"
                " `memcli simulate flush --session ID` (`memcli sessions` lists them)",
            ) from None
        tokens = count_contents(columns.contents, columns.metadata, tokenizer)
        return cls(columns.roles, tokens, call_sizes(columns.sizes, put)), columns.sessions


def run(replay: Replay, budget: Budget) -> Simulation:
    """Replay the calls under one budget, flushing after each call as `Memory.put_messages` does."""
    roles, tokens = replay.roles, replay.tokens
    threshold, flush_size = budget.threshold, budget.flush_size
    before = [0, *itertools.accumulate(tokens)]  # before[i]: tokens of the messages before i
    last_user = _last_user_positions(roles)
    events: list[Event] = []
    puts: list[PutEvent] = []
    flushed: list[FlushEvent] = []
    total = 0  # active tokens
    start = 0  # the active window is the positions start..end-1: flushes take the oldest
    end = 0
    for call, size in enumerate(replay.calls):
        first = end
        end += size
        added = before[end] - before[first]
        total += added
        kept, kept_from = total, start
        batches = []
        # As Memory._flush: no plan while under the threshold. And when the window is one turn
        # (a user message, then only replies), plan_flush keeps that newest turn whole and
        # returns nothing: skipping the call keeps an agent's long single turn linear, not O(n^2).
        if total > threshold and last_user[end - 1] != start:
            batches = plan_flush(roles[start:end], tokens[start:end], threshold, flush_size)
            if batches:
                kept -= sum(b.tokens for b in batches)
                kept_from += batches[-1].end
        put = PutEvent(
            call,
            first,
            end - 1,
            size,
            added,
            total,
            len(batches),
            kept,
            end - kept_from,
            kept > threshold,
        )
        events.append(put)
        puts.append(put)
        for batch in batches:
            event = FlushEvent(
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
            events.append(event)
            flushed.append(event)
        total, start = kept, kept_from
    return Simulation(budget, events, _summarize(budget, replay, puts, flushed))


def _last_user_positions(roles: Sequence[str]) -> list[int]:
    """For each position, the position of the last user message up to it (-1 if none)."""
    positions = []
    last = -1
    for i, role in enumerate(roles):
        if role == "user":
            last = i
        positions.append(last)
    return positions


def _summarize(
    budget: Budget, replay: Replay, puts: list[PutEvent], flushed: list[FlushEvent]
) -> Summary:
    n = len(flushed)
    archived_messages = sum(f.messages for f in flushed)
    archived_tokens = sum(f.tokens for f in flushed)
    over = [p for p in puts if p.over_threshold]
    last = puts[-1] if puts else None
    return Summary(
        token_limit=budget.token_limit,
        ratio=budget.chat_history_token_ratio,
        flush_size=budget.flush_size,
        threshold=budget.threshold,
        messages=len(replay.roles),
        tokens=sum(replay.tokens),
        puts=len(puts),
        flushes=n,
        archived_messages=archived_messages,
        archived_tokens=archived_tokens,
        average_batch_messages=round(archived_messages / n, 2) if n else 0.0,
        average_batch_tokens=round(archived_tokens / n, 2) if n else 0.0,
        largest_batch_messages=max((f.messages for f in flushed), default=0),
        largest_batch_tokens=max((f.tokens for f in flushed), default=0),
        largest_active_tokens=max((p.active_tokens for p in puts), default=0),
        largest_active_messages=_largest_window(puts),
        largest_kept_tokens=max((p.kept_tokens for p in puts), default=0),
        active_messages=last.kept_messages if last else 0,
        active_tokens=last.kept_tokens if last else 0,
        over_threshold_puts=len(over),
        first_over_threshold=over[0].last if over else None,
    )


def _largest_window(puts: list[PutEvent]) -> int:
    """The most messages active at once: right after a put, before its flushes."""
    largest = kept = 0
    for p in puts:
        largest = max(largest, kept + p.messages)
        kept = p.kept_messages
    return largest


def simulate(
    messages_by_call: Iterable[Sequence[Message]], budget: Budget, tokenizer: Tokenizer
) -> Simulation:
    """Replay put calls (each a list of messages) under one budget."""
    return run(Replay.from_calls(messages_by_call, tokenizer), budget)


def budgets(
    token_limits: Sequence[int | None],
    ratios: Sequence[float | None],
    flush_sizes: Sequence[int | None],
    budget: Callable[[BudgetOverride], Budget] = BudgetOverride.budget,
) -> list[Budget]:
    """`budget(BudgetOverride(limit, ratio, flush_size))` for every combination of the values, in
    order (limits vary slowest). The default, `BudgetOverride.budget`, takes a flush size of None
    as 10% of the limit; a caller that fills values left out (None) from settings or a session
    passes its own rule."""
    return [
        budget(BudgetOverride(limit, ratio, size))
        for limit, ratio, size in itertools.product(token_limits, ratios, flush_sizes)
    ]


def simulate_many(replay: Replay, budget_list: Iterable[Budget]) -> list[Simulation]:
    """Replay one transcript under several budgets (its tokens are counted once)."""
    return [run(replay, budget) for budget in budget_list]

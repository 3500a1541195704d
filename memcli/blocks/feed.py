"""Handing flushed batches to blocks, recording what each block processed, and backfilling.

Each block records, per scope (`user:ID` or `session:ID`) and flush, whether it processed the flush
(`done`) or must retry it (`pending`). `backfill` hands a block every archived batch it has not
processed, so a block added later, an `import --no-blocks` or a failed extraction catches up; an
LLM block without a model takes none, and `backfill` counts the batches waiting for one.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from memcli.blocks.base import BlockContext, LLMBlock, MemoryBlock
from memcli.errors import MemcliError
from memcli.store import longterm
from memcli.words import SET_MODEL

if TYPE_CHECKING:
    from memcli.messages import Message
    from memcli.store.base import FlushRecord, SessionInfo
    from memcli.tokens import Tokenizer

#: How many batches a block is given per put_many call.
CHUNK = 1024


@dataclass(frozen=True)
class FlushedBatch:
    """A flushed batch and whose it is."""

    flush_id: int
    session_id: str
    user_id: str
    messages: list[Message]


@dataclass
class FeedResult:
    """What feeding did: per block, how many batches were processed and how many stay pending,
    with why (`errors`: a failure's reason, when known; `feed` keeps the first, as later ones
    may follow from it); and per LLM block without a model, how many batches wait for one
    (`waiting`: a backfill hands it none)."""

    done: dict[str, int] = field(default_factory=dict)
    pending: dict[str, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    waiting: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.done.values()) + sum(self.pending.values())

    def pending_error(self, again: str) -> MemcliError | None:
        """The error a command ends with while batches stay pending (exit 1): how many, and
        why (each block's `errors`); `again` is the command that retries them. None: none is."""
        still = sum(self.pending.values())
        if not still:
            return None
        why = "; ".join(
            f"{name}: {(self.errors.get(name) or 'no error recorded').rstrip('.')}"
            for name, n in self.pending.items()
            if n
        )
        plural = "batch is" if still == 1 else "batches are"
        return MemcliError(
            f"{still} {plural} still pending ({why})", f"Run `{again}` again once the LLM answers"
        )

    def waiting_note(self, again: str) -> str | None:
        """What to say while LLM blocks without a model have batches waiting for one: which
        blocks, how many batches, and how to hand them over (`again`, the command to run once a
        model is set). None: no batch waits. Running without a model is a choice: not an error."""
        what = [
            f"block {name!r} has {n:,} {'batch' if n == 1 else 'batches'} waiting for a model"
            for name, n in self.waiting.items()
            if n
        ]
        if not what:
            return None
        return (
            f'{"; ".join(what).capitalize()}: set a model ({SET_MODEL}; or model = "..." on'
            f" the block), then run `{again}`."
        )


def feed(
    store: Any,
    blocks: Sequence[MemoryBlock],
    batches: Sequence[FlushedBatch],
    tokenizer: Tokenizer,
    progress: Callable[[int], None] | None = None,
) -> FeedResult:
    """Hand every batch to every block that takes flushes, CHUNK at a time, and record the outcome.

    `progress(n)` is told how many (block, batch) pairs were handed over: after each chunk, and
    as it goes, as the block reports the messages it processed (`MemoryBlock.put_many`).
    """
    result = FeedResult()
    for block in blocks:
        if not block.receives_flushes:
            continue
        result.done.setdefault(block.name, 0)
        result.pending.setdefault(block.name, 0)
        for start in range(0, len(batches), CHUNK):
            chunk = batches[start : start + CHUNK]
            items = [
                (
                    list(b.messages),
                    BlockContext(b.session_id, b.user_id, store, tokenizer, b.flush_id),
                )
                for b in chunk
            ]
            share = _Share(chunk, progress)
            outcomes = block.put_many(items, progress=share.messages)
            with store.transaction():
                for (_, ctx), outcome in zip(items, outcomes, strict=True):
                    assert ctx.flush_id is not None
                    status = "done" if outcome is None else "pending"
                    longterm.mark_flushes(
                        store, block.name, block.scope_key(ctx), [ctx.flush_id], status, outcome
                    )
                    key = "done" if outcome is None else "pending"
                    getattr(result, key)[block.name] += 1
                    if outcome is not None:  # the first failure: later ones may follow from it
                        result.errors.setdefault(block.name, outcome)
            share.finish()
    return result


class _Share:
    """Turns a block's progress in messages into whole batches of a chunk for `progress(n)`:
    a batch counts once as many messages as the chunk holds up to it are processed; the last
    one only when the chunk is recorded (`finish`)."""

    def __init__(self, chunk: Sequence[FlushedBatch], progress: Callable[[int], None] | None):
        self.ends = list(accumulate(max(1, len(b.messages)) for b in chunk))
        self.progress = progress
        self.seen = 0
        self.told = 0

    def messages(self, n: int) -> None:
        self.seen += n
        self._tell(min(bisect_right(self.ends, self.seen), len(self.ends) - 1))

    def finish(self) -> None:
        self._tell(len(self.ends))

    def _tell(self, done: int) -> None:
        if self.progress is not None and done > self.told:
            self.progress(done - self.told)
        self.told = max(self.told, done)


def unprocessed(
    store: Any,
    blocks: Sequence[MemoryBlock],
    sessions: Sequence[SessionInfo],
    *,
    unfed_only: bool = False,
) -> dict[str, list[FlushedBatch]]:
    """Per block, the archived batches it has not processed (or must retry), oldest first;
    with `unfed_only`, only those it was never handed (not the ones it failed on)."""
    todo: dict[str, list[FlushedBatch]] = {}
    messages: dict[int, list[Message]] = {}
    for block in blocks:
        if not block.receives_flushes:
            continue
        todo[block.name] = []
        for info in sessions:
            for record in not_done(store, block, info, unfed_only):
                if record.id not in messages:
                    messages[record.id] = longterm.flush_messages(store, record.id)
                todo[block.name].append(
                    FlushedBatch(record.id, info.id, info.user_id, messages[record.id])
                )
    return todo


def not_done(
    store: Any, block: MemoryBlock, info: SessionInfo, unfed_only: bool = False
) -> list[FlushRecord]:
    """The session's flushes that `block` has not processed (never handed it, or pending; with
    `unfed_only`, never handed it)."""
    key = block.key_for(info.id, info.user_id)
    statuses = longterm.flush_statuses(store, block.name, key, info.id)
    if unfed_only:
        return [r for r in store.list_flushes(info.id) if r.id not in statuses]
    return [r for r in store.list_flushes(info.id) if statuses.get(r.id) != "done"]


def backfill(
    store: Any,
    blocks: Sequence[MemoryBlock],
    sessions: Sequence[SessionInfo],
    tokenizer: Tokenizer,
    progress: Callable[[int], None] | None = None,
    on_total: Callable[[int], None] | None = None,
) -> FeedResult:
    """Hand each block every archived batch of these sessions that it has not processed.

    `on_total(n)` is told first how many (block, batch) pairs there are; running it twice does
    nothing the second time (unless a batch stayed pending). An LLM block without a model is
    handed nothing: `waiting` counts the batches it has not processed.
    """
    todo = unprocessed(store, blocks, sessions)
    if on_total is not None:
        on_total(sum(len(v) for v in todo.values()))
    result = FeedResult()
    for block in blocks:
        if isinstance(block, LLMBlock) and block.llm is None:
            result.waiting[block.name] = sum(len(not_done(store, block, i)) for i in sessions)
        if block.name not in todo:
            continue
        part = feed(store, [block], todo[block.name], tokenizer, progress)
        result.done.update(part.done)
        result.pending.update(part.pending)
        result.errors.update(part.errors)
    return result

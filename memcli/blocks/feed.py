"""Handing flushed batches to blocks, recording what each block processed, and backfilling.

Each block records, per scope (`user:ID` or `session:ID`) and flush, whether it processed the flush
(`done`) or must retry it (`pending`). `backfill` hands a block every archived batch it has not
processed, so a block added later, an `import --no-blocks` or a failed extraction catches up.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from memcli.blocks.base import BlockContext, MemoryBlock
from memcli.store import longterm

if TYPE_CHECKING:
    from memcli.messages import Message
    from memcli.store.base import SessionInfo
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
    """What feeding did: per block, how many batches were processed and how many stay pending."""

    done: dict[str, int] = field(default_factory=dict)
    pending: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.done.values()) + sum(self.pending.values())


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
    store: Any, blocks: Sequence[MemoryBlock], sessions: Sequence[SessionInfo]
) -> dict[str, list[FlushedBatch]]:
    """Per block, the archived batches it has not processed (or must retry), oldest first."""
    todo: dict[str, list[FlushedBatch]] = {}
    messages: dict[int, list[Message]] = {}
    for block in blocks:
        if not block.receives_flushes:
            continue
        todo[block.name] = []
        for info in sessions:
            key = block.key_for(info.id, info.user_id)
            statuses = longterm.flush_statuses(store, block.name, key, info.id)
            for record in store.list_flushes(info.id):
                if statuses.get(record.id) == "done":
                    continue
                if record.id not in messages:
                    messages[record.id] = longterm.flush_messages(store, record.id)
                todo[block.name].append(
                    FlushedBatch(record.id, info.id, info.user_id, messages[record.id])
                )
    return todo


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
    nothing the second time (unless a batch stayed pending).
    """
    todo = unprocessed(store, blocks, sessions)
    if on_total is not None:
        on_total(sum(len(v) for v in todo.values()))
    result = FeedResult()
    for block in blocks:
        if block.name not in todo:
            continue
        part = feed(store, [block], todo[block.name], tokenizer, progress)
        result.done.update(part.done)
        result.pending.update(part.pending)
    return result

"""Facts from whole conversations: what a fact block has not read of a user's stored messages,
in batches, and reading it (`memcli facts extract`, `Facts.extract`).

A fact block reads a session's messages two ways: the flushed batches it is handed (recorded per
flush in `block_flushes`), and the messages still active, which no flush holds (an imported
conversation shorter than the flush threshold, an open chat). Those are read here in batches of
the session's flush size (whole turns: a batch ends before a user message once it holds
`token_flush_size` tokens) and recorded as ranges of message ids per block and scope
(`store.longterm.record_read`). What is recorded is not read again: not by a second run, and not
when those messages are flushed later (`FactBlock.unread`). A run stopped at any point (the LLM
failed, Ctrl-C) goes on from the first batch not recorded; until a block has read all of a
conversation, the conversation is marked (`store.work.mark_unread`), so that `memcli check`
lists what a killed run left unread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memcli.blocks.base import BlockContext, conversation_text
from memcli.blocks.feed import FeedResult, not_done
from memcli.store import longterm, work

if TYPE_CHECKING:
    from memcli.blocks.facts import FactBlock
    from memcli.messages import Message
    from memcli.store.base import SessionInfo
    from memcli.tokens import Tokenizer


@dataclass(frozen=True)
class UnreadBatch:
    """Messages of a session a fact block has not read: of a flush (`flush_id`) it has not
    processed, or active ones (`flush_id` None). Empty for a flush whose messages it read while
    they were active (recorded as done without a request)."""

    block: str
    session_id: str
    user_id: str
    flush_id: int | None
    messages: list[Message]


@dataclass(frozen=True)
class ExtractionPlan:
    """What extraction would send: its batches, and the requests and tokens (of the tokenizer
    given: cl100k) they make. Condensations a long run may trigger come on top."""

    batches: list[UnreadBatch] = field(default_factory=list)
    tokens: int = 0
    #: The fact blocks it plans for (the ones that read its batches).
    blocks: list[FactBlock] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return sum(1 for b in self.batches if b.messages)


def plan_extraction(
    store: Any,
    blocks: Sequence[FactBlock],
    sessions: Sequence[SessionInfo],
    tokenizer: Tokenizer,
) -> ExtractionPlan:
    """Every batch these fact blocks have not read of these sessions, oldest first per block and
    session, with the tokens their requests hold (the prompt with the facts known now, and the
    batch)."""
    batches: list[UnreadBatch] = []
    tokens = 0
    prompts: dict[tuple[str, str], int] = {}  # (the same for every batch of a block's scope)
    for block in blocks:
        for info in sessions:
            key = block.key_for(info.id, info.user_id)
            for batch in unread_batches(store, block, info):
                batches.append(batch)
                if batch.messages:
                    if (block.name, key) not in prompts:
                        prompts[block.name, key] = block.prompt_tokens(store, key, tokenizer)
                    tokens += prompts[block.name, key]
                    tokens += tokenizer.count(conversation_text(batch.messages))
    return ExtractionPlan(batches, tokens, list(blocks))


def unread_batches(store: Any, block: FactBlock, info: SessionInfo) -> list[UnreadBatch]:
    """The session's batches `block` has not read: its flushes not done (less what it read
    while they were active), then its active messages not read, cut at the flush size."""
    key = block.key_for(info.id, info.user_id)
    ranges = longterm.read_ranges(store, block.name, key, info.id)

    def unread(messages: Sequence[Message]) -> list[Message]:
        return [m for m in messages if not _within(m.id, ranges)]

    out: list[UnreadBatch] = []
    for record in not_done(store, block, info):
        messages = unread(longterm.flush_messages(store, record.id))
        out.append(UnreadBatch(block.name, info.id, info.user_id, record.id, messages))
    batch: list[Message] = []
    size = 0
    for m in unread(store.get_messages(info.id, status="active")):
        if batch and size >= info.token_flush_size and m.role == "user":
            out.append(UnreadBatch(block.name, info.id, info.user_id, None, batch))
            batch, size = [], 0
        batch.append(m)
        size += m.tokens or 0
    if batch:
        out.append(UnreadBatch(block.name, info.id, info.user_id, None, batch))
    return out


def _within(message_id: int | None, ranges: Sequence[tuple[int, int]]) -> bool:
    return message_id is not None and any(a <= message_id <= b for a, b in ranges)


def read_batches(
    store: Any,
    blocks: Sequence[FactBlock],
    plan: ExtractionPlan,
    tokenizer: Tokenizer,
    progress: Callable[[int], None] | None = None,
) -> FeedResult:
    """Extract the facts of the plan's batches, one request each, recording each batch as it is
    done (a flush as done, active messages as a read range). A block stops at its first failure:
    that batch and the ones after it stay to read (`pending`, with the reason in `errors`; a
    flush also as pending in `block_flushes`); the next run goes on from there. `progress(1)`
    after each batch."""
    by_name = {b.name: b for b in blocks}
    result = FeedResult()
    failed: set[str] = set()
    # (each conversation marked as being read until its block has read all of it: a run
    # killed on the way leaves the mark, which `memcli check` lists)
    reading = {(b.block, b.session_id, b.user_id) for b in plan.batches if b.messages}
    work.mark_unread(store, sorted(reading))
    left = {(b.block, b.session_id): 0 for b in plan.batches}
    for b in plan.batches:
        left[b.block, b.session_id] += 1
    for batch in plan.batches:
        block = by_name[batch.block]
        result.done.setdefault(block.name, 0)
        result.pending.setdefault(block.name, 0)
        if block.name in failed:
            result.pending[block.name] += 1
            continue
        ctx = BlockContext(batch.session_id, batch.user_id, store, tokenizer, batch.flush_id)
        key = block.scope_key(ctx)
        reason = block.extract(batch.messages, ctx) if batch.messages else None
        if batch.flush_id is not None:
            status = "done" if reason is None else "pending"
            longterm.mark_flushes(store, block.name, key, [batch.flush_id], status, reason)
        elif reason is None:
            ids = [m.id for m in batch.messages if m.id is not None]
            longterm.record_read(store, block.name, key, batch.session_id, ids)
        if reason is None:
            result.done[block.name] += 1
            left[block.name, batch.session_id] -= 1
            if not left[block.name, batch.session_id]:
                work.clear_unread(store, block.name, batch.session_id)
        else:
            failed.add(block.name)
            result.pending[block.name] += 1
            result.errors.setdefault(block.name, reason)
        if progress is not None:
            progress(1)
    return result

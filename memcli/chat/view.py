"""What the chat's panels show, as plain data: taken on the chat's thread, drawn by any UI."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memcli.chat.session import Chat
    from memcli.memory import Flush
    from memcli.messages import Message
    from memcli.store.base import FlushRecord
    from memcli.tool_calls import ToolResult

_FACT = re.compile(r"<fact>(.*?)</fact>", re.DOTALL)


@dataclass(frozen=True)
class FlushMark:
    """A flush to show: how many messages and tokens left short-term memory, and why."""

    messages: int
    tokens: int
    reason: str
    live: bool = False  # it happened in this run (not read back from the store)


@dataclass(frozen=True)
class ShortTerm:
    """The "Short-term" panel: the active window against the budget, and the latest flushes."""

    session_id: str
    user_id: str
    messages: list[Message]
    active_tokens: int
    threshold: float
    token_limit: int
    flush_size: int
    archived: int
    flush_count: int
    flushes: list[FlushMark] = field(default_factory=list)


@dataclass(frozen=True)
class BlockView:
    """One long-term block in the "Long-term" panel."""

    name: str
    priority: int
    kind: str
    tokens: int = 0
    original_tokens: int = 0
    truncated: str | None = None
    content: str = ""
    facts: list[str] = field(default_factory=list)
    hits: list[Any] = field(default_factory=list)
    computed: bool = False


@dataclass(frozen=True)
class LongTerm:
    """The "Long-term" panel: each configured block and what it gave for the last turn."""

    blocks: list[BlockView]
    ready: bool  # False until the blocks have been asked once (models load in the background)


@dataclass(frozen=True)
class Pending:
    """Long-term work not done yet: flushed batches the blocks must still process (an LLM call
    failed: they are retried at later flushes, or by `memcli facts extract --pending`), and the
    newest failure's reason, with its block's name."""

    batches: int = 0
    error: str | None = None

    @property
    def text(self) -> str:
        """e.g. `2 batches pending (facts: LLM call ... failed: ...)`; empty when none."""
        if not self.batches:
            return ""
        noun = "batch" if self.batches == 1 else "batches"
        return f"{self.batches} {noun} pending" + (f" ({self.error})" if self.error else "")


@dataclass(frozen=True)
class Panels:
    short: ShortTerm
    long: LongTerm
    pending: Pending = Pending()


def facts_in(content: str) -> list[str]:
    """The `<fact>...</fact>` entries of a block's content."""
    return [f.strip() for f in _FACT.findall(content) if f.strip()]


def flush_marks(flushes: list[Flush] | list[FlushRecord], live: bool) -> list[FlushMark]:
    marks = []
    for f in flushes:
        count = len(f.message_ids) if hasattr(f, "message_ids") else f.messages  # type: ignore[union-attr]
        marks.append(FlushMark(count, f.tokens, f.reason, live))
    return marks


def short_term(chat: Chat, recent: list[FlushMark] | None = None, keep: int = 3) -> ShortTerm:
    """The short-term panel now; `recent` are flushes seen in this run (else the stored ones)."""
    memory = chat.mem
    info = memory.session()
    if recent:
        marks = recent[-keep:]
    else:
        marks = flush_marks(memory.store.list_flushes(memory.session_key)[-keep:], live=False)
    return ShortTerm(
        session_id=info.name,
        user_id=info.user_id,
        messages=memory.get_all(status="active"),
        active_tokens=info.active_tokens,
        threshold=memory.budget.threshold,
        token_limit=memory.budget.token_limit,
        flush_size=memory.budget.flush_size,
        archived=info.archived_messages,
        flush_count=info.flushes,
        flushes=marks,
    )


def long_term(chat: Chat) -> LongTerm:
    """The long-term panel from the last assembled context (or the configured blocks, not asked yet)."""
    ready = chat.last_context
    contents = {b.name: b for b in ready.context.blocks} if ready else {}
    views = []
    for block in chat.blocks:
        got = contents.get(block.name)
        kind = type(block).__name__
        if got is None:
            views.append(BlockView(block.name, block.priority, kind, computed=ready is not None))
            continue
        views.append(
            BlockView(
                name=block.name,
                priority=block.priority,
                kind=kind,
                tokens=got.tokens,
                original_tokens=got.original_tokens,
                truncated=got.truncated,
                content=got.content,
                facts=facts_in(got.content),
                hits=list(ready.hits.get(block.name, [])) if ready else [],
                computed=True,
            )
        )
    return LongTerm(views, ready is not None)


def pending_work(chat: Chat) -> Pending:
    """The long-term work the chat's blocks have not done for this session's scopes."""
    from memcli.store import longterm

    total, error = 0, None
    for block in chat.blocks:
        if not block.receives_flushes:
            continue
        key = block.key_for(chat.session_id, chat.user_id)
        count, reason = longterm.pending_work(chat.store, block.name, key)
        total += count
        if count and reason and error is None:
            error = f"{block.name}: {' '.join(reason.split())[:160]}"
    return Pending(total, error)


def panels(chat: Chat, recent: list[FlushMark] | None = None) -> Panels:
    return Panels(short_term(chat, recent), long_term(chat), pending_work(chat))


def tool_line(result: ToolResult, width: int = 60) -> str:
    """A memory tool call as the conversation shows it, e.g.
    `→ add_fact(text="Ana is vegan", topics=["food"]) ✓ fact 12`; a refused call ends with
    `✗` and the reason the model was given. Long argument values are cut to `width`."""
    import json

    arguments = result.arguments if isinstance(result.arguments, dict) else {}
    shown = []
    for key, value in arguments.items():
        text = json.dumps(value, ensure_ascii=False)
        shown.append(f"{key}={text if len(text) <= width else text[: width - 1] + '…'}")
    call = f"→ {result.name}({', '.join(shown)})"
    if not result.ok:
        return f"{call} ✗ {result.value}"
    return f"{call} ✓ {_outcome(result.name, result.value)}"


def _outcome(name: str, value: Any) -> str:
    """What a tool call did, in a few words."""
    if isinstance(value, list):
        noun = "hit" if name == "search_memory" else "fact"
        return f"{len(value)} {noun}{'' if len(value) == 1 else 's'}"
    if isinstance(value, dict):
        if "deleted" in value:
            return f"fact {value['deleted']['id']} deleted"
        if "before" in value:
            return f"fact {value['fact']['id']} updated"
        if "added" in value:
            known = "" if value["added"] else " (already known)"
            return f"fact {value['fact']['id']}{known}"
    return "done"

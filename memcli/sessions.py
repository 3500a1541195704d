"""Sessions as the commands and the chat open them: who a session belongs to, which budget it runs
under, a session's report, and the blocks' view of a session (or of none). Importing transcripts
into sessions is `memcli.importing`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memcli.errors import UsageError
from memcli.flush import Budget, BudgetOverride
from memcli.messages import format_time
from memcli.store.base import named, stored_session

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from memcli.blocks.base import MemoryBlock
    from memcli.config import Settings
    from memcli.memory import Context, Memory
    from memcli.messages import Message
    from memcli.store.base import FlushRecord, SessionInfo, Store
    from memcli.tokens import Tokenizer


def owned(store: Store, name: str, user: str | None) -> SessionInfo | None:
    """`user`'s stored session called `name` (None: any user's; `store.base.named`), or None
    when it does not exist yet (another user's session of that name is not theirs)."""
    return named(store, name, user)


def default_budget(settings: Settings) -> BudgetOverride:
    """The budget new sessions get from the settings (token limit, ratio, and flush size: when
    not set, 10% of whichever token limit the session gets)."""
    return BudgetOverride(settings.token_limit, settings.ratio, settings.flush_size)


def budget_for(
    info: SessionInfo | None, default: BudgetOverride, asked: BudgetOverride | None = None
) -> Budget:
    """The budget `asked` for (the flags): a stored session's own with the values asked for in
    place of its values (a new limit without a flush size: 10% of it); a new session takes the
    values asked for, else `default` (the settings', `default_budget`)."""
    from memcli.memory import stored_budget

    asked = asked or BudgetOverride()
    if info is not None:
        return asked.apply(stored_budget(info))
    return asked.over(default).budget()


def budget_rule(
    default: BudgetOverride,
    asked: BudgetOverride | None = None,
    *,
    given: Budget | None = None,
    rebudget: bool = False,
) -> Callable[[SessionInfo | None], Budget | None]:
    """The budget a writing command (import, chat) opens each session with, asked per session.

    A new session: the values `asked` for (the flags), else `given` (an export's session
    record), else `default`. A stored session: None (its stored budget) when the flags and
    `given` ask for nothing else; the budget asked for when `rebudget` (the caller stores it with
    `Memory.rebudget`); otherwise UsageError naming the stored budget and --rebudget. Budget
    options never change a session silently."""
    from memcli.memory import budget_text, stored_budget

    asked = asked or BudgetOverride()

    def rule(info: SessionInfo | None) -> Budget | None:
        if info is None:
            if given is None:
                return budget_for(None, default, asked)
            return asked.apply(given)
        if asked.is_empty and given is None:
            return None
        stored = stored_budget(info)
        wanted = asked.apply(given or stored)
        if wanted == stored:
            return None
        if not rebudget:
            source = (
                "the file's session record asks" if asked.is_empty else "the budget options ask"
            )
            raise UsageError(
                f"session {info.id!r} has the budget {budget_text(stored)}; {source} for"
                f" {budget_text(wanted)}",
                "Leave the budget options out to keep it, or add --rebudget to store the new"
                " one (it flushes what no longer fits)",
            )
        return wanted

    return rule


def session_record(info: SessionInfo) -> dict[str, Any]:
    """A session's info as a JSON-ready record: `memcli inspect`'s summary, the agent tools'."""
    return {
        "session": info.name,
        "user": info.user_id,
        "active_messages": info.active_messages,
        "archived_messages": info.archived_messages,
        "active_tokens": info.active_tokens,
        "threshold": info.threshold,
        "token_limit": info.token_limit,
        "flush_size": info.token_flush_size,
        "ratio": info.chat_history_token_ratio,
        "flushes": info.flushes,
        "created_at": format_time(info.created_at),
        "updated_at": format_time(info.updated_at),
    }


@dataclass(frozen=True)
class Report:
    """A session as `memcli inspect` shows it: its info, its messages and its flushes."""

    info: SessionInfo
    messages: list[Message]
    flushes: list[FlushRecord]
    what_if: WhatIf | None = None

    def summary(self) -> dict[str, Any]:
        return {
            "type": "summary",
            **session_record(self.info),
            "flushes": len(self.flushes),
            **({"what_if": self.what_if.to_dict()} if self.what_if else {}),
        }

    def records(self) -> list[dict[str, Any]]:
        """The messages, the flushes, then the summary, as JSON Lines records."""
        out: list[dict[str, Any]] = [
            {"type": "message", **m.to_dict(stored=True)} for m in self.messages
        ]
        out += [
            {
                "type": "flush",
                "id": f.id,
                "created_at": f.created_at,
                "messages": f.messages,
                "tokens": f.tokens,
                "first_message_id": f.first_message_id,
                "last_message_id": f.last_message_id,
                "reason": f.reason,
            }
            for f in self.flushes
        ]
        out.append(self.summary())
        return out


def report(
    store: Store, session_id: str, *, archived: bool = False, budget: Budget | None = None
) -> Report:
    """The report of the session stored under `session_id` (its key): its active messages
    (every message with `archived`); with `budget`, what the session would flush under that
    budget now (nothing is stored)."""
    info = stored_session(store, session_id)
    messages = store.get_messages(session_id, status=None if archived else "active")
    what_if = None
    if budget is not None:
        from memcli.flush import plan_flush

        window = store.active_window(session_id)
        batches = plan_flush(
            [e.role for e in window],
            [e.tokens for e in window],
            budget.threshold,
            budget.flush_size,
        )
        what_if = WhatIf(
            budget, len(batches), sum(b.count for b in batches), sum(b.tokens for b in batches)
        )
    return Report(info, messages, store.list_flushes(session_id), what_if)


@dataclass(frozen=True)
class WhatIf:
    """A budget a reading command was asked to show, and what the session would flush under it
    now: how many flushes, messages and tokens (`--rebudget` would do exactly that)."""

    budget: Budget
    flushes: int
    messages: int
    tokens: int

    def to_dict(self) -> dict[str, Any]:
        b = self.budget
        return {
            "token_limit": b.token_limit,
            "ratio": b.chat_history_token_ratio,
            "flush_size": b.flush_size,
            "threshold": b.threshold,
            "flushes": self.flushes,
            "messages": self.messages,
            "tokens": self.tokens,
        }


def blocks_view(
    store: Store,
    session_id: str | None,
    *,
    user: str,
    blocks: Sequence[MemoryBlock],
    tokenizer: Tokenizer,
    token_limit: int | None,
    insert_method: str = "system",
    input: str | None = None,
) -> Context:
    """What the blocks hold for a stored session (`session_id`: its key), or with
    `session_id=None` for `user` with an empty chat history (nothing is stored): the context
    `get(input)` would assemble.

    `token_limit` is what the blocks are truncated to: for a stored session, None is its own
    and another is a what-if (nothing is stored); with no session it must be given."""
    from memcli.blocks.base import BlockContext
    from memcli.memory import assemble

    if session_id is not None:
        memory = open_stored(store, session_id, blocks, tokenizer, insert_method)
        if token_limit is None or token_limit == memory.token_limit:
            return memory.context(input)
        active = memory.get_all(status="active")
        return assemble(blocks, active, input, memory.block_context(), token_limit, insert_method)
    if token_limit is None:
        raise UsageError("a token limit is needed for the blocks of no session", "Pass one")
    return assemble(blocks, [], input, BlockContext("", user, store, tokenizer), token_limit)


def open_stored(
    store: Store,
    session_id: str,
    blocks: Sequence[MemoryBlock],
    tokenizer: Tokenizer,
    insert_method: str = "system",
) -> Memory:
    """The Memory of the session stored under `session_id` (its key; SessionNotFound when there
    is none), as its user's."""
    from memcli.memory import Memory

    info = stored_session(store, session_id)
    return Memory(
        store,
        info.name,
        user_id=info.user_id,
        tokenizer=tokenizer,
        memory_blocks=blocks,
        insert_method=insert_method,
    )


#: The longest title a chat session gets from its first message (in characters, "…" included).
TITLE_WIDTH = 60
#: The longest title `/title` takes.
MAX_TITLE = 200


def title_from(text: str) -> str:
    """A chat session's title from its first user message: the text on one line (whitespace
    and control characters made single spaces), cut at a word end to TITLE_WIDTH with "…"."""
    flat = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    if len(flat) <= TITLE_WIDTH:
        return flat
    cut = flat[: TITLE_WIDTH - 1]
    space = cut.rfind(" ")
    if space >= TITLE_WIDTH // 2:
        cut = cut[:space]
    return cut.rstrip(" ,.;:") + "…"


def check_title(title: str) -> str:
    """A title as a person gives it (`/title`): whitespace made single spaces; UsageError when
    it is empty, holds control characters or is longer than MAX_TITLE."""
    from memcli.errors import UsageError
    from memcli.messages import check_name

    text = " ".join(check_name(title, "the title").split())
    if len(text) > MAX_TITLE:
        raise UsageError(
            f"the title has {len(text):,} characters, more than {MAX_TITLE}", "Shorten it"
        )
    return text

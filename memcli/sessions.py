"""Sessions as the commands and the chat open them: who a session belongs to, which budget it runs
under, a transcript imported into sessions, a session's report, and the blocks' view of a session
(or of none)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memcli.errors import SessionNotFound, UsageError
from memcli.flush import Budget

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from memcli.blocks.base import MemoryBlock
    from memcli.config import Settings
    from memcli.memory import Context, Memory
    from memcli.messages import Message
    from memcli.store.base import FlushRecord, SessionInfo, Store
    from memcli.tokens import Tokenizer
    from memcli.transcripts import ImportResult, Record


def require(store: Store, session_id: str) -> SessionInfo:
    """The stored session; SessionNotFound when there is none."""
    info = store.get_session(session_id)
    if info is None:
        raise SessionNotFound(session_id)
    return info


def check_owner(info: SessionInfo | None, user: str | None, hint: str) -> None:
    """Refuse a stored session of another user than `user` (None: any user may open it) with
    UsageError; `hint` says what to do instead, `{owner}` in it standing for the session's user."""
    if info is not None and user is not None and info.user_id != user:
        raise UsageError(
            f"session {info.id!r} belongs to user {info.user_id!r}, not {user!r}",
            hint.replace("{owner}", info.user_id),
        )


def owned(store: Store, session_id: str, user: str | None, hint: str) -> SessionInfo | None:
    """The stored session (None when it does not exist yet), once `check_owner` allows it."""
    info = store.get_session(session_id)
    check_owner(info, user, hint)
    return info


def budget_for(
    info: SessionInfo | None,
    default: tuple[int, float, int | None],
    token_limit: int | None = None,
    ratio: float | None = None,
    flush_size: int | None = None,
) -> Budget:
    """A session's budget: the flags override what a stored session was created with; a new
    session takes the flags, else `default` (token limit, ratio, flush size: the settings)."""
    if info is not None:
        limit = token_limit if token_limit is not None else info.token_limit
        share = ratio if ratio is not None else info.chat_history_token_ratio
        if flush_size is not None:
            size: int | None = flush_size
        elif token_limit is not None:
            size = None  # a new limit with no flush size: 10% of it, as for a new session
        else:
            size = info.token_flush_size
        return Budget(limit, share, size)
    return Budget(
        token_limit if token_limit is not None else default[0],
        ratio if ratio is not None else default[1],
        flush_size if flush_size is not None else default[2],
    )


def budget_rule(
    default: tuple[int, float, int | None],
    token_limit: int | None = None,
    ratio: float | None = None,
    flush_size: int | None = None,
) -> Callable[[SessionInfo | None], Budget | None]:
    """`budget_for` as a Chat asks it on opening each session: None (the stored budget) for a
    stored session when no flag is given."""
    flags_given = any(v is not None for v in (token_limit, ratio, flush_size))

    def rule(info: SessionInfo | None) -> Budget | None:
        if info is not None and not flags_given:
            return None
        return budget_for(info, default, token_limit, ratio, flush_size)

    return rule


@dataclass(frozen=True)
class Opening:
    """How an import opens each session: as whom, with which budget flags, blocks and tokenizer."""

    default_user: str
    default_budget: tuple[int, float, int | None]
    tokenizer: Tokenizer
    blocks: Sequence[MemoryBlock] = ()
    insert_method: str = "system"
    user: str | None = None  # given explicitly: a session of another user is refused
    token_limit: int | None = None
    ratio: float | None = None
    flush_size: int | None = None

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        blocks: Sequence[MemoryBlock] = (),
        *,
        user: str | None = None,
        token_limit: int | None = None,
        ratio: float | None = None,
        flush_size: int | None = None,
    ) -> Opening:
        """As the settings say (user, budget, encoding, insert method); the flags as given."""
        from memcli.tokens import TiktokenTokenizer

        return cls(
            default_user=settings.user,
            default_budget=(settings.token_limit, settings.ratio, settings.flush_size),
            tokenizer=TiktokenTokenizer(settings.encoding),
            blocks=blocks,
            insert_method=settings.insert_method,
            user=user,
            token_limit=token_limit,
            ratio=ratio,
            flush_size=flush_size,
        )


def import_transcript(
    store: Store,
    records: list[Record],
    opening: Opening,
    *,
    session_id: str | None = None,
    put: str = "call",
    feed_blocks: bool = True,
    progress: Callable[[int], None] | None = None,
    block_total: Callable[[int], None] | None = None,
    block_progress: Callable[[int], None] | None = None,
) -> ImportResult:
    """Import records into their sessions (or all into `session_id`), all or nothing, as
    `transcripts.import_records` does; each session is opened as `opening` says, a session of
    another user than `opening.user` refused before anything is stored."""
    from memcli.memory import Memory
    from memcli.transcripts import import_records

    o = opening

    def open_memory(target: str) -> Memory:
        info = owned(store, target, o.user, "Import into another --session, or leave out --user")
        return Memory(
            store,
            target,
            user_id=o.default_user,
            budget=budget_for(info, o.default_budget, o.token_limit, o.ratio, o.flush_size),
            tokenizer=o.tokenizer,
            memory_blocks=o.blocks,
            insert_method=o.insert_method,
        )

    return import_records(
        records,
        store=store,
        open_memory=open_memory,
        session_id=session_id,
        put=put,
        feed_blocks=feed_blocks,
        progress=progress,
        block_total=block_total,
        block_progress=block_progress,
    )


@dataclass(frozen=True)
class Report:
    """A session as `memcli inspect` shows it: its info, its messages and its flushes."""

    info: SessionInfo
    messages: list[Message]
    flushes: list[FlushRecord]

    def summary(self) -> dict[str, Any]:
        info = self.info
        return {
            "type": "summary",
            "session": info.id,
            "user": info.user_id,
            "active_messages": info.active_messages,
            "archived_messages": info.archived_messages,
            "active_tokens": info.active_tokens,
            "threshold": info.threshold,
            "token_limit": info.token_limit,
            "flush_size": info.token_flush_size,
            "ratio": info.chat_history_token_ratio,
            "flushes": len(self.flushes),
            "created_at": info.created_at,
            "updated_at": info.updated_at,
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


def report(store: Store, session_id: str, *, archived: bool = False) -> Report:
    """A stored session's report: its active messages (every message with `archived`)."""
    info = require(store, session_id)
    messages = store.get_messages(session_id, status=None if archived else "active")
    return Report(info, messages, store.list_flushes(session_id))


def blocks_view(
    store: Store,
    session_id: str | None,
    *,
    user: str,
    blocks: Sequence[MemoryBlock],
    tokenizer: Tokenizer,
    token_limit: int,
    insert_method: str = "system",
    input: str | None = None,
) -> Context:
    """What the blocks hold for a stored session, or with `session_id=None` for `user` with an
    empty chat history (nothing is stored): the context `get(input)` would assemble."""
    from memcli.blocks.base import BlockContext
    from memcli.memory import assemble

    if session_id is not None:
        return open_stored(store, session_id, blocks, tokenizer, insert_method).context(input)
    return assemble(blocks, [], input, BlockContext("", user, store, tokenizer), token_limit)


def open_stored(
    store: Store,
    session_id: str,
    blocks: Sequence[MemoryBlock],
    tokenizer: Tokenizer,
    insert_method: str = "system",
) -> Memory:
    """The Memory of a stored session (SessionNotFound when there is none), as its user's."""
    from memcli.memory import Memory

    info = require(store, session_id)
    return Memory(
        store,
        session_id,
        user_id=info.user_id,
        tokenizer=tokenizer,
        memory_blocks=blocks,
        insert_method=insert_method,
    )

"""Memory: a session's short-term window under a token budget, and its long-term blocks."""

from __future__ import annotations

import asyncio
import json
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from os import PathLike
from typing import TYPE_CHECKING

from memcli.blocks.base import BlockContext, MemoryBlock
from memcli.errors import InputError, MessageNotFound, UsageError
from memcli.flush import Budget, BudgetOverride, plan_flush, truncation_order
from memcli.messages import Message, format_time, metadata_json, new_session_id, parse_time
from memcli.store.base import (
    FlushPlan,
    NewMessage,
    SessionInfo,
    Store,
    WindowEntry,
    check_owner,
)
from memcli.tokens import TiktokenTokenizer, Tokenizer, count_messages, message_tokens

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from typing import Any, TypeVar

    T = TypeVar("T")
    from pathlib import Path

    from memcli.blocks.feed import FeedResult

INSERT_METHODS = ("system", "user")
#: After a put found the session changed by another writer twice in a row (once is a writer that
#: took its turn: the put reads the window again and tries once more), this many puts take the
#: locked path (`_put_locked`: the window read under the session's lock) before one tries again
#: without the lock.
CONTENDED_PUTS = 16


@dataclass(frozen=True)
class Flush:
    """A flush that happened: the batch that left short-term memory, and why it has its shape."""

    id: int
    message_ids: list[int]
    tokens: int
    reason: str
    messages: list[Message] = field(default_factory=list)


@dataclass(frozen=True)
class BlockContent:
    """A block's content in an assembled context, and what truncation did to it."""

    name: str
    priority: int
    content: str
    tokens: int
    original_tokens: int
    truncated: str | None = None  # None, "cut" or "dropped"
    original_content: str = ""  # the block's content before truncation


@dataclass(frozen=True)
class Context:
    """What `get()` assembles: the messages to send, and how the blocks contributed."""

    messages: list[Message]
    blocks: list[BlockContent] = field(default_factory=list)
    history_tokens: int = 0
    memory_text: str = ""


class Memory:
    """Short-term memory for one session, with long-term blocks, persisted in a store.

    Every method has an async twin with an `a` prefix (`aput`, `aget`, ...), as in LlamaIndex.
    Threads and tasks may share a Memory, and a store among Memories: the window this object
    holds changes only under `_lock` (the store's own lock when it has one, so that one lock
    orders both)."""

    def __init__(
        self,
        store: Store,
        session_id: str | None = None,
        user_id: str | None = None,
        budget: Budget | None = None,
        tokenizer: Tokenizer | None = None,
        memory_blocks: Iterable[MemoryBlock] = (),
        insert_method: str = "system",
    ) -> None:
        if insert_method not in INSERT_METHODS:
            raise UsageError(f"unknown insert_method {insert_method!r}", "Use 'system' or 'user'")
        self.store = store
        self.tokenizer: Tokenizer = tokenizer or TiktokenTokenizer()
        self.insert_method = insert_method
        self.memory_blocks: list[MemoryBlock] = list(memory_blocks)
        names = [b.name for b in self.memory_blocks]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise UsageError(
                f"block names must be unique; repeated: {', '.join(duplicates)}",
                "Give each block its own name",
            )
        self.session_id = session_id or new_session_id()
        #: A message given with `tokens` set keeps that count (an integration that counts as
        #: its framework does sets this: `MemcliMemory`); otherwise memcli counts every message.
        self.given_tokens = False
        self._lock: threading.RLock = getattr(store, "lock", None) or threading.RLock()
        # One feed at a time: tasks putting at once hand their flushes to the blocks in turn.
        self._feeding = threading.Lock()
        info = store.get_session(self.session_id)
        if info is None:
            self.budget = budget or Budget()
            self.user_id = user_id if user_id is not None else "default"
            info = store.create_session(
                self.session_id,
                self.user_id,
                self.budget.token_limit,
                self.budget.chat_history_token_ratio,
                self.budget.flush_size,
            )
        else:
            # A user's memory is theirs: a stored session opens as its own user's, and naming
            # another user is an error (never a put into someone else's session).
            check_owner(info, user_id, "Open it with user_id={owner}, or leave user_id out")
            self.user_id = info.user_id
            self.budget = stored_budget(info)
            if budget is not None and budget != self.budget:
                raise UsageError(
                    f"session {self.session_id!r} has the budget {budget_text(self.budget)},"
                    f" not {budget_text(budget)}",
                    "Open it without a budget to use its own, or call rebudget() to store another",
                )
        if self.memory_blocks:  # so that the CLI builds these blocks for this session
            from memcli.blocks.registry import record

            record(store, self.session_id, self.memory_blocks)
        # The active window as of session version `_version`: what the flush policy needs of each
        # message, and, once `get()` has asked for them, the messages themselves as a fresh read
        # returns them (index for index with `_window`). Puts and flushes by this object keep both
        # current; any other change to the session bumps its version, and the next use reloads.
        self._window: list[WindowEntry] = []
        self._window_tokens = 0
        self._window_users = 0  # user messages in the window
        self._messages: list[Message] | None = None
        self._version = -2
        self._txn_serial = -1
        self._contended = 0  # puts left to go by the general path (`_store_calls`)

    @classmethod
    def from_defaults(
        cls,
        session_id: str | None = None,
        user_id: str | None = None,
        token_limit: int | None = None,
        chat_history_token_ratio: float | None = None,
        token_flush_size: int | None = None,
        insert_method: str = "system",
        memory_blocks: Iterable[MemoryBlock] = (),
        db: str | Path | Store | None = None,
        tokenizer: Tokenizer | None = None,
    ) -> Memory:
        """A Memory as LlamaIndex builds one; `db` is a SQLite file, a `postgresql://` URL, or a
        store; `db=None` is an in-memory SQLite database.

        A budget value left out (None) is the stored session's, or for a new session LlamaIndex's
        default (30,000 tokens, ratio 0.7, a flush size of 10% of the limit). A stored session
        opened with a value that differs from its own raises UsageError: change a session's
        budget with `rebudget()`."""
        from memcli.store import open_store

        store: Store = open_store(db) if db is None or isinstance(db, str | PathLike) else db
        budget = None
        wanted = BudgetOverride(token_limit, chat_history_token_ratio, token_flush_size)
        if not wanted.is_empty:
            info = store.get_session(session_id) if session_id else None
            budget = wanted.apply(stored_budget(info) if info is not None else Budget())
        return cls(
            store,
            session_id=session_id,
            user_id=user_id,
            budget=budget,
            tokenizer=tokenizer,
            memory_blocks=memory_blocks,
            insert_method=insert_method,
        )

    # -- the short-term window --------------------------------------------------------------------

    @property
    def token_limit(self) -> int:
        return self.budget.token_limit

    @property
    def threshold(self) -> float:
        return self.budget.threshold

    def session(self) -> SessionInfo:
        info = self.store.get_session(self.session_id)
        assert info is not None
        return info

    def _sync(self, messages: bool = False) -> None:
        """Reload the cached active window if the session changed since it was read (the check is
        one indexed SELECT); with `messages`, make sure the window's messages are held too."""
        self._hold(self.store.session_version(self.session_id), messages)
        if messages and self._messages is None:
            # Read after the version: a write slipping in between makes the next check reload.
            self._messages = self.store.get_messages(self.session_id, status="active")
            self._set_window([_window_entry(m) for m in self._messages])
        if self.store.transaction_depth:
            # Read inside a transaction that may yet roll back: good only until the next check.
            self._version = -2

    def _hold(self, version: int, messages: bool = False) -> None:
        """The session is at `version`: read its window again if that is not the one held
        (without `messages`; with it, `_sync` reads the messages next)."""
        if version != self._version:
            self._messages = None
            if not messages:
                self._set_window(self.store.active_window(self.session_id))
            self._version = version

    def _set_window(self, window: list[WindowEntry]) -> None:
        self._window = window
        self._window_tokens = sum(e.tokens for e in window)
        self._window_users = sum(1 for e in window if e.role == "user")

    def _settle(self, nested: bool) -> None:
        """After a write: the window held is the session's at the version its transaction commits.
        Inside a caller's transaction that may still roll back, it is good only until that ends."""
        self._version = -2 if nested else self.store.session_version(self.session_id)

    def _forget(self) -> None:
        """Drop what this object holds of the session: the next use reads it again."""
        self._messages = None
        self._version = -2
        self._txn_serial = -1

    def active_tokens(self) -> int:
        with self._lock:
            self._sync()
            return self._window_tokens

    def _count(self, messages: Sequence[Message]) -> list[int]:
        """Each message's tokens: memcli's count, or the one given with it (`given_tokens`)."""
        if not self.given_tokens:
            return count_messages(messages, self.tokenizer)
        counted = iter(count_messages([m for m in messages if m.tokens is None], self.tokenizer))
        return [m.tokens if m.tokens is not None else next(counted) for m in messages]

    def put(self, message: Message) -> list[Flush]:
        """Store a message, then flush if the window is over budget; return the flushes."""
        return self.put_messages([message])

    def put_messages(self, messages: Sequence[Message], *, feed_blocks: bool = True) -> list[Flush]:
        """Store messages (in one call), then flush once for the call; return the flushes.

        With `feed_blocks=False` the flushed batches are archived but not handed to the blocks.
        """
        return self.put_calls([messages], feed_blocks=feed_blocks)[0]

    def put_calls(
        self,
        calls: Sequence[Sequence[Message]],
        *,
        feed_blocks: bool = True,
        progress: Callable[[int], None] | None = None,
    ) -> list[list[Flush]]:
        """Put several calls in order, exactly as that many `put_messages` calls would.

        One transaction, tokens counted and rows written in bulk: the fast path for imports.
        Returns each call's flushes; `progress(n)` is told how many messages each call put.
        """
        normal = [[_as_message(m) for m in call] for call in calls]
        out = self._store_calls(normal, progress)
        flushes = [f for call_flushes in out for f in call_flushes]
        if feed_blocks and self.memory_blocks and flushes:
            self.feed_blocks_many(flushes)
        return out

    def _store_calls(
        self,
        calls: list[list[Message]],
        progress: Callable[[int], None] | None,
    ) -> list[list[Flush]]:
        """The store part of `put_calls`."""
        messages = [m for call in calls for m in call]
        if not messages:
            return [[] for _ in calls]
        with self._lock:
            try:
                if self._contended:
                    self._contended -= 1
                    if progress is None and not self.store.transaction_depth:
                        out = self._put_locked(calls, messages)
                        if out is not None:
                            return out
                elif progress is None and not self.store.transaction_depth:
                    # (with `progress`, which may raise to undo the put, the general path)
                    for _ in range(2):
                        if self._version < 0:
                            # Read without the session's lock (two indexed reads): the put
                            # checks the version it was planned on, and writes nothing if
                            # another writer came in between.
                            self._sync()
                        out = self._put_at_once(calls, messages)
                        if out is not None:
                            return out
                        self._forget()  # another writer came first: read the window again
                    # Missed twice: writers putting into the session at the same moment. The
                    # next puts read it under its lock (`_put_locked`) rather than fail the
                    # version check and read it twice.
                    self._contended = CONTENDED_PUTS
                return self._put(calls, messages, progress)
            except BaseException:
                self._forget()  # the store rolled back what this object already holds
                raise

    def _put_locked(
        self,
        calls: Sequence[Sequence[Message]],
        messages: list[Message],
    ) -> list[list[Flush]] | None:
        """`_put_at_once` under the session's lock, taken by reading its version: the window read
        again if it changed, then the put (on PostgreSQL one statement in the lock's transaction:
        the lock is held over the version, the window if it changed, the put and the commit, not
        over a put's every statement)."""
        with self.store.transaction():
            self._hold(self.store.session_version(self.session_id))
            return self._put_at_once(calls, messages)

    def _put_at_once(
        self,
        calls: Sequence[Sequence[Message]],
        messages: list[Message],
    ) -> list[list[Flush]] | None:
        """The calls' messages stored and flushed by one store call (`Store.put_window`: one
        statement on PostgreSQL), the flushes planned here on the window held, new messages
        standing in them as -1, -2, ...; None (nothing written) when the session changed since
        the window was read."""
        tokens = self._count(messages)
        # Planned on the window held, which stays as it was until the store has the messages:
        # a write that waits for another process lets other threads read meanwhile.
        held = (self._window, self._window_tokens, self._window_users, self._messages)
        self._window = list(self._window)
        self._messages = None if self._messages is None else list(self._messages)
        planned: list[list[FlushPlan]] = []
        start = 0
        for call in calls:
            end = start + len(call)
            self._extend(call, [-1 - i for i in range(start, end)], tokens[start:end])
            planned.append(self._plan())
            start = end
        after = (self._window, self._window_tokens, self._window_users, self._messages)
        self._window, self._window_tokens, self._window_users, self._messages = held
        done = self.store.put_window(
            self.session_id,
            self._version,
            [NewMessage(m, t) for m, t in zip(messages, tokens, strict=True)],
            [p for call_plans in planned for p in call_plans],
        )
        if done is None:
            return None
        ids, flush_ids, self._version = done
        self._window, self._window_tokens, self._window_users, self._messages = after

        def real(i: int) -> int:
            return ids[-1 - i] if i < 0 else i

        # The new messages (ids -1, -2, ...) are the window's last entries: only they change
        # (the lists are this put's own copies).
        window = self._window
        for k in range(len(window) - 1, -1, -1):
            if window[k].id >= 0:
                break
            window[k] = window[k]._replace(id=real(window[k].id))
        held_messages = self._messages
        if held_messages is not None:
            for k in range(len(held_messages) - 1, -1, -1):
                m = held_messages[k]
                if m.id is None or m.id >= 0:
                    break
                held_messages[k] = replace(m, id=real(m.id))
        out: list[list[Flush]] = []
        given = iter(flush_ids)
        for call_plans in planned:
            flushes = [
                Flush(next(given), [real(i) for i in p.message_ids], p.tokens, p.reason)
                for p in call_plans
            ]
            out.append(self._with_messages(flushes) if flushes else flushes)
        return out

    def _extend(self, call: Sequence[Message], ids: Sequence[int], tokens: Sequence[int]) -> None:
        """Add a call's stored messages to the window held."""
        self._window.extend(
            WindowEntry(i, m.role, t) for m, i, t in zip(call, ids, tokens, strict=True)
        )
        if self._messages is not None:
            self._messages.extend(
                _as_stored(m, i, t, self.session_id)
                for m, i, t in zip(call, ids, tokens, strict=True)
            )
        self._window_tokens += sum(tokens)
        self._window_users += sum(1 for m in call if m.role == "user")

    def _put(
        self,
        calls: Sequence[Sequence[Message]],
        messages: list[Message],
        progress: Callable[[int], None] | None,
    ) -> list[list[Flush]]:
        """Store the calls' messages in one transaction, flushing after each call (having checked
        first, once per transaction, whether another process wrote since the window was read)."""
        out: list[list[Flush]] = []
        with self.store.transaction():
            nested = self.store.transaction_depth > 1
            if self._txn_serial != self.store.txn_serial:
                self._sync()
                self._txn_serial = self.store.txn_serial
            tokens = self._count(messages)
            ids = self.store.append_messages(
                self.session_id, [NewMessage(m, t) for m, t in zip(messages, tokens, strict=True)]
            )
            start = 0
            for call in calls:
                end = start + len(call)
                self._extend(call, ids[start:end], tokens[start:end])
                out.append(self._flush())
                if progress is not None:
                    progress(len(call))
                start = end
            self._settle(nested)
        return out

    def flush_now(self) -> list[Flush]:
        """Flush one batch now, whatever the budget (the newest complete turn still stays)."""
        try:
            with self._lock, self.store.transaction():
                nested = self.store.transaction_depth > 1
                self._sync()
                flushes = self._flush(threshold=0, max_batches=1)
                self._settle(nested)
        except BaseException:
            self._forget()
            raise
        if self.memory_blocks:
            for flush in flushes:
                self.feed_blocks(flush)
        return flushes

    def rebudget(self, budget: Budget, *, feed_blocks: bool = True) -> list[Flush]:
        """Store another budget for the session and flush now what it no longer holds, as a put
        would (whole turns, oldest first); return the flushes. The only way a stored session's
        budget changes: opening it with another budget is an error."""
        old = self.budget
        try:
            with self._lock, self.store.transaction():
                nested = self.store.transaction_depth > 1
                self._sync()
                self.store.update_session_budget(
                    self.session_id,
                    budget.token_limit,
                    budget.chat_history_token_ratio,
                    budget.flush_size,
                )
                self.budget = budget
                flushes = self._flush()
                self._settle(nested)
        except BaseException:
            self.budget = old
            self._forget()
            raise
        if feed_blocks and self.memory_blocks and flushes:
            self.feed_blocks_many(flushes)
        return flushes

    def _flush(self, threshold: float | None = None, max_batches: int | None = None) -> list[Flush]:
        """Archive the batches the flush policy picks (each one a transaction)."""
        planned = self._plan(threshold, max_batches)
        flushes = []
        for ids, tokens, reason in planned:
            with self.store.transaction():
                flush_id = self.store.archive(self.session_id, ids, tokens, reason)
            flushes.append(Flush(flush_id, ids, tokens, reason))
        return self._with_messages(flushes)

    def _plan(
        self, threshold: float | None = None, max_batches: int | None = None
    ) -> list[FlushPlan]:
        """The batches the flush policy picks from the window held; the window held then starts
        after them (the caller archives them)."""
        threshold = self.budget.threshold if threshold is None else threshold
        if self._window_tokens <= threshold:
            return []
        window = self._window
        if len(window) <= 1 or (self._window_users == 1 and window[0].role == "user"):
            # A single message or a single turn never flushes: skip planning (an agent's long
            # turn would otherwise replan the whole window on every put).
            return []
        batches = plan_flush(
            [e.role for e in window],
            [e.tokens for e in window],
            threshold,
            self.budget.flush_size,
        )[:max_batches]
        if not batches:
            return []
        moved = batches[-1].end
        self._window = window[moved:]
        if self._messages is not None:
            self._messages = self._messages[moved:]
        self._window_tokens -= sum(b.tokens for b in batches)
        self._window_users -= sum(1 for e in window[:moved] if e.role == "user")
        return [
            FlushPlan([e.id for e in window[b.start : b.end]], b.tokens, b.describe())
            for b in batches
        ]

    def _with_messages(self, flushes: list[Flush]) -> list[Flush]:
        """The flushes with their messages, read back as stored, when blocks are to be fed."""
        if not self.memory_blocks:
            return flushes
        return [
            replace(f, messages=self.store.get_messages(self.session_id, ids=f.message_ids))
            for f in flushes
        ]

    def feed_blocks(self, flush: Flush) -> None:
        """Hand a flushed batch to every block, recording which processed it."""
        self.feed_blocks_many([flush])

    def feed_blocks_many(
        self, flushes: Sequence[Flush], progress: Callable[[int], None] | None = None
    ) -> FeedResult:
        """Hand flushed batches to the blocks in bulk (one embedding call for many batches)."""
        from memcli.blocks.feed import FlushedBatch, feed

        batches = [
            FlushedBatch(f.id, self.session_id, self.user_id, list(f.messages)) for f in flushes
        ]
        with self._feeding:
            return feed(self.store, self.memory_blocks, batches, self.tokenizer, progress)

    def block_context(self, flush_id: int | None = None) -> BlockContext:
        return BlockContext(self.session_id, self.user_id, self.store, self.tokenizer, flush_id)

    # -- reading ----------------------------------------------------------------------------------

    def get_all(self, status: str | None = None) -> list[Message]:
        """Every message of the session in order (active and archived), or those of one status."""
        if status not in (None, "active", "archived"):
            raise UsageError(f"unknown status {status!r}", "Use 'active' or 'archived'")
        return self.store.get_messages(self.session_id, status=status)

    def get(self, input: str | Message | None = None) -> list[Message]:
        """The active messages with long-term memory inserted, as they would go to an LLM."""
        return self.context(input).messages

    def context(self, input: str | Message | None = None) -> Context:
        """Assemble what `get()` returns, with each block's content and what truncation cut."""
        got = self._history()
        return got if isinstance(got, Context) else self._assemble(*got, input)

    def _history(self) -> Context | tuple[list[Message], int]:
        """The active messages and their tokens, as of now (reread if the session changed); with
        no blocks, the context itself (it is those messages)."""
        with self._lock:
            self._sync(messages=True)
            assert self._messages is not None
            # A copy, made under the lock: puts extend the list held. (Message is frozen.)
            if not self.memory_blocks:
                return Context(list(self._messages), [], self._window_tokens, "")
            return list(self._messages), self._window_tokens

    def _assemble(
        self, history: list[Message], tokens: int, input: str | Message | None
    ) -> Context:
        return assemble(
            self.memory_blocks,
            history,
            input,
            self.block_context(),
            self.budget.token_limit,
            self.insert_method,
            history_tokens=tokens,  # the same sum, kept as puts and flushes go
        )

    # -- writing ----------------------------------------------------------------------------------

    def set(self, messages: Sequence[Message]) -> None:
        """Replace the active window with these messages; archived history is kept. No flush."""
        messages = [_as_message(m) for m in messages]
        tokens = self._count(messages)
        rows = [NewMessage(m, t) for m, t in zip(messages, tokens, strict=True)]

        def replace_window() -> None:
            self.store.delete_active(self.session_id)
            self.store.append_messages(self.session_id, rows)

        self._write(replace_window)

    def reset(self) -> int:
        """Delete the session's messages (active and archived); return how many. Blocks keep theirs."""
        return self._write(self._delete_messages)

    def _delete_messages(self) -> int:
        return self.store.delete_messages(self.session_id)

    def delete_message(self, message_id: int) -> Message:
        """Delete one of the session's messages (active or archived) for good; return it as it
        was. The window, the session's counts, the flush that archived it and the facts naming
        it stay consistent (see `memcli.store.forget`); MessageNotFound when the session holds
        no message of that id."""
        with self._lock:
            try:
                deleted = self.store.delete_message(self.session_id, message_id)
            finally:
                self._forget()
        if deleted is None:
            raise MessageNotFound(self.session_id, message_id)
        return deleted

    def _write(self, change: Callable[[], T]) -> T:
        """Run `change` in one transaction under the lock; the window is read again after."""
        with self._lock:
            try:
                with self.store.transaction():
                    return change()
            finally:
                self._forget()

    # -- async ------------------------------------------------------------------------------------
    # Each call runs its sync twin in a worker thread of the store's (`store_worker`): the event
    # loop only hands the call over and awaits it, so it goes on with other tasks while SQLite
    # writes, PostgreSQL answers, or another process holds the write lock. Several threads per
    # store, so that a read goes on while a write waits for another process; the store's lock
    # orders their statements. Blocks' work after a put (an LLM, an embedding model) runs in
    # asyncio's default executor, so that it does not hold a thread of the store's.

    async def aput(self, message: Message) -> list[Flush]:
        """`put`, for asyncio."""
        return (await self.aput_calls([[message]]))[0]

    async def aput_messages(
        self, messages: Sequence[Message], *, feed_blocks: bool = True
    ) -> list[Flush]:
        """`put_messages`, for asyncio."""
        return (await self.aput_calls([messages], feed_blocks=feed_blocks))[0]

    async def aput_calls(
        self, calls: Sequence[Sequence[Message]], *, feed_blocks: bool = True
    ) -> list[list[Flush]]:
        """`put_calls`, for asyncio."""
        normal = [[_as_message(m) for m in call] for call in calls]
        out = await _in_worker(self.store, self._store_calls, normal, None)
        flushes = [f for call_flushes in out for f in call_flushes]
        if feed_blocks and self.memory_blocks and flushes:
            await asyncio.to_thread(self.feed_blocks_many, flushes)
        return out

    async def aflush_now(self) -> list[Flush]:
        """`flush_now`, for asyncio."""
        return await _in_worker(self.store, self.flush_now)

    async def aget(self, input: str | Message | None = None) -> list[Message]:
        """`get`, for asyncio."""
        return (await self.acontext(input)).messages

    async def acontext(self, input: str | Message | None = None) -> Context:
        """`context`, for asyncio."""
        return await _in_worker(self.store, self.context, input)

    async def aget_all(self, status: str | None = None) -> list[Message]:
        """`get_all`, for asyncio."""
        return await _in_worker(self.store, self.get_all, status)

    async def aset(self, messages: Sequence[Message]) -> None:
        """`set`, for asyncio."""
        await _in_worker(self.store, self.set, messages)

    async def areset(self) -> int:
        """`reset`, for asyncio."""
        return await _in_worker(self.store, self.reset)

    async def adelete_message(self, message_id: int) -> Message:
        """`delete_message`, for asyncio."""
        return await _in_worker(self.store, self.delete_message, message_id)


#: Threads per store that run the async API's calls (one would queue a read behind a write that
#: waits for another process; more would only wait for the store's lock).
STORE_WORKERS = 4
_workers: weakref.WeakKeyDictionary[Store, ThreadPoolExecutor] = weakref.WeakKeyDictionary()
_workers_lock = threading.Lock()


def store_worker(store: Store) -> ThreadPoolExecutor:
    """The threads that run the async API's calls on `store` (made at its first async call, gone
    with the store)."""
    with _workers_lock:
        worker = _workers.get(store)
        if worker is None:
            worker = ThreadPoolExecutor(STORE_WORKERS, thread_name_prefix="memcli-store")
            _workers[store] = worker
        return worker


async def _in_worker(store: Store, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` in a worker thread of the store's, the event loop free meanwhile."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(store_worker(store), fn, *args)


def stored_budget(info: SessionInfo) -> Budget:
    """The budget a stored session runs under."""
    return Budget(info.token_limit, info.chat_history_token_ratio, info.token_flush_size)


def budget_text(budget: Budget) -> str:
    """A budget as `inspect` shows it: `4,000 × 0.7 (flush 400)`."""
    return (
        f"{budget.token_limit:,} × {budget.chat_history_token_ratio} (flush {budget.flush_size:,})"
    )


def assemble(
    blocks: Sequence[MemoryBlock],
    history: Sequence[Message],
    input: str | Message | None,
    ctx: BlockContext,
    token_limit: int,
    insert_method: str = "system",
    *,
    history_tokens: int | None = None,
) -> Context:
    """The context for `history` plus `input`: block contents, truncated by priority to fit
    `token_limit`, rendered into the messages. `history_tokens`, when the caller knows it, saves
    summing the history's tokens."""
    tokenizer = ctx.tokenizer
    if history_tokens is None:
        history_tokens = sum(
            m.tokens if m.tokens is not None else message_tokens(m, tokenizer) for m in history
        )
    if not blocks:
        return Context(list(history), [], history_tokens, "")
    shown = list(history)
    if input is not None:
        shown.append(input if isinstance(input, Message) else Message("user", input))
    contents: dict[str, str] = {}
    for block in blocks:
        text = block.get(shown, ctx)
        if text:
            contents[block.name] = text
    full = dict(contents)
    original = {name: tokenizer.count(text) for name, text in contents.items()}
    truncated = truncate_blocks(blocks, contents, original, history_tokens, token_limit, tokenizer)
    out = []
    for block in blocks:
        if block.name not in original:
            continue
        text = contents.get(block.name, "")
        out.append(
            BlockContent(
                name=block.name,
                priority=block.priority,
                content=text,
                tokens=tokenizer.count(text) if text else 0,
                original_tokens=original[block.name],
                truncated=truncated.get(block.name),
                original_content=full[block.name],
            )
        )
    memory_text = render_memory([(b.name, b.content) for b in out if b.content])
    messages = insert_memory(history, memory_text, insert_method)
    return Context(messages, out, history_tokens, memory_text)


def truncate_blocks(
    blocks: Sequence[MemoryBlock],
    contents: dict[str, str],
    original: dict[str, int],
    history_tokens: int,
    token_limit: int,
    tokenizer: Tokenizer,
) -> dict[str, str]:
    """Cut block contents in place until blocks + history fit the token limit; return, per block
    touched, "cut" or "dropped". Priority 0 and the history are never cut."""
    over = sum(original.values()) + history_tokens - token_limit
    what: dict[str, str] = {}
    if over <= 0:
        return what
    order = [blocks[i] for i in truncation_order([b.priority for b in blocks])]
    for block in order:
        if over <= 0:
            break
        text = contents.get(block.name)
        if not text:
            continue
        shorter = block.truncate(text, over)
        before = tokenizer.count(text)
        if shorter:
            over -= before - tokenizer.count(shorter)
            if shorter != text:
                contents[block.name] = shorter
                what[block.name] = "cut"
        else:
            over -= before
            del contents[block.name]
            what[block.name] = "dropped"
    for block in order:
        if over <= 0:
            break
        text = contents.pop(block.name, None)
        if text:
            over -= tokenizer.count(text)
            what[block.name] = "dropped"
    return what


def _as_message(value: Message | dict[str, object]) -> Message:
    if isinstance(value, Message):
        return value
    if not isinstance(value, dict):  # (a dict goes on to from_dict, which names what is wrong)
        raise InputError(
            f"a message must be a Message or a dict, not {type(value).__name__}",
            'Pass Message("user", "...") or {"role": "user", "content": "..."}',
        )
    return Message.from_dict(value)


def _as_stored(message: Message, id: int, tokens: int, session_id: str) -> Message:
    """`message` as a read returns it once stored active under `id`: metadata through JSON (a
    tuple comes back a list, `{}` as None), the timestamp through its stored text."""
    text = metadata_json(message.metadata)
    return replace(
        message,
        metadata=json.loads(text) if text else None,
        timestamp=parse_time(format_time(message.timestamp)) if message.timestamp else None,
        id=id,
        tokens=tokens,
        status="active",
        flush_id=None,
        session_id=session_id,
    )


def _window_entry(message: Message) -> WindowEntry:
    assert message.id is not None and message.tokens is not None
    return WindowEntry(message.id, message.role, message.tokens)


def render_memory(blocks: Sequence[tuple[str, str]]) -> str:
    """`<memory>`, each block as `<NAME>`, content, `</NAME>` on their own lines, `</memory>`."""
    if not blocks:
        return ""
    parts = ["<memory>"]
    for name, content in blocks:
        parts.extend((f"<{name}>", content, f"</{name}>"))
    parts.append("</memory>")
    return "\n".join(parts)


def insert_memory(
    history: Sequence[Message], memory_text: str, insert_method: str
) -> list[Message]:
    """Put the rendered memory into the messages, as the reference does."""
    result = list(history)
    if not memory_text:
        return result
    if insert_method == "system":
        for i, m in enumerate(result):
            if m.role == "system":
                result[i] = m.with_content(f"{memory_text}\n{m.content}")
                return result
        return [Message("system", memory_text), *result]
    for i in range(len(result) - 1, -1, -1):
        if result[i].role == "user":
            result[i] = result[i].with_content(f"{memory_text}\n{result[i].content}")
            return result
    result.append(Message("user", memory_text))
    return result

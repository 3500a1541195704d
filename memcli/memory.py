"""Memory: a session's short-term window under a token budget, and its long-term blocks: the
LlamaIndex-shaped API (`put`, `put_messages`, `get`, `get_all`, `set`, `reset`, `flush_now`,
`search`, and their async twins; `aopen` opens one off the event loop; `close`/`aclose`, `with`
and `async with` end it). How its writes reach the store alongside other writers:
`memcli.writer`; what `get()` assembles: `memcli.context`; the connections and threads the
Memories of one database share in a process: `memcli.store.pool`."""

from __future__ import annotations

import asyncio
import os
import threading
import warnings
import weakref
from datetime import UTC
from functools import partial
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING

from memcli.blocks.base import BlockContext, MemoryBlock
from memcli.context import Context, assemble
from memcli.errors import InputError, MessageNotFound, UsageError
from memcli.flush import Budget, BudgetOverride
from memcli.memory_facts import FactMethods
from memcli.messages import Message, new_session_id, validate_session_id, validate_user
from memcli.store.base import NewMessage, SessionInfo, Store, named
from memcli.tokens import TiktokenTokenizer, Tokenizer, count_messages
from memcli.writer import Flush, SessionWriter, in_worker, stop_worker

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from datetime import datetime
    from types import TracebackType

    from memcli.blocks.background import Background
    from memcli.blocks.feed import FeedResult, FlushedBatch
    from memcli.search.retriever import Retriever
    from memcli.search.types import SearchResult

INSERT_METHODS = ("system", "user")


class Memory(FactMethods):
    """Short-term memory for one session, with long-term blocks, persisted in a store.

    Every method has an async twin with an `a` prefix (`aput`, `aget`, ...), as in LlamaIndex.
    Threads and tasks may share a Memory, and a store among Memories: the window this object
    holds (`memcli.writer.SessionWriter`) changes only under its lock (the store's own lock when
    it has one, so that one lock orders both).

    A Memory is closed when done with: `close()` (`await aclose()`), or `with` / `async with`.
    That gives back the store `from_defaults`/`aopen` opened (the connection and the worker
    threads, shared with the other Memories of the database in this process:
    `memcli.store.pool`) and drops the search's index; a store passed in is the caller's to
    close. Closing twice is harmless; any other use of a closed Memory raises UsageError. A
    Memory collected unclosed gives its store back too, with a ResourceWarning (as a file does).

    `home` is memcli's home folder, where `search` finds the embedding model the CLI exported
    (`models/`) and keeps the index files of a database that has none beside it (`indexes/`);
    None is the CLI's home (`$MEMCLI_HOME`, else the platform's data folder: `memcli info`
    shows it)."""

    def __init__(
        self,
        store: Store,
        session_id: str | None = None,
        user_id: str | None = None,
        budget: Budget | None = None,
        tokenizer: Tokenizer | None = None,
        memory_blocks: Iterable[MemoryBlock] = (),
        insert_method: str = "system",
        home: str | Path | None = None,
        background: Background | None = None,
    ) -> None:
        """`background`: flushed batches go to it (fed to the blocks on its thread: the put
        returns at once) instead of being fed before the put returns."""
        if insert_method not in INSERT_METHODS:
            raise UsageError(f"unknown insert_method {insert_method!r}", "Use 'system' or 'user'")
        self._store = store
        #: What closing frees (no reference back to this object: `_collected` runs without it).
        self._held = _Held(store)
        self._finalizer = weakref.finalize(self, _collected, self._held)
        self._finalizer.atexit = False  # (at exit the process ends: nothing to warn about)
        self.tokenizer: Tokenizer = tokenizer or TiktokenTokenizer()
        self.insert_method = insert_method
        self.background = background
        self.memory_blocks: list[MemoryBlock] = list(memory_blocks)
        names = [b.name for b in self.memory_blocks]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise UsageError(
                f"block names must be unique; repeated: {', '.join(duplicates)}",
                "Give each block its own name",
            )
        self.session_id = validate_session_id(session_id) if session_id else new_session_id()
        #: A message given with `tokens` set keeps that count (an integration that counts as
        #: its framework does sets this: `MemcliMemory`); otherwise memcli counts every message.
        self.given_tokens = False
        # One feed at a time: tasks putting at once hand their flushes to the blocks in turn.
        self._feeding = threading.Lock()
        self.home = Path(home).expanduser() if home is not None else None
        self._retriever: Retriever | None = None  # made at the first search
        self._searching = threading.Lock()  # one search at a time on the retriever
        # A session is its user's: `user_id`'s session of that name (another user's of the same
        # name is another session), or without one any user's stored session, as its user's.
        user = validate_user(user_id) if user_id is not None else None
        info = named(store, self.session_id, user)
        if info is None:
            budget = budget or Budget()
            self.user_id = user if user is not None else "default"
            info = store.create_session(
                self.session_id,
                self.user_id,
                budget.token_limit,
                budget.chat_history_token_ratio,
                budget.flush_size,
            )
        else:
            self.user_id = info.user_id
            stored = stored_budget(info)
            if budget is not None and budget != stored:
                raise UsageError(
                    f"session {self.session_id!r} has the budget {budget_text(stored)},"
                    f" not {budget_text(budget)}",
                    "Open it without a budget to use its own, or call rebudget() to store another",
                )
            budget = stored
        #: The store's key of the session (`SessionInfo.id`): what the store's calls take.
        self.session_key = info.id
        if self.memory_blocks:  # so that the CLI builds these blocks for this session
            from memcli.blocks.registry import record

            record(store, self.session_key, self.memory_blocks)
        self._held.blocks = self.memory_blocks
        # The writer calls back through a weak reference: no cycle keeps a dropped Memory alive.
        me = weakref.ref(self)
        self._session_writer = SessionWriter(
            store,
            self.session_key,
            budget,
            lambda messages: _alive(me)._count(messages),
            lambda: bool(_alive(me).memory_blocks),
        )

    # -- life cycle -------------------------------------------------------------------------------

    @property
    def store(self) -> Store:
        """The store the session is kept in (UsageError once the Memory is closed)."""
        if self._held.closed:
            raise _closed_error(self.session_id)
        return self._store

    @property
    def _writer(self) -> SessionWriter:
        if self._held.closed:
            raise _closed_error(self.session_id)
        return self._session_writer

    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
        return self._held.closed

    def close(self) -> None:
        """Give back what this Memory opened: the store `from_defaults`/`aopen` opened (its
        connection and worker threads, or this Memory's share of them), the search's index
        (`search`), and a VectorBlock's index over that store once it is closed. What is stored
        stays; a store passed in stays open (the caller's). Twice is harmless."""
        self._finalizer.detach()
        self._held.close()

    async def aclose(self) -> None:
        """`close`, for asyncio (in a worker thread of the store's: a PostgreSQL connection goes
        back to its pool, the last Memory of a database stops its threads)."""
        if self._held.closed:
            return
        await in_worker(self._store, self.close)

    def __enter__(self) -> Memory:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> Memory:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

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
        home: str | Path | None = None,
        pool_size: int | None = None,
    ) -> Memory:
        """A Memory as LlamaIndex builds one; `db` is a SQLite file, a `postgresql://` URL, or a
        store; `db=None` is an in-memory SQLite database. `home`: see `Memory`. Close it when
        done (`close()`, or `with Memory.from_defaults(...) as memory:`).

        The Memories of one file or URL in a process share its connections and worker threads
        (`memcli.store.pool`): SQLite, one connection; PostgreSQL, a pool of up to `pool_size`
        connections (default `memcli.store.pool.POOL_SIZE`, 10; a larger size asked later grows
        it), each serving some of the open Memories: opening never waits for one.

        A budget value left out (None) is the stored session's, or for a new session LlamaIndex's
        default (30,000 tokens, ratio 0.7, a flush size of 10% of the limit). A stored session
        opened with a value that differs from its own raises UsageError: change a session's
        budget with `rebudget()`.

        This connects to the database (migrating it if it is older) and reads the session: in a
        coroutine, use `await Memory.aopen(...)`, which does that off the event loop."""
        if db is not None and not isinstance(db, str | PathLike):
            return cls._build(db, None, session_id, user_id, token_limit,
                              chat_history_token_ratio, token_flush_size, insert_method,
                              memory_blocks, tokenizer, home)  # fmt: skip
        store, release = _acquire(db, pool_size)
        return cls._build(store, release, session_id, user_id, token_limit,
                          chat_history_token_ratio, token_flush_size, insert_method,
                          memory_blocks, tokenizer, home)  # fmt: skip

    @classmethod
    def _build(
        cls,
        store: Store,
        release: Callable[[], None] | None,
        session_id: str | None,
        user_id: str | None,
        token_limit: int | None,
        chat_history_token_ratio: float | None,
        token_flush_size: int | None,
        insert_method: str,
        memory_blocks: Iterable[MemoryBlock],
        tokenizer: Tokenizer | None,
        home: str | Path | None,
    ) -> Memory:
        """`from_defaults` on a store; `release` gives it back (called here if this fails, else
        when the Memory closes; None: the store is the caller's)."""
        try:
            budget = None
            wanted = BudgetOverride(token_limit, chat_history_token_ratio, token_flush_size)
            if not wanted.is_empty:
                user = validate_user(user_id) if user_id is not None else None
                info = named(store, session_id, user) if session_id else None
                budget = wanted.apply(stored_budget(info) if info is not None else Budget())
            memory = cls(
                store,
                session_id=session_id,
                user_id=user_id,
                budget=budget,
                tokenizer=tokenizer,
                memory_blocks=memory_blocks,
                insert_method=insert_method,
                home=home,
            )
        except BaseException:
            if release is not None:
                release()
            raise
        memory._held.release = release
        return memory

    @classmethod
    async def aopen(
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
        home: str | Path | None = None,
        pool_size: int | None = None,
    ) -> Memory:
        """`from_defaults`, for asyncio: the connection, the migrations and the session's read
        or creation run in a worker thread (for a store given, one of its own: those of the
        async methods), and the event loop goes on with other tasks meanwhile. Close it
        when done: `async with await Memory.aopen(...) as memory:` (or `await aclose()`)."""
        if db is not None and not isinstance(db, str | PathLike):
            store: Store = db
            release = None
        else:
            store, release = await asyncio.to_thread(_acquire, db, pool_size)
        build = partial(
            cls._build,
            store,
            release,
            session_id,
            user_id,
            token_limit,
            chat_history_token_ratio,
            token_flush_size,
            insert_method,
            list(memory_blocks),
            tokenizer,
            home,
        )
        try:
            return await in_worker(store, build)
        except asyncio.CancelledError:
            # (`build` gives the store back if it fails; cancelled while it ran, it may not have)
            if release is not None:
                release()
            raise

    # -- the short-term window --------------------------------------------------------------------

    @property
    def budget(self) -> Budget:
        """The session's token budget (another one is stored by `rebudget()`)."""
        return self._writer.budget

    @property
    def token_limit(self) -> int:
        return self.budget.token_limit

    @property
    def threshold(self) -> float:
        return self.budget.threshold

    def session(self) -> SessionInfo:
        info = self.store.get_session(self.session_key)
        assert info is not None
        return info

    def active_tokens(self) -> int:
        return self._writer.active_tokens()

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
        out = self._writer.put_calls(normal, progress)
        flushes = [f for call_flushes in out for f in call_flushes]
        if feed_blocks and self.memory_blocks and flushes:
            self._hand_over(flushes)
        return out

    def _hand_over(self, flushes: Sequence[Flush]) -> None:
        """The flushed batches to the blocks: fed now, or handed to `background`."""
        if self.background is None:
            self.feed_blocks_many(flushes)
            return
        self.background.submit(self.memory_blocks, self._batches(flushes), self.tokenizer)

    def flush_now(self) -> list[Flush]:
        """Flush one batch now, whatever the budget (the newest complete turn still stays)."""
        flushes = self._writer.flush_now()
        if self.memory_blocks and flushes:
            self._hand_over(flushes)
        return flushes

    def rebudget(self, budget: Budget, *, feed_blocks: bool = True) -> list[Flush]:
        """Store another budget for the session and flush now what it no longer holds, as a put
        would (whole turns, oldest first); return the flushes. The only way a stored session's
        budget changes: opening it with another budget is an error."""
        flushes = self._writer.rebudget(budget)
        if feed_blocks and self.memory_blocks and flushes:
            self._hand_over(flushes)
        return flushes

    def feed_blocks(self, flush: Flush) -> None:
        """Hand a flushed batch to every block, recording which processed it."""
        self.feed_blocks_many([flush])

    def feed_blocks_many(
        self, flushes: Sequence[Flush], progress: Callable[[int], None] | None = None
    ) -> FeedResult:
        """Hand flushed batches to the blocks in bulk (one embedding call for many batches)."""
        from memcli.blocks.feed import feed

        with self._feeding:
            return feed(
                self.store, self.memory_blocks, self._batches(flushes), self.tokenizer, progress
            )

    def _batches(self, flushes: Sequence[Flush]) -> list[FlushedBatch]:
        from memcli.blocks.feed import FlushedBatch

        return [
            FlushedBatch(f.id, self.session_key, self.user_id, list(f.messages)) for f in flushes
        ]

    def block_context(self, flush_id: int | None = None) -> BlockContext:
        return BlockContext(self.session_key, self.user_id, self.store, self.tokenizer, flush_id)

    # -- reading ----------------------------------------------------------------------------------

    def get_all(self, status: str | None = None) -> list[Message]:
        """Every message of the session in order (active and archived), or those of one status."""
        if status not in (None, "active", "archived"):
            raise UsageError(f"unknown status {status!r}", "Use 'active' or 'archived'")
        return self.store.get_messages(self.session_key, status=status)

    def get(self, input: str | Message | None = None) -> list[Message]:
        """The active messages with long-term memory inserted, as they would go to an LLM."""
        return self.context(input).messages

    def context(self, input: str | Message | None = None) -> Context:
        """Assemble what `get()` returns, with each block's content and what truncation cut."""
        history, tokens = self._writer.active()
        if not self.memory_blocks:
            return Context(history, [], tokens, "")
        return assemble(
            self.memory_blocks,
            history,
            input,
            self.block_context(),
            self.budget.token_limit,
            self.insert_method,
            history_tokens=tokens,  # the same sum, kept as puts and flushes go
        )

    def search(
        self,
        query: str,
        k: int = 5,
        mode: str = "hybrid",
        since: datetime | None = None,
        until: datetime | None = None,
        *,
        session_only: bool = False,
    ) -> SearchResult:
        """The stored messages of the memory's user (every session of theirs; with
        `session_only`, this session's) that best match `query`, best first: `memcli search`'s
        search. `mode` is `hybrid` (words and meaning), `lexical` (words only: no model loaded)
        or `vector`; `since`/`until` bound each message's time (`until` excluded; a time without
        a zone is UTC, as a Message's timestamp). Short-term messages are found too.

        The model is the home's (`home`: the CLI's export, made there once at the first search
        that needs it; the vectors the CLI and a VectorBlock made are the ones searched).
        Messages not embedded yet are embedded first (up to `SearchOptions.embed_limit`)."""
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise UsageError(f"k must be a whole number >= 1, not {k!r}", "Ask for at least one")
        with self._searching:
            return self.retriever().search(
                query,
                k=k,
                user_id=self.user_id,
                session_id=self.session_key if session_only else None,
                since=_utc(since),
                until=_utc(until),
                mode=mode,
            )

    def retriever(self) -> Retriever:
        """The Retriever `search` runs (made at the first call, its index kept loaded)."""
        store = self.store  # (UsageError once closed)
        if self._retriever is None:
            from memcli.search.onnx import OnnxEmbedder
            from memcli.search.retriever import Retriever

            home = self.home if self.home is not None else default_home()
            self._retriever = Retriever(
                store, OnnxEmbedder(home / "models"), index_dir=home / "indexes"
            )
            self._held.retriever = self._retriever
        return self._retriever

    # -- writing ----------------------------------------------------------------------------------

    def set(self, messages: Sequence[Message]) -> None:
        """Replace the active window with these messages; archived history is kept. No flush."""
        messages = [_as_message(m) for m in messages]
        tokens = self._count(messages)
        rows = [NewMessage(m, t) for m, t in zip(messages, tokens, strict=True)]

        def replace_window() -> None:
            self.store.delete_active(self.session_key)
            self.store.append_messages(self.session_key, rows)

        self._writer.write(replace_window)

    def reset(self) -> int:
        """Delete the session's messages (active and archived); return how many. Blocks keep theirs."""
        return self._writer.write(self._delete_messages)

    def _delete_messages(self) -> int:
        return self.store.delete_messages(self.session_key)

    def delete_message(self, message_id: int) -> Message:
        """Delete one of the session's messages (active or archived) for good; return it as it
        was. The window, the session's counts, the flush that archived it and the facts naming
        it stay consistent (see `memcli.store.forget`); MessageNotFound when the session holds
        no message of that id."""
        with self._writer.lock:
            try:
                deleted = self.store.delete_message(self.session_key, message_id)
            finally:
                self._writer.forget()
        if deleted is None:
            raise MessageNotFound(self.session_id, message_id)
        return deleted

    # -- async ------------------------------------------------------------------------------------
    # Each call runs its sync twin in a worker thread of the store's (`writer.store_worker`): the
    # event loop goes on with other tasks meanwhile. Blocks' work after a put (an LLM, an
    # embedding model) runs in asyncio's default executor, so that it does not hold a thread of
    # the store's.

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
        out = await in_worker(self.store, self._writer.put_calls, normal, None)
        flushes = [f for call_flushes in out for f in call_flushes]
        if feed_blocks and self.memory_blocks and flushes:
            await asyncio.to_thread(self._hand_over, flushes)
        return out

    async def aflush_now(self) -> list[Flush]:
        """`flush_now`, for asyncio."""
        return await in_worker(self.store, self.flush_now)

    async def aget(self, input: str | Message | None = None) -> list[Message]:
        """`get`, for asyncio."""
        return (await self.acontext(input)).messages

    async def acontext(self, input: str | Message | None = None) -> Context:
        """`context`, for asyncio."""
        return await in_worker(self.store, self.context, input)

    async def aget_all(self, status: str | None = None) -> list[Message]:
        """`get_all`, for asyncio."""
        return await in_worker(self.store, self.get_all, status)

    async def aset(self, messages: Sequence[Message]) -> None:
        """`set`, for asyncio."""
        await in_worker(self.store, self.set, messages)

    async def areset(self) -> int:
        """`reset`, for asyncio."""
        return await in_worker(self.store, self.reset)

    async def adelete_message(self, message_id: int) -> Message:
        """`delete_message`, for asyncio."""
        return await in_worker(self.store, self.delete_message, message_id)

    async def asearch(
        self,
        query: str,
        k: int = 5,
        mode: str = "hybrid",
        since: datetime | None = None,
        until: datetime | None = None,
        *,
        session_only: bool = False,
    ) -> SearchResult:
        """`search`, for asyncio (in asyncio's default executor, as the blocks' embedding work:
        the model does not hold a thread of the store's)."""
        search = partial(self.search, query, k, mode, since, until, session_only=session_only)
        return await asyncio.to_thread(search)


class _Held:
    """What a Memory frees when it closes, or when it is collected unclosed (`_collected`): the
    store it opened (`release`, None for a store passed in), its retriever's index, and the
    VectorBlocks' indexes over the store once the store is closed. Holds no reference to the
    Memory."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.release: Callable[[], None] | None = None
        self.retriever: Retriever | None = None
        self.blocks: list[MemoryBlock] = []
        self.closed = False
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            retriever, self.retriever = self.retriever, None
            release, self.release = self.release, None
        if retriever is not None:
            close_index = getattr(retriever.vectors, "close", None)
            if callable(close_index):
                close_index()
        if release is None:
            return
        release()
        if getattr(self.store, "closed", False):  # the last Memory of its database
            for block in self.blocks:
                forget = getattr(block, "forget_store", None)
                if callable(forget):
                    forget(self.store)


def _collected(held: _Held) -> None:
    """A Memory collected unclosed: what it held is freed, with a ResourceWarning."""
    if held.release is not None and not held.closed:
        warnings.warn(
            "unclosed memcli.Memory: close it (`close()`, `with`, `async with`) when done",
            ResourceWarning,
            stacklevel=2,
        )
    held.close()


def _alive(ref: weakref.ReferenceType[Memory]) -> Memory:
    memory = ref()
    if memory is None:  # (the writer is used only through its Memory)
        raise UsageError("this Memory is gone", "Keep a reference to the Memory while using it")
    return memory


def _closed_error(session_id: str) -> UsageError:
    return UsageError(
        f"the Memory of session {session_id!r} is closed",
        "Open it again (Memory.from_defaults or Memory.aopen) to use it",
    )


def _acquire(
    db: str | PathLike[str] | None, pool_size: int | None
) -> tuple[Store, Callable[[], None]]:
    """The store `from_defaults` opens for `db`, and how to give it back: the process's shared
    one for a file or URL (`memcli.store.pool`); an in-memory database of its own for None."""
    from memcli.store import open_store, pool

    pool.check_pool_size(pool_size)
    if db is None:
        store = open_store(None)
        return store, partial(_close_own, store)
    shared = pool.acquire(os.fspath(db), pool_size)
    return shared, partial(pool.release, shared)


def _close_own(store: Store) -> None:
    """A store of the Memory's own closed, with its worker threads."""
    store.close()
    stop_worker(store)


def default_home() -> Path:
    """memcli's home folder as the CLI resolves it (`memcli.config.default_home`:
    `$MEMCLI_HOME`, else the platform's data folder), for a Memory given no `home`."""
    from memcli.config import default_home

    return default_home(os.environ)


def stored_budget(info: SessionInfo) -> Budget:
    """The budget a stored session runs under."""
    return Budget(info.token_limit, info.chat_history_token_ratio, info.token_flush_size)


def budget_text(budget: Budget) -> str:
    """A budget as `inspect` shows it: `4,000 × 0.7 (flush 400)`."""
    return (
        f"{budget.token_limit:,} × {budget.chat_history_token_ratio} (flush {budget.flush_size:,})"
    )


def _utc(time: datetime | None) -> datetime | None:
    """A time without a zone taken as UTC (as a Message's timestamp is)."""
    return time.replace(tzinfo=UTC) if time is not None and time.tzinfo is None else time


def _as_message(value: Message | dict[str, object]) -> Message:
    if isinstance(value, Message):
        return value
    if not isinstance(value, dict):  # (a dict goes on to from_dict, which names what is wrong)
        raise InputError(
            f"a message must be a Message or a dict, not {type(value).__name__}",
            'Pass Message("user", "...") or {"role": "user", "content": "..."}',
        )
    return Message.from_dict(value)

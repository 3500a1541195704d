"""A Memory's writes to its session, one writer among several (threads, tasks, processes): the
active window it holds between calls and keeps in step with the others, the puts (at once, under
the session's lock, in a transaction), the flushes, and the threads that run the async API's calls
on a store.

`Memory` (memcli.memory) is the API; this is how its writes reach the store when other writers
may be writing the same session."""

from __future__ import annotations

import asyncio
import json
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from memcli.flush import Budget, plan_flush
from memcli.messages import Message, format_time, metadata_json, parse_time
from memcli.store.base import FlushPlan, NewMessage, Store, WindowEntry

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any, TypeVar

    T = TypeVar("T")

#: After a put found the session changed by another writer twice in a row (once is a writer that
#: took its turn: the put reads the window again and tries once more), this many puts take the
#: locked path (`_put_locked`: the window read under the session's lock) before one tries again
#: without the lock.
CONTENDED_PUTS = 16


@dataclass(frozen=True)
class Flush:
    """A flush that happened: the batch that left short-term memory, and why it has its shape.

    `put`, `put_messages`, `flush_now` and `rebudget` return the flushes they caused, oldest
    first; `memcli inspect` lists a session's."""

    #: The flush's id in the store (the archived messages' `Message.flush_id`).
    id: int
    #: The ids of the messages it archived, in order: whole turns, oldest first.
    message_ids: list[int]
    #: Their tokens, as the budget counts them.
    tokens: int
    #: Why the batch ends where it does, in words (`memcli inspect` shows it, `Batch.describe`):
    #: "reached the flush size" or "queue down to one", then e.g. "extended by 1 so the queue
    #: starts with a user message", "newest turn kept".
    reason: str
    #: The messages themselves, as stored (archived), when the memory has blocks to feed them
    #: to; empty otherwise (read them by `message_ids`: `Memory.get_all("archived")`).
    messages: list[Message] = field(default_factory=list)


class SessionWriter:
    """A session's active window as of session version `version`, held between calls, and the
    writes that keep it current.

    It holds what the flush policy needs of each message (`window`), and, once a read has asked
    for them, the messages themselves as a fresh read returns them (`messages`, index for index
    with `window`). Puts and flushes through this object keep both current; any other change to
    the session bumps its version, and the next use reloads. The window changes only under `lock`
    (the store's own lock when it has one, so that one lock orders both).

    `count` gives each message's tokens; `reads_flushed()` tells whether the flushes returned
    carry their messages (read back as stored: the blocks are to be fed)."""

    def __init__(
        self,
        store: Store,
        session_id: str,
        budget: Budget,
        count: Callable[[Sequence[Message]], list[int]],
        reads_flushed: Callable[[], bool],
    ) -> None:
        self.store = store
        self.session_id = session_id
        self.budget = budget
        self.count = count
        self.reads_flushed = reads_flushed
        self.lock: threading.RLock = getattr(store, "lock", None) or threading.RLock()
        self.window: list[WindowEntry] = []
        self.window_tokens = 0
        self.window_users = 0  # user messages in the window
        self.messages: list[Message] | None = None
        self.version = -2
        self._txn_serial = -1
        self.contended = 0  # puts left to go by the locked path (`_put_locked`)

    # -- the window held ---------------------------------------------------------------------------

    def sync(self, messages: bool = False) -> None:
        """Reload the cached active window if the session changed since it was read (the check is
        one indexed SELECT); with `messages`, make sure the window's messages are held too."""
        self.hold(self.store.session_version(self.session_id), messages)
        if messages and self.messages is None:
            # Read after the version: a write slipping in between makes the next check reload.
            self.messages = self.store.get_messages(self.session_id, status="active")
            self._set_window([_window_entry(m) for m in self.messages])
        if self.store.transaction_depth:
            # Read inside a transaction that may yet roll back: good only until the next check.
            self.version = -2

    def hold(self, version: int, messages: bool = False) -> None:
        """The session is at `version`: read its window again if that is not the one held
        (without `messages`; with it, `sync` reads the messages next)."""
        if version != self.version:
            self.messages = None
            if not messages:
                self._set_window(self.store.active_window(self.session_id))
            self.version = version

    def _set_window(self, window: list[WindowEntry]) -> None:
        self.window = window
        self.window_tokens = sum(e.tokens for e in window)
        self.window_users = sum(1 for e in window if e.role == "user")

    def settle(self, nested: bool) -> None:
        """After a write: the window held is the session's at the version its transaction commits.
        Inside a caller's transaction that may still roll back, it is good only until that ends."""
        self.version = -2 if nested else self.store.session_version(self.session_id)

    def forget(self) -> None:
        """Drop what this object holds of the session: the next use reads it again."""
        self.messages = None
        self.version = -2
        self._txn_serial = -1

    def active_tokens(self) -> int:
        """The active window's tokens, as of now."""
        with self.lock:
            self.sync()
            return self.window_tokens

    def active(self) -> tuple[list[Message], int]:
        """The active messages and their tokens, as of now (read again if the session changed)."""
        with self.lock:
            self.sync(messages=True)
            assert self.messages is not None
            # A copy, made under the lock: puts extend the list held. (Message is frozen.)
            return list(self.messages), self.window_tokens

    # -- puts ----------------------------------------------------------------------------------------

    def put_calls(
        self,
        calls: list[list[Message]],
        progress: Callable[[int], None] | None,
    ) -> list[list[Flush]]:
        """Store the calls' messages, flushing after each call; return each call's flushes.

        Outside a transaction and without `progress`, by one store call planned on the window
        held (`_put_at_once`); when other writers keep moving the session, under its lock for a
        while (`_put_locked`); otherwise in one transaction, a flush after each call (`_put`)."""
        messages = [m for call in calls for m in call]
        if not messages:
            return [[] for _ in calls]
        with self.lock:
            try:
                if self.contended:
                    self.contended -= 1
                    if progress is None and not self.store.transaction_depth:
                        out = self._put_locked(calls, messages)
                        if out is not None:
                            return out
                elif progress is None and not self.store.transaction_depth:
                    # (with `progress`, which may raise to undo the put, the general path)
                    for _ in range(2):
                        if self.version < 0:
                            # Read without the session's lock (two indexed reads): the put
                            # checks the version it was planned on, and writes nothing if
                            # another writer came in between.
                            self.sync()
                        out = self._put_at_once(calls, messages)
                        if out is not None:
                            return out
                        self.forget()  # another writer came first: read the window again
                    # Missed twice: writers putting into the session at the same moment. The
                    # next puts read it under its lock (`_put_locked`) rather than fail the
                    # version check and read it twice.
                    self.contended = CONTENDED_PUTS
                return self._put(calls, messages, progress)
            except BaseException:
                self.forget()  # the store rolled back what this object already holds
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
            self.hold(self.store.session_version(self.session_id))
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
        tokens = self.count(messages)
        # Planned on the window held, which stays as it was until the store has the messages:
        # a write that waits for another process lets other threads read meanwhile.
        held = (self.window, self.window_tokens, self.window_users, self.messages)
        self.window = list(self.window)
        self.messages = None if self.messages is None else list(self.messages)
        planned: list[list[FlushPlan]] = []
        start = 0
        for call in calls:
            end = start + len(call)
            self._extend(call, [-1 - i for i in range(start, end)], tokens[start:end])
            planned.append(self._plan())
            start = end
        after = (self.window, self.window_tokens, self.window_users, self.messages)
        self.window, self.window_tokens, self.window_users, self.messages = held
        done = self.store.put_window(
            self.session_id,
            self.version,
            [NewMessage(m, t) for m, t in zip(messages, tokens, strict=True)],
            [p for call_plans in planned for p in call_plans],
        )
        if done is None:
            return None
        ids, flush_ids, self.version = done
        self.window, self.window_tokens, self.window_users, self.messages = after

        def real(i: int) -> int:
            return ids[-1 - i] if i < 0 else i

        # The new messages (ids -1, -2, ...) are the window's last entries: only they change
        # (the lists are this put's own copies).
        window = self.window
        for k in range(len(window) - 1, -1, -1):
            if window[k].id >= 0:
                break
            window[k] = window[k]._replace(id=real(window[k].id))
        held_messages = self.messages
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
        self.window.extend(
            WindowEntry(i, m.role, t) for m, i, t in zip(call, ids, tokens, strict=True)
        )
        if self.messages is not None:
            self.messages.extend(
                _as_stored(m, i, t, self.session_id)
                for m, i, t in zip(call, ids, tokens, strict=True)
            )
        self.window_tokens += sum(tokens)
        self.window_users += sum(1 for m in call if m.role == "user")

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
                self.sync()
                self._txn_serial = self.store.txn_serial
            tokens = self.count(messages)
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
            self.settle(nested)
        return out

    # -- flushes and other writes --------------------------------------------------------------------

    def flush_now(self) -> list[Flush]:
        """Flush one batch now, whatever the budget (the newest complete turn still stays)."""
        try:
            with self.lock, self.store.transaction():
                nested = self.store.transaction_depth > 1
                self.sync()
                flushes = self._flush(threshold=0, max_batches=1)
                self.settle(nested)
        except BaseException:
            self.forget()
            raise
        return flushes

    def rebudget(self, budget: Budget) -> list[Flush]:
        """Store another budget for the session and flush what it no longer holds."""
        old = self.budget
        try:
            with self.lock, self.store.transaction():
                nested = self.store.transaction_depth > 1
                self.sync()
                self.store.update_session_budget(
                    self.session_id,
                    budget.token_limit,
                    budget.chat_history_token_ratio,
                    budget.flush_size,
                )
                self.budget = budget
                flushes = self._flush()
                self.settle(nested)
        except BaseException:
            self.budget = old
            self.forget()
            raise
        return flushes

    def write(self, change: Callable[[], T]) -> T:
        """Run `change` in one transaction under the lock; the window is read again after."""
        with self.lock:
            try:
                with self.store.transaction():
                    return change()
            finally:
                self.forget()

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
        if self.window_tokens <= threshold:
            return []
        window = self.window
        if len(window) <= 1 or (self.window_users == 1 and window[0].role == "user"):
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
        self.window = window[moved:]
        if self.messages is not None:
            self.messages = self.messages[moved:]
        self.window_tokens -= sum(b.tokens for b in batches)
        self.window_users -= sum(1 for e in window[:moved] if e.role == "user")
        return [
            FlushPlan([e.id for e in window[b.start : b.end]], b.tokens, b.describe())
            for b in batches
        ]

    def _with_messages(self, flushes: list[Flush]) -> list[Flush]:
        """The flushes with their messages, read back as stored, when blocks are to be fed."""
        if not self.reads_flushed():
            return flushes
        return [
            replace(f, messages=self.store.get_messages(self.session_id, ids=f.message_ids))
            for f in flushes
        ]


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


# -- the async API's threads --------------------------------------------------------------------
# Each async call runs its sync twin in a worker thread of the store's: the event loop only hands
# the call over and awaits it, so it goes on with other tasks while SQLite writes, PostgreSQL
# answers, or another process holds the write lock. Several threads per store, so that a read goes
# on while a write waits for another process; the store's lock orders their statements.

#: Threads per store that run the async API's calls (one would queue a read behind a write that
#: waits for another process; more would only wait for the store's lock).
STORE_WORKERS = 4
_workers: weakref.WeakKeyDictionary[Store, ThreadPoolExecutor] = weakref.WeakKeyDictionary()
_workers_lock = threading.Lock()


def store_worker(store: Store) -> ThreadPoolExecutor:
    """The threads that run the async API's calls on `store` (made at its first async call, gone
    with the store): for a store the Memories of a database share (`memcli.store.pool`), the
    database's, shared too and stopped with its last Memory."""
    from memcli.store.pool import workers

    shared = workers(store)
    if shared is not None:
        return shared
    with _workers_lock:
        worker = _workers.get(store)
        if worker is None:
            worker = ThreadPoolExecutor(STORE_WORKERS, thread_name_prefix="memcli-store")
            _workers[store] = worker
        return worker


async def in_worker(store: Store, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` in a worker thread of the store's, the event loop free meanwhile."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(store_worker(store), fn, *args)


def stop_worker(store: Store) -> None:
    """Stop the threads `store_worker` made for a store of its own (its owner closes it); they
    end once what they run is done."""
    with _workers_lock:
        worker = _workers.pop(store, None)
    if worker is not None:
        worker.shutdown(wait=False)

"""Long-term work beside the conversation: flushed batches fed to the blocks on a thread of their
own, so that a chat's next turn (or an agent's next call) never waits for fact extraction,
summaries or embedding.

A `Background` is one daemon thread per chat or server, with its own store connection when it is
given a way to open one (`reopen`: SQLite connections serve one thread at a time; the shared
store, serialised by its lock, otherwise). Jobs run in order; each is `blocks.feed.feed` of some
batches, recorded in the store as it always is (done, or pending with the reason). A batch not
fed yet is in the store already: archived, with no block record (`memcli check` lists it, `memcli
blocks backfill` feeds it). So stopping waits for nothing: `close()` returns at once, the batches
not fed stay as they are, and the next chat in their session (`resume`) or a backfill feeds them.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memcli.blocks.feed import FeedResult, FlushedBatch, feed, unprocessed
from memcli.errors import MemcliError
from memcli.words import plural, shell_arg

if TYPE_CHECKING:
    from memcli.blocks.base import MemoryBlock
    from memcli.store.base import SessionInfo, Store
    from memcli.tokens import Tokenizer


@dataclass(frozen=True)
class Fed:
    """What one job did: `batches` fed to the blocks, and per block what stayed pending and why
    (`result`; `failed` counts the batches some block could not process)."""

    batches: int
    result: FeedResult

    @property
    def failed(self) -> int:
        return max(self.result.pending.values(), default=0)

    @property
    def error(self) -> str | None:
        """The first failure of the job, with its block's name (`facts: LLM call ... failed`)."""
        for name, n in self.result.pending.items():
            if n:
                reason = self.result.errors.get(name) or "no error recorded"
                return f"{name}: {' '.join(reason.split())[:160]}"
        return None


@dataclass(frozen=True)
class WorkStatus:
    """Long-term work of this run: batches `waiting` (queued or being fed), `done` and `failed`
    (some block left them pending: they are retried later), the newest failure's reason."""

    waiting: int = 0
    done: int = 0
    failed: int = 0
    error: str | None = None

    @property
    def text(self) -> str:
        """e.g. `long-term: 2 batches in progress`; empty when nothing waits."""
        if not self.waiting:
            return ""
        return f"long-term: {plural(self.waiting, 'batch')} in progress"


@dataclass
class _Job:
    """Feed `batches` to `blocks`; or, with `sessions`, what these sessions' blocks were never
    handed (read from the store on the thread). `ids`: the flush ids it holds as waiting."""

    blocks: Sequence[MemoryBlock]
    batches: list[FlushedBatch]
    tokenizer: Tokenizer
    ids: set[int] = field(default_factory=set)
    sessions: list[SessionInfo] | None = None


class Background:
    """One daemon thread that feeds flushed batches to blocks, in the order they were handed in.

    `reopen()` opens the thread's own store connection (called on the thread, at its first job);
    without it the thread uses `store`. `on_fed(fed)` is called on the thread after each job
    (a UI redraws its panels, plain mode says what failed)."""

    def __init__(
        self,
        store: Store,
        reopen: Callable[[], Store] | None = None,
        on_fed: Callable[[Fed], None] | None = None,
    ) -> None:
        self.store = store
        self.reopen = reopen
        self.on_fed = on_fed
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._waiting: set[int] = set()  # flush ids queued or being fed
        self._open = 0  # jobs queued or running
        self._done = 0
        self._failed = 0
        self._error: str | None = None
        self._closed = False
        self._thread: threading.Thread | None = None
        self._own: Store | None = None

    # -- handing work over -------------------------------------------------------------------------

    def submit(
        self, blocks: Sequence[MemoryBlock], batches: Sequence[FlushedBatch], tokenizer: Tokenizer
    ) -> None:
        """Feed these batches to these blocks in the background (a batch already waiting is
        not queued twice). After `close()`, nothing is queued: the batches stay unfed, in the
        store, for the next chat or a backfill."""
        with self._lock:
            fresh = [b for b in batches if b.flush_id not in self._waiting]
            if fresh:
                ids = {b.flush_id for b in fresh}
                self._waiting |= ids
                self._queue(_Job(blocks, fresh, tokenizer, ids))

    def resume(
        self, blocks: Sequence[MemoryBlock], sessions: Sequence[SessionInfo], tokenizer: Tokenizer
    ) -> None:
        """Feed the batches of these sessions that a block was never handed (a chat that quit
        before its blocks were fed); the store is read on the thread, not here. Batches a block
        failed on are left to its own retries (`retry_pending`) and to `memcli blocks backfill`."""
        with self._lock:
            self._queue(_Job(blocks, [], tokenizer, sessions=list(sessions)))

    def _queue(self, job: _Job) -> None:
        """(Under the lock.)"""
        job.blocks = [b for b in job.blocks if b.receives_flushes]
        if self._closed or not job.blocks:
            self._waiting -= job.ids
            return
        self._open += 1
        self._jobs.put(job)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="memcli-longterm", daemon=True)
            self._thread.start()

    # -- status ------------------------------------------------------------------------------------

    def status(self) -> WorkStatus:
        with self._lock:
            return WorkStatus(len(self._waiting), self._done, self._failed, self._error)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every batch handed over so far is fed (or `timeout` seconds); True when
        none waits. A program that needs the blocks' work done before it goes on calls this;
        a chat never does."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._open, timeout)

    def close(self) -> int:
        """Stop: no more jobs are taken, nothing is waited for. Return how many batches were
        left unfed (they stay in the store: the next chat in their session or `memcli blocks
        backfill` feeds them). The thread ends after the job it is running, if any; it closes
        its own connection then. An idle thread is waited for (it only closes its connection:
        so the store's last connection, which checkpoints the WAL, is closed by the time the
        program ends)."""
        with self._lock:
            self._closed = True
            left = len(self._waiting)
            while True:  # the queued jobs will not run
                try:
                    dropped = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if dropped is not None:
                    self._open -= 1
                    self._waiting -= dropped.ids
            self._idle.notify_all()
            idle = not self._open
        self._jobs.put(None)
        thread = self._thread
        if idle and thread is not None and thread is not threading.current_thread():
            thread.join()
        return left

    # -- the thread --------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                job = self._jobs.get()
                if job is None:  # (close: the queued jobs were taken out)
                    return
                fed = self._feed(job)
                with self._lock:
                    self._open -= 1
                    self._waiting -= job.ids
                    self._done += fed.batches - fed.failed
                    self._failed += fed.failed
                    if fed.error is not None:
                        self._error = fed.error
                    self._idle.notify_all()
                if self.on_fed is not None and fed.batches:
                    try:
                        self.on_fed(fed)
                    except (
                        Exception
                    ) as error:  # (the caller's: the work goes on, the status says it)
                        with self._lock:
                            self._error = f"after feeding: {type(error).__name__}: {error}"
        finally:
            own, self._own = self._own, None
            if own is not None:
                own.close()

    def _connection(self) -> Store:
        if self.reopen is None:
            return self.store
        if self._own is None:
            self._own = self.reopen()
        return self._own

    def _feed(self, job: _Job) -> Fed:
        try:
            store = self._connection()
            if job.sessions is None:
                return Fed(len(job.batches), feed(store, job.blocks, job.batches, job.tokenizer))
            # Resumed: each block is fed the batches it has no record of (another may have them).
            todo = unprocessed(store, job.blocks, job.sessions, unfed_only=True)
            with self._lock:
                job.ids = {b.flush_id for batches in todo.values() for b in batches}
                job.ids -= self._waiting
                self._waiting |= job.ids
            result = FeedResult()
            for block in job.blocks:
                batches = [b for b in todo.get(block.name, []) if b.flush_id in job.ids]
                if batches:
                    part = feed(store, [block], batches, job.tokenizer)
                    result.done.update(part.done)
                    result.pending.update(part.pending)
                    result.errors.update(part.errors)
            return Fed(len(job.ids), result)
        except Exception as error:  # a store or block failure: the batches stay unfed
            reason = str(error) if isinstance(error, MemcliError) else type(error).__name__
            result = FeedResult(
                pending={b.name: len(job.ids) for b in job.blocks},
                errors={b.name: reason for b in job.blocks},
            )
            return Fed(len(job.ids), result)


def left_note(left: int, session_id: str, user: str = "default") -> str | None:
    """What to say on quitting with `left` batches not fed yet (None: none): the chat that
    finishes them names the session, and its user when not the default one."""
    if not left:
        return None
    verb = "waits" if left == 1 else "wait"
    whose = "" if user == "default" else f" --user {shell_arg(user)}"
    return (
        f"{plural(left, 'batch')} of long-term memory {verb}; the next chat in this session"
        f" (`memcli chat --session {shell_arg(session_id)}{whose}`) or `memcli blocks backfill`"
        " finishes them."
    )

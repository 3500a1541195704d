"""The async API: the same results as the sync one, safe for many tasks and threads at once,
and blocks' slow work kept off the event loop."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fakes import WordTokenizer

from memcli import FactBlock, Memory, Message, SQLiteStore, StaticBlock
from memcli.blocks.base import BlockContext, MemoryBlock
from memcli.store import Store, open_store
from memcli.store import facts as fact_store

#: How long a test waits for something that should happen at once (a safety net, not a measure).
PATIENCE_S = 30.0


def small(store: Store, session: str = "s", blocks: Sequence[MemoryBlock] = ()) -> Memory:
    return Memory.from_defaults(
        session_id=session,
        token_limit=60,
        chat_history_token_ratio=0.5,
        token_flush_size=10,
        db=store,
        memory_blocks=blocks,
        tokenizer=WordTokenizer(),
    )


def turns(n: int, tag: str = "") -> list[Message]:
    out = []
    for i in range(n):
        out.append(Message("user", f"{tag} question {i} about the weather today"))
        out.append(Message("assistant", f"{tag} answer {i} it is sunny"))
    return out


def shape(flushes: Sequence[object]) -> list[tuple[object, ...]]:
    return [(f.id, f.message_ids, f.tokens, f.reason) for f in flushes]  # type: ignore[attr-defined]


def check_invariants(store: Any, memory: Memory) -> None:
    """Archived messages belong to a flush of theirs, counters match the rows, the cached window
    is the stored one, and memcli's own check finds nothing."""
    everything = memory.get_all()
    active = [m for m in everything if m.status == "active"]
    archived = [m for m in everything if m.status == "archived"]
    flushes = store.list_flushes(memory.session_id)
    assert sum(f.messages for f in flushes) == len(archived)
    assert {m.flush_id for m in archived} == {f.id for f in flushes}
    info = memory.session()
    assert info.active_messages == len(active) and info.archived_messages == len(archived)
    assert info.active_tokens == sum(m.tokens or 0 for m in active)
    assert memory.active_tokens() == info.active_tokens
    assert memory.get() == active
    # The window stays under the threshold after each put, unless it holds a single turn.
    users = sum(1 for m in active if m.role == "user")
    assert info.active_tokens <= memory.threshold or users <= 1
    assert store.check() == []


def test_async_results_equal_the_sync_ones() -> None:
    sync, asynced = small(SQLiteStore()), small(SQLiteStore())
    messages = turns(12)

    sync_flushes = [shape(sync.put(m)) for m in messages[:10]]
    sync_flushes.append(shape(sync.put_messages(messages[10:16])))
    sync_flushes += [shape(f) for f in sync.put_calls([messages[16:20], messages[20:]])]
    sync_view = (sync.get("and now?"), sync.get_all(), sync.get_all("archived"), sync.context())

    async def run() -> tuple[list[object], tuple[object, ...]]:
        flushes = [shape(await asynced.aput(m)) for m in messages[:10]]
        flushes.append(shape(await asynced.aput_messages(messages[10:16])))
        calls = await asynced.aput_calls([messages[16:20], messages[20:]])
        flushes += [shape(f) for f in calls]
        view = (
            await asynced.aget("and now?"),
            await asynced.aget_all(),
            await asynced.aget_all("archived"),
            await asynced.acontext(),
        )
        return flushes, view

    async_flushes, async_view = asyncio.run(run())
    assert any(async_flushes) and async_flushes == sync_flushes
    assert async_view == sync_view

    sync.set(turns(2, "fresh"))
    asyncio.run(asynced.aset(turns(2, "fresh")))
    assert asynced.get_all() == sync.get_all()
    assert shape(asyncio.run(asynced.aflush_now())) == shape(sync.flush_now())
    assert asyncio.run(asynced.areset()) == sync.reset() > 0
    assert asynced.get_all() == sync.get_all() == []


def test_async_get_with_a_static_block_equals_sync() -> None:
    blocks = [StaticBlock(name="persona", content="You are terse.")]
    memory = small(SQLiteStore(), blocks=blocks)
    memory.put_messages(turns(3))
    assert asyncio.run(memory.acontext("hi")) == memory.context("hi")


def _put_concurrently(memories: list[Memory], per_task: int) -> None:
    """One task per Memory in `memories` (repeats share one): half put with `aput` on the loop,
    half with the sync `put` in worker threads, so that the loop and threads contend."""

    async def writer(i: int, memory: Memory) -> None:
        for m in turns(per_task, f"t{i}"):
            if i % 2:
                await memory.aput(m)
            else:
                await asyncio.to_thread(memory.put, m)
            await asyncio.sleep(0)

    async def run() -> None:
        await asyncio.gather(*(writer(i, m) for i, m in enumerate(memories)))

    asyncio.run(run())


def _assert_each_task_whole(memory: Memory, tags: list[str], per_task: int) -> None:
    contents = [m.content for m in memory.get_all()]
    assert len(contents) == len(set(contents))  # nothing duplicated
    for tag in tags:
        mine = [c for c in contents if c.startswith(f"{tag} ")]
        assert mine == [m.content for m in turns(per_task, tag)]  # nothing lost, in order


def test_fifty_tasks_put_into_one_memory(db: str) -> None:
    store = open_store(db)
    memory = small(store)
    _put_concurrently([memory] * 50, per_task=3)
    assert store.list_flushes("s")  # the puts flushed as they went
    _assert_each_task_whole(memory, [f"t{i}" for i in range(50)], 3)
    # Turns stay whole in the flushes only per task: interleaved tasks share the window, so check
    # the invariants the store and window keep.
    check_invariants(store, memory)
    # A fresh object reading the file sees exactly what the shared one holds.
    again = small(open_store(db))
    assert again.get() == memory.get() and again.get_all() == memory.get_all()


def test_fifty_memories_on_one_store(db: str) -> None:
    store = open_store(db)
    memories = [small(store, f"s{i}") for i in range(50)]
    _put_concurrently(memories, per_task=4)
    for i, memory in enumerate(memories):
        _assert_each_task_whole(memory, [f"t{i}"], 4)
        assert len(memory.get_all()) == 8
        check_invariants(store, memory)
    # Each session flushed whole turns, oldest first, as alone (no other session's rows).
    for i, memory in enumerate(memories):
        alone = small(SQLiteStore(), f"s{i}")
        expected = [f[1:] for m in turns(4, f"t{i}") for f in shape(alone.put(m))]
        assert expected  # the puts flushed
        stored = store.list_flushes(f"s{i}")
        got = [memory.get_all()[j].id for j in range(len(memory.get_all()))]
        assert [(len(ids), tokens, reason) for ids, tokens, reason in expected] == [
            (f.messages, f.tokens, f.reason) for f in stored
        ]
        assert got == sorted(got)


class WaitingBlock(MemoryBlock):
    """A block that, given a flush (or asked for its content), blocks its thread until `go` is
    set, as a block waiting on an LLM would; it records whether `go` came."""

    name = "waiting"

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.started = threading.Event()
        self.saw_go: list[bool] = []

    def put(self, batch: Sequence[Message], ctx: BlockContext) -> None:
        self.started.set()
        self.saw_go.append(self.go.wait(PATIENCE_S))

    def get(self, messages: Sequence[Message], ctx: BlockContext) -> str:
        self.started.set()
        self.saw_go.append(self.go.wait(PATIENCE_S))
        return "remembered"


def test_a_slow_block_does_not_block_the_loop() -> None:
    """While the block waits in `put` (and then in `get`), another task on the loop runs and sets
    the event it waits for: were the block's work on the loop, it could never be set."""
    block = WaitingBlock()
    memory = small(SQLiteStore(), blocks=[block])
    other = small(memory.store, "other")

    async def releaser() -> None:
        # Wait (without blocking the loop) until the block has started, then do work on the
        # loop with the same store and let the block go on.
        while not block.started.is_set():
            await asyncio.sleep(0.001)
        await other.aput(Message("user", "meanwhile on the loop"))
        block.go.set()

    async def put_then_get() -> tuple[list[object], str]:
        flushes: list[object] = []
        for m in turns(6):
            flushes += await memory.aput(m)
        return flushes, (await memory.acontext()).memory_text

    async def run() -> tuple[list[object], str]:
        (flushes, text), _ = await asyncio.gather(put_then_get(), releaser())
        block.started.clear()
        block.go.clear()
        _, context = await asyncio.gather(releaser(), memory.acontext())
        return flushes, context.memory_text

    flushes, text = asyncio.run(run())
    assert flushes and block.saw_go and all(block.saw_go)
    assert "remembered" in text
    assert [m.content for m in other.get_all()] == ["meanwhile on the loop"] * 2


def test_fact_block_over_the_loopback_llm_through_aput_messages(llm, tmp_path: Path) -> None:
    llm.script({"content": "<facts><fact>Ana has a dog named Rex</fact></facts>"})
    block = FactBlock(model="openai/test", api_base=llm.api_base, timeout=10)
    memory = Memory.from_defaults(
        session_id="s1",
        user_id="ana",
        token_limit=100,
        chat_history_token_ratio=0.1,
        token_flush_size=5,
        db=tmp_path / "m.db",
        memory_blocks=[block],
        tokenizer=WordTokenizer(),
    )

    async def run() -> tuple[list[object], str]:
        flushes = await memory.aput_messages(
            [Message("user", "my dog is Rex is what I say"), Message("assistant", "ok noted")]
        )
        flushes += await memory.aput_messages(
            [Message("user", "and I like tea is what I say"), Message("assistant", "ok")]
        )
        return flushes, (await memory.acontext()).memory_text

    flushes, text = asyncio.run(run())
    assert len(flushes) == 1
    facts = fact_store.list_facts(memory.store, "extracted_info", "user:ana")
    assert [f.text for f in facts] == ["Ana has a dog named Rex"]
    assert facts[0].flush_id == flushes[0].id  # type: ignore[attr-defined]
    assert "my dog is Rex" in llm.requests[0]["messages"][-1]["content"]
    assert "<fact>Ana has a dog named Rex</fact>" in text


def test_a_put_waiting_for_another_process_does_not_block_the_loop(tmp_path: Path) -> None:
    """Another connection (as another process would) holds the write lock: `aput` waits for it
    in a worker thread, while a task on the loop goes on and, meanwhile, lets the lock go."""
    db = tmp_path / "m.db"
    memory = small(SQLiteStore(db))
    memory.put_messages(turns(2))
    other = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    events: list[str] = []

    async def releaser() -> None:
        await asyncio.sleep(0)  # let the put start first
        events.append("loop ran")
        # Reading goes on while the put waits (WAL; and the waiting thread lets the store go).
        assert await memory.aget()
        events.append("read")
        other.execute("COMMIT")

    async def put() -> None:
        await memory.aput(Message("user", "after the other writer"))
        events.append("put")

    async def run() -> None:
        await asyncio.wait_for(asyncio.gather(put(), releaser()), PATIENCE_S)

    asyncio.run(run())
    other.close()
    assert events == ["loop ran", "read", "put"]
    assert memory.get_all()[-1].content == "after the other writer"
    check_invariants(memory.store, memory)  # type: ignore[arg-type]


class OverlapBlock(MemoryBlock):
    """Records whether a second batch came in while one was being processed (each put waits a
    while for that to happen: it cannot, when feeds take turns)."""

    name = "overlap"

    def __init__(self) -> None:
        super().__init__()
        self.inside = 0
        self.overlapped = threading.Event()
        self.batches = 0
        self.guard = threading.Lock()

    def put(self, batch: Sequence[Message], ctx: BlockContext) -> None:
        with self.guard:
            self.inside += 1
            self.batches += 1
            if self.inside > 1:
                self.overlapped.set()
        self.overlapped.wait(0.2)  # long enough for a concurrent feed to come in, were there one
        with self.guard:
            self.inside -= 1

    def get(self, messages: Sequence[Message], ctx: BlockContext) -> str:
        return ""


def test_tasks_putting_into_one_memory_feed_its_blocks_in_turn() -> None:
    block = OverlapBlock()
    memory = small(SQLiteStore(), blocks=[block])

    async def writer(i: int) -> None:
        for m in turns(3, f"t{i}"):
            await memory.aput(m)

    async def run() -> None:
        await asyncio.gather(*(writer(i) for i in range(8)))

    asyncio.run(run())
    assert block.batches >= 2 and not block.overlapped.is_set()
    assert len(memory.get_all()) == 48


class HeldStore(SQLiteStore):
    """A store whose appends wait (in the thread that runs them) until `go` is set, and record
    which thread ran them."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.threads: list[int] = []

    def append_messages(self, session_id: str, messages: Any) -> list[int]:
        self.threads.append(threading.get_ident())
        assert self.go.wait(PATIENCE_S)
        return super().append_messages(session_id, messages)


def test_the_loop_runs_while_a_put_is_in_the_store() -> None:
    """A put's store work runs in another thread than the loop's: a ticker task on the loop ticks
    while the put is inside the store, and only then lets it go on (were the put's store work on
    the loop, the ticker could never tick and the put would fail its wait)."""
    store = HeldStore()
    memory = small(store)
    ticks: list[int] = []

    async def ticker() -> None:
        while not store.threads:
            await asyncio.sleep(0.001)
        for i in range(5):  # the put is held inside the store meanwhile
            ticks.append(i)
            await asyncio.sleep(0.001)
        store.go.set()

    async def run() -> tuple[int, list[object]]:
        loop_thread = threading.get_ident()
        flushes, _ = await asyncio.gather(memory.aput_messages(turns(8)), ticker())
        return loop_thread, flushes

    loop_thread, flushes = asyncio.run(run())
    assert ticks == [0, 1, 2, 3, 4] and flushes
    assert store.threads and loop_thread not in store.threads
    check_invariants(store, memory)

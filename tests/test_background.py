"""memcli.blocks.background: flushed batches fed to the blocks beside the caller (a chat, the
MCP server's put_messages), what is left on closing, and preparing the search ahead of it."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fakes import HashEmbedder

from memcli import Memory, MemoryBlock, Message
from memcli.blocks.background import Background, left_note
from memcli.blocks.base import BlockContext
from memcli.config import load_settings
from memcli.flush import Budget
from memcli.store.sqlite import SQLiteStore
from memcli.tools import AgentTools


class Held(MemoryBlock):
    """A block whose put waits until the test releases it, counting the batches it took."""

    name = "held"
    receives_flushes = True

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.started = threading.Event()
        self.taken: list[int] = []

    def put(self, batch: Sequence[Message], ctx: BlockContext) -> None:
        self.started.set()
        assert self.release.wait(30)
        assert ctx.flush_id is not None
        self.taken.append(ctx.flush_id)


def chatty(n: int) -> list[Message]:
    return [
        Message("user" if i % 2 == 0 else "assistant", f"message {i} about bees and honey")
        for i in range(n)
    ]


def test_a_put_returns_before_the_blocks_are_fed_and_closing_leaves_the_rest(tmp_path: Path):
    store = SQLiteStore(tmp_path / "m.db")
    block = Held()
    background = Background(store, reopen=lambda: SQLiteStore(tmp_path / "m.db"))
    memory = Memory(
        store, "s", budget=Budget(60, 0.5, 10), memory_blocks=[block], background=background
    )
    flushes = [f for m in chatty(12) for f in memory.put(m)]
    assert len(flushes) >= 2 and not block.taken  # every put returned while the block waits
    assert block.started.wait(30)
    assert background.status().waiting == len(flushes)
    left = background.close()  # nothing is waited for
    assert left == len(flushes)
    note = left_note(left, "s")
    assert note is not None and note.startswith(f"{left} batches of long-term memory wait")
    assert "memcli chat --session s" in note and "memcli blocks backfill" in note
    block.release.set()
    background.wait(30)
    assert block.taken == [flushes[0].id]  # the job running finished; the queued ones did not
    assert left_note(0, "s") is None
    assert "`memcli chat --session 'my s' --user bo`" in (left_note(1, "my s", "bo") or "")


def test_a_resumed_chat_feeds_what_the_last_one_left_unfed(tmp_path: Path):
    store = SQLiteStore(tmp_path / "m.db")
    unfed = Memory(store, "s", budget=Budget(60, 0.5, 10), memory_blocks=[Held()])
    flushes = unfed.put_messages(chatty(12), feed_blocks=False)
    assert flushes
    block = Held()
    block.release.set()
    background = Background(store)
    background.resume([block], [unfed.session()], unfed.tokenizer)
    assert background.wait(30)
    assert block.taken == [f.id for f in flushes]
    background.resume([block], [unfed.session()], unfed.tokenizer)  # now done: nothing again
    assert background.wait(30) and block.taken == [f.id for f in flushes]
    assert background.status().done == len(flushes)


def test_a_failing_on_fed_leaves_the_work_going_and_says_so(tmp_path: Path):
    store = SQLiteStore(tmp_path / "m.db")
    block = Held()
    block.release.set()
    background = Background(store)

    def on_fed(fed: Any) -> None:
        raise RuntimeError("the screen is gone")

    background.on_fed = on_fed
    memory = Memory(
        store, "s", budget=Budget(60, 0.5, 10), memory_blocks=[block], background=background
    )
    flushes = [f for m in chatty(12) for f in memory.put(m)]
    assert len(flushes) >= 2
    assert background.wait(60)  # every job ran: the thread outlived the callback
    assert block.taken == [f.id for f in flushes]
    status = background.status()
    assert status.waiting == 0 and status.done == len(flushes)
    assert status.error == "after feeding: RuntimeError: the screen is gone"


def test_put_messages_of_the_agent_tools_hands_the_batches_over(tmp_path: Path):
    s = load_settings({"MEMCLI_HOME": str(tmp_path)}, {"user": "ana", "token_limit": 60})
    store = SQLiteStore(tmp_path / "t.db")
    block = Held()
    background = Background(store)
    tools = AgentTools(store, s, "ana", blocks=lambda _: [block], background=background)
    result = tools.put_messages([m.to_dict() for m in chatty(12)], "g")
    assert result["flushes"] >= 1 and not block.taken
    block.release.set()
    assert background.wait(30) and len(block.taken) == result["flushes"]


def test_prepare_loads_the_search_model_before_the_first_search(tmp_path: Path):
    from memcli.search.retriever import Retriever

    class Counting(HashEmbedder):
        calls = 0

        def embed(self, texts: Sequence[str]) -> Any:
            Counting.calls += 1
            return super().embed(texts)

    s = load_settings({"MEMCLI_HOME": str(tmp_path)}, {"user": "ana"})
    store = SQLiteStore(tmp_path / "t.db")
    made: list[Retriever] = []

    def retriever() -> Retriever:
        made.append(Retriever(store, Counting(), index_dir=tmp_path / "idx"))
        return made[-1]

    tools = AgentTools(store, s, "ana", retriever=retriever)
    tools.prepare()
    assert len(made) == 1 and Counting.calls == 1
    tools.search("bees")
    assert len(made) == 1  # the first search used the retriever prepared

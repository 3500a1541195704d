"""A database holding a bit of everything, for the tests of `memcli copy`: several users and
sessions, messages with names, metadata and timestamps, flushes, a block's state and the
flushes it processed, block definitions, stored message vectors, facts with edits, deletions and
topics, a message edited after it was embedded, and a deleted session (so that the highest message id ever given is above the highest
one stored)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from fakes import HashEmbedder

from memcli import Memory, Message, VectorBlock
from memcli.blocks.base import MemoryBlock
from memcli.store import facts as fact_store
from memcli.store import open_store, summaries
from memcli.store.index import Scope


class Tally(MemoryBlock):
    """Counts the batches and messages flushed to it, in its state (the block_state table)."""

    name = "tally"
    priority = 1

    def put(self, batch: Any, ctx: Any) -> None:
        state = self.load_state(ctx, {"batches": 0, "messages": 0})
        state = {"batches": state["batches"] + 1, "messages": state["messages"] + len(batch)}
        self.save_state(ctx, state)

    def get(self, messages: Any, ctx: Any) -> str:
        return json.dumps(self.load_state(ctx, {}))


SESSIONS = (("ana", "a1", 30), ("ana", "a2", 16), ("bo", "b1", 24), ("bo", "gone", 10))
START = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


def memory(db: str, user: str, session: str, vectors: bool = True) -> Memory:
    """A Memory with a small budget, the Tally block and (with `vectors`) a vector block."""
    blocks: list[MemoryBlock] = [Tally()]
    if vectors:
        blocks.insert(0, VectorBlock(embedder=HashEmbedder()))
    return Memory.from_defaults(
        session_id=session,
        user_id=user,
        token_limit=300,
        chat_history_token_ratio=0.2,
        token_flush_size=30,
        db=db,
        memory_blocks=blocks,
    )


def build(db: str) -> None:
    """Fill the new SQLite database `db` (the vector block's SQL is SQLite's on this branch: a
    PostgreSQL database gets the same through `memcli copy`)."""
    for user, session, count in SESSIONS:
        m = memory(db, user, session)
        for i in range(count):
            when = START + timedelta(minutes=i)
            if i % 2 == 0:
                message = Message(
                    "user", f"{user} says {i}: my café is near the river ünïcode", timestamp=when
                )
            else:
                message = Message(
                    "assistant",
                    f"reply {i} to {user}, about rivers and dogs",
                    name="helper" if i % 3 == 0 else None,
                    metadata={"turn": i, "tags": ["x", "ÿ"]} if i % 5 == 0 else None,
                )
            m.put(message)
        m.get()
        for block in m.memory_blocks:  # (as an import does: every message of the user embedded)
            if isinstance(block, VectorBlock):
                block.retriever(m.store).index(scope=Scope(user_id=user))
        m.store.close()
    store: Any = open_store(db)
    try:
        store.delete_session("gone")
        # A message whose text changed after it was embedded (its vectors go; it waits in
        # retrieval_redo to be embedded again), as the schema's trigger records it.
        store.execute("UPDATE messages SET content = 'edited' WHERE session_id = 'b1' AND seq = 3")
        ana = fact_store.add_facts(
            store,
            "facts",
            "user:ana",
            ["Ana has a dog called Rex", "Ana lives in Porto", "Ana plays the cello"],
            origin="user",
            topics=[["pets"], ["home", "city"], []],
        )
        fact_store.add_facts(store, "facts", "user:bo", ["Bo likes tea"], topics=[["food"]])
        fact_store.edit_fact(store, ana[1].id, "Ana lives in Lisbon", topics=["home"])
        fact_store.delete_fact(store, ana[2].id)
        # Two versions of a session's running summary (the summary block's table).
        summaries.add_summary(store, "a1", "session_summary", "Ana has a dog.", 4, flush_id=1)
        summaries.add_summary(
            store, "a1", "session_summary", "Ana has a dog called Rex.", 6, message_ids=(3, 4)
        )
    finally:
        store.close()

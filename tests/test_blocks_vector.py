"""VectorBlock: real MiniLM (ONNX Runtime), real FAISS, real SQLite files; the main paths also on
PostgreSQL, with a FAISS file (Debian's server) and with pgvector (`vdb`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fakes import HashEmbedder
from helpers import import_file, transcript_lines

from memcli import BudgetOverride, Memory, Message, SQLiteStore, TiktokenTokenizer, VectorBlock

pytestmark = pytest.mark.slow

FACTS = [
    ("My dog is called Rex and he chases tennis balls in the park.", "What a good dog!"),
    ("I moved to Porto last year, I live near the Douro river.", "Porto is beautiful."),
    ("I work night shifts as a nurse in the children's hospital.", "That is demanding work."),
    ("I have been learning to play the cello for three years.", "Music is a great hobby."),
]


def chat(db: Path | str | None, session: str, embedder, user: str = "ana", **kw) -> Memory:
    block = VectorBlock(embedder=embedder, similarity_top_k=1, **kw)
    return Memory.from_defaults(
        session_id=session,
        user_id=user,
        token_limit=400,
        chat_history_token_ratio=0.15,
        token_flush_size=20,
        db=db,
        memory_blocks=[block],
    )


def small(tmp_path: Path, block: VectorBlock) -> Memory:
    """Session "s" in a file, with a budget so small that every few messages flush."""
    return Memory.from_defaults(
        session_id="s",
        token_limit=40,
        token_flush_size=10,
        db=tmp_path / "m.db",
        memory_blocks=[block],
    )


def fill(memory: Memory) -> None:
    for user, reply in FACTS:
        memory.put_messages([Message("user", user), Message("assistant", reply)])
    # Push the facts out of short-term memory.
    for i in range(6):
        memory.put_messages([Message("user", f"small talk {i}"), Message("assistant", "sure")])


def test_batches_are_stored_and_recalled(vdb: str, minilm) -> None:
    db = vdb
    memory = chat(db, "s1", minilm)
    fill(memory)
    context = memory.context("What instrument am I learning?")
    block = memory.memory_blocks[0]
    assert [h.text for h in block.last_hits] == [h.text for h in block.last_hits[:1]]
    assert "cello" in block.last_hits[0].text
    assert block.last_hits[0].session_id == "s1"
    assert block.last_hits[0].message_ids
    assert 0 < block.last_hits[0].score <= 1.0001
    assert "cello" in context.memory_text
    assert context.messages[0].role == "system"
    stored = memory.store.get_messages("s1", ids=block.last_hits[0].message_ids)
    assert "cello" in " ".join(m.content for m in stored)


def test_second_session_of_the_same_user_recalls_the_first(vdb: str, minilm) -> None:
    db = vdb
    fill(chat(db, "first", minilm))
    second = chat(db, "second", minilm)
    second.put(Message("user", "Hello again"))
    text = second.context("What's the name of my dog?").memory_text
    assert "Rex" in text
    # Another user sees nothing of it.
    other = chat(db, "other", minilm, user="bob")
    other.put(Message("user", "Hello"))
    assert other.context("What's the name of my dog?").memory_text == ""


def test_session_scope_isolates(tmp_path: Path, minilm) -> None:
    db = tmp_path / "m.db"
    fill(chat(db, "first", minilm, scope="session"))
    second = chat(db, "second", minilm, scope="session")
    second.put(Message("user", "Hello again"))
    assert second.context("What's the name of my dog?").memory_text == ""


def test_long_term_memory_holds_other_sessions_unflushed_messages(vdb: str, minilm) -> None:
    """A short conversation that never flushed (an import, a chat still open) is recalled by a
    new session of its user, not by another user's; the session's own window is not repeated
    in its long-term block; `source = "flushed"` (LlamaIndex's) sees flushed messages only."""
    db = vdb
    imported = Memory.from_defaults(session_id="imported", user_id="alice", db=db)
    imported.put_messages(
        [Message("user", FACTS[3][0]), Message("assistant", FACTS[3][1])], feed_blocks=False
    )
    bob = Memory.from_defaults(session_id="bob-chat", user_id="bob", db=db)
    bob.put_messages([Message("user", "My neighbour plays the cello every night in Lyon.")])
    assert imported.store.get_session("imported").archived_messages == 0  # never flushed

    new = chat(db, "new", minilm, user="alice")
    new.put(Message("user", "I also like reading books about the sea."))
    text = new.context("What instrument am I learning?").memory_text
    assert "cello" in text and "three years" in text
    assert "Lyon" not in text
    hits = new.memory_blocks[0].last_hits
    assert {h.session_id for h in hits} == {"imported"}
    # The session's own window is already in the context: never in its long-term block.
    own = new.context("What do I like reading about?")
    assert "the sea" not in own.memory_text

    flushed = chat(db, "flushed", minilm, user="alice", source="flushed")
    flushed.put(Message("user", "Hello"))
    assert flushed.context("What instrument am I learning?").memory_text == ""
    assert flushed.memory_blocks[0].definition()["source"] == "flushed"


def test_an_unknown_source_is_refused() -> None:
    from memcli.errors import ConfigError

    with pytest.raises(ConfigError, match="source must be one of all, flushed"):
        VectorBlock(source="everything")


def test_memory_survives_a_restart_in_a_new_process(vdb: str, minilm) -> None:
    db = vdb
    fill(chat(db, "s1", minilm))
    code = (
        "from memcli import Memory, VectorBlock\n"
        f"m = Memory.from_defaults(session_id='s1', db={str(db)!r}, memory_blocks=[VectorBlock()])\n"
        "print(m.context('Which city do I live in?').memory_text)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert "Porto" in out.stdout


def test_in_memory_database(minilm) -> None:
    memory = chat(None, "s1", minilm)
    fill(memory)
    assert "Rex" in memory.context("my dog's name?").memory_text


def test_put_many_embeds_in_one_call_and_search_dedups_batches(tmp_path: Path) -> None:
    embedder = HashEmbedder(dim=32, max_tokens=8)
    block = VectorBlock(embedder=embedder, similarity_top_k=3)
    memory = small(tmp_path, block)
    flushes = []
    for i in range(20):
        flushes += memory.put_messages(
            [Message("user", f"apple banana cherry number {i} " * 3), Message("assistant", "ok")],
            feed_blocks=False,
        )
    assert len(flushes) > 3
    embedder.calls.clear()
    result = memory.feed_blocks_many(flushes)
    # Issue 6: the block embeds stored messages (one vector each), many per model call.
    assert len(embedder.calls) == 1 and embedder.calls[0] >= len(memory.get_all())
    assert result.done == {"vector_memory": len(flushes)}
    memory.context("apple banana")
    hits = block.last_hits
    ids = [i for h in hits for i in h.message_ids]
    assert len(hits) == 3 and len(ids) == len(set(ids))
    assert hits == sorted(hits, key=lambda h: -h.score)


def test_reset_forgets_and_reused_flush_ids_are_processed(tmp_path: Path) -> None:
    embedder = HashEmbedder(dim=32)
    block = VectorBlock(embedder=embedder, similarity_top_k=5)
    memory = small(tmp_path, block)
    for i in range(4):
        memory.put_messages(
            [Message("user", f"apples and pears {i} " * 3), Message("assistant", "ok")]
        )
    memory.context("apples")
    assert block.last_hits and "apples" in block.last_hits[0].text
    # Issue 6: the block searches the stored messages, so reset() (which deletes them) forgets
    # them, where the reference keeps its vector store.
    memory.reset()
    memory.context("apples")
    assert block.last_hits == []
    for i in range(4):
        memory.put_messages(
            [Message("user", f"kiwis and plums {i} " * 3), Message("assistant", "ok")]
        )
    # The new flushes (their ids may be reused) were all stored, not mistaken for processed ones.
    memory.context("kiwis plums")
    assert "kiwis" in block.last_hits[0].text
    assert block.retriever(memory.store).pending() == 0


def test_import_embeds_in_bulk(tmp_path: Path) -> None:
    from memcli.blocks.feed import CHUNK
    from memcli.importing import Opening

    embedder = HashEmbedder(dim=32)
    block = VectorBlock(embedder=embedder)
    store = SQLiteStore(tmp_path / "m.db")
    data = transcript_lines(
        *(
            {"role": "user" if i % 2 == 0 else "assistant", "content": f"message number {i} " * 4}
            for i in range(400)
        ),
        session="s",
    )
    totals: list[int] = []
    progress: list[int] = []
    opening = Opening(
        TiktokenTokenizer(), default_budget=BudgetOverride(100, 0.7, 20), blocks=[block]
    )
    result = import_file(
        store,
        data,
        opening,
        block_total=totals.append,
        block_progress=progress.append,
    )
    assert result.flushes > 50 and result.blocks_done == result.flushes
    assert totals == [result.flushes] and sum(progress) == result.flushes
    # Issue 6: messages are embedded many per model call, not one call per flushed batch.
    per_call = VectorBlock.embed_batch
    assert CHUNK >= 1 and len(embedder.calls) <= -(-400 // per_call) * -(-result.flushes // CHUNK)
    assert block.retriever(store).pending() == 0


def test_a_long_message_is_stored_in_pieces_and_its_tail_is_found(vdb: str, minilm) -> None:
    filler = " ".join(f"The weather report number {i} said it was cloudy." for i in range(60))
    tail = "By the way, my passport number ends in 4471 and it expires in March."
    memory = chat(vdb, "s", minilm)
    block = memory.memory_blocks[0]
    memory.put_messages([Message("user", f"{filler} {tail}"), Message("assistant", "Noted.")])
    for i in range(6):
        memory.put_messages([Message("user", f"small talk {i}"), Message("assistant", "sure")])
    memory.context("When does my passport expire?")
    assert "expires in March." in block.last_hits[0].text  # too long for the context budget
    retriever = block.retriever(memory.store)
    # Found by its last piece's vector alone, not only by its words.
    (hit,) = retriever.search("When does my passport expire?", k=1, mode="vector").hits
    assert "weather report number 0 " in hit.text and "4471" in hit.text
    # Far beyond the model's 256-token window: several vectors, none of them cut off.
    (pieces,) = memory.store.execute(
        "SELECT COUNT(*) FROM retrieval_vectors WHERE model = ? GROUP BY message_id"
        " ORDER BY COUNT(*) DESC LIMIT 1",
        (retriever.model,),
    ).fetchone()
    assert pieces >= 3


def test_stored_messages_and_queries_share_one_embedder(tmp_path: Path) -> None:
    embedder = HashEmbedder(dim=32, max_tokens=8)
    block = VectorBlock(embedder=embedder, similarity_top_k=2)
    memory = small(tmp_path, block)
    for i in range(12):
        memory.put_messages([Message("user", f"apple banana {i} " * 3), Message("assistant", "ok")])
    assert embedder.calls  # the stored messages
    embedder.calls.clear()
    memory.context("apple banana")
    assert embedder.calls and block.last_hits  # the query, by the same embedder
    calls = len(embedder.calls)
    memory.context("apple banana")  # the same window: every message's vector is kept
    assert len(embedder.calls) == calls and block.last_hits
    memory.context("cherry")  # a new input: only it is embedded
    assert embedder.calls[calls:] == [1]


def test_memcli_memory_searches_flushed_messages_only_as_llama_index(tmp_path: Path) -> None:
    """MemcliMemory's vector blocks default to LlamaIndex's "flushed" source (recorded so that
    the CLI builds the same block); one given a source keeps it."""
    from memcli.blocks.registry import Defaults, rebuild
    from memcli.integrations.llama_index import MemcliMemory
    from memcli.store import longterm

    db = tmp_path / "m.db"
    plain = VectorBlock(embedder=HashEmbedder())
    adapter = MemcliMemory.from_defaults(session_id="li", db=db, memory_blocks=[plain])
    assert plain.source == "flushed"
    found = longterm.block_definitions(adapter.memory.store, "li")
    assert found is not None
    (block,), problems = rebuild(found[1], Defaults(embedder=HashEmbedder()))
    assert not problems and isinstance(block, VectorBlock) and block.source == "flushed"
    given = VectorBlock(embedder=HashEmbedder(), source="all")
    MemcliMemory.from_defaults(session_id="li2", db=db, memory_blocks=[given])
    assert given.source == "all"
    assert VectorBlock(embedder=HashEmbedder()).source == "all"

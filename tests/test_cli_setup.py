"""`memcli setup` prepares the embedding model; the chat's vector block answers from words while
the model is being prepared instead of waiting for it."""

from __future__ import annotations

from pathlib import Path

from fakes import HashEmbedder
from helpers import memcli

from memcli import Memory, Message, VectorBlock
from memcli.search.onnx import onnx_path


def test_setup_exports_the_model_once(isolated: Path) -> None:
    run = memcli("setup", "--json")
    assert run.code == 0, run.stderr
    assert onnx_path(isolated / "models").is_file()
    assert run.records()[0]["embedding_model"] == str(isolated / "models")
    again = memcli("setup", "--json")
    assert again.code == 0 and again.records()[0]["exported"] is False
    assert "already exported" in again.stderr
    assert not (isolated / "memcli.db").exists()  # no database is created


class Preparing(HashEmbedder):
    """An embedder whose model is still being prepared: embedding would wait for it."""

    preparing = True

    def __init__(self) -> None:
        super().__init__()
        self.started = 0

    def prepare_in_background(self) -> None:
        self.started += 1

    def embed(self, texts):  # type: ignore[no-untyped-def]
        raise AssertionError("embedded while the model is being prepared")


def test_words_while_preparing(tmp_path: Path) -> None:
    embedder = Preparing()
    block = VectorBlock(embedder=embedder)
    block.words_while_preparing = True
    memory = Memory.from_defaults(session_id="s", db=tmp_path / "m.db", memory_blocks=[block])
    memory.put(Message("user", "My dog is called Rex"))
    result = block.retriever(memory.store).search("dog Rex", mode="lexical")
    assert result.hits
    hits = block.get([Message("user", "what is my dog called")], _ctx(memory))
    assert embedder.started >= 1  # the export was started, not waited for
    assert hits == "" or "Rex" in hits


def _ctx(memory: Memory):  # type: ignore[no-untyped-def]
    from memcli.blocks.base import BlockContext

    return BlockContext("s", "default", memory.store, memory.tokenizer, None)


def test_the_chat_warms_up_without_waiting_for_the_model(tmp_path: Path) -> None:
    from memcli import Chat, SQLiteStore

    embedder = Preparing()
    block = VectorBlock(embedder=embedder)
    chat = Chat(SQLiteStore(tmp_path / "m.db"), blocks=[block])
    chat.open("s")
    assert block.words_while_preparing
    chat.warm_up()  # would embed (and wait for the export) without it
    assert embedder.started >= 1
    chat.mem.put(Message("user", "My dog is called Rex"))
    assert chat.search("dog Rex").hits  # by words
    events = list(chat.send("what is my dog called?").events())  # offline: made from memory
    assert type(events[-1]).__name__ == "ReplyDone", events[-1]

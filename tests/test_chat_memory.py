"""What a chat sends the model from long-term memory, read from the requests the loopback server
received: `memcli import` some conversations, then `memcli chat` in new sessions (the default
blocks, or a vector block with a small token budget so that what is chosen matters)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from helpers import memcli, no_blocks  # noqa: F401 (a fixture)

from memcli.tokens import TiktokenTokenizer

USER = "ana"

#: Conversations stating facts, and distractors. Each record is one message.
CONVERSATIONS = [
    ("pets", "user", "My cat is called Mochi-Vortex."),
    ("pets", "assistant", "What a lovely name for a cat!"),
    ("alps", "user", "I went hiking in the Alps last summer."),
    ("alps", "assistant", "The Alps are beautiful in July."),
    ("family", "user", "My sister Ana Lucia lives in Porto."),
    ("family", "assistant", "Porto is a lovely city."),
    ("family", "user", "Ana Lucia is a nurse at the children's hospital."),
    ("family", "assistant", "That sounds like demanding work."),
    ("work", "user", "My colleague Tom works as a baker at night."),
    ("work", "assistant", "Night shifts are hard."),
    ("work2", "user", "My neighbour Rui works as a pilot for a small airline."),
    ("work2", "assistant", "He must travel a lot."),
    ("work3", "user", "Carla works as a teacher in a primary school."),
    ("work3", "assistant", "Teaching is rewarding work."),
]


def model_args(llm: Any) -> list[str]:
    return ["--model", "openai/test", "--api-base", llm.api_base]


def imported(tmp_path: Path) -> None:
    lines = [json.dumps({"session": s, "role": r, "content": c}) for s, r, c in CONVERSATIONS]
    file = tmp_path / "conversations.jsonl"
    file.write_text("\n".join(lines) + "\n")
    run = memcli("import", str(file), "--user", USER, "--json")
    assert run.code == 0, run.stderr


def budget_config(tmp_path: Path, tokens: int) -> Path:
    config = tmp_path / "small.toml"
    config.write_text(f'[[blocks]]\nkind = "vector"\ntoken_budget = {tokens}\n')
    return config


def chat(llm: Any, lines: list[str], config: Path | None = None) -> list[dict[str, Any]]:
    """A new chat session of the user (with this config file): its requests, one per line."""
    llm.reset()
    first = ["--config", str(config)] if config is not None else []
    text = "\n".join(lines) + "\n"
    run = memcli(*first, "chat", "--plain", "--user", USER, *model_args(llm), input=text)
    assert run.code == 0, run.stderr
    assert len(llm.requests) == len(lines)
    return list(llm.requests)


def text_of(request: dict[str, Any]) -> str:
    return "\n".join(m.get("content") or "" for m in request["messages"])


def vector_memory(request: dict[str, Any]) -> str:
    found = re.search(r"<vector_memory>\n(.*?)\n</vector_memory>", text_of(request), re.S)
    return found.group(1) if found else ""


def test_a_new_chat_gets_the_fact_with_its_reply_from_the_default_blocks(llm, tmp_path) -> None:
    imported(tmp_path)
    [request] = chat(llm, ["What is my cat called?"])
    memory = vector_memory(request)
    assert "My cat is called Mochi-Vortex." in memory
    assert "What a lovely name for a cat!" in memory  # its turn partner
    assert TiktokenTokenizer().count(memory) <= 600


def test_a_question_asked_before_does_not_crowd_out_the_answer(llm, tmp_path, monkeypatch) -> None:
    imported(tmp_path)
    config = budget_config(tmp_path, 40)
    monkeypatch.setattr(llm, "default", {"content": "I am not sure what your cat is called."})
    for _ in range(2):
        chat(llm, ["What is my cat called?"], config)
    [third] = chat(llm, ["What is my cat called?"], config)
    memory = vector_memory(third)
    assert "Mochi-Vortex" in memory
    assert "What is my cat called?" not in memory
    assert TiktokenTokenizer().count(memory) <= 40
    # and in `memcli search`: the answer first
    run = memcli("search", "What is my cat called?", "--user", USER, "-k", "1", "--json")
    assert run.code == 0, run.stderr
    assert "Mochi-Vortex" in run.records()[0]["text"]


def test_the_memory_follows_the_input_and_resolves_a_follow_up(llm, tmp_path) -> None:
    imported(tmp_path)
    config = budget_config(tmp_path, 60)
    requests = chat(
        llm,
        ["Where did I go hiking?", "Where does Ana Lucia live?", "and what does she do for work?"],
        config,
    )
    assert "Alps" in vector_memory(requests[0])
    assert "Porto" in vector_memory(requests[1])
    assert "Alps" not in vector_memory(requests[1])  # refreshed for the input
    assert "nurse" in vector_memory(requests[2])  # "she" is Ana Lucia, from the turn before
    for request in requests:
        assert TiktokenTokenizer().count(vector_memory(request)) <= 60


def test_what_the_window_holds_is_not_repeated(llm, tmp_path) -> None:
    imported(tmp_path)
    said = "I went hiking in the Alps last summer."
    requests = chat(llm, [said, "Where did I go hiking?"])
    assert text_of(requests[1]).count(said) == 1  # in the window only
    assert said not in vector_memory(requests[1])


@pytest.mark.usefixtures("no_blocks")
def test_blocks_config_takes_a_token_budget_and_refuses_it_with_llama_index_parameters(
    tmp_path,
) -> None:
    config = tmp_path / "both.toml"
    config.write_text('[[blocks]]\nkind = "vector"\ntoken_budget = 300\nsimilarity_top_k = 2\n')
    run = memcli("--config", str(config), "blocks", "list")
    assert run.code == 2
    assert "token_budget" in run.stderr and "LlamaIndex" in run.stderr


def many_facts(db: Path, user: str = USER, count: int = 60) -> None:
    """`count` facts of the user that have nothing to do with cats, added after the others."""
    from memcli import SQLiteStore
    from memcli.store import facts as fact_store

    store = SQLiteStore(db)
    texts = [f"Ana visited the museum number {i} in the city of Town{i}" for i in range(count)]
    fact_store.add_facts(store, "extracted_info", f"user:{user}", texts, origin="manual")
    store.close()


def extracted_info(request: dict[str, Any]) -> str:
    found = re.search(r"<extracted_info>\n(.*?)\n</extracted_info>", text_of(request), re.S)
    return found.group(1) if found else ""


def test_an_imported_conversations_fact_reaches_the_chat_when_it_bears_on_the_input(
    llm, tmp_path, isolated, monkeypatch
) -> None:
    imported(tmp_path)
    llm.script({"content": "<facts><fact>Ana's cat is called Mochi-Vortex</fact></facts>"})
    monkeypatch.setattr(llm, "default", {"content": "<facts></facts>"})
    env = {"MEMCLI_MODEL": "openai/test", "MEMCLI_API_BASE": llm.api_base}
    run = memcli("facts", "extract", "--user", USER, env=env)
    assert run.code == 0, run.stderr
    many_facts(isolated / "memcli.db")  # newer facts, far more than the block's budget holds
    monkeypatch.setattr(llm, "default", {"content": "OK"})
    [request] = chat(llm, ["What is my cat called?"])
    facts = extracted_info(request)
    assert "<fact>Ana's cat is called Mochi-Vortex</fact>" in facts
    assert 0 < TiktokenTokenizer().count(facts) <= 400  # FACT_TOKEN_BUDGET
    # (the room left holds others: by meaning every fact is ranked, and which of 60 alike facts
    # come next is not for a test to say)
    assert facts.count("museum number") >= 3


def test_the_fact_block_budget(tmp_path) -> None:
    from memcli import FactBlock, Memory, SQLiteStore
    from memcli.store import facts as fact_store

    store = SQLiteStore(tmp_path / "f.db")
    fact_store.add_facts(store, "extracted_info", "user:ana", ["Ana's cat is called Mochi"])
    many_facts(tmp_path / "f.db", "ana", 30)
    tokens = TiktokenTokenizer()

    def shown(block: FactBlock, input: str) -> str:
        memory = Memory(store, "s", user_id="ana", memory_blocks=[block])
        return memory.context(input).blocks[0].content

    small = shown(FactBlock(token_budget=60), "What is my cat called?")
    assert small.startswith("<fact>Ana's cat is called Mochi</fact>")
    assert tokens.count(small) <= 60
    lines = small.split("\n")
    assert lines[1:] == sorted(lines[1:], key=lambda line: int(re.findall(r"\d+", line)[0]))
    every = shown(FactBlock(token_budget=0), "What is my cat called?")
    assert every.count("<fact>") == 31  # 0: every fact, oldest first
    assert every == shown(FactBlock(token_budget=10_000), "hello")
    with pytest.raises(Exception, match="token_budget"):
        FactBlock(token_budget=-1)


def test_llama_index_parameters_keep_llama_index_retrieval(tmp_path) -> None:
    from memcli import FactBlock, VectorBlock
    from memcli.errors import ConfigError

    ours = VectorBlock()
    assert (ours.reference, ours.token_budget) == (False, 600)
    assert ours.definition()["token_budget"] == 600
    assert "similarity_top_k" not in ours.definition()
    given = VectorBlock(similarity_top_k=3)
    assert given.reference
    assert (
        given.definition()["similarity_top_k"],
        given.definition()["retrieval_context_window"],
    ) == (3, 5)
    assert "token_budget" not in given.definition()
    with pytest.raises(ConfigError, match="not both"):
        VectorBlock(token_budget=100, retrieval_context_window=2)

    pytest.importorskip("llama_index.core")
    from memcli.integrations.llama_index import MemcliMemory

    memory = MemcliMemory.from_defaults(
        session_id="s",
        db=str(tmp_path / "l.db"),
        memory_blocks=[
            VectorBlock(),
            VectorBlock(name="b", token_budget=50),
            FactBlock(),
            FactBlock(name="f", token_budget=80),
        ],
    )
    plain, budgeted, facts, bounded = memory.memory.memory_blocks
    assert plain.reference and plain.source == "flushed"  # LlamaIndex's VectorMemoryBlock
    assert not budgeted.reference
    assert (facts.token_budget, bounded.token_budget) == (0, 80)  # 0: every fact, as LlamaIndex


def test_a_chat_answers_from_what_is_indexed_without_embedding_the_backlog(
    llm, tmp_path, isolated, minilm
) -> None:
    """Messages of the user stored by another process with no vectors yet, that process holding
    the embedding claim: the chat's turn neither waits for the claim (a minute before) nor
    embeds them (up to 1,000 a turn before); it finds them by words. (`minilm`: the model is
    exported, so the chat searches both ways from its first turn.)"""
    import os
    import socket
    import sqlite3
    import time

    from memcli.search.onnx import VECTORS

    lines = [json.dumps({"session": s, "role": r, "content": c}) for s, r, c in CONVERSATIONS]
    file = tmp_path / "conversations.jsonl"
    file.write_text("\n".join(lines) + "\n")
    (tmp_path / "none.toml").write_text("blocks = []\n")  # stored, not embedded
    run = memcli("--config", str(tmp_path / "none.toml"), "import", str(file), "--user", USER)
    assert run.code == 0, run.stderr
    db = sqlite3.connect(isolated / "memcli.db")
    claim = f"other/{os.getpid()}@{socket.gethostname()} {time.time() + 3600:.3f}"
    with db:  # a live process's claim to embed, for an hour
        db.execute(
            "INSERT INTO retrieval_state (key, value) VALUES (?, ?)",
            (f"embedding:{VECTORS}/sum+1", claim),
        )
    held = chat(llm, ["What is my cat called?"])  # (a wait would show as the guard's timeout)
    assert "My cat is called Mochi-Vortex." in vector_memory(held[0])
    with db:
        db.execute("DELETE FROM retrieval_state WHERE key LIKE 'embedding:%'")
    free = chat(llm, ["Where does Ana Lucia live?"])  # no claim: still nothing embedded
    assert "My sister Ana Lucia lives in Porto." in vector_memory(free[0])
    texts = {c for _, _, c in CONVERSATIONS}
    ids = [i for i, c in db.execute("SELECT id, content FROM messages") if c in texts]
    assert len(ids) == len(CONVERSATIONS)
    vectors = {i for (i,) in db.execute("SELECT message_id FROM retrieval_vectors")}
    assert not vectors & set(ids)
    search = memcli("search", "What is my cat called?", "--user", USER, "--json")
    assert search.code == 0, search.stderr  # `memcli search` embeds the scope's backlog first
    vectors = {i for (i,) in db.execute("SELECT message_id FROM retrieval_vectors")}
    assert set(ids) <= vectors


def test_the_importer_embeds_a_conversation_too_short_to_flush(isolated) -> None:
    """With the default blocks, a conversation that never flushes is embedded by its import (a
    chat's turn searches only what is embedded, and never embeds an import's backlog)."""
    import sqlite3

    lines = [
        {"role": "user", "content": "My cat is called Mochi-Vortex."},
        {"role": "assistant", "content": "A fine name for a cat."},
    ]
    text = "".join(json.dumps(line) + "\n" for line in lines)
    run = memcli("import", "-", "--session", "short", "--no-extract", input=text)
    assert run.code == 0, run.stderr
    conn = sqlite3.connect(isolated / "memcli.db")
    try:
        active, embedded = conn.execute(
            "SELECT COUNT(*), COUNT(DISTINCT v.message_id) FROM messages m"
            " LEFT JOIN retrieval_vectors v ON v.message_id = m.id WHERE m.session_id = 'short'"
        ).fetchone()
    finally:
        conn.close()
    assert (active, embedded) == (2, 2)

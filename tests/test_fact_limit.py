"""A fact is at most MAX_FACT_CHARS characters on every path: the CLI, the store, extraction."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import WordTokenizer
from helpers import memcli, no_blocks  # noqa: F401 (a fixture)

from memcli import FactBlock, Memory, Message
from memcli.errors import InputError
from memcli.store import facts as fact_store
from memcli.store import open_store
from memcli.store.facts import MAX_FACT_CHARS


@pytest.mark.usefixtures("no_blocks")
def test_cli_refuses_a_fact_over_the_limit() -> None:
    run = memcli("facts", "add", "x" * (MAX_FACT_CHARS + 1))
    assert run.code == 2 and "at most 2,000" in run.stderr and "Traceback" not in run.stderr
    assert memcli("facts", "add", "y" * MAX_FACT_CHARS).code == 0  # the limit itself is fine
    fact = memcli("facts", "--json").records()[0]
    run = memcli("facts", "edit", str(fact["id"]), "z" * (MAX_FACT_CHARS + 1))
    assert run.code == 2 and "at most 2,000" in run.stderr
    assert [f["text"] for f in memcli("facts", "--json").records()] == ["y" * MAX_FACT_CHARS]


def test_store_leaves_out_or_refuses_an_over_long_fact(tmp_path: Path) -> None:
    store = open_store(tmp_path / "m.db")
    added = fact_store.add_facts(store, "f", "user:a", ["z" * 2_000_000, "Ana likes tea"])
    assert [f.text for f in added] == ["Ana likes tea"]
    with pytest.raises(InputError, match="at most 2,000"):
        fact_store.edit_fact(store, added[0].id, "z" * (MAX_FACT_CHARS + 1))
    assert [f.text for f in fact_store.list_facts(store, "f", "user:a")] == ["Ana likes tea"]


def test_extraction_leaves_out_an_over_long_fact(llm, tmp_path: Path) -> None:
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
    huge = "Ana " + "very " * 100_000 + "likes tea"
    llm.script({"content": f"<facts><fact>{huge}</fact><fact>Ana lives in Porto</fact></facts>"})
    for text in ("one", "two"):
        memory.put_messages(
            [Message("user", f"{text} is what I say today"), Message("assistant", "ok noted")]
        )
    texts = [f.text for f in fact_store.list_facts(memory.store, block.name, "user:ana")]
    assert texts == ["Ana lives in Porto"]

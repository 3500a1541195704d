"""Memory's fact methods: a mem0-style script gets facts from the library (remember, facts,
add, update, delete, history, restore), through the facts service `memcli mcp` uses, sync and
async; the loopback LLM server is the model."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from memcli import Fact, FactBlock, Facts, Memory, Message, StaticBlock
from memcli.errors import MemcliError, ProviderError, UsageError
from memcli.facts import AddedFact, FactHistory, Remembered, RestoredFact, UpdatedFact
from memcli.store import facts as fact_store


def open_memory(tmp_path: Path, llm: Any, **kwargs: Any) -> Memory:
    block = FactBlock(model="openai/test", api_base=llm.api_base, timeout=60)
    return Memory.from_defaults(
        session_id="ana-1",
        user_id="ana",
        db=str(tmp_path / "m.db"),
        memory_blocks=[block],
        **kwargs,
    )


def texts(facts: list[Fact]) -> list[str]:
    return [f.text for f in facts]


def test_a_mem0_style_script_remembers_lists_searches_and_changes_facts(
    tmp_path: Path, llm: Any
) -> None:
    memory = open_memory(tmp_path, llm)
    for text in ("Hi, I'm Ana.", "I live in Lisbon.", "I have a dog.", "He is called Rex."):
        memory.put(Message("user", text))
    assert memory.facts() == []  # puts alone extract nothing: facts come from flushes
    llm.script({"content": '<facts><fact topics="home">Ana lives in Lisbon</fact></facts>'})
    remembered = memory.remember("I live in Lisbon.")
    assert isinstance(remembered, Remembered)
    assert texts(remembered.added) == ["Ana lives in Lisbon"] and remembered.changed == []
    assert "I live in Lisbon." in llm.requests[-1]["messages"][-1]["content"]
    (lisbon,) = memory.facts()
    assert lisbon.origin == "api" and lisbon.topics == ["home"]
    # a move: the model replaces the fact it is shown; the old one is superseded, not lost
    llm.script(
        {"content": f'<facts><fact replaces="{lisbon.id}">Ana lives in Porto</fact></facts>'}
    )
    moved = memory.remember("We moved to Porto last week.")
    assert texts(moved.added) == ["Ana lives in Porto"]
    assert [(f.id, f.status()) for f in moved.changed] == [(lisbon.id, "superseded")]
    assert texts(memory.facts()) == ["Ana lives in Porto"]
    assert [(f.text, f.status()) for f in memory.facts(everything=True)] == [
        ("Ana lives in Lisbon", "superseded"),
        ("Ana lives in Porto", "current"),
    ]

    added = memory.add_fact("Ana's dog is called Rex", topics=["pets"], entities=["Rex"])
    assert isinstance(added, AddedFact) and added.added
    again = memory.add_fact("ana's DOG is called rex")
    assert again == AddedFact(added.fact, False)
    assert texts(memory.facts("what is the dog's name", mode="lexical"))[0] == added.fact.text
    assert texts(memory.facts(entity="Rex")) == [added.fact.text]
    assert texts(memory.facts(topic="pets")) == [added.fact.text]

    updated = memory.update_fact(added.fact.id, "Ana's dog is called Rex, a beagle")
    assert isinstance(updated, UpdatedFact)
    assert (updated.before.text, updated.fact.text) == (added.fact.text, updated.fact.text)
    assert updated.fact.topics == ["pets"]  # the topics stay when none are given
    assert memory.get_fact(added.fact.id).text == "Ana's dog is called Rex, a beagle"

    deleted = memory.delete_fact(added.fact.id)
    assert deleted.status() == "deleted"
    assert added.fact.id not in [f.id for f in memory.facts()]
    history = memory.fact_history(added.fact.id)
    assert isinstance(history, FactHistory)
    assert [c.action for c in history.changes][-2:] == ["edited", "deleted"]
    assert [c.origin for c in history.changes] == ["api"] * len(history.changes)

    restored = memory.restore_fact(lisbon.id)
    assert isinstance(restored, RestoredFact)
    assert restored.fact.text == "Ana lives in Lisbon"
    assert texts(restored.superseded) == ["Ana lives in Porto"]
    assert texts(memory.facts()) == ["Ana lives in Lisbon"]
    everything = memory.fact_history()  # every change to the user's facts
    assert len(everything.changes) > len(history.changes) and everything.versions == []

    assert memory.delete_all_facts() == 2  # Lisbon, and Porto which it superseded
    assert memory.facts(everything=True) == []


def test_facts_are_the_memory_users_own(tmp_path: Path, llm: Any) -> None:
    """Another user's fact is no fact of this memory's; a memory without a fact block with a
    model cannot remember, and a failed reply stores nothing."""
    ana = open_memory(tmp_path, llm)
    bo = Memory.from_defaults(session_id="bo-1", user_id="bo", db=ana.store)
    fact = bo.add_fact("Bo plays chess").fact
    with pytest.raises(MemcliError, match=f"no fact {fact.id} of user 'ana'"):
        ana.get_fact(fact.id)
    with pytest.raises(MemcliError, match="no fact"):
        ana.delete_fact(fact.id)
    assert ana.facts() == [] and texts(bo.facts()) == ["Bo plays chess"]
    with pytest.raises(UsageError, match="no fact block"):
        bo.remember("I play chess")
    llm.script({"content": "I cannot answer that."})
    with pytest.raises(ProviderError, match="could not be extracted"):
        ana.remember("I play the cello")
    assert ana.facts(everything=True) == []
    with pytest.raises(UsageError, match="no topic"):
        ana.facts("cello", topic="music")


def test_the_async_twins_do_the_same(tmp_path: Path, llm: Any) -> None:
    memory = open_memory(tmp_path, llm)
    llm.script({"content": "<facts><fact>Ana is vegetarian</fact></facts>"})

    async def go() -> tuple[Any, ...]:
        remembered = await memory.aremember("I don't eat meat.")
        added = await memory.aadd_fact("Ana plays the cello", topics=["music"])
        updated = await memory.aupdate_fact(added.fact.id, "Ana plays the cello on Thursdays")
        listed = await memory.afacts()
        found = await memory.afacts("cello", mode="lexical")
        got = await memory.aget_fact(added.fact.id)
        deleted = await memory.adelete_fact(added.fact.id)
        history = await memory.afact_history(added.fact.id)
        restored = await memory.arestore_fact(added.fact.id)
        count = await memory.adelete_all_facts(keep_history=True)
        return remembered, updated, listed, found, got, deleted, history, restored, count

    remembered, updated, listed, found, got, deleted, history, restored, count = asyncio.run(go())
    assert texts(remembered.added) == ["Ana is vegetarian"]
    assert updated.fact.text == "Ana plays the cello on Thursdays"
    assert texts(listed) == ["Ana is vegetarian", "Ana plays the cello on Thursdays"]
    assert texts(found) == ["Ana plays the cello on Thursdays"]
    assert got == updated.fact
    assert deleted.status() == "deleted"
    assert [c.action for c in history.changes] == ["added", "edited", "deleted"]
    assert restored.fact.status() == "current"
    assert count == 2
    assert {f.status() for f in memory.facts(everything=True)} == {"deleted"}


def test_facts_as_the_docs_once_wrote_it(tmp_path: Path, llm: Any) -> None:
    """`Facts(store, user, blocks)`, the blocks a list: the service of that user's facts."""
    memory = Memory.from_defaults(session_id="s", user_id="ana", db=str(tmp_path / "m.db"))
    block = FactBlock(model="openai/test", api_base=llm.api_base, timeout=60)
    facts = Facts(memory.store, "ana", [StaticBlock(content="x"), block])
    assert facts.owner == "ana"
    fact, added = facts.add("Ana likes tea")
    assert added and fact.block == block.name
    assert Facts(memory.store, "bo", [block]).list_facts() == []
    assert Facts(memory.store, "bo", owner=None).get(fact.id) == fact  # None: any user's
    assert fact_store.list_facts(memory.store, None, "user:ana") == [fact]


def test_a_fact_search_by_meaning_uses_the_homes_model(tmp_path: Path, onnx_models: Path) -> None:
    """`facts(query)` (hybrid by default) embeds with the model `search` uses: a question that
    shares no word with a fact finds it."""
    home = tmp_path / "memcli-home"
    home.mkdir()
    (home / "models").symlink_to(onnx_models, target_is_directory=True)
    memory = Memory.from_defaults(
        session_id="s", user_id="ana", db=str(tmp_path / "m.db"), home=home
    )
    for text in ("Ana's flat is near the river in Porto", "Ana plays chess", "Ana is vegetarian"):
        memory.add_fact(text)
    assert texts(memory.facts("what does she eat", k=1)) == ["Ana is vegetarian"]
    assert texts(memory.facts("which city is her home", k=1)) == [
        "Ana's flat is near the river in Porto"
    ]
    assert memory.facts("what does she eat", mode="lexical") == []  # (no word in common)
    vectors = memory.fact_service().vectors()
    assert vectors is not None and vectors.embedder is memory.retriever().embedder

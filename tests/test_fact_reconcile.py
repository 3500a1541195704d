"""Facts that stay true: extraction shows the model the existing facts most related to the batch
(bounded), and applies its replacements and retirements without deleting anything; expiry,
entities, restore; over HTTP to the loopback server answering in the protocol."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from fakes import WordTokenizer

from memcli import FactBlock, Memory, Message
from memcli.blocks.fact_replies import parse_fact_reply
from memcli.store import facts as fact_store
from memcli.store import longterm

KEY = "user:ana"
BLOCK = "extracted_info"


def memory_with(llm, db, embedder=None, **kw: Any) -> Memory:
    block = FactBlock(
        model="openai/test", api_base=llm.api_base, timeout=10, embedder=embedder, **kw
    )
    return Memory.from_defaults(
        session_id="s1",
        user_id="ana",
        token_limit=100,
        chat_history_token_ratio=0.1,
        token_flush_size=5,
        db=db,
        memory_blocks=[block],
        tokenizer=WordTokenizer(),
    )


def say(memory: Memory, text: str) -> None:
    """One turn (of 8 words and more); from the second on, each flushes the one before."""
    memory.put_messages([Message("user", f"{text} , so I say"), Message("assistant", "ok noted")])


def shown(request: dict[str, Any]) -> dict[int, str]:
    """The existing facts an extraction request showed: id -> text."""
    prompt = request["messages"][0]["content"]
    block = prompt.split("<existing_facts>")[1].split("</existing_facts>")[0]
    return {int(i): t for i, t in re.findall(r'<fact id="(\d+)"[^>]*>(.*?)</fact>', block)}


def protocol(body: dict[str, Any]) -> dict[str, Any]:
    """A model that answers in the protocol: a home it is told of replaces the home it was shown."""
    conversation = body["messages"][-1]["content"]
    if "Bern" in conversation and "Zurich" not in conversation:
        return {
            "content": '<facts><fact entities="Bern" topics="home">Ana lives in Bern</fact></facts>'
        }
    if "Zurich" in conversation:
        homes = [i for i, t in shown(body).items() if "lives in" in t]
        replaces = f' replaces="{homes[0]}"' if homes else ""
        return {
            "content": f'<facts><fact entities="Zurich" topics="home"{replaces}>'
            "Ana lives in Zurich</fact></facts>"
        }
    return {"content": "<facts></facts>"}


def test_parse_replaces_retire_entities_expiry() -> None:
    reply = parse_fact_reply(
        '<facts><fact topics="home" entities="Zurich, ana" replaces="3, 4" expires="2026-12-01">'
        'Ana lives in Zurich</fact><retire id="7">she sold it</retire></facts>'
    )
    assert reply is not None
    [fact] = reply.facts
    assert (fact.text, fact.topics, fact.entities, fact.replaces) == (
        "Ana lives in Zurich",
        ["home"],
        ["ana", "Zurich"],
        ["3", "4"],
    )
    assert (
        fact.expires_at is not None and fact.expires_at.isoformat() == "2026-12-01T00:00:00+00:00"
    )
    assert reply.retire == [("7", "she sold it")]
    assert parse_fact_reply("<facts><retire>no id</retire></facts>") is None
    assert parse_fact_reply('<facts><retire id="1" x="2">two</retire></facts>') is None


def test_a_move_supersedes_the_old_home_and_can_be_undone(llm, db: str) -> None:
    llm.default = protocol
    memory = memory_with(llm, db)
    say(memory, "I live in Bern")
    say(memory, "I moved to Zurich")
    say(memory, "nice weather")
    current = fact_store.list_facts(memory.store, BLOCK, KEY)
    assert [f.text for f in current] == ["Ana lives in Zurich"]
    every = fact_store.list_facts(memory.store, BLOCK, KEY, everything=True)
    bern, zurich = every
    assert (bern.text, bern.status(), bern.superseded_by) == (
        "Ana lives in Bern",
        "superseded",
        zurich.id,
    )
    assert bern.entities == ["Bern"] and zurich.entities == ["Zurich"]
    # What caused it: the flush of "I moved to Zurich", and its messages.
    changes = fact_store.fact_history(memory.store, KEY, fact_id=bern.id)
    assert [c.action for c in changes] == ["added", "superseded"]
    assert (
        changes[1].flush_id == zurich.flush_id
        and changes[1].reason == f"superseded by fact {zurich.id}"
    )
    moved = longterm.flush_messages(memory.store, zurich.flush_id)
    assert moved[0].content.startswith("I moved to Zurich") and zurich.message_ids == [
        m.id for m in moved
    ]
    assert "<fact>Ana lives in Zurich</fact>" in memory.context().memory_text
    assert "Bern" not in memory.context().memory_text
    # The chain of versions, from either end.
    chain = fact_store.fact_chain(memory.store, bern.id)
    assert (
        [f.id for f in chain]
        == [bern.id, zurich.id]
        == [f.id for f in fact_store.fact_chain(memory.store, zurich.id)]
    )
    # Undo: Bern is current again, Zurich superseded by it; both changes recorded.
    restored, displaced = fact_store.restore_fact(memory.store, bern.id, origin="manual")
    assert restored.status() == "current" and [f.id for f in displaced] == [zurich.id]
    assert [f.text for f in fact_store.list_facts(memory.store, BLOCK, KEY)] == [
        "Ana lives in Bern"
    ]
    assert fact_store.get_fact(memory.store, zurich.id).superseded_by == bern.id  # type: ignore[union-attr]
    actions = [(c.fact_id, c.action) for c in fact_store.fact_history(memory.store, KEY)]
    assert actions[-2:] == [(bern.id, "restored"), (zurich.id, "superseded")]
    from memcli.errors import MemcliError

    with pytest.raises(MemcliError, match="is current"):
        fact_store.restore_fact(memory.store, bern.id)


def unrelated(n: int) -> list[str]:
    things = ["jazz records", "green tea", "chess openings", "oil painting", "sourdough bread"]
    verbs = ["collects", "enjoys", "studies", "dislikes", "reads about"]
    return [f"Ana {verbs[i % 5]} {things[(i // 5) % 5]} number {i}" for i in range(n)]


@pytest.mark.parametrize("vectors", [True, False], ids=["hybrid", "words"])
def test_150_unrelated_facts_the_prompt_shows_few_and_the_right_one(
    llm, tmp_path: Path, minilm, vectors: bool
) -> None:
    llm.default = protocol
    memory = memory_with(llm, tmp_path / "m.db", embedder=minilm if vectors else None)
    fact_store.add_facts(memory.store, BLOCK, KEY, unrelated(75))
    fact_store.add_facts(memory.store, BLOCK, KEY, ["Ana lives in Bern"], entities=[["Bern"]])
    fact_store.add_facts(memory.store, BLOCK, KEY, unrelated(150)[75:])
    # Meaning finds the old home from "I moved to Zurich"; words need a shared word.
    say(memory, "I moved to Zurich" if vectors else "I moved from Bern to Zurich")
    say(memory, "nice weather")
    request = next(r for r in llm.requests if "Zurich" in r["messages"][-1]["content"])
    facts = shown(request)
    assert len(facts) <= 30
    assert "Ana lives in Bern" in facts.values()
    current = [f.text for f in fact_store.list_facts(memory.store, BLOCK, KEY)]
    assert "Ana lives in Zurich" in current and "Ana lives in Bern" not in current
    assert len(current) == 151  # nothing else touched


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        ('<facts><fact replaces="999">Ana lives in Zurich</fact></facts>', "unknown fact ids"),
        ('<facts><retire id="abc">gone</retire></facts>', "unknown fact ids"),
        ("<facts><fact>Ana lives in Zurich</fact><retire>x</retire></facts>", "malformed reply"),
        ('<facts><fact replaces="1">A</fact><retire id="1">B</retire></facts>', "both replaces"),
    ],
)
def test_a_bad_reply_changes_nothing_and_the_batch_is_retried(
    llm, tmp_path: Path, reply, error
) -> None:
    llm.script(
        {"content": "<facts><fact>Ana lives in Bern</fact></facts>"},
        {"content": reply},
        {"content": "<facts></facts>"},  # the next batch works ...
        {
            "content": '<facts><fact replaces="1">Ana lives in Zurich</fact></facts>'
        },  # ... the retry
    )
    memory = memory_with(llm, tmp_path / "m.db")
    say(memory, "I live in Bern")
    say(memory, "I moved to Zurich")
    say(memory, "filler")
    assert [f.text for f in fact_store.list_facts(memory.store, BLOCK, KEY, everything=True)] == [
        "Ana lives in Bern"
    ]
    row = memory.store.execute(
        "SELECT status, error FROM block_flushes WHERE flush_id = 2"
    ).fetchone()
    assert row[0] == "pending" and error in row[1]
    say(memory, "more filler")  # a flush that works, then the pending batch again
    every = fact_store.list_facts(memory.store, BLOCK, KEY, everything=True)
    assert [(f.text, f.status()) for f in every] == [
        ("Ana lives in Bern", "superseded"),
        ("Ana lives in Zurich", "current"),
    ]
    assert longterm.pending_flushes(memory.store, BLOCK, KEY) == []


def test_retire_expire_and_entities_from_the_model(llm, tmp_path: Path) -> None:
    llm.script(
        {
            "content": '<facts><fact entities="Rex">Ana has a dog named Rex</fact>'
            '<fact expires="2000-01-01">Ana is in Rome this week</fact>'
            '<fact entities="Rex, Vet Lisa">Rex sees Vet Lisa</fact></facts>'
        },
        {"content": '<facts><retire id="1">Rex was given away</retire></facts>'},
    )
    memory = memory_with(llm, tmp_path / "m.db")
    say(memory, "facts one")
    assert "Rome" not in memory.context().memory_text  # expired: not in the context
    say(memory, "facts two")
    say(memory, "filler")
    every = {f.text: f for f in fact_store.list_facts(memory.store, BLOCK, KEY, everything=True)}
    assert every["Ana has a dog named Rex"].status() == "retired"
    assert every["Ana has a dog named Rex"].reason == "Rex was given away"
    assert every["Ana is in Rome this week"].status() == "expired"
    assert [f.text for f in fact_store.list_facts(memory.store, BLOCK, KEY)] == [
        "Rex sees Vet Lisa"
    ]
    assert fact_store.entity_counts(memory.store, KEY) == [("Rex", 1), ("Vet Lisa", 1)]
    assert [f.text for f in fact_store.list_facts(memory.store, None, KEY, entity="vet  lisa")] == [
        "Rex sees Vet Lisa"
    ]


def test_truncation_keeps_the_facts_related_to_the_input(tmp_path: Path) -> None:
    block = FactBlock()
    memory = Memory.from_defaults(
        session_id="s1",
        user_id="ana",
        token_limit=60,
        db=tmp_path / "m.db",
        memory_blocks=[block],
        tokenizer=WordTokenizer(),
    )
    fact_store.add_facts(memory.store, BLOCK, KEY, ["Ana lives in Zurich"])
    fact_store.add_facts(
        memory.store, BLOCK, KEY, [f"Ana once read book number {i}" for i in range(20)]
    )
    text = memory.context("where do I live now?").memory_text
    assert "Ana lives in Zurich" in text  # the oldest, yet kept: the input asks about it
    assert "book number 0<" not in text  # the oldest unrelated went first
    full = memory.context("hello").memory_text
    assert "Ana lives in Zurich" not in full  # without a related input, the oldest go first


def test_candidates_is_a_block_setting() -> None:
    from memcli import ConfigError
    from memcli.blocks.registry import Defaults, build_block

    block = build_block(0, {"kind": "facts", "candidates": 5}, Defaults())
    assert isinstance(block, FactBlock) and block.candidates == 5
    assert block.definition()["candidates"] == 5
    assert "candidates" not in FactBlock().definition()  # the default is not recorded
    with pytest.raises(ConfigError, match="candidates"):
        FactBlock(candidates=0)


def test_the_prompt_shows_at_most_candidates(llm, tmp_path: Path) -> None:
    llm.default = {"content": "<facts></facts>"}
    memory = memory_with(llm, tmp_path / "m.db", candidates=3)
    fact_store.add_facts(memory.store, BLOCK, KEY, [f"Ana likes tea number {i}" for i in range(10)])
    say(memory, "I like tea with milk")
    say(memory, "filler")
    assert len(shown(llm.requests[0])) == 3

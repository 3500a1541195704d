"""Topics on facts: asked of the LLM at extraction (over HTTP to the loopback server), stored
normalised, listed and filtered by `memcli facts --topic`, set by hand, kept by edits."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import memcli, no_blocks  # noqa: F401 (a fixture)
from test_blocks_facts import facts_memory, turn

from memcli.blocks.fact_replies import EXTRACT_PROMPT, parse_fact_reply
from memcli.store import facts as fact_store
from memcli.store import longterm, open_store


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (
            '<facts><fact topics="Food, health , food">Ana is vegetarian</fact></facts>',
            [("Ana is vegetarian", ["food", "health"])],
        ),
        ("<facts><fact>No topics</fact></facts>", [("No topics", [])]),
        ("<facts><fact topics=''>Empty</fact></facts>", [("Empty", [])]),
        ("<facts><fact topics='work'>Single quotes</fact></facts>", [("Single quotes", ["work"])]),
        # Malformed topics are dropped, the fact kept.
        ("<facts><fact topics=food>Unquoted</fact></facts>", [("Unquoted", [])]),
        ('<facts><fact topic="food">Wrong name</fact></facts>', [("Wrong name", [])]),
        ('<facts><fact topics="a" x="1">Two attributes</fact></facts>', [("Two attributes", [])]),
        ('<facts><fact topics="a > b">Angle</fact></facts>', [("Angle", ["a > b"])]),
        (f'<facts><fact topics="{"x" * 61}, ok">Long</fact></facts>', [("Long", ["ok"])]),
        # The facts themselves are as strict as before.
        ('<facts><fact topics="a"></fact></facts>', None),
        ('<facts><factoid topics="a">A</factoid></facts>', None),
    ],
)
def test_parse_fact_reply_topics(reply: str, expected) -> None:
    """The parser the block reads replies with (`parse_fact_reply`): the facts' topics."""
    parsed = parse_fact_reply(reply)
    assert (None if parsed is None else [(f.text, f.topics) for f in parsed.facts]) == expected


def test_extraction_asks_for_topics_and_stores_them(llm, tmp_path: Path) -> None:
    llm.script(
        {
            "content": '<facts><fact topics="Food,  Health">Ana is vegetarian</fact>'
            "<fact>Ana has a dog named Rex</fact>"
            "<fact topics=pets>Rex is three</fact></facts>"
        }
    )
    memory = facts_memory(llm, tmp_path / "m.db")
    turn(memory, "I am vegetarian and my dog Rex is three")
    turn(memory, "and I like tea")
    assert 'topics="' in EXTRACT_PROMPT
    assert 'topics="' in llm.requests[0]["messages"][0]["content"]
    stored = fact_store.list_facts(memory.store, "extracted_info", "user:ana")
    assert [(f.text, f.topics) for f in stored] == [
        ("Ana is vegetarian", ["food", "health"]),
        ("Ana has a dog named Rex", []),
        ("Rex is three", []),  # malformed topics: the fact kept, the batch done
    ]
    food = fact_store.list_facts(memory.store, None, "user:ana", topic=" FOOD ")
    assert [f.text for f in food] == ["Ana is vegetarian"]
    assert longterm.pending_flushes(memory.store, "extracted_info", "user:ana") == []
    # The context the model sees is unchanged: <fact> lines.
    assert "<fact>Ana is vegetarian</fact>" in memory.context().memory_text


def test_condense_keeps_the_topics_it_is_given(llm, tmp_path: Path) -> None:
    llm.script(
        {"content": '<facts><fact topics="food">F1</fact><fact>F2</fact></facts>'},
        {"content": "<facts><fact>F3</fact><fact>F4</fact></facts>"},
        {"content": '<facts><fact topics="x" replaces="3,4">F3 and F4</fact></facts>'},
    )
    memory = facts_memory(llm, tmp_path / "m.db", max_facts=3)
    for text in ("one", "two", "three"):
        turn(memory, text)
    condense_prompt = llm.requests[2]["messages"][0]["content"]
    assert (
        '<fact id="1" topics="food">F1</fact>' in condense_prompt
        and '<fact id="2">F2</fact>' in condense_prompt
    )
    stored = fact_store.list_facts(memory.store, "extracted_info", "user:ana")
    assert [(f.text, f.topics) for f in stored] == [
        ("F1", ["food"]),
        ("F2", []),
        ("F3 and F4", ["x"]),
    ]


def test_edit_keeps_topics_unless_given(db: str) -> None:
    store = open_store(db)
    [fact] = fact_store.add_facts(store, "facts", "user:ana", ["A"], topics=[["Food", "food "]])
    assert fact.topics == ["food"]
    assert fact_store.edit_fact(store, fact.id, "B")[1].topics == ["food"]  # type: ignore[index]
    after = fact_store.edit_fact(store, fact.id, "C", topics=["Work, Home"])[1]  # type: ignore[index]
    assert after.topics == ["home", "work"]
    assert fact_store.list_facts(store, None, "user:ana", topic="food") == []
    assert fact_store.edit_fact(store, fact.id, "D", topics=[])[1].topics == []  # type: ignore[index]
    with pytest.raises(ValueError, match="one list of topics per text"):
        fact_store.add_facts(store, "facts", "user:ana", ["E", "F"], topics=[["a"]])


@pytest.mark.usefixtures("no_blocks")
def test_cli_facts_topics_add_list_filter_edit() -> None:
    run = memcli("facts", "add", "Ana is vegetarian", "--topic", "Food", "--topic", "health")
    assert run.code == 0, run.stderr
    assert memcli("facts", "add", "Ana lives in Porto", "--topic", "home").code == 0
    assert memcli("facts", "add", "Ana likes tea").code == 0  # no topics: still a fact

    listed = memcli("facts", "--json").records()
    assert [(f["text"], f["topics"]) for f in listed] == [
        ("Ana is vegetarian", ["food", "health"]),
        ("Ana lives in Porto", ["home"]),
        ("Ana likes tea", []),
    ]
    run = memcli("facts", "--topic", "FOOD", "--json")
    assert run.code == 0 and [f["text"] for f in run.records()] == ["Ana is vegetarian"]
    run = memcli("facts", "--topic", "travel")
    assert run.code == 0 and "No facts." in run.stderr

    first = listed[0]["id"]
    run = memcli("facts", "edit", str(first), "Ana is vegan", "--json")
    assert run.code == 0 and run.records()[0]["topics"] == ["food", "health"]
    run = memcli("facts", "edit", str(first), "Ana is vegan", "--topic", "diet", "--json")
    assert run.code == 0 and run.records()[0]["topics"] == ["diet"]
    assert memcli("facts", "--topic", "food", "--json").records() == []


def test_chat_facts_command_shows_topics(tmp_path, llm) -> None:
    from test_chat import make_chat, play

    from memcli import FactBlock
    from memcli.chat import Commands
    from memcli.flush import Budget

    llm.script(
        {
            "content": '<facts><fact topics="home">The user lives in Porto</fact>'
            "<fact>The user has a cat</fact></facts>"
        }
    )
    facts = FactBlock(model="openai/test", api_base=llm.api_base, timeout=5)
    chat = make_chat(tmp_path, blocks=[facts], budget_for=lambda info: Budget(20, 0.5, 5))
    for text in ("I live in Porto with my cat", "I work nights", "I like tea", "and cake"):
        play(chat.send(text))
    assert chat.longterm is not None and chat.longterm.wait(timeout=120)  # (in background)
    lines = Commands(chat).run("/facts").text.splitlines()
    assert lines[0].startswith("[extracted_info] #")
    assert lines[0].endswith("The user lives in Porto (home)")
    assert lines[1].endswith("The user has a cat")


@pytest.mark.usefixtures("no_blocks")
def test_cli_facts_search_limited_to_a_topic() -> None:
    assert memcli("facts", "add", "Ana drinks green tea", "--topic", "food").code == 0
    assert memcli("facts", "add", "Ana's tea shop is in Porto", "--topic", "work").code == 0
    assert memcli("facts", "add", "Ana likes coffee", "--topic", "food").code == 0

    def found(*args: str) -> list[str]:
        run = memcli("facts", "search", *args, "--json")
        assert run.code == 0, run.stderr
        return [f["text"] for f in run.records()]

    assert found("TEA") == ["Ana drinks green tea", "Ana's tea shop is in Porto"]
    assert found("tea", "--topic", "Food") == ["Ana drinks green tea"]
    assert found("tea porto") == ["Ana's tea shop is in Porto"]
    assert found("tea", "--topic", "travel") == []
    run = memcli("facts", "search", "  ")
    assert run.code == 2 and "the query is empty" in run.stderr

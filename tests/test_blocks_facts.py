"""FactBlock: litellm over HTTP to the loopback server with scripted replies."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import WordTokenizer

from memcli import FactBlock, Memory, Message
from memcli.store import facts as fact_store
from memcli.store import longterm, open_store


def facts_memory(llm, db, session="s1", user="ana", **kw) -> Memory:
    block = FactBlock(
        model="openai/test", api_base=llm.api_base, timeout=kw.pop("timeout", 10), **kw
    )
    return Memory.from_defaults(
        session_id=session,
        user_id=user,
        token_limit=100,
        chat_history_token_ratio=0.1,
        token_flush_size=5,
        db=db,
        memory_blocks=[block],
        tokenizer=WordTokenizer(),
    )


def turn(memory: Memory, text: str) -> list:
    """A turn of 8 words: from the second on, each turn flushes the one before."""
    return memory.put_messages(
        [Message("user", f"{text} is what I say today"), Message("assistant", "ok noted")]
    )


def facts(memory: Memory) -> list[str]:
    return [f.text for f in fact_store.list_facts(memory.store, "extracted_info", "user:ana")]


def test_extracts_facts_with_provenance(llm, db: str) -> None:
    llm.script({"content": "<facts><fact>Ana has a dog named Rex</fact></facts>"})
    memory = facts_memory(llm, db)
    flushes = turn(memory, "my dog is Rex") + turn(memory, "and I like tea")
    assert len(flushes) == 1 and len(flushes[0].message_ids) == 2
    assert facts(memory) == ["Ana has a dog named Rex"]
    fact = fact_store.list_facts(memory.store, "extracted_info", "user:ana")[0]
    assert fact.flush_id == flushes[0].id
    assert fact.message_ids == flushes[0].message_ids
    assert fact.session_id == "s1" and fact.origin == "extracted"
    request = llm.requests[0]
    assert request["model"] == "test"
    assert "my dog is Rex" in request["messages"][-1]["content"]
    assert "<existing_facts>" in request["messages"][0]["content"]
    # Rendered as <fact> lines in the context.
    assert "<fact>Ana has a dog named Rex</fact>" in memory.context().memory_text


def test_duplicates_after_normalising_are_not_added(llm, tmp_path: Path) -> None:
    llm.script(
        {"content": "<facts><fact>Ana likes tea</fact></facts>"},
        {"content": "<facts><fact>ana   LIKES tea</fact><fact>Ana lives in Porto</fact></facts>"},
    )
    memory = facts_memory(llm, tmp_path / "m.db")
    for text in ("one", "two", "three"):
        turn(memory, text)
    assert facts(memory) == ["Ana likes tea", "Ana lives in Porto"]
    # The second request told the LLM what is already known.
    assert '<fact id="1">Ana likes tea</fact>' in llm.requests[1]["messages"][0]["content"]


@pytest.mark.parametrize(
    "failure",
    [
        {"content": ""},
        {"content": "Sure! The user likes tea."},
        {"raw": "this is not json"},
        {"status": 500},
        {"status": 429},
        {"delay": 3, "content": "<facts><fact>late</fact></facts>"},
    ],
    ids=["empty", "malformed", "junk", "http500", "http429", "timeout"],
)
def test_failed_extraction_keeps_facts_and_is_retried(llm, tmp_path: Path, failure) -> None:
    llm.script(
        {"content": "<facts><fact>Ana likes tea</fact></facts>"},
        failure,
        {"content": "<facts></facts>"},  # the next batch
        {"content": "<facts><fact>Ana lives in Porto</fact></facts>"},  # then the retry
    )
    memory = facts_memory(llm, tmp_path / "m.db", timeout=1)
    turn(memory, "one")
    first = turn(memory, "two")  # flushes "one": tea
    assert facts(memory) == ["Ana likes tea"]
    second = turn(memory, "three")  # flushes "two": the failure; the flush itself succeeds
    assert len(second) == 1 and second[0].id != first[0].id
    assert facts(memory) == ["Ana likes tea"]
    assert longterm.pending_flushes(memory.store, "extracted_info", "user:ana") == [
        (second[0].id, "s1")
    ]
    turn(memory, "four")  # extracts "three", then retries "two"
    assert facts(memory) == ["Ana likes tea", "Ana lives in Porto"]
    assert longterm.pending_flushes(memory.store, "extracted_info", "user:ana") == []
    porto = fact_store.list_facts(memory.store, "extracted_info", "user:ana")[1]
    assert porto.flush_id == second[0].id


def poisoned(failure: dict, fails: int | None = None):
    """Replies: `failure` to the batch that holds "poison" (its first `fails` times, or always),
    a known fact to every other batch."""
    calls: list[int] = []

    def reply(body: dict) -> dict:
        if "poison" not in body["messages"][-1]["content"]:
            return {"content": "<facts><fact>Ana likes tea</fact></facts>"}
        calls.append(len(calls))
        if fails is None or len(calls) <= fails:
            return failure
        return {"content": "<facts><fact>Ana lives in Porto</fact></facts>"}

    return reply, calls


@pytest.mark.parametrize(
    "failure",
    [{"content": "Sure! The user lives in Porto."}, {"content": ""}, {"status": 500}],
    ids=["malformed", "empty", "http500"],
)
def test_a_batch_that_always_fails_is_retried_with_back_off_then_left(
    llm, tmp_path: Path, failure
) -> None:
    reply, calls = poisoned(failure)
    llm.script(*[reply] * 100)
    memory = facts_memory(llm, tmp_path / "m.db")
    turn(memory, "one")
    turn(memory, "poison")  # flushes "one"
    tried_at = []
    for i in range(20):  # 20 later flushes: the first flushes "poison"
        before = len(calls)
        turn(memory, f"later {i}")
        tried_at += [i] * (len(calls) - before)
    # The first attempt, then 3 automatic retries after 1, 2 and 4 later flushes: 4 calls, not 20.
    assert tried_at == [0, 1, 3, 7]
    assert len(llm.requests) == 21 + 3  # one per flush, plus the retries
    # Garbage never touched the facts; the batch stays pending, left for `extract --pending`.
    assert facts(memory) == ["Ana likes tea"]
    assert [c.action for c in fact_store.fact_history(memory.store, "user:ana")] == ["added"]
    pending = longterm.pending_flushes(memory.store, "extracted_info", "user:ana")
    assert len(pending) == 1
    assert longterm.pending_flushes(memory.store, "extracted_info", "user:ana", retries=3) == []


def test_a_batch_that_fails_then_succeeds_on_a_retry_gets_its_facts(llm, db: str) -> None:
    reply, calls = poisoned({"content": "no facts here"}, fails=2)
    llm.script(*[reply] * 100)
    memory = facts_memory(llm, db)
    turn(memory, "one")
    flushes = turn(memory, "poison")
    flushes = turn(memory, "later 0")  # flushes "poison": fails
    poison_flush = flushes[0].id
    turn(memory, "later 1")  # the next flush retries it: fails again
    assert len(calls) == 2
    turn(memory, "later 2")  # backing off: not retried
    assert len(calls) == 2 and facts(memory) == ["Ana likes tea"]
    turn(memory, "later 3")  # two flushes later: retried, and it works
    assert len(calls) == 3
    assert facts(memory) == ["Ana likes tea", "Ana lives in Porto"]
    porto = fact_store.list_facts(memory.store, "extracted_info", "user:ana")[1]
    assert porto.flush_id == poison_flush
    assert longterm.pending_flushes(memory.store, "extracted_info", "user:ana") == []
    for i in range(4, 10):  # done: never asked again
        turn(memory, f"later {i}")
    assert len(calls) == 3


def test_extract_pending_retries_a_batch_left_after_its_automatic_retries(
    llm, tmp_path: Path
) -> None:
    from memcli.blocks.facts import extract_pending

    reply, calls = poisoned({"status": 503}, fails=4)
    llm.script(*[reply] * 100)
    memory = facts_memory(llm, tmp_path / "m.db", auto_retries=2)
    block = memory.memory_blocks[0]
    turn(memory, "poison")
    for i in range(8):
        turn(memory, f"later {i}")
    assert len(calls) == 3  # the first attempt and 2 automatic retries
    sessions = memory.store.list_sessions("ana")
    # Still failing: tried again whatever its back-off, and still pending.
    result = extract_pending(memory.store, [block], sessions, memory.tokenizer)
    assert (result.done, result.pending) == ({"extracted_info": 0}, {"extracted_info": 1})
    assert len(calls) == 4
    # The LLM answers: done, its facts stored.
    result = extract_pending(memory.store, [block], sessions, memory.tokenizer)
    assert (result.done, result.pending) == ({"extracted_info": 1}, {"extracted_info": 0})
    assert facts(memory) == ["Ana likes tea", "Ana lives in Porto"]
    result = extract_pending(memory.store, [block], sessions, memory.tokenizer)
    assert (result.done, result.pending) == ({"extracted_info": 0}, {"extracted_info": 0})
    assert len(calls) == 5


def test_condense_over_max_facts(llm, db: str) -> None:
    """Condensing is the same mechanism as extraction: a merged fact supersedes the facts it
    names, a retired fact is kept with its reason, the others stay; nothing is deleted."""
    llm.script(
        {"content": "<facts><fact>F1</fact><fact>F2</fact></facts>"},
        {"content": "<facts><fact>F3</fact><fact>F4</fact></facts>"},
        {
            "content": '<facts><fact replaces="3, 4">F3 and F4</fact>'
            '<retire id="2">F2 is old news</retire></facts>'
        },  # condensed
    )
    memory = facts_memory(llm, db, max_facts=3)
    for text in ("one", "two", "three"):
        turn(memory, text)
    assert facts(memory) == ["F1", "F3 and F4"]
    prompt = llm.requests[2]["messages"][0]["content"]
    assert "more than 3" in prompt and '<fact id="3">F3</fact>' in prompt
    every = fact_store.list_facts(memory.store, "extracted_info", "user:ana", everything=True)
    assert [(f.text, f.status(), f.superseded_by, f.reason) for f in every] == [
        ("F1", "current", None, None),
        ("F2", "retired", None, "F2 is old news"),
        ("F3", "superseded", 5, "superseded by fact 5"),
        ("F4", "superseded", 5, "superseded by fact 5"),
        ("F3 and F4", "current", None, None),
    ]
    history = fact_store.fact_history(memory.store, "user:ana")
    actions = [(c.action, c.fact_id) for c in history]
    assert actions == [
        ("added", 1),
        ("added", 2),
        ("added", 3),
        ("added", 4),
        ("condensed", 5),
        ("superseded", 3),
        ("superseded", 4),
        ("retired", 2),
    ]
    # Extraction's changes and condensing's say so in the history (memcli facts history).
    assert [c.origin for c in history] == ["extracted"] * 4 + ["condensed"] * 4


@pytest.mark.parametrize(
    "bad",
    [
        {"content": ""},
        {"content": "<facts></facts>"},
        {"content": "nonsense"},
        {"status": 500},
        {"content": '<facts><fact replaces="99">a</fact></facts>'},  # an id it was not shown
        {"content": '<facts><retire id="1">x</retire><fact replaces="1">b</fact></facts>'},
    ],
)
def test_bad_condense_reply_is_ignored(llm, tmp_path: Path, bad) -> None:
    llm.script(
        {"content": "<facts><fact>F1</fact><fact>F2</fact></facts>"},
        {"content": "<facts><fact>F3</fact><fact>F4</fact></facts>"},
        bad,
    )
    memory = facts_memory(llm, tmp_path / "m.db", max_facts=3)
    for text in ("one", "two", "three"):
        turn(memory, text)
    assert facts(memory) == ["F1", "F2", "F3", "F4"]
    assert longterm.pending_flushes(memory.store, "extracted_info", "user:ana") == []


def test_facts_survive_a_restart_and_are_shared_by_the_users_sessions(llm, db: str) -> None:
    llm.script({"content": "<facts><fact>Ana is vegetarian</fact></facts>"})
    memory = facts_memory(llm, db)
    turn(memory, "one")
    turn(memory, "two")
    memory.store.close()
    again = facts_memory(llm, db, session="s2")
    again.put(Message("user", "hello"))
    assert "<fact>Ana is vegetarian</fact>" in again.context().memory_text
    other = facts_memory(llm, db, session="s3", user="bob")
    other.put(Message("user", "hello"))
    assert other.context().memory_text == ""


def test_fact_block_checks_its_settings() -> None:
    from memcli import ConfigError

    with pytest.raises(ConfigError, match="model must be a model name"):
        FactBlock(model="")
    with pytest.raises(ConfigError, match="max_facts"):
        FactBlock(model="x", max_facts=0)
    with pytest.raises(ConfigError, match="auto_retries"):
        FactBlock(model="x", auto_retries=-1)


def test_edit_and_delete_keep_history(db: str) -> None:
    store = open_store(db)
    added = fact_store.add_facts(
        store, "extracted_info", "user:ana", ["A", "B", " a "], origin="manual"
    )
    assert [f.text for f in added] == ["A", "B"]
    before, after = fact_store.edit_fact(store, added[0].id, "A2")
    assert (before.text, after.text) == ("A", "A2")
    assert fact_store.delete_fact(store, added[1].id) is not None
    assert fact_store.delete_fact(store, added[1].id) is None
    assert [f.text for f in fact_store.list_facts(store, None, "user:ana")] == ["A2"]
    assert [(c.action, c.text, c.old_text) for c in fact_store.fact_history(store, "user:ana")] == [
        ("added", "A", None),
        ("added", "B", None),
        ("edited", "A2", "A"),
        ("deleted", None, "B"),
    ]


def test_messages_read_while_active_are_not_sent_again_when_flushed(llm, tmp_path: Path) -> None:
    from memcli.blocks.conversations import plan_extraction, read_batches

    memory = facts_memory(llm, tmp_path / "m.db")
    turn(memory, "my dog is Rex")  # stays active: no flush yet
    [block] = memory.memory_blocks
    info = memory.store.get_session("s1")
    plan = plan_extraction(memory.store, [block], [info], memory.tokenizer)
    assert plan.requests == 1 and plan.batches[0].flush_id is None
    llm.script({"content": "<facts><fact>Ana has a dog named Rex</fact></facts>"})
    result = read_batches(memory.store, [block], plan, memory.tokenizer)
    assert result.done == {"extracted_info": 1} and len(llm.requests) == 1

    flushes = turn(memory, "and I like tea")  # flushes the turn read above
    assert len(flushes) == 1
    assert len(llm.requests) == 1  # not sent again
    statuses = longterm.flush_statuses(memory.store, "extracted_info", "user:ana", "s1")
    assert statuses == {flushes[0].id: "done"}
    assert facts(memory) == ["Ana has a dog named Rex"]
    assert plan_extraction(memory.store, [block], [info], memory.tokenizer).requests == 1  # tea

"""SummaryBlock: a running session summary, over litellm's HTTP to the loopback server."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fakes import WordTokenizer

from memcli import (
    ConfigError,
    Memory,
    Message,
    SQLiteStore,
    SummaryBlock,
    TiktokenTokenizer,
)
from memcli.blocks.feed import backfill
from memcli.blocks.registry import Defaults, build_blocks
from memcli.blocks.summary import cap_text, parse_summary
from memcli.store import longterm, summaries


def summary_memory(llm, db, session="s1", user="ana", tokenizer=None, **kw) -> Memory:
    token_limit = kw.pop("token_limit", 400)
    block = SummaryBlock(
        model="openai/test", api_base=llm.api_base, timeout=kw.pop("timeout", 10), **kw
    )
    return Memory.from_defaults(
        session_id=session,
        user_id=user,
        token_limit=token_limit,
        chat_history_token_ratio=0.02,
        token_flush_size=5,
        db=db,
        memory_blocks=[block],
        tokenizer=tokenizer or WordTokenizer(),
    )


def turn(memory: Memory, text: str) -> list:
    """A turn of 8 words: from the second on, each turn flushes the one before."""
    return memory.put_messages(
        [Message("user", f"{text} is what I say today"), Message("assistant", "ok noted")]
    )


def said(request: dict) -> str:
    """Which turn a request's batch holds ("one", "two", ...)."""
    match = re.search(
        r"<message role='user'>(.*?) is what I say today", request["messages"][-1]["content"]
    )
    assert match, request
    return match.group(1)


def versions(memory: Memory) -> list[tuple[int, str]]:
    return [
        (s.version, s.text)
        for s in summaries.summary_history(memory.store, memory.session_id, "session_summary")
    ]


def pending(memory: Memory) -> list[int]:
    key = f"session:{memory.session_id}"
    return [f for f, _ in longterm.pending_flushes(memory.store, "session_summary", key)]


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("<summary>Ana has a dog.</summary>", "Ana has a dog."),
        (
            "Here it is:\n```\n<summary>\n  Ana  has\n\n a dog &amp; a cat.\n</summary>\n```",
            "Ana has\na dog & a cat.",
        ),
        ("", None),
        ("Ana has a dog.", None),
        ("<summary>  </summary>", None),
        ("<summary>A</summary><summary>B</summary>", None),
        ("<summary>I'm sorry, but I can't help with that.</summary>", None),
        ("<summary>As an AI, I cannot summarise.</summary>", None),
        ("<summary><message role='user'>hi</message></summary>", None),
        ("<summary>Ana has a dog.", None),
        (
            "<summary>Ana has a dog.</summary>\n<summary> Ana has  a dog.</summary>",
            "Ana has a dog.",
        ),
        ("<think>Hm, a <summary> tag.</think><summary>Ana has a dog.</summary>", "Ana has a dog."),
        ('{"summary": "Ana has a dog."}', "Ana has a dog."),
        ('```json\n{"summary": "Ana has a dog."}\n```', "Ana has a dog."),
        ('{"summary": "Ana has', None),
        ('{"text": "Ana has a dog."}', None),
        ('{"summary": ""}', None),
        ('{"summary": "Sorry, I cannot help."}', None),
    ],
)
def test_parse_summary(reply: str, expected) -> None:
    assert parse_summary(reply) == expected


def test_cap_text_cuts_at_a_sentence_end_else_a_word() -> None:
    words = WordTokenizer()
    text = "Ana has a dog. She lives in Porto! Is it sunny? Yes."
    assert cap_text(text, 100, words) == text
    assert cap_text(text, 9, words) == "Ana has a dog. She lives in Porto!"
    assert cap_text(text, 5, words) == "Ana has a dog."
    assert cap_text(text, 3, words) == "Ana has a"
    assert cap_text("Supercalifragilistic", 0, words) == ""


def test_the_summary_is_updated_with_each_flushed_batch(llm, tmp_path: Path) -> None:
    llm.script(
        {"content": "<summary>Ana has a dog named Rex.</summary>"},
        {"content": "<summary>Ana has a dog named Rex and likes tea.</summary>"},
    )
    memory = summary_memory(llm, tmp_path / "m.db")
    turn(memory, "one")
    first = turn(memory, "two")  # flushes "one"
    second = turn(memory, "three")  # flushes "two"
    assert [said(r) for r in llm.requests] == ["one", "two"]
    # The first request had no summary; the second had the first one as the previous summary.
    assert "<previous_summary>\n\n</previous_summary>" in llm.requests[0]["messages"][0]["content"]
    assert (
        "<previous_summary>\nAna has a dog named Rex.\n</previous_summary>"
        in llm.requests[1]["messages"][0]["content"]
    )
    assert "at most 300 words" in llm.requests[0]["messages"][0]["content"]
    assert versions(memory) == [
        (1, "Ana has a dog named Rex."),
        (2, "Ana has a dog named Rex and likes tea."),
    ]
    history = summaries.summary_history(memory.store, "s1", "session_summary")
    assert [h.flush_id for h in history] == [first[0].id, second[0].id]
    assert (history[1].first_message_id, history[1].last_message_id) == (
        second[0].message_ids[0],
        second[0].message_ids[-1],
    )
    assert history[1].tokens == 9
    # In the context, rendered as a block like the others.
    assert (
        "<session_summary>\nAna has a dog named Rex and likes tea.\n</session_summary>"
        in memory.context().memory_text
    )
    assert pending(memory) == []


def test_the_summary_survives_a_restart_and_stays_with_its_session(llm, tmp_path: Path) -> None:
    llm.script({"content": "<summary>Ana is vegetarian.</summary>"})
    db = tmp_path / "m.db"
    memory = summary_memory(llm, db)
    turn(memory, "one")
    turn(memory, "two")
    memory.store.close()
    again = summary_memory(llm, db)
    assert (
        "<session_summary>\nAna is vegetarian.\n</session_summary>" in again.context().memory_text
    )
    assert versions(again) == [(1, "Ana is vegetarian.")]
    other = summary_memory(llm, db, session="s2")  # the same user, another session
    other.put(Message("user", "hello"))
    assert other.context().memory_text == ""


@pytest.mark.parametrize(
    "failure",
    [
        {"content": ""},
        {"content": "Sure! Ana lives in Porto."},
        {"content": "<summary>I'm sorry, I cannot help with that.</summary>"},
        {"raw": "this is not json"},
        {"status": 500},
        {"status": 429},
        {"delay": 3, "content": "<summary>late</summary>"},
    ],
    ids=["empty", "no-summary", "refusal", "junk", "http500", "http429", "timeout"],
)
def test_a_failed_reply_keeps_the_summary_and_the_batch_is_retried(
    llm, tmp_path: Path, failure
) -> None:
    llm.script(
        {"content": "<summary>Ana likes tea.</summary>"},
        failure,
        {"content": "<summary>Ana likes tea and lives in Porto.</summary>"},  # the retry
        {"content": "<summary>Ana likes tea, lives in Porto, works.</summary>"},  # the next batch
    )
    memory = summary_memory(llm, tmp_path / "m.db", timeout=1)
    turn(memory, "one")
    turn(memory, "two")  # flushes "one"
    failed = turn(memory, "three")  # flushes "two": the failure; the flush itself succeeds
    assert len(failed) == 1
    assert versions(memory) == [(1, "Ana likes tea.")]
    assert "Ana likes tea." in memory.context().memory_text
    assert pending(memory) == [failed[0].id]
    turn(memory, "four")  # flushes "three": first retries "two", then takes "three" in
    assert [said(r) for r in llm.requests] == ["one", "two", "two", "three"]
    assert versions(memory)[1:] == [
        (2, "Ana likes tea and lives in Porto."),
        (3, "Ana likes tea, lives in Porto, works."),
    ]
    history = summaries.summary_history(memory.store, "s1", "session_summary")
    assert history[1].flush_id == failed[0].id
    assert pending(memory) == []


def poisoned(fails: int | None):
    """Replies: a failure to the batch of "poison" (its first `fails` times, or always), a
    summary naming its batch to every other."""
    calls: list[int] = []

    def reply(body: dict) -> dict:
        text = said(body)
        if text == "poison":
            calls.append(len(calls))
            if fails is None or len(calls) <= fails:
                return {"status": 503}
        return {"content": f"<summary>Up to {text}.</summary>"}

    return reply, calls


def test_later_batches_wait_for_an_earlier_pending_one(llm, tmp_path: Path) -> None:
    reply, calls = poisoned(fails=2)
    llm.script(*[reply] * 100)
    memory = summary_memory(llm, tmp_path / "m.db")
    turn(memory, "one")
    turn(memory, "poison")  # flushes "one"
    turn(memory, "a")  # flushes "poison": fails
    turn(memory, "b")  # retries "poison" (due): fails again; "a" waits, not asked for
    assert [said(r) for r in llm.requests] == ["one", "poison", "poison"]
    turn(memory, "c")  # "poison" backs off: "b" waits too, nothing asked
    assert [said(r) for r in llm.requests] == ["one", "poison", "poison"]
    assert versions(memory) == [(1, "Up to one.")]
    assert len(pending(memory)) == 3
    turn(memory, "d")  # "poison" is due: it works, then "a", "b" and "c" in order
    assert [said(r) for r in llm.requests] == ["one", "poison", "poison", "poison", "a", "b", "c"]
    assert [text for _, text in versions(memory)] == [
        "Up to one.",
        "Up to poison.",
        "Up to a.",
        "Up to b.",
        "Up to c.",
    ]
    history = summaries.summary_history(memory.store, "s1", "session_summary")
    flush_ids = [h.flush_id for h in history]
    assert flush_ids == sorted(flush_ids)
    assert pending(memory) == []


def test_a_summary_written_meanwhile_elsewhere_is_not_overwritten(llm, tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    memory = summary_memory(llm, db)
    other = SQLiteStore(db)  # another process's connection
    calls: list[str] = []

    def reply(body: dict) -> dict:
        if not calls:  # while the first reply is on its way, another writer stores a summary
            summaries.add_summary(other, "s1", "session_summary", "Written elsewhere.", 2)
        calls.append(said(body))
        return {"content": f"<summary>Up to {said(body)}.</summary>"}

    llm.script(*[reply] * 10)
    turn(memory, "one")
    first = turn(memory, "two")  # flushes "one": made from no summary, but one exists now
    assert versions(memory) == [(1, "Written elsewhere.")]
    assert pending(memory) == [first[0].id]
    turn(memory, "three")  # "one" again, on top of the other summary; then "two"
    assert calls == ["one", "one", "two"]
    assert "Written elsewhere." in llm.requests[1]["messages"][0]["content"]
    assert versions(memory) == [(1, "Written elsewhere."), (2, "Up to one."), (3, "Up to two.")]


def test_summaries_go_with_their_session_and_stay_after_a_reset(llm, tmp_path: Path) -> None:
    llm.script(*[poisoned(fails=0)[0]] * 10)
    memory = summary_memory(llm, tmp_path / "m.db")
    turn(memory, "one")
    turn(memory, "two")
    memory.reset()  # messages and flushes go; the summary stays, as block contents do
    assert versions(memory) == [(1, "Up to one.")]
    turn(memory, "three")
    turn(memory, "four")  # flushes "three" (its flush id may be one given out before)
    assert versions(memory) == [(1, "Up to one."), (2, "Up to three.")]
    memory.store.delete_session("s1")
    assert summaries.summary_history(memory.store, "s1", "session_summary") == []


def test_a_batch_that_always_fails_is_left_after_its_retries_and_backfill_catches_up(
    llm, tmp_path: Path
) -> None:
    reply, calls = poisoned(fails=None)
    llm.script(*[reply] * 100)
    memory = summary_memory(llm, tmp_path / "m.db", auto_retries=2)
    block = memory.memory_blocks[0]
    turn(memory, "poison")
    for name in ("a", "b", "c", "d", "e", "f", "g"):
        turn(memory, name)
    # The first attempt and 2 automatic retries (after 1 and 2 later flushes); nothing after it.
    assert len(calls) == 3
    assert [said(r) for r in llm.requests] == ["poison"] * 3
    assert versions(memory) == []
    assert len(pending(memory)) == 7  # "poison" and the 6 batches after it
    sessions = memory.store.list_sessions("ana")
    result = backfill(memory.store, [block], sessions, memory.tokenizer)
    # Tried again whatever its back-off; the later ones wait without being sent.
    assert (result.done, result.pending) == ({"session_summary": 0}, {"session_summary": 7})
    assert len(calls) == 4 and len(llm.requests) == 4
    llm.reset()
    llm.script(*[poisoned(fails=0)[0]] * 100)
    result = backfill(memory.store, [block], sessions, memory.tokenizer)
    assert (result.done, result.pending) == ({"session_summary": 7}, {"session_summary": 0})
    assert [said(r) for r in llm.requests] == ["poison", "a", "b", "c", "d", "e", "f"]
    assert versions(memory)[-1] == (7, "Up to f.")


def test_a_block_added_later_takes_in_the_older_batches_first(llm, tmp_path: Path) -> None:
    llm.script(*[poisoned(fails=0)[0]] * 100)
    db = tmp_path / "m.db"
    plain = Memory.from_defaults(
        session_id="s1",
        user_id="ana",
        token_limit=400,
        chat_history_token_ratio=0.02,
        token_flush_size=5,
        db=db,
        tokenizer=WordTokenizer(),
    )
    for name in ("one", "two", "three"):
        turn(plain, name)  # two flushes, no blocks
    plain.store.close()
    memory = summary_memory(llm, db, retry_pending=1)
    turn(memory, "four")  # flushes "three": "one" first (one per flush), "three" waits
    assert [said(r) for r in llm.requests] == ["one"]
    turn(memory, "five")  # "two", then "three" still waits
    turn(memory, "six")  # "three"; "four" and "five" wait
    assert [said(r) for r in llm.requests] == ["one", "two", "three"]
    turn(memory, "seven")
    assert [said(r) for r in llm.requests] == ["one", "two", "three", "four"]


def test_the_summary_is_capped_in_tokens(llm, tmp_path: Path) -> None:
    long = " ".join(f"Ana said thing number {i}." for i in range(40))
    llm.script({"content": f"<summary>{long}</summary>"})
    tokenizer = TiktokenTokenizer()
    memory = summary_memory(llm, tmp_path / "m.db", tokenizer=tokenizer, max_tokens=30)
    turn(memory, "one")
    turn(memory, "two")
    assert "at most 22 words" in llm.requests[0]["messages"][0]["content"]
    current = summaries.latest_summary(memory.store, "s1", "session_summary")
    assert current is not None
    assert current.tokens == tokenizer.count(current.text) <= 30
    assert current.text.startswith("Ana said thing number 0.") and current.text.endswith(".")
    assert long.startswith(current.text) and len(current.text) < len(long)


def test_truncation_cuts_the_summary_at_a_sentence(llm, tmp_path: Path) -> None:
    llm.script({"content": "<summary>Ana has a dog. She lives in Porto. She likes tea.</summary>"})
    memory = summary_memory(llm, tmp_path / "m.db", token_limit=15)
    turn(memory, "one")
    turn(memory, "two")
    context = memory.context()  # 8 words of history + 11 of summary over a limit of 15
    block = context.blocks[0]
    assert block.truncated == "cut" and block.content == "Ana has a dog."


def test_summary_block_from_config_and_its_checks() -> None:
    tables = [
        {"kind": "summary", "max_tokens": 200, "priority": 3, "temperature": 0, "auto_retries": 1}
    ]
    (block,) = build_blocks(tables, Defaults("openai/m", "http://127.0.0.1:9/v1", 5))
    assert isinstance(block, SummaryBlock)
    assert (block.name, block.max_tokens, block.priority, block.scope) == (
        "session_summary",
        200,
        3,
        "session",
    )
    assert block.llm.model == "openai/m" and block.llm.extra == {"temperature": 0}
    # Its definition rebuilds it (what a Memory records for the CLI).
    (again,) = build_blocks([block.definition()], Defaults())
    assert again.definition() == block.definition()
    for table, message in [
        ({"max_tokens": 5}, r"\[\[blocks\]\] #1: block 'session_summary': max_tokens must be"),
        ({"max_tokens": "400"}, r"\[\[blocks\]\] #1: max_tokens must be int"),
        ({"scope": "user"}, r"#1: block 'session_summary': scope must be 'session'"),
        ({"name": "s", "retry_pending": -1}, r"#1 \('s'\): block 's': retry_pending must be"),
        ({"max_facts": 3}, r"#1: unknown key 'max_facts' for kind 'summary'"),
        ({"model": ""}, r"model must be a model name"),
    ]:
        with pytest.raises(ConfigError, match=message):
            build_blocks([{"kind": "summary", **table}], Defaults("openai/m"))
    with pytest.raises(
        ConfigError, match="kind must be one of static, facts, vector, python, summary"
    ):
        build_blocks([{"kind": "summaries"}], Defaults())


def test_without_a_model_the_block_shows_the_summary_and_takes_no_flushes(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "m.db")
    memory = Memory(store, "s1", tokenizer=WordTokenizer(), memory_blocks=[SummaryBlock()])
    memory.put(Message("user", "hello"))
    summaries.add_summary(store, "s1", "session_summary", "Ana said hello.", 3)
    assert memory.memory_blocks[0].receives_flushes is False
    assert "Ana said hello." in memory.context().memory_text

"""How an LLM block's calls are made, as the loopback server receives them: every call bounded
(`max_tokens`, a timeout that closes the connection), the instructions in the user message or
the system message, structured output (a JSON schema) when asked for or when litellm says the
model supports it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import WordTokenizer

from memcli import ConfigError, FactBlock, Memory, Message, SummaryBlock
from memcli.blocks.registry import Defaults, build_blocks
from memcli.store import facts as fact_store
from memcli.store import longterm, summaries


def memory_with(block, db: Path) -> Memory:
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


def turns(memory: Memory, *texts: str) -> None:
    """Turns of 8 words: from the second on, each turn flushes the one before."""
    for text in texts:
        memory.put_messages(
            [Message("user", f"{text} is what I say today"), Message("assistant", "ok noted")]
        )


def facts(memory: Memory) -> list[str]:
    return [f.text for f in fact_store.list_facts(memory.store, "extracted_info", "user:ana")]


def fact_block(llm, **kw) -> FactBlock:
    return FactBlock(model="openai/test", api_base=llm.api_base, timeout=10, **kw)


def summary_block(llm, **kw) -> SummaryBlock:
    return SummaryBlock(model="openai/test", api_base=llm.api_base, timeout=10, **kw)


def test_every_block_call_sends_max_tokens(llm, tmp_path: Path) -> None:
    """Extraction and condensing send the fact block's bound (default 1024), a summary its own
    (twice its cap by default)."""
    llm.script(
        {"content": "<facts><fact>F1</fact><fact>F2</fact></facts>"},
        {"content": '<facts><fact replaces="1, 2">F1 and F2</fact></facts>'},  # condensed
    )
    memory = memory_with(fact_block(llm, max_facts=1), tmp_path / "f.db")
    turns(memory, "one", "two")
    assert facts(memory) == ["F1 and F2"]
    assert [r["max_tokens"] for r in llm.requests] == [1024, 1024]
    assert "more than 1" in llm.requests[1]["messages"][0]["content"]  # the condense call

    llm.reset()
    llm.script({"content": "<summary>Ana talks.</summary>"})
    memory = memory_with(summary_block(llm, max_tokens=300), tmp_path / "s.db")
    turns(memory, "one", "two")
    assert summaries.latest_summary(memory.store, "s1", "session_summary").text == "Ana talks."
    assert [r["max_tokens"] for r in llm.requests] == [600]


def test_reply_tokens_is_configurable_and_recorded(llm, tmp_path: Path) -> None:
    (facts_block, summary) = build_blocks(
        [
            {"kind": "facts", "reply_tokens": 300},
            {"kind": "summary", "reply_tokens": 200, "max_tokens": 150},
        ],
        Defaults("openai/test", llm.api_base),
    )
    assert (facts_block.reply_tokens, summary.reply_tokens) == (300, 200)
    assert summary.max_tokens == 150  # the summary's own cap is another thing
    for block in (facts_block, summary):
        (again,) = build_blocks([block.definition()], Defaults())
        assert again.reply_tokens == block.reply_tokens
        assert again.definition() == block.definition()
    # A fact block's `max_tokens` (litellm's name, from older tables) is the same bound.
    (older,) = build_blocks([{"kind": "facts", "max_tokens": 256}], Defaults())
    assert older.reply_tokens == 256 and older.definition()["reply_tokens"] == 256
    llm.script({"content": "<facts><fact>Ana likes tea</fact></facts>"})
    memory = memory_with(fact_block(llm, reply_tokens=64), tmp_path / "m.db")
    turns(memory, "one", "two")
    assert llm.requests[0]["max_tokens"] == 64


def test_a_timed_out_call_closes_its_connection(llm, tmp_path: Path) -> None:
    """The server sees the client leave when the block's timeout passes (it stops generating
    then), and the batch stays pending."""
    llm.script({"delay": 30, "content": "<facts><fact>late</fact></facts>"})
    block = FactBlock(model="openai/test", api_base=llm.api_base, timeout=1)
    memory = memory_with(block, tmp_path / "m.db")
    turns(memory, "one", "two")
    assert llm.wait_for_disconnect(timeout=20) is not None
    assert facts(memory) == []
    count, reason = longterm.pending_work(memory.store, "extracted_info", "user:ana")
    assert count == 1 and reason is not None and reason.startswith("timeout")


def roles(request: dict) -> list[str]:
    return [m["role"] for m in request["messages"]]


@pytest.mark.parametrize("kind", ["facts", "summary"])
def test_instructions_in_the_user_message_by_default(llm, tmp_path: Path, kind: str) -> None:
    """No system message reaches the server (some chat templates drop it): the instructions and
    the conversation are one user message."""
    llm.script({"content": "<facts></facts>" if kind == "facts" else "<summary>S.</summary>"})
    block = fact_block(llm) if kind == "facts" else summary_block(llm)
    memory = memory_with(block, tmp_path / "m.db")
    turns(memory, "one", "two")
    (request,) = llm.requests
    assert roles(request) == ["user"]
    content = request["messages"][0]["content"]
    assert "INSTRUCTIONS:" in content and "<message role='user'>one is what I say" in content


@pytest.mark.parametrize("kind", ["facts", "summary"])
def test_instructions_as_a_system_message(llm, tmp_path: Path, kind: str) -> None:
    llm.script({"content": "<facts></facts>" if kind == "facts" else "<summary>S.</summary>"})
    (block,) = build_blocks(
        [{"kind": kind, "instructions": "system"}], Defaults("openai/test", llm.api_base)
    )
    assert block.definition()["instructions"] == "system"
    memory = memory_with(block, tmp_path / "m.db")
    turns(memory, "one", "two")
    (request,) = llm.requests
    assert roles(request) == ["system", "user"]
    assert "INSTRUCTIONS:" in request["messages"][0]["content"]
    assert request["messages"][1]["content"].startswith("<conversation>")


def test_structured_output_sends_a_schema_and_reads_json(llm, tmp_path: Path) -> None:
    llm.script(
        {
            "content": json.dumps(
                {
                    "facts": [
                        {
                            "text": "Ana likes tea",
                            "topics": ["food"],
                            "entities": [],
                            "replaces": [],
                            "expires": "",
                        }
                    ],
                    "retire": [],
                }
            )
        }
    )
    memory = memory_with(fact_block(llm, structured_output=True), tmp_path / "m.db")
    turns(memory, "one", "two")
    assert facts(memory) == ["Ana likes tea"]
    (request,) = llm.requests
    schema = request["response_format"]
    assert schema["type"] == "json_schema" and schema["json_schema"]["name"] == "facts"
    assert schema["json_schema"]["schema"]["required"] == ["facts", "retire"]
    prompt = request["messages"][0]["content"]
    assert "JSON object" in prompt and "<facts>" not in prompt


def test_structured_output_for_summaries(llm, tmp_path: Path) -> None:
    llm.script({"content": '{"summary": "Ana talks."}'})
    memory = memory_with(summary_block(llm, structured_output=True), tmp_path / "m.db")
    turns(memory, "one", "two")
    assert summaries.latest_summary(memory.store, "s1", "session_summary").text == "Ana talks."
    assert llm.requests[0]["response_format"]["json_schema"]["name"] == "summary"


def test_structured_output_follows_litellm_unless_forced(llm, tmp_path: Path) -> None:
    """A model litellm knows supports schemas gets one; one it does not know (a local server's
    name) gets tags; `structured_output = false` turns it off."""
    cases = [("openai/gpt-4o-mini", None, True), ("openai/test", None, False)]
    cases.append(("openai/gpt-4o-mini", False, False))
    for i, (model, forced, expected) in enumerate(cases):
        llm.reset()
        llm.script({"content": "<facts><fact>Ana likes tea</fact></facts>"})
        kw = {} if forced is None else {"structured_output": forced}
        block = FactBlock(model=model, api_base=llm.api_base, timeout=10, **kw)
        assert block.uses_schema is expected
        memory = memory_with(block, tmp_path / f"{i}.db")
        turns(memory, "one", "two")
        # A tagged reply is read either way (a server that ignores response_format).
        assert facts(memory) == ["Ana likes tea"]
        assert ("response_format" in llm.requests[0]) is expected


def test_a_reply_cut_by_its_bound_keeps_its_complete_facts(llm, tmp_path: Path) -> None:
    llm.script({"content": "<facts>\n<fact>Ana has a dog</fact>\n<fact>Ana lives in Po"})
    memory = memory_with(fact_block(llm), tmp_path / "m.db")
    turns(memory, "one", "two")
    assert facts(memory) == ["Ana has a dog"]
    assert longterm.pending_flushes(memory.store, "extracted_info", "user:ana") == []


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("reply_tokens", 8, r"reply_tokens must be a whole number >= 16"),
        ("reply_tokens", "big", r"reply_tokens must be int"),
        ("reply_tokens", True, r"reply_tokens must be int"),
        ("instructions", "assistant", r"instructions must be 'user' or 'system'"),
        ("instructions", 1, r"instructions must be str"),
        ("structured_output", "yes", r"structured_output must be true or false"),
        ("structured_output", 1, r"structured_output must be true or false"),
    ],
)
@pytest.mark.parametrize("kind", ["facts", "summary"])
def test_bad_call_options(kind: str, key: str, value, message: str) -> None:
    with pytest.raises(ConfigError, match=r"\[\[blocks\]\] #1.*" + message):
        build_blocks([{"kind": kind, key: value}], Defaults())


def test_reply_bounds_cannot_be_given_twice() -> None:
    with pytest.raises(ConfigError, match="both reply_tokens and max_tokens"):
        build_blocks([{"kind": "facts", "reply_tokens": 100, "max_tokens": 100}], Defaults())

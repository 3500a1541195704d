"""The reference's own outputs (llama-index-core 0.14.25), reproduced exactly by Memory."""

from __future__ import annotations

import json

import pytest
from conftest import CONFORMANCE

from memcli import Memory, Message

CASES = sorted(p.stem for p in CONFORMANCE.glob("*.json"))


def run_case(case: dict, db: str | None = None) -> tuple[Memory, list[Message]]:
    p = case["params"]
    memory = Memory.from_defaults(
        session_id="conformance",
        token_limit=p["token_limit"],
        token_flush_size=p["token_flush_size"],
        chat_history_token_ratio=p["chat_history_token_ratio"],
        db=db,
    )
    for call in case["calls"]:
        messages = [Message(**m) for m in call["messages"]]
        if call["method"] == "put":
            for m in messages:
                memory.put(m)
        else:
            memory.put_messages(messages)
    return memory, memory.get_all()


def test_fixtures_are_there() -> None:
    assert len(CASES) >= 5, f"conformance fixtures missing from {CONFORMANCE}"


@pytest.mark.parametrize("name", CASES)
def test_reference_case(name: str, db: str) -> None:
    case = json.loads((CONFORMANCE / f"{name}.json").read_text())
    memory, everything = run_case(case, db=db)
    expected = case["expected"]
    position = {m.id: i for i, m in enumerate(everything)}

    active = [position[m.id] for m in memory.get_all(status="active")]
    assert active == expected["active"]

    flushes = memory.store.list_flushes(memory.session_id)
    ranges = [[position[f.first_message_id], position[f.last_message_id]] for f in flushes]
    assert ranges == expected["flushes"]
    # Each flush holds exactly the messages of its range.
    for f, (first, last) in zip(flushes, ranges, strict=True):
        members = [position[m.id] for m in everything if m.flush_id == f.id]
        assert members == list(range(first, last + 1))

    got = [{"role": m.role, "content": m.content} for m in memory.get()]
    assert got == expected["get"]
    assert len(everything) == expected["get_all_count"]


def test_doc_example_figures() -> None:
    """The LlamaIndex documentation example: 198 flushes, 396 archived, 4 active."""
    case = json.loads((CONFORMANCE / "doc_example.json").read_text())
    memory, everything = run_case(case)
    assert len(memory.store.list_flushes(memory.session_id)) == 198
    assert len(memory.get_all(status="archived")) == 396
    assert len(memory.get()) == 4
    assert len(everything) == 400


@pytest.mark.parametrize("name", CASES)
def test_reference_case_through_put_calls(name: str, db: str) -> None:
    """The bulk path (`put_calls`, what `memcli import` uses) gives the same flushes and window."""
    case = json.loads((CONFORMANCE / f"{name}.json").read_text())
    p = case["params"]
    memory = Memory.from_defaults(
        token_limit=p["token_limit"],
        token_flush_size=p["token_flush_size"],
        chat_history_token_ratio=p["chat_history_token_ratio"],
        db=db,
    )
    calls = []
    for call in case["calls"]:
        messages = [Message(**m) for m in call["messages"]]
        calls.extend([[m] for m in messages] if call["method"] == "put" else [messages])
    memory.put_calls(calls)
    everything = memory.get_all()
    position = {m.id: i for i, m in enumerate(everything)}
    assert [position[m.id] for m in memory.get_all(status="active")] == case["expected"]["active"]
    flushes = memory.store.list_flushes(memory.session_id)
    ranges = [[position[f.first_message_id], position[f.last_message_id]] for f in flushes]
    assert ranges == case["expected"]["flushes"]

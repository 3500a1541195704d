"""memcli.simulate: the replay reproduces the reference and the engine, batch for batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import WordTokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memcli import Memory, Message
from memcli.flush import Budget, BudgetOverride
from memcli.simulate import FlushEvent, PutEvent, Replay, Simulation, budgets, simulate
from memcli.tokens import TiktokenTokenizer, message_tokens

CASES = [
    "doc_example",
    "doc_small_200_50_05",
    "mixed_roles_put_each",
    "big_turns_batches",
    "locomo26_turns",
]


def load_case(conformance_dir: Path, name: str) -> tuple[dict, list[list[Message]], Budget]:
    case = json.loads((conformance_dir / f"{name}.json").read_text())
    calls: list[list[Message]] = []
    for call in case["calls"]:
        messages = [Message(m["role"], m["content"]) for m in call["messages"]]
        if call["method"] == "put":
            calls.extend([m] for m in messages)
        else:
            calls.append(messages)
    p = case["params"]
    budget = Budget(p["token_limit"], p["chat_history_token_ratio"], p["token_flush_size"])
    return case, calls, budget


def active_positions(sim: Simulation) -> list[int]:
    """Source positions of the messages still active at the end (the last ones)."""
    return list(range(sim.summary.messages - sim.summary.active_messages, sim.summary.messages))


@pytest.mark.parametrize("name", CASES)
def test_conformance_cases_are_reproduced(conformance_dir: Path, name: str) -> None:
    case, calls, budget = load_case(conformance_dir, name)
    sim = simulate(calls, budget, TiktokenTokenizer())
    expected = case["expected"]
    assert [[f.first, f.last] for f in sim.flushes] == expected["flushes"]
    assert active_positions(sim) == expected["active"]
    assert sim.summary.messages == expected["get_all_count"]
    assert sim.summary.flushes == len(expected["flushes"])


def test_documentation_example(conformance_dir: Path) -> None:
    """400 messages as 100 batches of 4, limit 50, flush 10, ratio 0.7: 198 flushes, 4 active."""
    _, calls, budget = load_case(conformance_dir, "doc_example")
    assert len(calls) == 100 and all(len(c) == 4 for c in calls)
    assert (budget.token_limit, budget.flush_size, budget.chat_history_token_ratio) == (50, 10, 0.7)
    m = simulate(calls, budget, TiktokenTokenizer()).summary
    assert m.flushes == 198
    assert m.archived_messages == 396
    assert m.active_messages == 4
    assert m.puts == 100
    assert not m.stayed_over


def test_events_put_then_its_flushes_with_source_positions() -> None:
    tok = WordTokenizer()
    calls = [
        [Message("user", "a b c d"), Message("assistant", "e f g h")],
        [Message("user", "i j k l"), Message("assistant", "m n o p")],
    ]
    sim = simulate(calls, Budget(10, 1.0, 4), tok)
    kinds = [type(e).__name__ for e in sim.events]
    assert kinds == ["PutEvent", "PutEvent", "FlushEvent"]
    put = sim.events[1]
    assert isinstance(put, PutEvent)
    assert (put.first, put.last, put.tokens, put.active_tokens, put.flushes) == (2, 3, 8, 16, 1)
    flush = sim.events[2]
    assert isinstance(flush, FlushEvent)
    # 4 tokens reach the flush size; the assistant reply joins so the queue starts at a user.
    assert (flush.first, flush.last, flush.messages, flush.tokens) == (0, 1, 2, 8)
    assert (
        flush.reason
        == "reached the flush size; extended by 1 so the queue starts with a user message"
    )
    assert put.kept_tokens == 8 and put.kept_messages == 2
    assert flush.to_dict()["type"] == "flush" and put.to_dict()["type"] == "put"


def test_a_turn_larger_than_the_budget_stays_and_is_reported() -> None:
    tok = WordTokenizer()
    big = " ".join(["w"] * 50)
    calls = [[Message("user", "hi")], [Message("assistant", "yo")], [Message("user", big)]]
    sim = simulate(calls, Budget(20, 0.5, 2), tok)
    m = sim.summary
    assert m.stayed_over and m.over_threshold_puts == 1 and m.first_over_threshold == 2
    assert [(f.first, f.last) for f in sim.flushes] == [(0, 1)]
    assert m.active_messages == 1 and m.active_tokens == 50
    assert m.largest_active_tokens == 52 and m.largest_kept_tokens == 50


def test_a_transcript_replayed_counts_the_tokens_the_engine_stores(tmp_path: Path) -> None:
    """One counting path: the tokens simulate reads from a file are those Memory stores."""
    lines = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hello there <|endoftext|> é 🙂"},
        {"role": "assistant", "content": "end.\n\nNext paragraph  - item"},
        {"role": "tool", "content": "42", "metadata": {"tool": "calc", "n": 1}},
        {"messages": [{"role": "user", "content": "ok"}, {"role": "assistant", "content": "ok"}]},
        {"role": "user", "content": "hello there <|endoftext|> é 🙂"},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    tok = TiktokenTokenizer()
    replay, _ = Replay.from_source(path, "call", tok)
    memory = Memory.from_defaults(session_id="s", tokenizer=tok)
    for line in lines:
        messages = line.get("messages", [line])
        memory.put_messages([Message.from_dict(m) for m in messages])
    stored = [m.tokens for m in memory.get_all()]
    assert replay.tokens == stored
    assert stored == [message_tokens(m, tok) for m in memory.get_all()]


def test_budgets_are_every_combination_in_order() -> None:
    got = budgets([100, 200], [0.5, 0.7], [None, 10])
    assert [(b.token_limit, b.chat_history_token_ratio, b.flush_size) for b in got] == [
        (100, 0.5, 10),
        (100, 0.5, 10),
        (100, 0.7, 10),
        (100, 0.7, 10),
        (200, 0.5, 20),
        (200, 0.5, 10),
        (200, 0.7, 20),
        (200, 0.7, 10),
    ]


def test_budgets_fill_values_left_out_by_the_callers_rule() -> None:
    def from_session(asked: BudgetOverride) -> Budget:
        return Budget(asked.token_limit or 1000, asked.ratio or 0.5, asked.flush_size or 50)

    got = budgets([None, 2000], [None], [None, 300], from_session)
    assert [(b.token_limit, b.flush_size) for b in got] == [
        (1000, 50),
        (1000, 300),
        (2000, 50),
        (2000, 300),
    ]


def test_replay_with_stored_tokens_keeps_them() -> None:
    stored = [Message("user", "one two", tokens=99), Message("assistant", "x", tokens=1)]
    replay = Replay.from_calls([stored], WordTokenizer(), stored_tokens=True)
    assert replay.tokens == [99, 1] and replay.calls == [2]
    fresh = Replay.from_calls([stored], WordTokenizer())
    assert fresh.tokens == [2, 1]


# -- the engine and the simulation agree --------------------------------------------------------

ROLES = st.sampled_from(["user", "user", "assistant", "assistant", "tool", "system"])
MESSAGE = st.tuples(ROLES, st.integers(min_value=0, max_value=30))
CALLS = st.lists(st.lists(MESSAGE, min_size=1, max_size=5), min_size=1, max_size=25)


def assert_engine_agrees(calls: list[list[tuple[str, int]]], budget: Budget) -> None:
    """The simulation's flushes and final window equal what Memory does with the same calls."""
    tok = WordTokenizer()
    message_calls = [
        [Message(role, " ".join(f"w{i}" for i in range(n))) for role, n in call] for call in calls
    ]
    sim = simulate(message_calls, budget, tok)
    memory = Memory.from_defaults(
        session_id="s",
        token_limit=budget.token_limit,
        chat_history_token_ratio=budget.chat_history_token_ratio,
        token_flush_size=budget.flush_size,
        tokenizer=tok,
    )
    engine = []
    for call in message_calls:
        engine.extend(memory.put_messages(call))
    position = {m.id: i for i, m in enumerate(memory.get_all())}
    got = [
        (
            position[f.message_ids[0]],
            position[f.message_ids[-1]],
            len(f.message_ids),
            f.tokens,
            f.reason,
        )
        for f in engine
    ]
    assert got == [(f.first, f.last, f.messages, f.tokens, f.reason) for f in sim.flushes]
    active = [position[m.id] for m in memory.get_all(status="active")]
    assert active == active_positions(sim)
    assert memory.active_tokens() == sim.summary.active_tokens


BUDGETS = st.builds(
    lambda limit, ratio, share: Budget(limit, ratio, max(1, int(limit * share))),
    st.integers(min_value=5, max_value=120),
    st.sampled_from([0.3, 0.5, 0.7, 1.0]),
    st.floats(min_value=0.01, max_value=1.0),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls=CALLS, budget=BUDGETS)
def test_simulation_batches_equal_the_engines(
    calls: list[list[tuple[str, int]]], budget: Budget
) -> None:
    assert_engine_agrees(calls, budget)


# Agent-like logs: few user messages, long runs of replies and tool messages (one turn can outgrow
# the budget and stay: the replay skips planning there, and must still agree with the engine).
RARE_USER = st.sampled_from(["user"] + ["assistant"] * 6 + ["tool"] * 3)
AGENT_CALLS = st.lists(
    st.lists(st.tuples(RARE_USER, st.integers(min_value=0, max_value=30)), min_size=1, max_size=4),
    min_size=1,
    max_size=30,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls=AGENT_CALLS, budget=BUDGETS)
def test_simulation_agrees_on_agent_logs(
    calls: list[list[tuple[str, int]]], budget: Budget
) -> None:
    assert_engine_agrees(calls, budget)


def test_one_long_turn_stays_whole_and_is_linear() -> None:
    """A user message then 30,000 replies: nothing can flush; the window stays over the budget."""
    n = 30_000
    replay = Replay(["user"] + ["assistant"] * (n - 1), [5] * n, [1] * n)
    from memcli.simulate import run

    sim = run(replay, Budget(100, 0.7, 10))
    assert sim.summary.flushes == 0
    assert sim.summary.over_threshold_puts == n - 14  # over 70 tokens from the 15th message on
    assert sim.summary.active_messages == n
    # A user message ends the long turn: everything before it can go at last.
    replay = Replay([*replay.roles, "user"], [*replay.tokens, 5], [*replay.calls, 1])
    flushes = run(replay, Budget(100, 0.7, 10)).flushes
    assert (flushes[0].first, flushes[-1].last) == (0, n - 1)


def test_events_json_is_json_dumps_of_each_event() -> None:
    from memcli.simulate import events_json

    events = [
        PutEvent(1, 2, 3, 2, 40, 90, 1, 30, 2, False),
        FlushEvent(1, 0, 1, 2, 60, "queue down to one; newest turn kept", False, 0, True),
        PutEvent(2, 4, 4, 1, 10_000_000, 10_000_030, 0, 10_000_030, 3, True),
    ]
    for run in (None, 0, 3):
        extra = {} if run is None else {"run": run}
        expected = "".join(json.dumps({**e.to_dict(), **extra}) + "\n" for e in events)
        assert events_json(events, run) == expected
    assert events_json([]) == ""


def test_openai_records_replayed_count_the_tokens_import_stores(tmp_path: Path) -> None:
    """Content parts, tool calls and kept keys: simulate counts what an import stores."""
    from memcli.formats import read

    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    lines = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "42", "metadata": {"k": 1}},
        {"messages": [{"role": "assistant", "content": "42.", "refusal": None}]},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    tok = TiktokenTokenizer()
    replay, _ = Replay.from_source(path, "call", tok)
    memory = Memory.from_defaults(session_id="s", tokenizer=tok)
    for record in read(path).records:  # as `memcli import` reads it
        memory.put_messages(record.messages)
    stored = [m.tokens for m in memory.get_all()]
    assert replay.tokens == stored
    plain = [message_tokens(Message(m.role, m.content), tok) for m in memory.get_all()]
    assert all(s > p for s, p in zip(stored[1:], plain[1:], strict=True))  # the kept keys count


def test_an_exported_file_replays_without_its_session_record(tmp_path: Path) -> None:
    """`memcli export` writes a session record first: simulate reads the file as import does."""
    header = {"type": "session", "id": "a", "user": "ana", "token_limit": 300}
    lines = [header, {"role": "user", "content": "hi", "session": "a"}]
    path = tmp_path / "export.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    tok = TiktokenTokenizer()
    replay, sessions = Replay.from_source(path, "call", tok)
    assert replay.roles == ["user"] and sessions == {"a"}
    assert replay.tokens == [message_tokens(Message("user", "hi"), tok)]

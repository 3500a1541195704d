"""The flush policy as a pure function: tables, and invariants checked with Hypothesis."""

from __future__ import annotations

import uuid

import pytest
from fakes import WordTokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memcli import Budget, Memory, Message, UsageError, plan_flush
from memcli.flush import truncation_order


def spans(batches: list) -> list[tuple[int, int]]:
    return [(b.start, b.end) for b in batches]


@pytest.mark.parametrize(
    ("roles", "tokens", "threshold", "flush_size", "expected"),
    [
        # Under the threshold: nothing moves.
        (["user", "assistant"], [5, 5], 10, 3, []),
        # One message stays whatever its size.
        (["user"], [100], 10, 3, []),
        # The message that crosses the flush size is included; the queue restarts at a user message.
        (["user", "assistant", "user", "assistant"], [4, 4, 4, 4], 10, 5, [(0, 2)]),
        # Extension: the batch reaches the flush size at the user message, the assistant reply follows.
        (["user", "assistant", "assistant", "user", "assistant"], [3, 3, 3, 3, 3], 10, 3, [(0, 3)]),
        # The newest complete turn is never flushed, even over the budget.
        (["user", "assistant", "tool", "assistant"], [10, 10, 10, 10], 10, 5, []),
        (
            ["user", "assistant", "user", "assistant", "tool"],
            [10, 10, 10, 10, 10],
            10,
            100,
            [(0, 2)],
        ),
        # A system prompt stored as a message is flushed like any other.
        (["system", "user", "assistant", "user", "assistant"], [6, 2, 2, 2, 2], 10, 5, [(0, 1)]),
        # No user message at all: the reference flushes everything.
        (["assistant", "assistant"], [20, 20], 10, 5, [(0, 2)]),
        # Several passes in one call.
        (["user", "assistant"] * 4, [4] * 8, 10, 4, [(0, 2), (2, 4), (4, 6)]),
    ],
)
def test_plan_flush_table(roles, tokens, threshold, flush_size, expected) -> None:
    assert spans(plan_flush(roles, tokens, threshold, flush_size)) == expected


def test_batch_reasons() -> None:
    batches = plan_flush(["user", "assistant", "assistant", "user", "assistant"], [3] * 5, 10, 3)
    assert batches[0].reason == "flush_size"
    assert batches[0].extended == 2
    assert "user message" in batches[0].describe()
    kept = plan_flush(["user", "assistant", "user", "assistant", "tool"], [10] * 5, 10, 100)
    assert kept[0].kept_turn and "newest turn kept" in kept[0].describe()


@pytest.mark.parametrize(
    ("limit", "ratio", "size", "error"),
    [
        (100, 0.7, 101, "larger than token_limit"),
        (0, 0.7, None, "positive"),
        (100, 0.0, None, "ratio"),
        (100, 1.5, None, "ratio"),
        (100, 0.7, 0, "positive"),
    ],
)
def test_budget_rejects_bad_values(limit, ratio, size, error) -> None:
    with pytest.raises(UsageError, match=error):
        Budget(limit, ratio, size)


def test_budget_default_flush_size_is_ten_percent() -> None:
    assert Budget(30000).flush_size == 3000
    assert Budget(5).flush_size == 1


@pytest.mark.parametrize(
    ("priorities", "order"),
    [
        ([0, 1, 2], [2, 1]),
        ([2, 0, 1, 3], [3, 0, 2]),
        ([1, 1, 0], [0, 1]),  # equal priorities: declaration order
        ([0, 0], []),
    ],
)
def test_truncation_order(priorities, order) -> None:
    assert truncation_order(priorities) == order


roles_st = st.lists(
    st.sampled_from(["user", "assistant", "tool", "system"]), min_size=1, max_size=40
)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_plan_invariants(data) -> None:
    roles = data.draw(roles_st)
    tokens = data.draw(st.lists(st.integers(0, 50), min_size=len(roles), max_size=len(roles)))
    threshold = data.draw(st.integers(1, 200))
    flush_size = data.draw(st.integers(1, 200))
    batches = plan_flush(roles, tokens, threshold, flush_size)
    # Batches are consecutive from the start: nothing is lost, duplicated or reordered.
    position = 0
    for b in batches:
        assert b.start == position and b.count > 0
        assert b.tokens == sum(tokens[b.start : b.end])
        position = b.end
    remaining = roles[position:]
    remaining_tokens = sum(tokens[position:])
    if batches and remaining:
        # The queue starts with a user message whenever a user message is left.
        assert remaining[0] == "user" or "user" not in remaining or len(remaining) == 1
    if "user" in roles:
        # The newest turn (last user message and what follows) is never flushed.
        last_user = max(i for i, r in enumerate(roles) if r == "user")
        assert position <= last_user
    if remaining_tokens > threshold and len(remaining) > 1:
        # Still over budget only when a single turn is left.
        assert remaining[0] == "user" and "user" not in remaining[1:]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    calls=st.lists(
        st.lists(
            st.tuples(st.sampled_from(["user", "assistant", "tool"]), st.integers(1, 12)),
            min_size=1,
            max_size=4,
        ),
        min_size=1,
        max_size=25,
    ),
    limit=st.integers(10, 80),
)
def test_engine_invariants(calls, limit, db) -> None:
    """Through the real engine, on each backend (one database per backend, a new session per
    example): active + archived = all put, in order; flushes hold whole turns."""
    memory = Memory.from_defaults(
        session_id=uuid.uuid4().hex, token_limit=limit, tokenizer=WordTokenizer(), db=db
    )
    put = []
    for call in calls:
        messages = [Message(role, " ".join(["w"] * n)) for role, n in call]
        put.extend(messages)
        if memory.put_messages(messages):
            # Right after a flush the queue starts with a user message whenever one is left.
            active = memory.get_all(status="active")
            if len(active) > 1 and any(m.role == "user" for m in active):
                assert active[0].role == "user"
    everything = memory.get_all()
    assert [(m.role, m.content) for m in everything] == [(m.role, m.content) for m in put]
    active = memory.get_all(status="active")
    archived = memory.get_all(status="archived")
    assert len(active) + len(archived) == len(put)
    # Archived messages are exactly the oldest ones.
    assert all(m.status == "archived" for m in everything[: len(archived)])
    memory.store.close()


@settings(max_examples=40, deadline=None)
@given(
    calls=st.lists(
        st.lists(
            st.tuples(st.sampled_from(["user", "assistant", "tool"]), st.integers(1, 12)),
            min_size=1,
            max_size=4,
        ),
        min_size=1,
        max_size=25,
    ),
    limit=st.integers(10, 80),
)
def test_put_calls_equals_sequential_puts(calls, limit) -> None:
    one = Memory.from_defaults(token_limit=limit, tokenizer=WordTokenizer())
    bulk = Memory.from_defaults(token_limit=limit, tokenizer=WordTokenizer())
    messages = [[Message(role, " ".join(["w"] * n)) for role, n in call] for call in calls]
    sequential = [one.put_messages(call) for call in messages]
    together = bulk.put_calls(messages)
    assert [[len(f.message_ids) for f in fs] for fs in sequential] == [
        [len(f.message_ids) for f in fs] for fs in together
    ]
    assert [(m.status, m.flush_id is None) for m in one.get_all()] == [
        (m.status, m.flush_id is None) for m in bulk.get_all()
    ]

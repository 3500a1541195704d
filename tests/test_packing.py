"""What a chat's memory takes from search hits: the budget packing, the follow-up rule, and the
echoes of a question (memcli.search.packing, memcli.search.ranking)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from memcli.search.packing import (
    PARTNER_TOKENS,
    Candidate,
    is_follow_up,
    pack,
    partner_of,
)
from memcli.search.ranking import demote_echoes, is_echo, is_question, only_asks
from memcli.store.index import MessageRow

START = datetime(2024, 1, 1, tzinfo=UTC)


def row(
    id: int, text: str, *, seq: int | None = None, role: str = "user", session: str = "a"
) -> MessageRow:
    seq = id if seq is None else seq
    return MessageRow(
        id, session, seq, role, None, text, len(text.split()), START + timedelta(minutes=id),
        "archived",
    )  # fmt: skip


def words(rows) -> int:
    return sum(len(m.content.split()) for m in rows)


def test_pack_respects_the_budget_and_passes_over_what_does_not_fit() -> None:
    big = row(1, "w " * 30)
    small = row(5, "two words")
    other = row(9, "three more words")
    packed = pack([Candidate(1, big), Candidate(2, small), Candidate(3, other)], 6, words)
    assert [[m.id for m in rows] for _, rows in packed] == [[5], [9]]
    assert sum(words(rows) for _, rows in packed) <= 6


@pytest.mark.parametrize(
    ("budget", "partner_words", "expected"),
    [
        (20, 2, [[2, 3]]),  # the matched message with its partner
        (3, 2, [[2]]),  # the matched message alone: both do not fit
        (1, 2, []),  # nothing fits
        (100, PARTNER_TOKENS + 1, [[2]]),  # a long partner stays out
    ],
)
def test_pack_takes_a_short_partner_when_it_fits(
    budget: int, partner_words: int, expected: list[list[int]]
) -> None:
    anchor = row(2, "my question?")
    reply = row(3, "answer " * partner_words, role="assistant")
    packed = pack([Candidate(1, anchor, reply)], budget, words)
    assert [[m.id for m in rows] for _, rows in packed] == expected


def test_pack_orders_by_time_joins_neighbours_and_takes_nothing_twice() -> None:
    late = row(20, "late one", session="b")
    early = row(3, "early one")
    next_to_early = row(4, "right after", role="assistant")
    packed = pack(
        [
            Candidate(1, late),
            Candidate(2, early, next_to_early),
            Candidate(3, next_to_early, early),  # both already taken
            Candidate(4, row(5, "then this")),
        ],
        100,
        words,
    )
    assert [(rank, [m.id for m in rows]) for rank, rows in packed] == [(2, [3, 4, 5]), (1, [20])]


def test_pack_never_repeats_the_window() -> None:
    said = row(1, "I live in Porto")
    reply = row(2, "Nice city!", role="assistant")
    packed = pack(
        [Candidate(1, said, reply), Candidate(2, reply, said)],
        100,
        words,
        repeated=lambda m: m.content == "I live in Porto",
    )
    assert [[m.id for m in rows] for _, rows in packed] == [[2]]


def test_partner_is_the_reply_to_a_question_or_the_question_before_an_answer() -> None:
    q, a, q2 = row(1, "q?"), row(2, "a", role="assistant"), row(3, "q2?")
    assert partner_of(q, [q, a, q2]) == a
    assert partner_of(a, [q, a, q2]) == q
    assert partner_of(q2, [a, q2]) is None  # nothing after it
    assert partner_of(q, [row(0, "x", seq=0), q, row(4, "y", seq=2)]) is None  # a user message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("and her brother?", True),
        ("What about Lisbon?", True),
        ("why?", True),
        ("When did it happen?", True),
        ("and what does she do for work?", True),
        ("What is my cat called?", False),
        ("When did Caroline go to the LGBTQ support group?", False),
        ("Where does my sister live?", False),
        ("Tell me everything you remember about that trip to Lisbon last spring", False),
    ],
)
def test_follow_ups(text: str, expected: bool) -> None:
    assert is_follow_up(text) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("What is my cat called?", True),  # an earlier copy
        ("what is my cat called again?", True),  # a copy with one word more
        ("Your cat called?", True),  # a question that adds nothing
        ("Cat called.", True),  # a reply that adds nothing
        ("My cat is called Mochi-Vortex", False),  # the answer
        ("It's called Mochi", False),
        ("I am not sure.", False),
        ("What is my dog called?", False),  # another question
    ],
)
def test_echoes_of_a_question(text: str, expected: bool) -> None:
    assert is_echo(text, "What is my cat called?") is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Where did you go?", True),
        ("Really? When?", True),
        ("I moved last year. Have you been to Porto?", False),
        ("I moved to Porto.", False),
    ],
)
def test_messages_that_only_ask(text: str, expected: bool) -> None:
    assert only_asks(text) is expected


def test_nothing_is_an_echo_of_a_query_that_does_not_ask() -> None:
    assert not is_question("Mochi-Vortex")
    assert not is_echo("Mochi-Vortex", "Mochi-Vortex")
    assert is_question("where does Ana live")


def test_demote_echoes_moves_them_and_the_replies_to_them_after_the_rest() -> None:
    rows = {
        1: row(1, "What is my cat called?", session="chat1", seq=0),
        2: row(2, "I am not sure what your cat is called.", session="chat1", seq=1, role="assistant"),
        3: row(3, "My cat is called Mochi", session="pets", seq=0),
        4: row(4, "Cats are called many things.", session="pets", seq=1, role="assistant"),
        5: row(5, "what is my cat called", session="chat2", seq=0),
        7: row(7, "Do you have pets?", session="pets", seq=2),
    }  # fmt: skip
    fused = [(2, 0.95), (1, 0.9), (7, 0.85), (5, 0.8), (3, 0.5), (4, 0.4), (6, 0.1)]

    def read(ids):
        return {i: rows[i] for i in ids if i in rows}

    demoted = demote_echoes(fused, "What is my cat called?", read, 10)
    assert demoted == [(3, 0.5), (4, 0.4), (6, 0.1), (2, 0.95), (1, 0.9), (7, 0.85), (5, 0.8)]
    assert demote_echoes(fused, "cat called", read, 10) == fused  # not a question

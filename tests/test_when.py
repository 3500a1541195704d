"""Times named in a query, as a time window (memcli.search.when)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from memcli.search.when import names_time, time_window

REF = datetime(2023, 10, 22, 15, 0, tzinfo=UTC)  # a Sunday


def day(y: int, m: int, d: int) -> datetime:
    return datetime(y, m, d, tzinfo=UTC)


@pytest.mark.parametrize(
    ("query", "since", "until"),
    [
        ("What did Gina find on 1 February, 2023?", day(2023, 1, 31), day(2023, 2, 3)),
        ("the painting shown on October 13, 2023", day(2023, 10, 12), day(2023, 10, 15)),
        ("notes of 2023-05-08", day(2023, 5, 7), day(2023, 5, 10)),
        ("What did Mel paint in July 2023?", day(2023, 7, 1), day(2023, 8, 1)),
        ("When did Melanie go camping in June?", day(2023, 6, 1), day(2023, 7, 1)),
        ("what happened in November?", day(2022, 11, 1), day(2022, 12, 1)),  # the latest one
        ("on 30 October", day(2022, 10, 29), day(2022, 11, 1)),
        ("How many beach trips in 2022?", day(2022, 1, 1), day(2023, 1, 1)),
        ("what did we do yesterday", day(2023, 10, 20), day(2023, 10, 23)),
        ("last week's plan", day(2023, 10, 7), day(2023, 10, 17)),
        ("anything this month?", day(2023, 10, 1), day(2023, 10, 23)),
        ("last year", day(2022, 1, 1), day(2023, 1, 1)),
        ("what did she say last Friday", day(2023, 10, 19), day(2023, 10, 22)),
        ("three days ago", day(2023, 10, 17), day(2023, 10, 21)),  # 2 days either side
        ("from May to June 2023", day(2023, 5, 1), day(2023, 7, 1)),  # spans both
    ],
)
def test_times_in_a_query_become_a_window(query: str, since: datetime, until: datetime) -> None:
    window = time_window(query, REF)
    assert window is not None and names_time(query)
    assert (window.since.replace(hour=0), window.until.replace(hour=0)) == (since, until)


def test_years_ago_is_a_wide_window_around_that_time() -> None:
    window = time_window("Where did Caroline move from 4 years ago?", REF)
    assert window is not None and window.text == "4 years ago"
    assert window.since < datetime(2019, 10, 22, tzinfo=UTC) < window.until
    assert window.until - window.since > datetime(2021, 1, 1) - datetime(2020, 1, 1)


@pytest.mark.parametrize(
    "query",
    [
        "May I ask you something?",
        "this may be the one",
        "the 2 may have left",
        "a march through the park",
        "what breed is the puppy",
        "",
    ],
)
def test_no_time_no_window(query: str) -> None:
    assert time_window(query, REF) is None


def test_relative_times_need_a_reference() -> None:
    assert time_window("what did we do yesterday", None) is None
    assert time_window("in June", None) is None
    assert time_window("in June 2023", None) is not None  # needs none

"""Times named in a query ("in May 2023", "on October 13", "last week", "yesterday", "2 years ago")
as a time window: the retriever fuses a search restricted to that window with the plain one, so a
question about a given week finds what was said that week first (see `Retriever.search`).

Pure functions, no clock: a relative time is resolved against the `reference` time the caller
gives (the retriever's: the latest message's time in the search's scope, else now). A date without
a year ("in June", "on 8 May") is its latest occurrence at or before the reference. A month name
alone counts only after a word that makes it a time ("in", "during", "last", ...): "May I ask"
and "a march" are no times. Windows are a little wider than what they name (a day by a day each
side, a relative week or month by a few days), as people speak of times loosely; the window of
several times in one query spans them all. Times are UTC.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

MONTHS = {
    name: number
    for number, names in enumerate(
        [
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ],
        start=1,
    )
    for name in names
}
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
NUMBERS = {
    "a": 1,
    "an": 1,
    "one": 1,
    "two": 2,
    "a couple of": 2,
    "couple of": 2,
    "three": 3,
    "a few": 3,
    "few": 3,
    "four": 4,
    "several": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
}
#: Words after which a month name alone is a time.
MONTH_LEAD = r"(?:in|during|since|from|to|between|of|last|this|early|late|mid|mid-|by|until|till|before|after|around|through|throughout|past|previous)"

_MONTH = r"(?P<month>" + "|".join(sorted(MONTHS, key=len, reverse=True)) + r")\.?"
_DAY = r"(?P<day>[0-3]?\d)(?:st|nd|rd|th)?"
_YEAR = r"(?P<year>(?:19|20)\d\d)"
_NUMBER = r"(?P<n>\d+|" + "|".join(sorted(NUMBERS, key=len, reverse=True)) + r")"
_UNIT = r"(?P<unit>day|week|weekend|month|year)s?"

#: (pattern, kind), tried in order; a later pattern does not match text an earlier one took.
PATTERNS = [
    (r"\b(?P<year>(?:19|20)\d\d)-(?P<month>[01]\d)-(?P<day>[0-3]\d)\b", "iso"),
    (rf"\b{_MONTH}\s+{_DAY}(?:,\s*|\s+){_YEAR}\b", "day"),
    (rf"\b{_DAY}(?:\s+of)?\s+{_MONTH}(?:,\s*|\s+){_YEAR}\b", "day"),
    (rf"\b{_MONTH}(?:,\s*|\s+of\s+|\s+){_YEAR}\b", "month"),
    (rf"\b{_MONTH}\s+{_DAY}\b(?!:)", "day"),
    (rf"\b{_DAY}(?:\s+of)?\s+{_MONTH}\b", "day"),
    (rf"\b{MONTH_LEAD}\s+(?:the\s+)?{_MONTH}\b", "month"),
    (rf"\b{_NUMBER}\s+{_UNIT}\s+ago\b", "ago"),
    (r"\b(?P<which>last|past|previous|this)\s+(?P<unit>week|weekend|month|year)\b", "relative"),
    (r"\b(?P<which>last|this|on)\s+(?P<weekday>" + "|".join(WEEKDAYS) + r")\b", "weekday"),
    (r"\bthe\s+day\s+before\s+yesterday\b", "day_before_yesterday"),
    (r"\b(?P<word>yesterday|today|tonight)\b", "today"),
    (rf"\b{_YEAR}\b", "year"),
]
_COMPILED = [(re.compile(p, re.IGNORECASE), kind) for p, kind in PATTERNS]


@dataclass(frozen=True)
class TimeWindow:
    """A time range a query names: `since` included, `until` excluded; `text` what named it."""

    since: datetime
    until: datetime
    text: str


def names_time(query: str) -> bool:
    """Whether the query names a time at all (cheap: no reference needed to tell)."""
    return any(pattern.search(query) for pattern, _ in _COMPILED)


def time_window(query: str, reference: datetime | None) -> TimeWindow | None:
    """The window of the times `query` names (spanning all of them), or None when it names none.
    A relative time needs `reference` (left out without one)."""
    found: list[tuple[datetime, datetime, str]] = []
    taken: list[tuple[int, int]] = []
    ref = _utc(reference) if reference is not None else None
    for pattern, kind in _COMPILED:
        for match in pattern.finditer(query):
            span = match.span()
            if any(span[0] < end and start < span[1] for start, end in taken):
                continue
            window = _window(kind, match, ref)
            if window is not None:
                taken.append(span)
                found.append((*window, match.group(0)))
    if not found:
        return None
    found.sort(key=lambda w: query.find(w[2]))
    return TimeWindow(
        since=min(w[0] for w in found),
        until=max(w[1] for w in found),
        text=", ".join(w[2] for w in found),
    )


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


#: "May" followed by one of these is the verb ("this may be", "in may help"), not the month.
_MODAL = re.compile(
    r"\s+(?:be|been|have|not|also|well|still|need|help|want|seem|take|get|look|sound|come|go|"
    r"happen|work|change|i|we|you|he|she|it|they)\b",
    re.IGNORECASE,
)


def _window(kind: str, m: re.Match[str], ref: datetime | None) -> tuple[datetime, datetime] | None:
    month = m.groupdict().get("month")
    if month and month.lower() == "may" and _MODAL.match(m.string, m.end()):
        return None
    try:
        return _WINDOWS[kind](m, ref)
    except (ValueError, OverflowError):  # "February 30", a year out of range
        return None


def _day_window(day: datetime) -> tuple[datetime, datetime]:
    return day - timedelta(days=1), day + timedelta(days=2)


def _month_start(year: int, month: int) -> datetime:
    return datetime(year, month, 1, tzinfo=UTC)


def _next_month(start: datetime) -> datetime:
    return _month_start(start.year + start.month // 12, start.month % 12 + 1)


def _iso(m: re.Match[str], ref: datetime | None) -> tuple[datetime, datetime]:
    return _day_window(datetime(int(m["year"]), int(m["month"]), int(m["day"]), tzinfo=UTC))


def _day(m: re.Match[str], ref: datetime | None) -> tuple[datetime, datetime] | None:
    month, day = MONTHS[m["month"].lower()], int(m["day"])
    if m.groupdict().get("year"):
        return _day_window(datetime(int(m["year"]), month, day, tzinfo=UTC))
    if ref is None:
        return None
    when = datetime(ref.year, month, day, tzinfo=UTC)
    if when > ref:
        when = datetime(ref.year - 1, month, day, tzinfo=UTC)
    return _day_window(when)


def _month(m: re.Match[str], ref: datetime | None) -> tuple[datetime, datetime] | None:
    month = MONTHS[m["month"].lower()]
    if m.groupdict().get("year"):
        start = _month_start(int(m["year"]), month)
    elif ref is None:
        return None
    else:
        start = _month_start(ref.year, month)
        if start > ref:
            start = _month_start(ref.year - 1, month)
    return start, _next_month(start)


def _year(m: re.Match[str], ref: datetime | None) -> tuple[datetime, datetime]:
    year = int(m["year"])
    return datetime(year, 1, 1, tzinfo=UTC), datetime(year + 1, 1, 1, tzinfo=UTC)


#: How far either side of "N units ago" the window reaches.
AGO_SLACK = {
    "day": timedelta(days=1),
    "week": timedelta(days=4),
    "weekend": timedelta(days=4),
    "month": timedelta(days=16),
    "year": timedelta(days=183),
}
UNIT_DAYS = {"day": 1, "week": 7, "weekend": 7, "month": 30.44, "year": 365.25}


def _ago(m: re.Match[str], ref: datetime | None) -> tuple[datetime, datetime] | None:
    if ref is None:
        return None
    text = m["n"].lower()
    count = int(text) if text.isdigit() else NUMBERS[re.sub(r"\s+", " ", text)]
    unit = m["unit"].lower()
    point = ref - timedelta(days=count * UNIT_DAYS[unit])
    slack = AGO_SLACK[unit] * (1 + (count > 2))  # "10 years ago" is rougher than "a year ago"
    return point - slack, point + slack


def _relative(m: re.Match[str], ref: datetime | None) -> tuple[datetime, datetime] | None:
    if ref is None:
        return None
    unit, which = m["unit"].lower(), m["which"].lower()
    today = datetime(ref.year, ref.month, ref.day, tzinfo=UTC)
    if unit in ("week", "weekend"):
        monday = today - timedelta(days=today.weekday())
        if which == "this":
            return monday - timedelta(days=1), today + timedelta(days=1)
        if which == "past":  # the seven days before
            return today - timedelta(days=8), today + timedelta(days=1)
        return monday - timedelta(days=9), monday + timedelta(days=1)
    if unit == "month":
        start = _month_start(ref.year, ref.month)
        if which == "this":
            return start, today + timedelta(days=1)
        if which == "past":
            return today - timedelta(days=32), today + timedelta(days=1)
        before = _month_start(ref.year - (ref.month == 1), (ref.month - 2) % 12 + 1)
        return before - timedelta(days=3), start + timedelta(days=3)
    if which == "this":
        return datetime(ref.year, 1, 1, tzinfo=UTC), today + timedelta(days=1)
    if which == "past":
        return today - timedelta(days=366), today + timedelta(days=1)
    return datetime(ref.year - 1, 1, 1, tzinfo=UTC), datetime(ref.year, 1, 1, tzinfo=UTC)


def _weekday(m: re.Match[str], ref: datetime | None) -> tuple[datetime, datetime] | None:
    if ref is None:
        return None
    today = datetime(ref.year, ref.month, ref.day, tzinfo=UTC)
    back = (today.weekday() - WEEKDAYS.index(m["weekday"].lower())) % 7 or 7
    return _day_window(today - timedelta(days=back))


def _today(m: re.Match[str], ref: datetime | None) -> tuple[datetime, datetime] | None:
    if ref is None:
        return None
    today = datetime(ref.year, ref.month, ref.day, tzinfo=UTC)
    if m["word"].lower() == "yesterday":
        return _day_window(today - timedelta(days=1))
    return _day_window(today)


def _day_before_yesterday(
    m: re.Match[str], ref: datetime | None
) -> tuple[datetime, datetime] | None:
    if ref is None:
        return None
    today = datetime(ref.year, ref.month, ref.day, tzinfo=UTC)
    return _day_window(today - timedelta(days=2))


_WINDOWS = {
    "iso": _iso,
    "day": _day,
    "month": _month,
    "year": _year,
    "ago": _ago,
    "relative": _relative,
    "weekday": _weekday,
    "today": _today,
    "day_before_yesterday": _day_before_yesterday,
}

"""The record a format is (`Reader`), what its reader is given (`Input`) and what it gives back
(`Source`). Each format module exports one `Reader` as `READER`; `memcli.formats.READERS` is
their table, and a plugin's entry point (group `memcli.formats`) names one too.

A reader's `detect(input)` says whether the input is in its format (asked in the table's
order, the first that says yes reads it); its `read(input)` reads all of it, validated whole,
and raises `InputError` naming the file and the line, entry or conversation for anything that is
not as the format says.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from memcli.errors import InputError
from memcli.formats.base import LIMITS, Conversation, Limits, json_lines, where

if TYPE_CHECKING:
    from memcli.transcripts import Record, SessionRecord

#: How an SQLite database file starts.
SQLITE = b"SQLite format 3\x00"


@dataclass(frozen=True, eq=False)
class Input:
    """A file as its reader sees it: its bytes (a zip's conversations, unzipped) and the name its
    errors give it (`file.zip:conversations.json`, `<stdin>`), within `limits`. A database is
    never read whole when it is a file: then `path` names it and `data` is empty."""

    data: bytes
    name: str
    limits: Limits = LIMITS
    is_database: bool = False  # an SQLite database (by its first bytes)
    path: str | None = None

    @cached_property
    def value(self) -> Any:
        """The input as one JSON value (an object or an array); None when it is not one (JSON
        Lines, broken JSON, text, a database)."""
        if self.is_database:
            return None
        stripped = self.data.lstrip().lstrip(b"\xef\xbb\xbf").lstrip()
        if stripped[:1] not in (b"[", b"{"):
            return None
        try:
            return json.loads(stripped)
        except (ValueError, RecursionError):
            return None  # JSON Lines, or broken JSON: the transcript reader names the error

    @property
    def is_lines(self) -> bool:
        """Whether the input is no JSON value (JSON Lines, or text): only the readers that read
        such input (`Reader.lines`) are asked whether it is theirs."""
        return self.value is None and not self.is_database

    @property
    def first(self) -> dict[str, Any] | None:
        """The object a format is told by: the first object of the JSON value (the value itself
        when it is an object), or the first line of JSON Lines when that is an object; None when
        there is none."""
        return self._first[0]

    @property
    def at(self) -> str:
        """Where `first` is: the input's name, with its line for JSON Lines (`chat.jsonl:3`)."""
        return self._first[1]

    @cached_property
    def _first(self) -> tuple[dict[str, Any] | None, str]:
        if self.is_database:
            return None, self.name
        value = self.value
        if value is None:
            return _first_line(self.data, self.name)
        items = value if isinstance(value, list) else [value]
        return next((item for item in items if isinstance(item, dict)), None), self.name

    def items(self) -> list[Any]:
        """The JSON value's items (an object: itself); InputError when the input is not one JSON
        value (`memcli.formats.read` says so before a reader not read as lines is called)."""
        value = self.value
        if value is None:
            raise InputError(f"{self.name}: not a JSON value", "Give the JSON as it was exported")
        return value if isinstance(value, list) else [value]

    def entries(self) -> list[tuple[str, Any]]:
        """The JSON value's items, each with how an error names it (`name: conversation 2
        ('Its title')`)."""
        return [(where(self.name, i, item), item) for i, item in enumerate(self.items())]

    def lines(self, hint: str) -> list[tuple[str, Any]]:
        """The JSON value of each line that is not blank, with where it is (`name:line`);
        InputError (with `hint`) naming the line that is not JSON."""
        return json_lines(self.data, self.name, hint)


@dataclass
class Source:
    """What a reader found in a file: the conversations of an export, or (the `transcript`
    format) the records of a transcript, which the import groups into conversations (it knows
    `--session`), with the session record they start with. `memcli.formats.read` sets `format`
    (the reader's name) and `name` (the input's)."""

    conversations: list[Conversation] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    header: SessionRecord | None = None
    format: str = ""
    name: str = ""

    @property
    def dropped(self) -> int:
        return sum(r.dropped for r in self.records) + sum(c.dropped for c in self.conversations)


@dataclass(frozen=True)
class Reader:
    """A format memcli reads.

    - `name`: what `--format` calls it;
    - `help`: one line saying what it is, in `memcli import --help` and in the error of an
      input of no known shape;
    - `lines`: it reads input that is not one JSON value (JSON Lines, or text); False: only a
      JSON object or array (an input that is no JSON value is then refused before `read`, and
      `detect` is not asked about it);
    - `detect(input)`: whether `input` is in this format (by its shape: `input.first`'s keys,
      its bytes); never raises for input that is not;
    - `read(input)`: everything in it, as a `Source`."""

    name: str
    help: str
    lines: bool
    detect: Callable[[Input], bool]
    read: Callable[[Input], Source]


def _first_line(data: bytes, name: str) -> tuple[dict[str, Any] | None, str]:
    """The first line of JSON Lines as an object, and its place (None: not an object)."""
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if raw.strip():
            try:
                value = json.loads(raw.lstrip(b"\xef\xbb\xbf"))
            except (ValueError, RecursionError):
                return None, name
            return (value if isinstance(value, dict) else None), f"{name}:{number}"
    return None, name

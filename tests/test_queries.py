"""Query files for `memcli search --queries`: lines, optional fields, errors naming the line."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from memcli.errors import InputError
from memcli.search.queries import QueryLine, parse_queries
from memcli.transcripts import read_source


def test_lines_keep_their_0_based_number() -> None:
    data = b'{"query": "cello"}\n\n{"query": "dog", "user": "ana", "session": "s1", "k": 3}\n'
    assert parse_queries(data) == [
        QueryLine(0, "cello"),
        QueryLine(2, "dog", "ana", "s1", 3),
    ]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"not json", "q.jsonl:2: invalid JSON"),
        (b'["cello"]', "q.jsonl:2: expected a JSON object"),
        (b'{"query": ""}', "q.jsonl:2: query must be a non-empty string"),
        (b'{"text": "cello"}', "q.jsonl:2: unknown key 'text'"),
        (b'{"query": "x", "k": 0}', "q.jsonl:2: k must be a whole number >= 1"),
        (b'{"query": "x", "k": true}', "q.jsonl:2: k must be a whole number >= 1"),
        (b'{"query": "x", "user": 7}', "q.jsonl:2: user must be a non-empty string"),
        (b"\xff", "q.jsonl:2: invalid UTF-8"),
    ],
)
def test_bad_lines_are_errors_naming_the_line(line: bytes, message: str) -> None:
    with pytest.raises(InputError) as caught:
        parse_queries(b'{"query": "fine"}\n' + line, "q.jsonl")
    assert caught.value.message.startswith(message)
    assert caught.value.exit_code == 2


def test_read_from_a_file_and_stdin_as_the_cli_reads_them(tmp_path: Path) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text('{"query": "cello"}\n')
    assert parse_queries(*read_source(path)) == [QueryLine(0, "cello")]
    stdin = io.BytesIO(b'{"query": "dog"}\n{"k": 2}')
    with pytest.raises(InputError, match="<stdin>:2: query must be"):
        parse_queries(*read_source("-", stdin))
    with pytest.raises(InputError, match="no such file"):
        read_source(tmp_path / "missing.jsonl")

"""Message: what it takes (valid Unicode, JSON metadata, times in range) and how it is written."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from memcli.errors import InputError
from memcli.messages import (
    MAX_DEPTH,
    Message,
    format_time,
    parse_time,
    to_json_line,
    validate_session_id,
)


@pytest.mark.parametrize(
    ("fields", "what"),
    [
        ({"content": "x\ud800y"}, "content holds a lone surrogate '\\ud800' at character 1"),
        ({"content": "ok", "name": "\udfff"}, "name holds a lone surrogate"),
        ({"content": "ok", "metadata": {"k\udc00": 1}}, "a key in metadata holds"),
        ({"content": "ok", "metadata": {"k": {"j": ["\ud800"]}}}, "metadata['k']['j'][0] holds"),
        ({"content": "ok", "metadata": {"k": float("nan")}}, "metadata['k'] is nan"),
        ({"content": "ok", "metadata": {"k": float("-inf")}}, "not a finite number"),
        ({"content": "ok", "metadata": {"k": {1, 2}}}, "holds a set"),
        ({"content": "ok", "metadata": {1: "x"}}, "key 1 that is not text"),
        ({"content": "ok", "metadata": False}, "metadata must be an object, not false"),
        ({"content": "ok", "metadata": []}, "metadata must be an object, not []"),
    ],
)
def test_message_refuses_what_no_store_or_reader_can_hold(fields: dict, what: str) -> None:
    with pytest.raises(InputError) as info:
        Message("user", **fields)
    assert what in str(info.value)


def test_metadata_depth_limit() -> None:
    deep: object = {}
    for _ in range(MAX_DEPTH - 1):
        deep = {"a": deep}
    Message("user", "x", metadata=deep)  # type: ignore[arg-type]  # MAX_DEPTH levels: fine
    with pytest.raises(InputError, match=f"nested more than {MAX_DEPTH} levels"):
        Message("user", "x", metadata={"a": deep})  # type: ignore[dict-item]


def test_surrogate_pairs_and_text_beyond_the_bmp_are_fine() -> None:
    m = Message.from_dict(json.loads('{"role": "user", "content": "\\ud83d\\ude00", "name": "é"}'))
    assert m.content == "\U0001f600" and m.name == "é"


@pytest.mark.parametrize("metadata", [False, 0, [], "k=v", 1.5, True])
def test_from_dict_refuses_metadata_that_is_no_object(metadata: object) -> None:
    with pytest.raises(InputError, match="metadata must be an object"):
        Message.from_dict({"role": "user", "content": "x", "metadata": metadata})


@pytest.mark.parametrize("metadata", [None, {}])
def test_null_and_empty_metadata_mean_none(metadata: object) -> None:
    m = Message.from_dict({"role": "user", "content": "x", "metadata": metadata})
    assert m.metadata is None and "metadata" not in m.to_dict()


@pytest.mark.parametrize(
    "value",
    [1e20, -1e15, 10**30, -(10**30), "9999-12-31T23:59:59-05:00", "0001-01-01T00:00:00+05:00"],
)
def test_times_out_of_range_are_input_errors(value: object) -> None:
    with pytest.raises(InputError, match="is out of range"):
        parse_time(value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_times_that_are_not_finite_are_input_errors(value: float) -> None:
    with pytest.raises(InputError, match="not a finite number"):
        parse_time(value)


@pytest.mark.parametrize("value", [True, None, [], {}, "yesterday", "\ud800"])
def test_invalid_times_are_input_errors(value: object) -> None:
    with pytest.raises(InputError, match="invalid timestamp"):
        parse_time(value)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (-62135596800, "0001-01-01T00:00:00Z"),
        (253402300799, "9999-12-31T23:59:59Z"),
        (1.5, "1970-01-01T00:00:01.500000Z"),
        ("0001-01-01T00:00:00Z", "0001-01-01T00:00:00Z"),
        ("9999-12-31T23:59:59.999999+00:00", "9999-12-31T23:59:59.999999Z"),
        ("2023-05-08T15:56:00+02:00", "2023-05-08T13:56:00Z"),
    ],
)
def test_times_at_the_edges_round_trip(value: object, text: str) -> None:
    assert format_time(parse_time(value)) == text
    assert parse_time(text) == parse_time(value)


@pytest.mark.parametrize("value", ["", "   ", "\t\n", 3, None, "s\ud800"])
def test_session_ids_must_be_non_blank_valid_text(value: object) -> None:
    with pytest.raises(InputError, match="--session"):
        validate_session_id(value, "--session")


def test_session_ids_take_any_other_text() -> None:
    for value in ("work", "a b", "日本", "\U0001f600"):
        assert validate_session_id(value) == value
    assert validate_session_id(" padded ") == "padded"  # (trimmed, as every name is)


def test_json_lines_escape_unicode_line_breaks_and_read_back() -> None:
    record = {
        "content": "a\u2028b\x85c\u2029d\ne\x0bf\x1cg",
        "metadata": {"k\u2028": "v\x85"},
        "when": datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC),
        "file": Path("/tmp/x"),
    }
    line = to_json_line(record)
    assert len(line.splitlines()) == 1 and "\n" not in line
    assert "\\u2028" in line and "\\u0085" in line and "\\u2029" in line
    assert "é" in to_json_line({"t": "é"})  # other text stays as it is (UTF-8)
    back = json.loads(line)
    assert back["content"] == record["content"] and back["metadata"] == record["metadata"]
    assert back["when"] == "2024-01-02T03:04:05Z" and back["file"] == "/tmp/x"


def test_json_lines_refuse_values_json_cannot_hold() -> None:
    with pytest.raises(TypeError, match="cannot write set"):
        to_json_line({"x": {1}})

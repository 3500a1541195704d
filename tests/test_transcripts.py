"""Reading transcripts: three formats, and errors that name the line."""

from __future__ import annotations

import json

import pytest

from memcli.errors import InputError
from memcli.messages import Message
from memcli.transcripts import export_lines, parse_columns, parse_transcript, plan_calls


def lines(*records: object) -> bytes:
    return "\n".join(json.dumps(r) for r in records).encode()


def test_message_per_line() -> None:
    data = lines(
        {"role": "user", "content": "hi", "name": "Ana", "timestamp": "2023-05-08T13:56:00"},
        {"role": "assistant", "content": "hello", "session": "s1", "metadata": {"k": 1}},
    )
    records = parse_transcript(data)
    assert [r.line for r in records] == [1, 2]
    first = records[0].messages[0]
    assert first.name == "Ana" and first.timestamp is not None and first.timestamp.hour == 13
    assert records[1].session == "s1" and records[1].messages[0].metadata == {"k": 1}


def test_conversation_per_line_and_array() -> None:
    convo = lines(
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}
    )
    records = parse_transcript(convo)
    assert len(records) == 1 and records[0].is_conversation and len(records[0].messages) == 2
    array = json.dumps([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
    assert [r.messages[0].content for r in parse_transcript(array.encode())] == ["a", "b"]


def test_blank_lines_and_bom_are_fine() -> None:
    data = b"\xef\xbb\xbf" + lines({"role": "user", "content": "x"}) + b"\n\n"
    assert len(parse_transcript(data)) == 1


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            b'{"role": "user", "content": "ok"}\n{"role": "user", "content": ',
            "t.jsonl:2: invalid JSON",
        ),
        (b'{"role": "user", "content": "ok"}\n{"content": "x"}', "t.jsonl:2: missing role"),
        (b'{"role": "robot", "content": "x"}', "t.jsonl:1: unknown role 'robot'"),
        (b'{"role": "user", "content": 5}', "t.jsonl:1: content must be text"),
        (b'{"role": "user"}', "t.jsonl:1: missing content"),
        (
            b'{"role": "user", "content": "x"}\n{"role": "user", "content": "\xff"}',
            "t.jsonl:2: invalid UTF-8",
        ),
        (
            b'[{"role": "user", "content": "x"}, {"role": 3, "content": "y"}]',
            "t.jsonl: item 1: role must be text",
        ),
        (
            b'{"messages": [{"role": "user", "content": "x"}, {"role": "user"}]}',
            "t.jsonl:1: message 1: missing content",
        ),
        (b'"just a string"', "t.jsonl:1: expected a JSON object"),
        (
            b'{"role": "user", "content": "x", "timestamp": "yesterday"}',
            "t.jsonl:1: invalid timestamp",
        ),
    ],
)
def test_errors_name_the_line(data: bytes, message: str) -> None:
    with pytest.raises(InputError) as info:
        parse_transcript(data, "t.jsonl")
    assert message in str(info.value)


def test_plan_calls() -> None:
    records = parse_transcript(
        lines(
            {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
            {"role": "user", "content": "c"},
        )
    )
    assert [len(c) for c in plan_calls(records, "call")] == [2, 1]
    assert [len(c) for c in plan_calls(records, "message")] == [1, 1, 1]
    assert [len(c) for c in plan_calls(records, "batch")] == [3]
    with pytest.raises(InputError):
        plan_calls(records, "sometimes")


def test_unhashable_role_is_an_error_not_a_crash() -> None:
    with pytest.raises(InputError, match="t.jsonl:1: role must be text"):
        parse_transcript(b'{"role": ["user"], "content": "x"}', "t.jsonl")


@pytest.mark.parametrize(
    "line",
    [
        b'{"role": "user", "content": "x"} trailing',
        b'{"role": "user", "content": "x"}{"role": "user", "content": "y"}',
        b'{"role": "user", "content": "x"},',
    ],
)
def test_text_after_the_object_is_invalid_json(line: bytes) -> None:
    data = b'{"role": "user", "content": "ok"}\n' + line
    with pytest.raises(InputError, match="t.jsonl:2: invalid JSON"):
        parse_transcript(data, "t.jsonl")


def test_white_space_around_a_line_and_crlf_are_fine() -> None:
    data = b'  {"role": "user", "content": "a"}  \r\n\t{"role": "assistant", "content": "b"}\r\n'
    records = parse_transcript(data)
    assert [(r.line, r.messages[0].content) for r in records] == [(1, "a"), (2, "b")]


def test_plain_lines_give_the_same_messages_as_full_ones() -> None:
    from dataclasses import fields

    from memcli.messages import Message

    records = parse_transcript(
        lines(
            {"role": "user", "content": "a"},
            {"messages": [{"role": "assistant", "content": "b"}, {"role": "tool", "content": ""}]},
        )
    )
    made = [m for r in records for m in r.messages]
    full = [Message("user", "a"), Message("assistant", "b"), Message("tool", "")]
    for got, want in zip(made, full, strict=True):
        assert {f.name: getattr(got, f.name) for f in fields(Message)} == {
            f.name: getattr(want, f.name) for f in fields(Message)
        }
        assert got == want and hash(got) == hash(want)


def test_columns_are_the_records_flattened() -> None:
    from memcli.transcripts import call_sizes, parse_columns

    data = lines(
        {"role": "system", "content": "be brief"},
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
        {"messages": [{"role": "user", "content": "c", "name": "Ana"}], "session": "s1"},
        {"messages": []},
        {"role": "tool", "content": "d", "metadata": {"k": 1}, "session": "s2"},
    )
    records = parse_transcript(data)
    columns = parse_columns(data)
    messages = [m for r in records for m in r.messages]
    assert columns.roles == [m.role for m in messages]
    assert columns.contents == [m.content for m in messages]
    assert columns.metadata == {4: "{'k': 1}"}
    assert columns.sessions == {"s1", "s2"}
    for put in ("message", "batch", "call"):
        assert call_sizes(columns.sizes, put) == [len(c) for c in plan_calls(records, put)]
    array = json.dumps([{"role": "user", "content": "x"}, {"role": "user", "content": "y"}])
    assert parse_columns(array.encode()).contents == ["x", "y"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"role": "user", "content": "ok"}\n{"content": "x"}', "t.jsonl:2: missing role"),
        (b'{"messages": [{"role": "user", "content": 1}]}', "t.jsonl:1: message 0: content"),
        (b'{"role": "user", "content": "x"} junk', "t.jsonl:1: invalid JSON"),
    ],
)
def test_columns_name_the_line_of_an_error(data: bytes, message: str) -> None:
    from memcli.transcripts import parse_columns

    with pytest.raises(InputError, match=message):
        parse_columns(data, "t.jsonl")


BAD_LINES = [
    (rb'{"role": "user", "content": "x\ud800y"}', "t.jsonl:2: content holds a lone surrogate"),
    (rb'{"role": "user", "content": "\udc00"}', "t.jsonl:2: content holds a lone surrogate"),
    (rb'{"role": "user", "content": "\uDFFF"}', "t.jsonl:2: content holds a lone surrogate"),
    (rb'{"role": "user", "content": "x", "name": "\uDC00"}', "t.jsonl:2: name holds a lone"),
    (
        rb'{"role": "user", "content": "x", "metadata": {"\ud800": 1}}',
        "t.jsonl:2: a key in metadata holds",
    ),
    (rb'{"role": "user", "content": "x", "session": "\udfff"}', "t.jsonl:2: session holds"),
    (
        rb'{"messages": [{"role": "user", "content": "\ud83d"}]}',
        "t.jsonl:2: messages[0]['content'] holds",
    ),
    (b'{"role": "user", "role": "assistant", "content": "x"}', "duplicate key 'role'"),
    (b'{"role": "user", "content": "x", "timestamp": NaN}', "t.jsonl:2: invalid JSON (NaN"),
    (b'{"role": "user", "content": "x", "timestamp": -Infinity}', "-Infinity is not JSON"),
    (b'{"role": "user", "content": "x", "timestamp": 1e400}', "not a finite number"),
    (b'{"role": "user", "content": "x", "timestamp": 1e20}', "t.jsonl:2: timestamp 1e+20 is out"),
    (b'{"role": "user", "content": "x", "timestamp": -1e15}', "is out of range"),
    (b'{"role": "user", "content": "x", "metadata": {"n": ' + b"1" * 5000 + b"}}", "4300 digits"),
    (b'{"role": "user", "content": "x", "metadata": ' + b"[" * 100_000, "nested too deeply"),
    (b'{"role": "user", "content": "x", "metadata": false}', "metadata must be an object"),
    (b'{"role": "user", "content": "x", "metadata": 0}', "t.jsonl:2: metadata must be"),
    (b'{"role": "user", "content": "x", "metadata": []}', "metadata must be an object, not []"),
    (b'{"role": "user", "content": "x", "session": ""}', "t.jsonl:2: session must not be empty"),
]


@pytest.mark.parametrize(("line", "message"), BAD_LINES)
def test_hostile_lines_are_input_errors_naming_the_line(line: bytes, message: str) -> None:
    from memcli.transcripts import parse_columns

    data = b'{"role": "user", "content": "fine"}\n' + line + b"\n"
    for parse in (parse_transcript, parse_columns):  # import, and simulate
        with pytest.raises(InputError) as info:
            parse(data, "t.jsonl")
        assert message in str(info.value)


def test_hostile_items_of_a_json_array_name_the_item() -> None:
    data = rb'[{"role": "user", "content": "ok"}, {"role": "user", "content": "\ud800"}]'
    with pytest.raises(InputError, match="t.json: item 1: content holds a lone surrogate"):
        parse_transcript(data, "t.json")
    with pytest.raises(InputError, match="t.json: JSON nested too deeply"):
        parse_transcript(b"[" * 100_000 + b"]" * 100_000, "t.json")
    with pytest.raises(InputError, match="t.json: invalid JSON \\(duplicate key 'a'\\)"):
        parse_transcript(
            b'[{"role": "user", "content": "x", "metadata": {"a": 1, "a": 2}}]', "t.json"
        )


def test_escapes_that_are_not_lone_surrogates_are_fine() -> None:
    data = (
        rb'{"role": "user", "content": "\ud83d\ude00 \uD83D\uDE00"}' + b"\n"
        rb'{"role": "user", "content": "\\ud800 is how you write it"}' + b"\n"
        rb'{"role": "user", "content": "x", "metadata": {"k": "\u00e9"}, "name": "\ud83d\ude00"}'
    )
    messages = [r.messages[0] for r in parse_transcript(data)]
    assert messages[0].content == "\U0001f600 \U0001f600"
    assert messages[1].content == "\\ud800 is how you write it"
    assert messages[2].metadata == {"k": "é"} and messages[2].name == "\U0001f600"


#: OpenAI's chat format: content parts, a tool call with null content, the tool's answer, and
#: keys memcli has no field for.
OPENAI = [
    {
        "role": "system",
        "content": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use tools."}],
    },
    {"role": "user", "content": "Weather in Porto?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Porto"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
    {"role": "assistant", "content": "18C.", "refusal": None, "x-trace": [7], "metadata": {"k": 1}},
]


def test_openai_content_parts_are_joined_with_a_newline() -> None:
    (message,) = parse_transcript(lines(OPENAI[0]))[0].messages
    assert message.content == "Be brief.\nUse tools." and message.metadata is None
    (message,) = parse_transcript(lines({"role": "user", "content": []}))[0].messages
    assert message.content == ""


def test_openai_tool_calls_and_other_keys_are_kept_in_metadata_extra() -> None:
    records = parse_transcript(lines({"messages": OPENAI}))
    call, answer, last = records[0].messages[2:]
    assert call.content == "" and call.metadata == {
        "extra": {"content": None, "tool_calls": OPENAI[2]["tool_calls"]}
    }
    assert answer.metadata == {"extra": {"tool_call_id": "call_1"}}
    assert last.metadata == {"k": 1, "extra": {"refusal": None, "x-trace": [7]}}
    # an assistant message with tool calls may leave content out (written back as null)
    (bare,) = parse_transcript(lines({"role": "assistant", "tool_calls": []}))[0].messages
    assert bare.metadata == {"extra": {"content": None, "tool_calls": []}}


def test_export_writes_the_kept_keys_back_where_they_came_from() -> None:
    messages = [m for r in parse_transcript(lines(*OPENAI)) for m in r.messages]
    exported = list(export_lines(messages))
    for original, record in zip(OPENAI[1:], exported[1:], strict=True):
        assert record == original
    assert exported[0] == {"role": "system", "content": "Be brief.\nUse tools."}
    again = [m for r in parse_transcript(lines(*exported)) for m in r.messages]
    assert again == messages


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (
            {"role": "user", "content": ["a"]},
            "t:1: content must be text or an array of content parts: part 0 is a string 'a'",
        ),
        (
            {"role": "user", "content": [{"text": "a"}]},
            'content must be text or an array of content parts: part 0 is an object without "type"',
        ),
        ({"role": "user", "content": [{"type": "text"}]}, 'content part 0 has no "text" string'),
        (
            {"role": "user", "content": [{"type": "text", "text": "a", "cache_control": {}}]},
            "content part 0 has a key 'cache_control' memcli does not keep",
        ),
        (
            {"role": "assistant", "content": None, "tool_calls": {"id": "c"}},
            "t:1: tool_calls must be an array of objects, not an object",
        ),
        (
            {"role": "assistant", "content": None, "tool_calls": [{}, "c1"]},
            "t:1: tool_calls must be an array of objects, tool_calls[1] is a string 'c1'",
        ),
        (
            {"role": "tool", "content": "x", "tool_call_id": 5},
            "t:1: tool_call_id must be text, not 5",
        ),
        ({"role": "user", "content": None}, "t:1: content must be text"),
        ({"role": "tool", "content": None, "tool_calls": []}, "t:1: content must be text"),
        (
            {"role": "user", "content": "x", "a": 1, "metadata": {"extra": 2}},
            't:1: metadata has a key "extra"',
        ),
    ],
)
def test_openai_records_memcli_cannot_keep_are_refused(record: object, message: str) -> None:
    with pytest.raises(InputError) as info:
        parse_transcript(json.dumps(record).encode(), "t")
    assert message in info.value.message


def test_columns_count_the_kept_keys_as_metadata() -> None:
    data = lines(*OPENAI, {"messages": OPENAI[2:4]})
    columns = parse_columns(data)
    messages = [m for r in parse_transcript(data) for m in r.messages]
    assert columns.contents == [m.content for m in messages]
    assert columns.metadata == {i: str(m.metadata) for i, m in enumerate(messages) if m.metadata}


def test_kept_keys_are_checked_as_metadata_is() -> None:
    # a dict put into memory goes through the same reading as a transcript's record
    with pytest.raises(InputError, match=r"metadata\['extra'\]\['a'\]\[0\] holds a lone surr"):
        Message.from_dict({"role": "user", "content": "x", "a": ["\udc80"]})
    with pytest.raises(InputError, match="not a finite number"):
        Message.from_dict({"role": "user", "content": "x", "a": float("nan")})


def test_non_text_parts_are_left_out_and_counted() -> None:
    """An image or a file in a message does not refuse the transcript: its text is kept, the
    other parts are counted on the record."""
    image = {"type": "image_url", "image_url": {"url": "x"}}
    lines = [
        {"role": "user", "content": [{"type": "text", "text": "look"}, image, {"type": "file"}]},
        {"messages": [{"role": "user", "content": [image, {"type": "text", "text": "b"}]}]},
    ]
    data = "\n".join(json.dumps(line) for line in lines).encode()
    records = parse_transcript(data, "t")
    assert [m.content for r in records for m in r.messages] == ["look", "b"]
    assert [r.dropped for r in records] == [2, 1]


def test_developer_role_reads_as_system_and_writes_back() -> None:
    data = json.dumps({"role": "developer", "content": "Be brief"}).encode()
    (record,) = parse_transcript(data, "t")
    (m,) = record.messages
    assert m.role == "system"
    assert m.export_record() == {"role": "developer", "content": "Be brief"}

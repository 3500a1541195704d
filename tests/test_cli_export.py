"""`memcli export --format jsonl|openai|markdown`: OpenAI fine-tuning lines that import reads back
identically, and Markdown transcripts that read well."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import memcli, no_blocks  # noqa: F401 (a fixture)

from memcli import Message
from memcli.provider_messages import openai_line
from memcli.store.base import SessionInfo
from memcli.transcripts import (
    markdown_transcript,
    openai_message,
    parse_transcript,
    session_record_keys,
)

pytestmark = pytest.mark.usefixtures("no_blocks")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
MESSAGES = [
    {"role": "system", "content": "You are a weather assistant."},
    {"role": "user", "content": "What is the weather in Paris?", "name": "ana"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18°C and sunny"},
    {
        "role": "assistant",
        "content": "It is 18°C and sunny.\n\n```python\nprint('pack sunglasses')\n```",
        "weight": 1,
    },
]


def fine_tuning_file(tmp_path: Path, **keys: object) -> Path:
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps({"messages": MESSAGES, **keys}, ensure_ascii=False) + "\n")
    return path


def export(session: str, *args: str) -> str:
    run = memcli("export", session, *args)
    assert run.code == 0, run.stderr
    return run.stdout


def test_openai_export_round_trips_a_fine_tuning_line(tmp_path: Path) -> None:
    path = fine_tuning_file(tmp_path)
    assert memcli("import", str(path), "--session", "ft").code == 0
    out = export("ft", "--format", "openai")
    [line] = out.splitlines()
    assert json.loads(line) == {"messages": MESSAGES}
    # ... and import reads the export back to the same conversation, exported the same again.
    again = tmp_path / "again.jsonl"
    again.write_text(out)
    assert memcli("import", str(again), "--session", "ft2").code == 0
    assert export("ft2", "--format", "openai") == out
    # The jsonl export of the copy holds the same messages.
    first = [r for r in map(json.loads, export("ft").splitlines()) if r.get("type") != "session"]
    second = [r for r in map(json.loads, export("ft2").splitlines()) if r.get("type") != "session"]
    strip = [{k: v for k, v in r.items() if k != "session"} for r in first]
    assert strip == [{k: v for k, v in r.items() if k != "session"} for r in second]


@pytest.mark.skipif(
    "metadata" not in SessionInfo.__dataclass_fields__,
    reason="import keeps a line's record keys on the session with issue 21's import formats",
)
def test_openai_export_writes_back_the_record_keys(tmp_path: Path) -> None:
    path = fine_tuning_file(tmp_path, tools=TOOLS, parallel_tool_calls=False)
    assert memcli("import", str(path), "--session", "ft").code == 0
    [line] = export("ft", "--format", "openai").splitlines()
    assert json.loads(line) == json.loads(path.read_text())


def test_openai_line_holds_the_kept_record_keys_and_reads_back() -> None:
    original = {"messages": MESSAGES, "tools": TOOLS, "parallel_tool_calls": False}
    [record] = parse_transcript(json.dumps(original).encode())
    for info in (
        SimpleNamespace(metadata={"tools": TOOLS, "parallel_tool_calls": False}),
        SimpleNamespace(metadata={"record_keys": {"tools": TOOLS, "parallel_tool_calls": False}}),
    ):
        line = openai_line(record.messages, session_record_keys(info))
        assert line == original
        [back] = parse_transcript(json.dumps(line).encode())
        assert back.messages == record.messages
    assert session_record_keys(SimpleNamespace()) is None
    assert openai_line(record.messages) == {"messages": MESSAGES}


def test_openai_message_leaves_memcli_fields_out_and_writes_developer_back() -> None:
    m = Message(
        "user", "hi", metadata={"source": "mail"}, timestamp=datetime(2024, 1, 1, tzinfo=UTC)
    )
    assert openai_message(m) == {"role": "user", "content": "hi"}
    # A developer message, as an import keeps it: a system message whose kept keys say so.
    developer = Message("system", "Answer in French.", metadata={"extra": {"role": "developer"}})
    assert openai_message(developer) == {"role": "developer", "content": "Answer in French."}


def test_markdown_export_reads_well(tmp_path: Path) -> None:
    records = [
        {"role": "user", "content": "How do I list files?", "timestamp": "2024-03-01T09:30:00Z"},
        {
            "role": "assistant",
            "content": "Use ls:\n\n```sh\nls -la\n```\n\n# not a heading of the transcript",
            "timestamp": "2024-03-01T09:30:05+02:00",
        },
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert memcli("import", str(path), "--session", "howto", "--user", "ana").code == 0
    text = export("howto", "--format", "markdown")
    assert text.startswith("# Session howto\n\nUser: ana\n")
    headings = re.findall(r"^## .*$", text, flags=re.MULTILINE)
    assert headings == [
        "## User · #1 · 2024-03-01 09:30:00 UTC",
        "## Assistant · #2 · 2024-03-01 07:30:05 UTC",
    ]
    assert "```sh\nls -la\n```" in text  # code kept as it was
    # Each message's text follows its heading after a blank line.
    assert "## User · #1 · 2024-03-01 09:30:00 UTC\n\nHow do I list files?\n" in text
    # The fine-tuning conversation: tool calls as JSON, a tool reply names its call.
    ft = fine_tuning_file(tmp_path)
    assert memcli("import", str(ft), "--session", "ft").code == 0
    text = export("ft", "--format", "markdown")
    assert "## User (ana) · #4" in text
    assert "## Tool · #6 · reply to call_1\n\n18°C and sunny" in text
    assert '```json\n[\n  {\n    "id": "call_1"' in text
    assert "```python\nprint('pack sunglasses')\n```" in text


def test_markdown_archived_messages_say_so() -> None:
    m = Message("user", "a fence ``` inside", metadata={"extra": {"tool_calls": ["```"]}})
    object.__setattr__(m, "status", "archived")
    object.__setattr__(m, "id", 7)
    text = "".join(markdown_transcript([m]))
    assert text.startswith("# Conversation\n")
    assert "## User · #7 · archived" in text
    assert "````json" in text  # a fence longer than the backticks inside


def test_export_format_errors(tmp_path: Path) -> None:
    path = fine_tuning_file(tmp_path)
    assert memcli("import", str(path), "--session", "ft").code == 0
    run = memcli("export", "ft", "--format", "csv")
    assert run.code == 2 and "jsonl, openai, markdown" in run.stderr and run.stdout == ""
    run = memcli("export", "nope", "--format", "markdown")
    assert run.code == 1 and run.stdout == ""


EXPORTS = Path(__file__).parent / "data" / "exports"


def valid_for_openai(messages: list[dict]) -> None:
    """OpenAI's rule for tool turns: every tool message answers a `tool_calls` entry of the
    assistant message before its run of tool messages, once; every entry is answered."""
    open_calls: set[str] = set()
    for m in messages:
        if m["role"] == "tool":
            assert m["tool_call_id"] in open_calls, m
            open_calls.remove(m["tool_call_id"])
            continue
        assert not open_calls, f"calls without results before {m}"
        assert m["content"] is not None or m.get("tool_calls"), m
        open_calls = {c["id"] for c in m.get("tool_calls") or []}
    assert not open_calls


def test_chatgpt_tool_turns_export_as_valid_openai_messages() -> None:
    assert memcli("import", str(EXPORTS / "chatgpt-tools.json")).code == 0
    (session,) = memcli("sessions", "--json").records()
    (line,) = memcli("export", session["session"], "--format", "openai").records()
    messages = line["messages"]
    valid_for_openai(messages)
    calls = [c["function"]["name"] for m in messages for c in m.get("tool_calls") or []]
    assert calls == ["bio", "browser", "python", "dalle_text2im"]
    # the browser's second result answers no call: said as text after the answers, not an orphan
    assert {
        "role": "assistant",
        "content": "Tool result (browser):\nBaeckerei Glatz opens at 6:30.",
    } in messages
    assert [m["content"] for m in messages if m["role"] == "tool"] == [
        "Model set context updated.",
        "# 0 Baeckerei Glatz, Bern",
        "84",
        "DALL·E displayed 1 images. The images are already plainly visible, so don't repeat"
        " the descriptions in detail.",
    ]


def test_markdown_export_has_the_conversations_title() -> None:
    assert memcli("import", str(EXPORTS / "openwebui-chat.json")).code == 0
    (session,) = memcli("sessions", "--json").records()
    text = memcli("export", session["session"], "--format", "markdown").stdout
    assert text.startswith(f"# Train to Zermatt\n\nSession: {session['session']}  \nUser: ")

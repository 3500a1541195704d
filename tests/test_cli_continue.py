"""The everyday chat: `chat -c`, sessions by a start of their id, titles and /title, no empty
sessions, sessions dated by their messages (`first_at`, `last_at`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest
from helpers import memcli, no_blocks  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("no_blocks")

LONG = "my-passport-number-ends-in-pp-7300-and-m-3a1001"


def sessions() -> list[dict[str, Any]]:
    run = memcli("sessions", "--json")
    assert run.code == 0, run.stderr
    return run.records()


def chat(*args: str, input: str = "") -> Any:
    """Plain-mode chat, offline (no model): replies come from memory."""
    return memcli("chat", "--plain", *args, input=input)


def imported(session: str, times: tuple[str, str], user: str = "default") -> None:
    lines = [
        {"role": "user", "content": f"hello from {session}", "timestamp": times[0]},
        {"role": "assistant", "content": "hi", "timestamp": times[1]},
    ]
    data = "".join(json.dumps(line) + "\n" for line in lines)
    run = memcli("import", "-", "--session", session, "--user", user, input=data)
    assert run.code == 0, run.stderr


def test_no_empty_session_is_left_by_a_chat_without_a_message() -> None:
    """Quit at once, an empty stdin, `/new` or `/session` before any message: nothing stored."""
    assert chat(input="").code == 0
    assert chat(input="/exit\n").code == 0
    assert chat("--session", "later", input="/new\n/new\n").code == 0
    assert sessions() == []
    assert chat(input="/new\nhello there\n").code == 0
    [only] = sessions()
    assert only["active_messages"] == 1  # the message (an offline reply is not stored)
    assert memcli("sessions", "--json").code == 0


def test_a_chat_session_is_titled_by_its_first_message_and_by_title() -> None:
    first = (
        "Please help me plan the garden: roses along the south wall, tulips by the gate, and herbs"
    )
    run = chat("--session", "garden", input=f"{first}\nsecond message\n/title\n")
    assert run.code == 0, run.stderr
    [info] = sessions()
    assert info["title"].startswith("Please help me plan the garden: roses along the")
    assert info["title"].endswith("…") and len(info["title"]) <= 60
    assert f"Title: {info['title']}" in run.stderr
    run = chat("--session", "garden", input="/title   Spring   planting \n")
    assert run.code == 0 and "Title set: Spring planting" in run.stderr, run.stderr
    assert sessions()[0]["title"] == "Spring planting"
    bad = chat("--session", "garden", input="/title \x1b[2J\n")
    assert bad.code == 1 and "control character" in bad.stderr, bad.stderr
    assert sessions()[0]["title"] == "Spring planting"  # an imported title is never replaced


def test_continue_resumes_the_session_with_the_latest_message() -> None:
    """-c takes the session whose last message is newest, not the one imported last."""
    imported("recent", ("2024-06-01T10:00:00Z", "2024-06-01T10:01:00Z"))
    imported("older", ("2023-01-01T10:00:00Z", "2023-01-01T10:01:00Z"))  # imported last
    imported("bo-s", ("2025-01-01T10:00:00Z", "2025-01-01T10:01:00Z"), user="bo")
    run = chat("-c", input="again\n")
    assert run.code == 0 and "resumed session recent" in run.stderr, run.stderr
    run = chat("--continue", "--user", "bo", input="")
    assert "resumed session bo-s" in run.stderr, run.stderr
    both = chat("-c", "--session", "recent", input="")
    assert both.code == 2 and "--continue and --session" in both.stderr


def test_continue_with_no_session_starts_one() -> None:
    run = chat("-c", input="first words\n")
    assert run.code == 0 and "No session of user default to continue" in run.stderr
    assert len(sessions()) == 1


def test_a_session_is_named_by_a_unique_start_of_its_id_everywhere() -> None:
    imported(LONG, ("2024-06-01T10:00:00Z", "2024-06-01T10:01:00Z"))
    imported("my-notes", ("2024-06-02T10:00:00Z", "2024-06-02T10:01:00Z"))
    run = memcli("inspect", "my-pass", "--json")
    assert run.code == 0, run.stderr
    assert {r.get("session") for r in run.records()} == {LONG}
    for args in (("export", "my-pass"), ("summary", "my-pass"), ("blocks", "list", "my-pass")):
        run = memcli(*args)
        assert run.code == 0, (args, run.stderr)
    run = chat("--session", "my-pass", input="")
    assert f"resumed session {LONG}" in run.stderr, run.stderr
    # Ambiguous: the candidates, exit 2, nothing done.
    run = memcli("inspect", "my-")
    assert run.code == 2, run.stderr
    assert "2 sessions start with 'my-'" in run.stderr
    assert LONG in run.stderr and "my-notes" in run.stderr
    run = memcli("rm", "my-", "--yes")
    assert run.code == 2 and len(sessions()) == 2
    run = chat("--session", "my-", input="")
    assert run.code == 2 and "2 sessions start with" in run.stderr
    # A unique start removes that session only.
    assert memcli("rm", "my-n", "--yes").code == 0
    assert [s["session"] for s in sessions()] == [LONG]


@pytest.mark.usefixtures("cli_db")  # on SQLite and on PostgreSQL
def test_sessions_are_dated_by_their_messages_not_by_the_import() -> None:
    imported("late", ("2024-06-01T10:00:00Z", "2024-06-01T10:05:00Z"))
    imported("early", ("2023-02-01T08:00:00Z", "2023-02-01T09:30:00Z"))
    records = sessions()
    assert [r["session"] for r in records] == ["late", "early"]  # by last message
    late = records[0]
    assert late["first_at"] == "2024-06-01T10:00:00Z" and late["last_at"] == "2024-06-01T10:05:00Z"
    assert late["created_at"] > "2025"  # the import's own time, apart
    assert records[1]["first_at"] == "2023-02-01T08:00:00Z"
    # A start of an id names the session on both backends; -c takes the latest message's.
    run = memcli("inspect", "ear", "--json")
    assert run.code == 0 and run.records()[-1]["session"] == "early", run.stderr
    assert "resumed session late" in chat("-c", input="").stderr


def test_the_sessions_table_gives_the_title_room() -> None:
    """At 140 columns, a 48-character session id leaves the title most of a line."""
    title = "A conversation about the history of the Hanseatic League and its towns"
    assert chat("--session", LONG, input=f"{title}\n").code == 0
    script = (
        "import sys; sys.stdout.isatty = lambda: True; sys.argv = ['memcli', 'sessions'];"
        "from memcli.cli.app import main; main()"
    )
    env = {**os.environ, "COLUMNS": "140", "PAGER": "cat"}
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    proc.stdout = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout)  # bold headers
    header, *rows = [line for line in proc.stdout.splitlines() if line.strip()]
    assert "last message" in header and "stored" in header, header
    first = next(line for line in rows if LONG in line)
    assert "A conversation about the history of" in first, proc.stdout
    assert max(len(line) for line in proc.stdout.splitlines()) <= 140

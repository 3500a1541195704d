"""LM Studio conversations get their messages' times from the file, and a store imported
before messages were dated (by the old LM Studio reader, or any format's) is recognised by a
re-import: nothing stored twice (`memcli.importing.same_message`)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers import import_file, memcli, no_blocks  # noqa: F401 (a fixture)

from memcli import SQLiteStore
from memcli.errors import InputError
from memcli.flush import BudgetOverride
from memcli.formats import read
from memcli.importing import Opening, from_source, import_conversations
from memcli.tokens import TiktokenTokenizer

EXPORTS = Path(__file__).parent / "data" / "exports"
LMSTUDIO = EXPORTS / "lmstudio.conversation.json"


def opening() -> Opening:
    return Opening(TiktokenTokenizer(), default_budget=BudgetOverride(30000, 0.7), user="ana")


def conversation() -> dict[str, Any]:
    value: dict[str, Any] = json.loads(LMSTUDIO.read_text())
    return value


def write(path: Path, value: Any) -> Path:
    path.write_text(json.dumps(value))
    return path


def times(path: Path) -> list[str | None]:
    (found,) = read(path).conversations
    return [None if m.timestamp is None else m.timestamp.isoformat() for m in found.messages]


# -- the times of the file -------------------------------------------------------------------


@pytest.mark.usefixtures("no_blocks")
def test_lmstudio_messages_are_dated_by_the_file_in_export_and_sessions() -> None:
    run = memcli("import", str(LMSTUDIO), "--user", "ana")
    assert run.code == 0, run.stderr
    (session,) = memcli("sessions", "--json").records()
    (_, *messages) = memcli("export", session["session"]).records()
    assert [(m["role"], m["timestamp"]) for m in messages] == [
        ("system", "2024-06-01T12:00:00.123000Z"),  # the conversation's createdAt
        ("user", "2024-06-01T12:01:02Z"),  # the reply it got (its first step: a thinking one)
        ("assistant", "2024-06-01T12:01:02Z"),
        ("user", "2024-06-01T12:01:45Z"),
        ("assistant", "2024-06-01T12:01:45Z"),
    ]


def test_own_times_come_first_then_steps_then_the_conversations(tmp_path: Path) -> None:
    value = conversation()
    first, reply, second, last = value["messages"]
    first["versions"][0]["createdAt"] = "2024-06-01T13:00:00+01:00"  # ISO, another zone
    second["createdAt"] = 1717243290  # seconds, on the message (not its version)
    for step in last["versions"][0]["steps"]:
        step["stepIdentifier"] = "step-1"  # no time in it: an id only
    assert times(write(tmp_path / "a.json", value)) == [
        "2024-06-01T12:00:00.123000+00:00",
        "2024-06-01T12:00:00+00:00",
        "2024-06-01T12:01:02+00:00",
        "2024-06-01T12:01:30+00:00",
        "2024-06-01T12:01:45.789000+00:00",  # assistantLastMessagedAt: nothing after it
    ]
    del value["assistantLastMessagedAt"], value["userLastMessagedAt"]
    value["messages"] = [first, reply, {**second, "createdAt": None}]
    reply["versions"][1]["steps"] = [{"type": "contentBlock", "content": "Start at 70%."}]
    assert times(write(tmp_path / "b.json", value)) == [  # createdAt for the undated
        "2024-06-01T12:00:00.123000+00:00",
        "2024-06-01T12:00:00+00:00",
        "2024-06-01T12:00:00.123000+00:00",
        "2024-06-01T12:00:00.123000+00:00",
    ]
    del value["createdAt"]
    assert times(write(tmp_path / "c.json", value))[2:] == [None, None]  # no time: none given


@pytest.mark.parametrize(
    ("where", "value", "named"),
    [
        ((), "yesterday", "Sourdough hydration'): createdAt: invalid timestamp 'yesterday'"),
        ((), True, "createdAt: invalid timestamp True"),
        ((), 1e22, "createdAt: 1e+22 is not a time between the years 1 and 9999"),
        ((), 10**400, "createdAt: 100000000000000000000... is not a time"),
        ((), -(10**16), "createdAt: -10000000000000000 is not a time"),
        (("userLastMessagedAt",), {"at": 1}, "userLastMessagedAt: invalid timestamp {'at': 1}"),
        ((0,), "2024-13-01", "message 0: createdAt: invalid timestamp '2024-13-01'"),
        ((1, 1), [1717243200123], "message 1: createdAt: invalid timestamp [1717243200123]"),
    ],
)
def test_a_bad_time_is_refused_naming_its_place(
    tmp_path: Path, where: tuple[Any, ...], value: Any, named: str
) -> None:
    data = conversation()
    if where == ():
        data["createdAt"] = value
    elif isinstance(where[0], str):
        data[where[0]] = value
    elif len(where) == 1:
        data["messages"][where[0]]["versions"][0]["createdAt"] = value
    else:
        data["messages"][where[0]]["versions"][where[1]]["createdAt"] = value
    path = write(tmp_path / "bad.conversation.json", data)
    with pytest.raises(InputError) as caught:
        read(path)
    assert named in caught.value.message and str(path) in caught.value.message
    assert "ISO 8601" in (caught.value.hint or "")


@pytest.mark.usefixtures("no_blocks")
def test_a_bad_time_exits_2_on_the_cli_and_stores_nothing(tmp_path: Path) -> None:
    data = conversation()
    data["messages"][2]["versions"][0]["createdAt"] = "soon"
    run = memcli("import", str(write(tmp_path / "x.conversation.json", data)))
    assert run.code == 2
    assert "message 2: createdAt: invalid timestamp 'soon'" in run.stderr
    assert "Traceback" not in run.stderr
    assert memcli("sessions", "--json").records() == []


# -- a store of the old reader ---------------------------------------------------------------


def undated(path: Path) -> list[Any]:
    """The conversations of an export as a reader that gave no timestamps read them."""
    found = from_source(read(path))
    for c in found:
        c.records = [
            r._replace(messages=[replace(m, timestamp=None) for m in r.messages]) for r in c.records
        ]
    return found


def test_a_store_of_the_old_lmstudio_reader_is_recognised(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "m.db")
    old = import_conversations(store, undated(LMSTUDIO), opening())
    assert old.messages == 5
    (session,) = old.sessions
    again = import_file(store, LMSTUDIO, opening())
    assert (again.messages, again.already_stored, again.new_sessions) == (0, 5, [])
    assert again.undated == 5  # said, not silent
    stored = store.get_messages(session)
    assert len(stored) == 5 and all(m.timestamp is None for m in stored)  # kept as stored
    # The conversation went on in LM Studio: its new messages are stored, dated; no others.
    grown = conversation()
    user, reply = json.loads(json.dumps(grown["messages"][2:]))
    user["versions"][0]["content"] = [{"type": "text", "text": "And the oven?"}]
    reply["versions"][0]["steps"][0]["stepIdentifier"] = "1717329600000-0.5"
    reply["versions"][0]["steps"][0]["content"][0]["text"] = "250 C with steam."
    grown["messages"] += [user, reply]
    result = import_file(store, write(tmp_path / "grown.json", grown), opening())
    assert (result.messages, result.already_stored, result.sessions) == (2, 5, {session: 2})
    assert result.undated == 5
    stored = store.get_messages(session)
    assert [m.content for m in stored[5:]] == ["And the oven?", "250 C with steam."]
    assert [m.timestamp.isoformat() for m in stored[5:] if m.timestamp] == [
        "2024-06-02T12:00:00+00:00",
        "2024-06-02T12:00:00+00:00",
    ]
    last = import_file(store, tmp_path / "grown.json", opening())
    assert (last.messages, last.already_stored, last.undated) == (0, 7, 5)


@pytest.mark.usefixtures("no_blocks")
def test_the_cli_says_how_many_stored_messages_have_no_timestamp(tmp_path: Path) -> None:
    lines = "".join(
        json.dumps({"role": m.role, "content": m.content}) + "\n"
        for c in read(LMSTUDIO).conversations
        for m in c.messages
    )
    undated = tmp_path / "undated.jsonl"
    undated.write_text(lines)
    assert memcli("import", str(undated), "--session", "s").code == 0
    for dry in ([], ["--dry-run"]):
        run = memcli("import", str(LMSTUDIO), "--session", "s", *dry)
        assert run.code == 0, run.stderr
        (summary,) = run.records()
        assert (summary["new"], summary["already_stored"]) == (0, 5)
        assert summary["already_stored_undated"] == 5
        assert "5 messages already stored had no timestamp where this file gives one" in (
            run.stderr
        )
    dated = memcli("import", str(LMSTUDIO), "--session", "t")
    assert "no timestamp" not in dated.stderr
    again = memcli("import", str(LMSTUDIO), "--session", "t")
    assert again.records()[0]["already_stored_undated"] == 0
    assert "no timestamp" not in again.stderr


@pytest.mark.parametrize(
    "name",
    [
        "lmstudio.conversation.json",
        "chatgpt-conversations.json",
        "claude-conversations.json",
        "openwebui-chats.json",
        "sillytavern.jsonl",
        "llm-0.27-logs.db",
    ],
)
def test_any_format_re_imported_dated_over_an_undated_store_stores_nothing(
    tmp_path: Path, name: str
) -> None:
    """The rule is the import's, not a reader's: for each format whose messages have times."""
    path = EXPORTS / name
    if name.endswith(".db"):
        path = tmp_path / name
        path.write_bytes((EXPORTS / name).read_bytes())
    assert any(m.timestamp for c in read(path).conversations for m in c.messages)
    store = SQLiteStore(tmp_path / "m.db")
    old = import_conversations(store, undated(path), opening())
    again = import_file(store, path, opening())
    assert (again.messages, again.already_stored) == (0, old.messages)
    dated = sum(1 for c in read(path).conversations for m in c.messages if m.timestamp)
    assert again.undated == dated
    assert len(store.list_sessions()) == len(old.sessions)


def test_stored_messages_with_other_times_are_other_messages(tmp_path: Path) -> None:
    """Times are compared where both messages have one: a file whose times differ from the
    stored ones is another conversation's messages, stored as such."""
    store = SQLiteStore(tmp_path / "m.db")
    import_file(store, LMSTUDIO, opening(), "s")
    other = conversation()
    for message in other["messages"]:
        for version in message["versions"]:
            version["createdAt"] = 1000000000000  # 2001
    result = import_file(store, write(tmp_path / "o.json", other), opening(), "s")
    assert (result.messages, result.already_stored) == (5, 0)  # the last reply's time differs


def test_a_message_deleted_from_the_old_store_stays_deleted_and_is_not_counted(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "m.db")
    (session,) = import_conversations(store, undated(LMSTUDIO), opening()).sessions
    gone = store.get_messages(session)[3]  # "Here is my crumb, is it done?"
    assert store.delete_message(session, gone.id) is not None
    again = import_file(store, LMSTUDIO, opening())
    assert (again.messages, again.already_stored, again.undated) == (0, 5, 4)
    assert gone.content not in [m.content for m in store.get_messages(session)]

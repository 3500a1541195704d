"""The exports people have (ChatGPT, Claude.ai, simonw/llm, OpenAI fine-tuning files): read by
their shape, one session per conversation, nothing stored twice (from the file, stdin or the
zip), and bad input refused naming the conversation."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import sqlite3
import zipfile
from datetime import UTC, datetime
from pathlib import Path

import pytest
from helpers import import_file

from memcli import SQLiteStore
from memcli.errors import InputError
from memcli.flush import BudgetOverride
from memcli.formats import Limits, read
from memcli.importing import Opening
from memcli.tokens import TiktokenTokenizer

DATA = Path(__file__).parent / "data" / "exports"
T0 = datetime(2024, 6, 1, 12, 0, tzinfo=UTC).timestamp()


def opening(user: str = "alice") -> Opening:
    return Opening(TiktokenTokenizer(), default_budget=BudgetOverride(30000, 0.7), user=user)


def load(path: Path | str, store: SQLiteStore, session: str | None = None, **options: object):
    return import_file(store, path, opening(), session, **options)


def sessions(store: SQLiteStore) -> dict[str, list[tuple[str, str]]]:
    """Each session's messages as (role, content), by title (else id)."""
    return {
        (i.title or i.id): [(m.role, m.content) for m in store.iter_messages(i.id)]
        for i in store.list_sessions()
    }


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(T0 + seconds, tz=UTC)


def test_chatgpt_export_one_session_per_conversation_on_the_current_branch(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "m.db")
    result = load(DATA / "chatgpt-conversations.json", store)
    assert sorted(result.titles.values()) == ["Sourdough in Bern", "Zurich museum day"]
    assert result.dropped_parts == 1  # the image part, not the file
    found = sessions(store)
    assert found["Sourdough in Bern"] == [
        ("user", "I live in Bern and bake bread for a living."),
        ("assistant", "Nice! What do you bake most?"),
        # the edited message, not its first version ("Mostly baguettes."), without its image
        (
            "user",
            "Mostly sourdough. Here is my starter, how many grams of flour for 500 g of dough?",
        ),
        ("assistant", "Let me compute that."),
        ("assistant", ""),  # the code is the arguments of its tool call (below)
        ("tool", "286"),
        ("assistant", "About 286 g of flour for 500 g of dough at 75% hydration."),
    ]
    # custom instructions are hidden: not a message
    assert found["Zurich museum day"] == [
        ("user", "Which museum in Zurich should I visit on Sunday?"),
        ("assistant", "The Kunsthaus: open on Sundays from 10:00."),
    ]
    info = next(i for i in store.list_sessions() if i.title == "Sourdough in Bern")
    assert info.source_id == "chatgpt:6650a1b2-0000-4000-8000-00000000c0de"
    assert info.user_id == "alice" and info.id.startswith("sourdough-in-bern-")
    stored = list(store.iter_messages(info.id))
    assert [m.timestamp for m in stored] == [at(s) for s in (1, 2, 5, 6, 7, 8, 9)]
    assert stored[5].name == "python"
    call = stored[4].metadata["extra"]["tool_calls"][0]
    assert call["id"] == "c1" and call["function"]["name"] == "python"
    assert json.loads(call["function"]["arguments"]) == {
        "input": "flour = 500 / 1.75\nround(flour)"
    }
    assert stored[5].metadata["extra"] == {"tool_call_id": "c1"}
    assert [m.metadata["source_id"] for m in stored] == ["u1", "a1", "u2", "a2", "c1", "o1", "a3"]


def test_chatgpt_again_from_the_zip_and_the_split_zip_stores_nothing(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "m.db")
    load(DATA / "chatgpt-conversations.json", store)
    data = (DATA / "chatgpt-conversations.json").read_bytes()
    whole = tmp_path / "export.zip"
    with zipfile.ZipFile(whole, "w") as z:
        z.writestr("conversations.json", data)
        z.writestr("chat.html", "<html></html>")
        z.writestr("user.json", "{}")
    items = json.loads(data)
    split = tmp_path / "split.zip"
    with zipfile.ZipFile(split, "w") as z:
        z.writestr("conversations-000.json", json.dumps(items[:1]))
        z.writestr("conversations-001.json", json.dumps(items[1:]))
    for path in (whole, split):
        result = load(path, store)
        assert (result.messages, result.already_stored) == (0, 9), path
    assert len(store.list_sessions()) == 2


def test_a_conversation_that_grew_gets_only_its_new_messages(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "m.db")
    load(DATA / "chatgpt-conversations.json", store)
    items = json.loads((DATA / "chatgpt-conversations.json").read_text())
    zurich = items[1]
    zurich["mapping"]["b2"]["children"] = ["b3"]
    zurich["mapping"]["b3"] = {
        "id": "b3",
        "parent": "b2",
        "children": [],
        "message": {
            "id": "b3",
            "author": {"role": "user"},
            "create_time": T0 + 86500,
            "content": {"content_type": "text", "parts": ["And after that, lunch?"]},
        },
    }
    zurich["current_node"] = "b3"
    grown = tmp_path / "conversations.json"
    grown.write_text(json.dumps(items))
    result = load(grown, store)
    assert (result.messages, result.already_stored) == (1, 9)
    assert sessions(store)["Zurich museum day"][-1] == ("user", "And after that, lunch?")


def test_claude_export_keeps_attachments_searchable_with_their_message(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "m.db")
    result = load(DATA / "claude-conversations.json", store)
    # tool use and results are skipped, and the uploaded file's text is kept: nothing left out
    assert result.dropped_parts == 0
    found = sessions(store)
    (user, assistant) = found["Bakery price list"]
    assert user[0] == "user" and user[1].startswith("Can you tidy up my price list?")
    assert "[prices.txt]\nRye loaf 6.50 CHF" in user[1]
    assert assistant == (
        "assistant",
        "Here it is, sorted by price:\n\nCroissant 2.20, Rye loaf 6.50, Zopf 7.80.",
    )
    unnamed = next(i for i in store.list_sessions() if i.title is None)
    assert unnamed.id.startswith("what-goes-well-with-zopf-")
    assert unnamed.source_id == "claude:1b2c3d4e-1111-4aaa-8bbb-000000000002"
    (first, _) = store.iter_messages(unnamed.id)
    assert first.timestamp == datetime(2024, 6, 4, 18, 0, tzinfo=UTC)


@pytest.mark.parametrize("name", ["llm-0.27-logs.db", "llm-0.36-logs.db"])
def test_llm_logs_db_of_each_schema_read_only(tmp_path: Path, name: str) -> None:
    (tmp_path / "llm").mkdir()
    path = tmp_path / "llm" / name
    shutil.copy(DATA / name, path)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    store = SQLiteStore(tmp_path / "m.db")
    result = load(path, store)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before  # never written
    assert [p.name for p in path.parent.iterdir()] == [name]  # no journal, WAL or shm left
    assert result.messages == 9 and len(result.new_sessions) == 2
    found = sessions(store)
    bern = found["I live in Bern and work as a ba…"]
    assert [r for r, _ in bern] == ["user", "assistant", "user", "assistant"]
    assert bern[0][1] == "I live in Bern and work as a baker"
    assert bern[2][1] == "What bread should I bake for Sunday?"
    trip = found["Plan a trip to Zurich"]
    assert trip[0] == ("system", "You are terse") and trip[1] == ("user", "Plan a trip to Zurich")
    assert trip[3] == ("user", "Add a museum visit")
    for info in store.list_sessions():
        times = [m.timestamp for m in store.iter_messages(info.id)]
        assert all(t is not None for t in times) and times == sorted(times)  # type: ignore[type-var]


@pytest.mark.parametrize("version", ["0.27", "0.36"])
def test_llm_logs_json_is_the_same_conversations_as_the_db(tmp_path: Path, version: str) -> None:
    store = SQLiteStore(tmp_path / "m.db")
    first = load(DATA / f"llm-{version}-logs.json", store)
    assert first.messages == 9 and len(first.new_sessions) == 2
    again = load(DATA / f"llm-{version}-logs.db", store)
    assert (again.messages, again.already_stored) == (0, 9)


def test_fine_tuning_file_one_session_per_line_keeping_record_keys(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "m.db")
    result = load(DATA / "finetune.jsonl", store)
    assert len(result.new_sessions) == 3 and result.messages == 10 and result.dropped_parts == 1
    infos = {i.id.rsplit("-", 1)[0]: i for i in store.list_sessions()}
    assert set(infos) == {"weather-in-bern", "and-this-place", "say-hi"}
    weather = infos["weather-in-bern"]
    assert weather.metadata is not None and weather.metadata["parallel_tool_calls"] is False
    assert weather.metadata["tools"][0]["function"]["name"] == "get_weather"
    assert infos["say-hi"].metadata is None
    messages = list(store.iter_messages(weather.id))
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[0].export_record()["role"] == "developer"  # written back as it came
    line = json.loads((DATA / "finetune.jsonl").read_text().splitlines()[0])
    assert [m.export_record() for m in messages] == line["messages"]
    again = load(DATA / "finetune.jsonl", store)
    assert (again.messages, again.already_stored) == (0, 10)


def test_lines_starting_alike_are_separate_conversations(tmp_path: Path) -> None:
    line = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(line) + "\n" + json.dumps(line) + "\n")
    store = SQLiteStore(tmp_path / "m.db")
    assert len(load(path, store).new_sessions) == 2
    assert load(path, store).already_stored == 4 and len(store.list_sessions()) == 2


def test_locomo_like_file_one_session_per_conversation_with_times(tmp_path: Path) -> None:
    lines = [
        {
            "messages": [
                {
                    "role": "user",
                    "content": f"Session {n}: hi Mel",
                    "timestamp": f"2023-05-0{n}T13:56:00Z",
                },
                {
                    "role": "assistant",
                    "content": f"Session {n}: hi Caroline",
                    "timestamp": f"2023-05-0{n}T13:57:00Z",
                },
            ]
        }
        for n in range(1, 6)
    ]
    path = tmp_path / "locomo.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    store = SQLiteStore(tmp_path / "m.db")
    result = load(path, store)
    assert len(result.new_sessions) == 5 and result.messages == 10
    for n, session in enumerate(result.new_sessions, start=1):
        (first, second) = store.iter_messages(session)
        assert first.content == f"Session {n}: hi Mel"
        assert second.timestamp == datetime(2023, 5, n, 13, 57, tzinfo=UTC)
    # with --session, everything in one session, as before
    one = load(path, SQLiteStore(tmp_path / "one.db"), session="all")
    assert one.sessions == {"all": 10}


def test_session_given_puts_every_conversation_in_it_once(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "m.db")
    assert load(DATA / "chatgpt-conversations.json", store, session="gpt").sessions == {"gpt": 9}
    again = load(DATA / "chatgpt-conversations.json", store, session="gpt")
    assert (again.messages, again.already_stored) == (0, 9)


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "m.db")
    result = load(DATA / "chatgpt-conversations.json", store, dry_run=True)
    assert result.dry_run and result.messages == 9 and len(result.new_sessions) == 2
    assert result.dropped_parts == 1 and store.list_sessions() == []


def test_again_forces_a_second_copy(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "m.db")
    load(DATA / "claude-conversations.json", store)
    result = load(DATA / "claude-conversations.json", store, again=True)
    assert result.messages == 4 and len(store.list_sessions()) == 4


def conversation_json(**changes: object) -> bytes:
    items = json.loads((DATA / "chatgpt-conversations.json").read_text())
    items[1].update(changes)
    return json.dumps(items).encode()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            conversation_json(current_node="nowhere"),
            "x.json: conversation 1 ('Zurich museum day'): node 'nowhere' is not in the mapping",
        ),
        (
            conversation_json(mapping=[]),
            "x.json: conversation 1 ('Zurich museum day'): no mapping of messages",
        ),
        (
            json.dumps(
                [{"uuid": "u", "name": "n", "chat_messages": [{"sender": "robot"}]}]
            ).encode(),
            "x.json: conversation 0 ('n'): message 0: sender 'robot' is not human or assistant",
        ),
        (
            json.dumps([{"id": 1, "question": "q"}]).encode(),
            "x.json: a JSON array of objects with keys id, question: not a format memcli reads",
        ),
        (
            b'{"prompt": "p", "answer": "a"}\n{"prompt": "q"}\n',
            "x.json:1: a JSON object with keys prompt, answer: not a format memcli reads",
        ),
        (b"PK\x03\x04 not really a zip", "x.json: not a readable zip"),
        (b"SQLite format 3\x00" + b"\x00" * 200, "x.json: cannot read the database"),
    ],
)
def test_bad_input_names_the_file_and_conversation(
    tmp_path: Path, data: bytes, message: str
) -> None:
    path = tmp_path / "x.json"
    path.write_bytes(data)
    with pytest.raises(InputError) as info:
        read(path)
    assert info.value.message.replace(str(path), "x.json").startswith(message), info.value.message


def test_on_postgresql_the_same_sessions_and_nothing_twice(pg_url: str) -> None:
    from memcli.store.postgres import PostgresStore

    store = PostgresStore(pg_url)
    try:
        first = load(DATA / "finetune.jsonl", store)  # type: ignore[arg-type]
        assert first.messages == 10 and len(first.new_sessions) == 3
        weather = next(i for i in store.list_sessions() if i.id.startswith("weather-in-bern-"))
        assert weather.metadata is not None and weather.metadata["parallel_tool_calls"] is False
        assert weather.source_id is not None and weather.source_id.startswith("sha256:")
        again = load(DATA / "finetune.jsonl", store)  # type: ignore[arg-type]
        assert (again.messages, again.already_stored) == (0, 10)
    finally:
        store.close()


def test_with_or_without_session_the_same_conversation_once(tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    path.write_text(
        "".join(
            json.dumps({"role": role, "content": f"{role} {i}"}) + "\n"
            for i in range(3)
            for role in ("user", "assistant")
        )
    )
    store = SQLiteStore(tmp_path / "m.db")
    assert load(path, store, session="demo").sessions == {"demo": 6}
    again = load(path, store)  # without --session: found in demo by its first messages
    assert again.sessions == {"demo": 0} and again.already_stored == 6
    assert [i.id for i in store.list_sessions()] == ["demo"]


def test_alike_starts_in_two_files_are_two_conversations(tmp_path: Path) -> None:
    def conversation(*texts: str) -> str:
        roles = ("user", "assistant") * len(texts)
        return json.dumps(
            {"messages": [{"role": r, "content": t} for r, t in zip(roles, texts, strict=False)]}
        )

    store = SQLiteStore(tmp_path / "m.db")
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text(conversation("hi", "hello", "rye?", "yes") + "\n")
    second.write_text(conversation("hi", "hello", "zopf?", "no") + "\n")
    load(first, store)
    assert len(load(second, store).new_sessions) == 1  # not the first file's conversation
    for path in (first, second):
        assert load(path, store).messages == 0
    assert len(store.list_sessions()) == 2
    # the start of a stored conversation is stored: nothing new
    head = tmp_path / "head.jsonl"
    head.write_text(conversation("hi", "hello") + "\n")
    assert (load(head, store).messages, len(store.list_sessions())) == (0, 2)


def test_an_edited_chatgpt_branch_adds_only_what_changed(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "m.db")
    load(DATA / "chatgpt-conversations.json", store)
    items = json.loads((DATA / "chatgpt-conversations.json").read_text())
    items[0]["current_node"] = "a2old"  # the user went back to the first version
    edited = tmp_path / "conversations.json"
    edited.write_text(json.dumps(items))
    result = load(edited, store)
    assert (result.messages, result.already_stored) == (2, 4)
    bern = sessions(store)["Sourdough in Bern"]
    assert bern[-2:] == [("user", "Mostly baguettes."), ("assistant", "Baguettes are great.")]
    assert len(bern) == 9


def test_an_export_carries_title_source_and_keys_to_another_store(tmp_path: Path) -> None:
    from memcli.transcripts import SessionRecord, export_lines

    store = SQLiteStore(tmp_path / "m.db")
    load(DATA / "finetune.jsonl", store)
    info = next(i for i in store.list_sessions() if i.id.startswith("weather-in-bern-"))
    lines = [SessionRecord.of(info).to_dict(), *export_lines(store.iter_messages(info.id))]
    path = tmp_path / "export.jsonl"
    path.write_text("".join(json.dumps(line, default=str) + "\n" for line in lines))
    other = SQLiteStore(tmp_path / "other.db")
    assert load(path, other).messages == 5
    (copied,) = other.list_sessions()
    assert (copied.id, copied.source_id, copied.metadata) == (
        info.id,
        info.source_id,
        info.metadata,
    )
    assert load(path, other).messages == 0


# -- bounds: every input is read within its limits, and over one nothing is stored ---------------


def chatgpt_items() -> list[dict[str, object]]:
    return json.loads((DATA / "chatgpt-conversations.json").read_text())


def refused(path: Path, what: str, limits: Limits | None = None) -> str:
    with pytest.raises(InputError) as info:
        read(path, limits=limits or Limits())
    message = info.value.message
    assert str(path) in message and what in message, message
    return message


def test_a_zip_bomb_is_refused_naming_its_entry_before_it_is_expanded(tmp_path: Path) -> None:
    bomb = tmp_path / "export.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("conversations.json", b"[" + b" " * (8 * 2**20) + b"]")  # 8 MB of spaces
    assert bomb.stat().st_size < 20_000
    refused(bomb, "conversations.json: expands from")
    # Not one byte too many read, whatever the header says: lowered, the size limit holds too.
    small = tmp_path / "small.zip"
    with zipfile.ZipFile(small, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("conversations.json", json.dumps(chatgpt_items()))
    limit = small.stat().st_size + 1  # the zip is read, its entry is larger
    refused(small, "conversations.json: it expands to", Limits(max_bytes=limit))
    assert len(read(small).conversations) == 2


def test_a_split_zip_is_read_within_its_part_and_size_limits(tmp_path: Path) -> None:
    items = chatgpt_items()
    split = tmp_path / "split.zip"
    with zipfile.ZipFile(split, "w", zipfile.ZIP_DEFLATED) as z:
        for i in range(3):
            z.writestr(f"conversations-{i:03}.json", json.dumps(items[i % 2 : i % 2 + 1]))
    refused(split, "a zip of 3 conversation files, more than the 2", Limits(max_parts=2))
    limit = split.stat().st_size + 1
    refused(split, "its conversations expand to", Limits(max_bytes=limit))


def test_a_split_zip_holding_a_conversation_many_times_imports_it_once(tmp_path: Path) -> None:
    items = chatgpt_items()
    same = tmp_path / "same.zip"
    with zipfile.ZipFile(same, "w") as z:
        for i in range(300):
            z.writestr(f"conversations-{i:03}.json", json.dumps(items[:1]))
    store = SQLiteStore(tmp_path / "m.db")
    result = load(same, store)  # was: "the sessions kept changing ... other writers"
    assert result.messages == 7 and len(store.list_sessions()) == 1
    edited = json.loads(json.dumps(items[:1]))
    edited[0]["current_node"] = "a2old"
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("conversations-000.json", json.dumps(items[:1]))
        z.writestr("conversations-001.json", json.dumps(edited))
    with pytest.raises(InputError, match="is in it twice, with other messages"):
        load(other, store)
    assert len(store.list_sessions()) == 1


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"role": "user", "content": "hello there"}\n')
    refused(path, "more than 10 bytes", Limits(max_bytes=10))
    with pytest.raises(InputError, match="<stdin>: more than 10 bytes"):
        read("-", io.BytesIO(path.read_bytes()), limits=Limits(max_bytes=10))


def test_a_logs_db_whose_tables_are_views_is_refused_not_read_forever(tmp_path: Path) -> None:
    path = tmp_path / "logs.db"
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE conversations (id TEXT, name TEXT, model TEXT);
        CREATE VIEW responses AS
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n)
            SELECT i AS id, 'p' AS prompt, 'r' AS response, 'c' AS conversation_id FROM n;
        """
    )
    conn.close()
    refused(path, "responses is a view, not a table")


@pytest.mark.parametrize("name", ["llm-0.27-logs.db", "llm-0.36-logs.db"])
def test_a_logs_db_is_read_within_its_row_and_text_limits(name: str) -> None:
    refused(DATA / name, "rows", Limits(max_rows=1))
    refused(DATA / name, "bytes of text", Limits(max_bytes=50))
    assert read(DATA / name, limits=Limits(max_rows=100)).conversations


def test_a_fragment_named_many_times_counts_as_that_much_text(tmp_path: Path) -> None:
    """A part naming one fragment thousands of times would make gigabytes of text from a
    small file: each use counts toward the limit on bytes of text."""
    path = tmp_path / "logs.db"
    shutil.copy(DATA / "llm-0.36-fragments.db", path)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE fragments SET content = ? WHERE id = 1", ("x" * 100_000,))
    payload = json.dumps({"text_ref": [{"fragment": 1}] * 1_000})
    conn.execute("UPDATE parts SET payload = ? WHERE payload LIKE '%text_ref%'", (payload,))
    conn.commit()
    conn.close()
    assert path.stat().st_size < 2_000_000
    refused(path, "bytes of text", Limits(max_bytes=5_000_000))


def test_a_claude_attachment_over_its_limit_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "conversations.json"
    shutil.copy(DATA / "claude-conversations.json", path)
    message = refused(path, "attachment 0 ('prices.txt') holds", Limits(max_attachment=10))
    assert "conversation 0 ('Bakery price list'): message 0" in message


@pytest.mark.parametrize(
    ("items", "what"),
    [
        ([1, *chatgpt_items()], "conversation 0: no mapping of messages"),
        ([*chatgpt_items(), "x"], "conversation 2: no mapping of messages"),
        (
            [{"uuid": "u", "chat_messages": []}, None],
            "conversation 1: no chat_messages list",
        ),
        (
            [{**chatgpt_items()[0], "conversation_id": "a\ud800"}],
            "its id holds a lone surrogate",
        ),
        ([{**chatgpt_items()[0], "title": "\udc00"}], "its title holds a lone surrogate"),
        ([{"uuid": "\ud800", "chat_messages": []}], "its uuid holds a lone surrogate"),
        (
            [{"prompt": "p", "response": "r", "conversation_id": "\ud800"}],
            "response 0: conversation_id holds a lone surrogate",
        ),
    ],
)
def test_an_export_that_is_not_as_its_format_says_is_an_input_error(
    tmp_path: Path, items: list[object], what: str
) -> None:
    path = tmp_path / "conversations.json"
    path.write_text(json.dumps(items))  # a lone surrogate written as its escape
    refused(path, what)


def test_claude_counts_only_the_parts_left_out_and_no_bare_file_line(tmp_path: Path) -> None:
    conversation = {
        "uuid": "c-1",
        "name": "Scans",
        "chat_messages": [
            {
                "uuid": "m-1",
                "sender": "human",
                "created_at": "2024-06-01T12:00:00Z",
                "content": [{"type": "text", "text": "Read my scan"}],
                "attachments": [
                    {"file_name": "scan.pdf", "extracted_content": ""},
                    {"file_name": "notes.txt", "extracted_content": "Gecko-1122"},
                ],
                "files": [{"file_name": "scan.pdf"}, {"file_name": "notes.txt"}],
            },
            {
                "uuid": "m-2",
                "sender": "assistant",
                "created_at": "2024-06-01T12:00:01Z",
                "content": [
                    {"type": "thinking", "thinking": "Let me look."},
                    {"type": "text", "text": "The scan has no text."},
                    {"type": "tool_use", "name": "search", "input": {}},
                    {"type": "tool_result", "content": []},
                ],
            },
        ],
    }
    path = tmp_path / "conversations.json"
    path.write_text(json.dumps([conversation]))
    (found,) = read(path).conversations
    assert found.dropped == 1  # the scan without text; not thinking, tools, or notes.txt
    user, assistant = found.messages
    assert user.content == "Read my scan\n\n[notes.txt]\nGecko-1122"  # no bare [scan.pdf] line
    assert [user.metadata, assistant.metadata] == [{"source_id": "m-1"}, {"source_id": "m-2"}]


def test_an_open_webui_chat_with_no_branch_to_follow_is_refused(tmp_path: Path) -> None:
    """A history of messages with no `currentId` and no `messages` list would import nothing
    of it without a word: refused, naming the chat."""
    chat = json.loads((DATA / "openwebui-chat.json").read_text())
    assert chat["history"]["messages"]
    del chat["history"]["currentId"]
    chat["messages"] = []
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(chat))
    refused(path, "but no currentId, and it has no messages list")


def test_a_chatgpt_tool_call_whose_text_is_nested_too_deep_is_kept_as_text(tmp_path: Path) -> None:
    items = json.loads((DATA / "chatgpt-tools.json").read_text())
    deep = "[" * 100_000
    items[0]["mapping"]["b1"]["message"]["content"]["parts"] = [deep]
    path = tmp_path / "conversations.json"
    path.write_text(json.dumps(items))
    (conversation, *_) = read(path).conversations
    calls = [
        c
        for m in conversation.messages
        for c in m.to_dict().get("metadata", {}).get("extra", {}).get("tool_calls", [])
    ]
    assert json.loads(calls[0]["function"]["arguments"]) == {"input": deep}


@pytest.mark.parametrize(
    ("name", "data", "said"),
    [
        ("chat.csv", "role,content\nuser,hello\nassistant,hi\n", "chat.csv: CSV is not a format"),
        ("chat.txt", "role;content\nuser;hello\n", "chat.txt: CSV is not a format"),
        ("notes.md", "# My notes\n\nhello\n", "notes.md: not JSON (it starts with '# My notes')"),
        ("a.jsonl", '{"role": "user", "content": "a"}\n{"role": bad}\n', "a.jsonl:2: invalid JSON"),
        ("b.json", '\ufeff[{"role": "user", "content": }]', "b.json:1: invalid JSON"),
    ],
)
def test_input_that_is_no_json_is_named_for_what_it_is(
    tmp_path: Path, name: str, data: str, said: str
) -> None:
    """A CSV file or a text was 'line 1: invalid JSON'; JSON with an error still names its line."""
    from memcli.errors import InputError
    from memcli.formats import read

    path = tmp_path / name
    path.write_text(data, encoding="utf-8")
    with pytest.raises(InputError) as err:
        read(path)
    assert f"{tmp_path}/{said}" in str(err.value), str(err.value)


@pytest.mark.parametrize("steps", [-1, "steps", {"type": "contentBlock"}])
def test_lm_studio_steps_that_are_no_list_are_refused_naming_the_message(
    tmp_path: Path, steps: object
) -> None:
    from memcli.errors import InputError
    from memcli.formats import read

    chat = {
        "name": "x",
        "createdAt": 1,
        "messages": [
            {"versions": [{"role": "user", "content": "hi"}], "currentlySelected": 0},
            {
                "versions": [{"type": "multiStep", "role": "assistant", "steps": steps}],
                "currentlySelected": 0,
            },
        ],
    }
    path = tmp_path / "x.conversation.json"
    path.write_text(json.dumps(chat))
    with pytest.raises(InputError, match="message 1: steps .* is not a list of steps"):
        read(path)

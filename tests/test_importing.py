"""memcli.importing: a transcript's conversations imported into sessions, all or nothing, as
whom and under which budget, nothing twice; through the path `memcli import` takes (`formats.read`,
`from_source`, `import_conversations`: `helpers.import_file`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from helpers import import_file
from hypothesis import given, settings
from hypothesis import strategies as st

from memcli import Message, SQLiteStore, UsageError
from memcli.errors import InputError
from memcli.flush import Budget, BudgetOverride
from memcli.formats import read
from memcli.importing import Opening, conversations, same_message, stored_overlap
from memcli.memory import Memory
from memcli.store.base import require_session as require
from memcli.tokens import TiktokenTokenizer
from memcli.transcripts import SessionRecord, parse_transcript

DEFAULT = BudgetOverride(30000, 0.7)


def store_with(tmp_path: Path, session: str = "s1", user: str = "ann") -> SQLiteStore:
    store = SQLiteStore(tmp_path / "m.db")
    memory = Memory(store, session, user_id=user, budget=Budget(500, 0.5, 40))
    memory.put_messages([Message("user", "I live in Porto"), Message("assistant", "Nice city")])
    return store


def opening(rebudget: bool = False, user: str | None = None, **budget: object) -> Opening:
    return Opening(
        TiktokenTokenizer(),
        default_budget=DEFAULT,
        user=user,
        budget=BudgetOverride(**budget),  # type: ignore[arg-type]
        rebudget=rebudget,
    )


def test_an_import_goes_into_the_users_own_session_of_that_name(tmp_path: Path) -> None:
    """`--session s1 --user bob` after ann's `s1`: bob's own s1, new; ann's is untouched; again,
    nothing is stored twice; without a user, a name two users have is ambiguous."""
    store = store_with(tmp_path)
    data = b'{"role": "user", "content": "a"}\n'
    result = import_file(store, data, opening(user="bob"), "s1")
    assert result.sessions == {"s1": 1} and result.new_sessions == ["s1"]
    bobs = require(store, "s1", "bob")
    assert bobs.id != "s1" and bobs.active_messages == 1
    assert import_file(store, data, opening(user="bob"), "s1").already_stored == 1
    assert require(store, "s1", "bob").active_messages == 1
    assert require(store, "s1", "ann").active_messages == 2
    with pytest.raises(UsageError, match="2 users have a session 's1': ann, bob"):
        import_file(store, data, opening(), "s1")
    assert require(store, "s1", "ann").active_messages == 2
    with pytest.raises(UsageError, match="has the budget 500"):
        import_file(store, data, opening(user="ann", token_limit=800), "s1")
    assert require(store, "s1", "ann").active_messages == 2
    assert require(store, "s1", "ann").token_limit == 500
    result = import_file(store, data, opening(user="ann", token_limit=800, rebudget=True), "s1")
    assert result.sessions == {"s1": 1} and result.new_sessions == []
    assert result.rebudgets["s1"].old == Budget(500, 0.5, 40)
    assert result.rebudgets["s1"].new == Budget(800, 0.5, 80)
    info = require(store, "s1", "ann")
    assert info.active_messages == 3 and info.token_limit == 800 and info.user_id == "ann"


def test_a_smaller_budget_flushes_at_once_and_says_so(tmp_path: Path) -> None:
    store = store_with(tmp_path)
    Memory(store, "s1").put_messages([Message("user", "and the sea"), Message("assistant", "Yes")])
    data = b'{"role": "user", "content": "and I like the sea"}\n'
    result = import_file(store, data, opening(token_limit=8, flush_size=2, rebudget=True), "s1")
    change = result.rebudgets["s1"]
    assert change.flushes == 1 and change.archived == 2  # the old turn left at once
    assert result.archived >= 2 and require(store, "s1").archived_messages == result.archived


def test_import_opens_new_sessions_as_the_default_user_with_the_flags(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "m.db")
    data = b'{"role": "user", "content": "a", "session": "x"}\n{"role": "user", "content": "b"}\n'
    result = import_file(store, data, opening(ratio=0.5))
    assert result.new_sessions[0] == "x" and len(result.new_sessions) == 2  # one made up
    for session in result.new_sessions:
        info = require(store, session)
        assert (info.user_id, info.token_limit, info.chat_history_token_ratio) == (
            "default",
            30000,
            0.5,
        )


# -- idempotent imports -------------------------------------------------------------------------


def lines(*pairs: tuple[str, str], session: str | None = None) -> bytes:
    out = []
    for role, content in pairs:
        record = {"role": role, "content": content}
        if session:
            record["session"] = session
        out.append(json.dumps(record))
    return ("\n".join(out) + "\n").encode()


CHAT = (("user", "hi"), ("assistant", "ok"), ("user", "thanks"), ("assistant", "ok"))


def contents(store: SQLiteStore, session: str) -> list[str]:
    return [m.content for m in store.get_messages(session)]


def test_importing_the_same_records_again_stores_nothing(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "m.db")
    data = lines(*CHAT)
    first = import_file(store, data, opening(), "s")
    assert (first.messages, first.already_stored) == (4, 0)  # "ok" twice: both stored
    again = import_file(store, data, opening(), "s")
    assert (again.messages, again.already_stored, again.sessions) == (0, 4, {"s": 0})
    assert contents(store, "s") == ["hi", "ok", "thanks", "ok"]
    copy = import_file(store, data, opening(), "s", again=True)
    assert (copy.messages, copy.already_stored) == (4, 0)
    assert len(contents(store, "s")) == 8


def test_a_grown_transcript_appends_only_what_is_new(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "m.db")
    import_file(store, lines(*CHAT, session="s"), opening())
    grown = lines(*CHAT, ("user", "bye"), ("assistant", "ok"), session="s")
    result = import_file(store, grown, opening())
    assert (result.messages, result.already_stored, result.skipped) == (2, 4, {"s": 4})
    assert contents(store, "s") == ["hi", "ok", "thanks", "ok", "bye", "ok"]


def test_equal_messages_elsewhere_in_the_session_are_not_duplicates(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "m.db")
    import_file(store, lines(*CHAT), opening(), "s")
    other = lines(("user", "hi"), ("assistant", "ok"))
    # Stored, but not at the end (which is "thanks", "ok"): both are new.
    result = import_file(store, other, opening(), "s")
    assert (result.messages, result.already_stored) == (2, 0)
    assert contents(store, "s") == ["hi", "ok", "thanks", "ok", "hi", "ok"]


def test_a_sessions_export_imports_back_as_nothing_new(tmp_path: Path) -> None:
    from memcli.transcripts import export_lines

    store = SQLiteStore(tmp_path / "m.db")
    memory = Memory(store, "s", budget=Budget(60, 0.5, 10))
    for i in range(6):
        memory.put_messages(
            [
                Message("user", f"question {i} about the garden", name="ann"),
                Message("assistant", "ok", metadata={"turn": i}, timestamp=datetime(2024, 1, 1, i)),
            ]
        )
    assert store.list_flushes("s")
    for status in (None, "active"):  # --all, and the active tail only
        data = "".join(
            json.dumps(r) + "\n"
            for r in export_lines(store.iter_messages("s", status), with_status=True)
        )
        result = import_file(store, data.encode(), opening())
        assert result.messages == 0 and result.already_stored == data.count("\n")
    assert len(store.get_messages("s")) == 12


def test_a_transcript_without_timestamps_matches_stored_ones_with_them(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "m.db")
    Memory(store, "s").put(Message("user", "hi", timestamp=datetime(2024, 1, 1)))
    result = import_file(store, lines(("user", "hi")), opening(), "s")
    assert result.already_stored == 1
    timed = b'{"role": "user", "content": "hi", "timestamp": "2025-01-01T00:00:00Z"}\n'
    result = import_file(store, timed, opening(), "s")
    assert result.messages == 1  # another time: another message


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from("abc"), max_size=12),
    st.lists(st.sampled_from("abc"), max_size=8),
)
def test_stored_overlap_is_the_longest_prefix_stored_at_the_end(
    stored: list[str], incoming: list[str]
) -> None:
    expected = max(
        k
        for k in range(min(len(stored), len(incoming)) + 1)
        if stored[len(stored) - k :] == incoming[:k]
    )
    as_messages = [Message("user", c) for c in stored]
    assert stored_overlap([Message("user", c) for c in incoming], iter(as_messages)) == expected


#: A message of a property test: its text, and its time (None: undated), as an hour of a day.
TIMED = st.tuples(st.sampled_from("ab"), st.sampled_from([None, 1, 2]))


@settings(max_examples=500, deadline=None)
@given(st.lists(TIMED, max_size=12), st.lists(TIMED, max_size=8))
def test_stored_overlap_compares_times_only_where_both_messages_have_one(
    stored: list[tuple[str, int | None]], incoming: list[tuple[str, int | None]]
) -> None:
    """The longest start of the conversation that the session ends with, each message the same
    as its stored one (`same_message`: a time counts only where both have one), by brute force."""

    def message(text: str, hour: int | None) -> Message:
        return Message("user", text, timestamp=None if hour is None else datetime(2024, 1, 1, hour))

    old = [message(*m) for m in stored]
    new = [message(*m) for m in incoming]
    expected = max(
        k
        for k in range(min(len(old), len(new)) + 1)
        if all(same_message(a, b) for a, b in zip(old[len(old) - k :], new[:k], strict=True))
    )
    assert stored_overlap(new, iter(old)) == expected


def test_an_undated_deleted_message_stays_deleted_when_the_file_is_dated(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "m.db")
    import_file(store, lines(*CHAT), opening(), "s")
    gone = store.get_messages("s")[2]  # "thanks"
    assert store.delete_message("s", gone.id) is not None
    dated = "".join(
        json.dumps({"role": r, "content": c, "timestamp": f"2024-01-0{i + 1}T00:00:00Z"}) + "\n"
        for i, (r, c) in enumerate(CHAT)
    )
    result = import_file(store, dated.encode(), opening(), "s")
    assert (result.messages, result.already_stored) == (0, 4)
    assert contents(store, "s") == ["hi", "ok", "ok"]


# -- the session record of an export ------------------------------------------------------------


SESSION = {
    "type": "session",
    "id": "a",
    "user": "ann",
    "token_limit": 400,
    "chat_history_token_ratio": 0.5,
    "token_flush_size": 20,
}


def test_a_session_record_gives_a_new_session_its_budget_and_user(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes((json.dumps(SESSION) + "\n").encode() + lines(*CHAT))
    header = read(path).header
    assert header == SessionRecord("a", "ann", Budget(400, 0.5, 20))
    store = SQLiteStore(tmp_path / "m.db")
    result = import_file(store, path, opening())
    assert result.new_sessions == ["a"]  # records naming no session go to the record's
    info = require(store, "a")
    assert (info.user_id, info.token_limit, info.token_flush_size) == ("ann", 400, 20)
    import_file(store, path, opening(token_limit=300), "b")
    assert require(store, "b").token_limit == 300  # the flags win
    with pytest.raises(UsageError, match="session record"):
        import_file(store, path, opening(), "b")
    assert header.to_dict() == SESSION


def test_a_bad_session_record_names_its_line_and_later_lines_keep_theirs(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"\n" + json.dumps({**SESSION, "token_limit": -1}).encode() + b"\n")
    with pytest.raises(InputError, match=r"a.jsonl:2: token_limit must be positive"):
        read(path)
    path.write_bytes(json.dumps(SESSION).encode() + b'\n{"role": "user"}\n')
    with pytest.raises(InputError, match=r"a.jsonl:2: missing content"):
        read(path)
    path.write_bytes(lines(*CHAT))
    assert read(path).header is None


def test_an_import_racing_another_into_one_session_aligns_again(tmp_path: Path) -> None:
    """Another process stores the same records between this import's read of the session and
    its transaction: the session's version tells, and the import aligns again (nothing twice)."""
    db = tmp_path / "m.db"
    store, other = SQLiteStore(db), SQLiteStore(db)
    data = lines(*CHAT)
    import_file(store, lines(*CHAT[:2]), opening(), "s")
    reads = 0
    read = store.iter_messages

    def racing(session_id: str, status: str | None = None) -> Iterator[Message]:
        nonlocal reads
        reads += 1
        yield from read(session_id, status)
        if reads == 1:  # the other import commits right after this one read the session
            import_file(other, data, opening(), "s")

    store.iter_messages = racing  # type: ignore[method-assign]
    result = import_file(store, data, opening(), "s")
    assert reads == 2 and (result.messages, result.already_stored) == (0, 4)
    assert contents(store, "s") == ["hi", "ok", "thanks", "ok"]


def test_conversations_are_the_records_of_each_session_in_order() -> None:
    data = (
        lines(("user", "a"), session="x")
        + lines(("user", "b"))
        + lines(("user", "c"), session="x")
        + lines(("user", "d"))
    )
    records = parse_transcript(data)
    found = conversations(records)
    assert [(c.session, [m.content for m in c.messages]) for c in found] == [
        ("x", ["a", "c"]),
        (None, ["b", "d"]),  # records naming no session: one new session
    ]
    assert [c.session for c in conversations(records, "s")] == ["s"]
    assert [c.session for c in conversations(records, header=SessionRecord("h"))] == ["x", "h"]
    with pytest.raises(InputError, match="--session must not be empty"):
        conversations(records, session_id="")


# -- deletes hold ---------------------------------------------------------------------------------


@pytest.mark.parametrize("session", [None, "s"])
def test_a_message_deleted_for_good_is_not_imported_again(
    tmp_path: Path, session: str | None
) -> None:
    """A transcript (no ids in it): the deleted message keeps its place, by its hash."""
    store = SQLiteStore(tmp_path / "m.db")
    data = lines(*CHAT, ("user", "bye"), ("assistant", "ok"))
    first = import_file(store, data, opening(), session)
    (target,) = first.sessions
    gone = store.get_messages(target)[1]  # the first "ok"
    assert store.delete_message(target, gone.id) is not None
    for _ in range(2):
        result = import_file(store, data, opening(), session)
        assert (result.messages, result.already_stored) == (0, 6)
    assert contents(store, target) == ["hi", "thanks", "ok", "bye", "ok"]
    assert len(store.list_sessions()) == 1
    # What is kept of it is a hash: not its text.
    (row,) = store.execute("SELECT source_hash FROM deleted_sources").fetchall()
    assert row[0].startswith("content:") and "ok" not in row[0][8:]


def test_messages_of_an_export_keep_their_ids_in_the_source(tmp_path: Path) -> None:
    exports = Path(__file__).parent / "data" / "exports"
    for name in ("chatgpt-conversations.json", "claude-conversations.json", "llm-0.27-logs.db"):
        for c in read(exports / name).conversations:
            ids = [(m.metadata or {}).get("source_id") for m in c.messages]
            assert all(isinstance(i, str) and i for i in ids), (name, ids)
            assert len(set(ids)) == len(ids), name
    llm = [m for c in read(exports / "llm-0.27-logs.json").conversations for m in c.messages]
    first = llm[0].metadata["source_id"]  # type: ignore[index]
    assert first.endswith(":user") and llm[1].metadata == {  # one row: two messages
        "source_id": first.removesuffix(":user") + ":assistant"
    }


def test_messages_stored_before_source_ids_are_aligned_by_the_stored_tail(
    tmp_path: Path,
) -> None:
    """A session imported before memcli kept source ids: its messages have none, and a
    re-import of the export (whose messages now have them) stores nothing twice."""
    store = SQLiteStore(tmp_path / "m.db")
    export = Path(__file__).parent / "data" / "exports" / "claude-conversations.json"
    (conversation, *_) = read(export).conversations
    old = [Message(m.role, m.content, timestamp=m.timestamp) for m in conversation.messages]
    Memory(store, "s", budget=Budget(30000, 0.7, 100)).put_messages(old)
    result = import_file(store, export, opening(), "s")
    assert result.already_stored >= len(old)
    assert len(store.get_messages("s")) == len(old) + result.messages
    assert contents(store, "s")[: len(old)] == [m.content for m in old]
    assert all(m.content not in contents(store, "s")[len(old) :] for m in old)

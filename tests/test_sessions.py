"""memcli.sessions: who may open a session, its budget, a session's report, and the blocks' view
of a session or of none."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from memcli import MemoryBlock, Message, SQLiteStore, UsageError
from memcli.blocks.base import BlockContext
from memcli.errors import SessionNotFound
from memcli.flush import Budget, BudgetOverride
from memcli.memory import Memory
from memcli.sessions import (
    blocks_view,
    budget_for,
    budget_rule,
    open_stored,
    owned,
    report,
)
from memcli.store.base import require_session as require
from memcli.tokens import TiktokenTokenizer

DEFAULT = BudgetOverride(30000, 0.7)
Asked = BudgetOverride


def store_with(tmp_path: Path, session: str = "s1", user: str = "ann") -> SQLiteStore:
    store = SQLiteStore(tmp_path / "m.db")
    memory = Memory(store, session, user_id=user, budget=Budget(500, 0.5, 40))
    memory.put_messages([Message("user", "I live in Porto"), Message("assistant", "Nice city")])
    return store


class Whose(MemoryBlock):
    """A block that tells whose memory it was asked for."""

    name = "whose"

    def get(self, messages: Sequence[Message], ctx: BlockContext) -> str:
        return f"session {ctx.session_id!r} user {ctx.user_id} sees {len(messages)} messages"


def test_a_session_name_is_its_users_and_another_users_name_is_another_session(
    tmp_path: Path,
) -> None:
    """Two users may each have `s1`: bob's is another session under another key, found by
    (user, name) only; his messages, counts and reports are his alone, and nothing he sees
    (the name, the not-found error) tells him ann's exists."""
    store = store_with(tmp_path)
    assert owned(store, "s1", "bob") is None  # ann's is not his
    with pytest.raises(SessionNotFound) as caught:
        require(store, "s1", "bob")
    assert caught.value.message == "no session 's1' of user 'bob'"
    assert "ann" not in str(caught.value.hint)  # (nothing close among his: no owner named)
    bobs = Memory(store, "s1", user_id="bob")
    bobs.put(Message("user", "I live in Oslo"))
    assert bobs.session_id == "s1" and bobs.session_key != "s1"
    info = owned(store, "s1", "bob")
    assert info is not None and (info.name, info.user_id) == ("s1", "bob")
    assert info.id == bobs.session_key
    anns = owned(store, "s1", "ann")
    assert anns is not None and (anns.id, anns.user_id, anns.active_messages) == ("s1", "ann", 2)
    assert [m.content for m in report(store, info.id).messages] == ["I live in Oslo"]
    assert [m.to_dict(stored=True)["session"] for m in bobs.get_all()] == ["s1"]
    assert sorted(i.name for i in store.list_sessions("bob")) == ["s1"]
    # Opened without a user, a name that two users have is ambiguous: said, with the users.
    with pytest.raises(UsageError, match="2 users have a session 's1': ann, bob"):
        owned(store, "s1", None)
    assert owned(store, "new", "bob") is None
    with pytest.raises(SessionNotFound):
        require(store, "new")
    # A third user of that name, and ann's deleted then made again: every key stays unique.
    carls = Memory(store, "s1", user_id="carl")
    store.delete_session("s1")
    again = Memory(store, "s1", user_id="ann")
    keys = {bobs.session_key, carls.session_key, again.session_key}
    assert len(keys) == 3 and {i.name for i in store.list_sessions()} == {"s1"}
    assert Memory(store, "s1", user_id="bob").session_key == bobs.session_key


def test_the_library_opens_a_name_as_its_users(tmp_path: Path) -> None:
    """A stored session opened without a user is its user's (when one user has that name)."""
    store = store_with(tmp_path)
    assert Memory(store, "s1").user_id == "ann"
    assert Memory(store, "s1", user_id="ann").session_key == "s1"


def test_flags_override_a_stored_budget_and_new_sessions_take_the_defaults(tmp_path: Path) -> None:
    info = require(store_with(tmp_path), "s1")
    assert budget_for(info, DEFAULT) == Budget(500, 0.5, 40)
    assert budget_for(info, DEFAULT, Asked(ratio=0.6)) == Budget(500, 0.6, 40)
    assert budget_for(info, DEFAULT, Asked(token_limit=900)) == Budget(900, 0.5, None)  # 10% of 900
    assert budget_for(info, DEFAULT, Asked(token_limit=900, flush_size=30)) == Budget(900, 0.5, 30)
    assert budget_for(None, DEFAULT) == Budget(30000, 0.7, None)
    assert budget_for(None, DEFAULT, Asked(flush_size=100)) == Budget(30000, 0.7, 100)
    assert budget_for(None, Asked(2000, 0.5, 100), Asked(token_limit=900)) == Budget(900, 0.5, 100)
    assert budget_rule(DEFAULT)(info) is None  # a stored session keeps its budget
    assert budget_rule(DEFAULT)(None) == Budget(30000, 0.7, None)
    assert budget_rule(DEFAULT, given=Budget(900, 0.6, 90))(None) == Budget(900, 0.6, 90)
    assert budget_rule(DEFAULT, Asked(token_limit=100), given=Budget(900, 0.6, 90))(None) == Budget(
        100, 0.6, None
    )


def test_a_budget_that_differs_from_a_stored_one_is_an_error_unless_rebudget(
    tmp_path: Path,
) -> None:
    info = require(store_with(tmp_path), "s1")
    assert budget_rule(DEFAULT, Asked(token_limit=500, ratio=0.5))(info) is None  # what it has
    assert budget_rule(DEFAULT, given=Budget(500, 0.5, 40))(info) is None
    with pytest.raises(UsageError) as caught:
        budget_rule(DEFAULT, Asked(ratio=0.6))(info)
    assert caught.value.message == (
        "session 's1' has the budget 500 × 0.5 (flush 40);"
        " the budget options ask for 500 × 0.6 (flush 40)"
    )
    assert caught.value.hint is not None and "--rebudget" in caught.value.hint
    with pytest.raises(UsageError, match="the file's session record asks for"):
        budget_rule(DEFAULT, given=Budget(900, 0.5, 90))(info)
    assert budget_rule(DEFAULT, Asked(ratio=0.6), rebudget=True)(info) == Budget(500, 0.6, 40)


def test_report_lists_messages_flushes_and_a_summary(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "m.db")
    memory = Memory(store, "s1", user_id="ann", budget=Budget(60, 0.5, 10))
    for i in range(6):
        memory.put(Message("user", f"message number {i} about the garden"))
    active = report(store, "s1")
    every = report(store, "s1", archived=True)
    assert active.flushes and len(every.messages) == 6
    assert [m.status for m in active.messages] == ["active"] * len(active.messages)
    records = every.records()
    assert [r["type"] for r in records] == ["message"] * 6 + ["flush"] * len(every.flushes) + [
        "summary"
    ]
    summary = records[-1]
    assert summary["session"] == "s1" and summary["user"] == "ann"
    assert summary["flushes"] == len(every.flushes)
    assert summary["archived_messages"] == sum(
        f["messages"] for f in records if f["type"] == "flush"
    )
    with pytest.raises(SessionNotFound):
        report(store, "nope")


def test_blocks_view_of_a_session_or_of_none_stores_nothing(tmp_path: Path) -> None:
    store = store_with(tmp_path)
    tokenizer = TiktokenTokenizer()
    view = blocks_view(
        store, None, user="bob", blocks=[Whose()], tokenizer=tokenizer, token_limit=1000, input="hi"
    )
    assert view.blocks[0].content == "session '' user bob sees 1 messages"
    assert [i.id for i in store.list_sessions(None)] == ["s1"]  # no session was made
    view = blocks_view(
        store, "s1", user="bob", blocks=[Whose()], tokenizer=tokenizer, token_limit=1000
    )
    assert view.blocks[0].content == "session 's1' user ann sees 2 messages"  # its own user
    assert open_stored(store, "s1", [Whose()], tokenizer).get()[0].role == "system"
    with pytest.raises(SessionNotFound):
        blocks_view(store, "nope", user="bob", blocks=[], tokenizer=tokenizer, token_limit=1000)

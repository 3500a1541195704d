"""memcli.search: queries run as `memcli search` runs them, each scoped to a user or a session."""

from __future__ import annotations

import pytest
from fakes import HashEmbedder

from memcli import Message
from memcli.errors import SessionNotFound
from memcli.memory import Memory
from memcli.search.queries import QueryLine, scope_user, search_lines
from memcli.search.retriever import Retriever
from memcli.store import open_store


def test_the_scope_is_the_given_user_else_the_default_one_unless_a_session_is_named() -> None:
    assert scope_user(None, None, "me") == "me"
    assert scope_user(None, "ann", "me") == "ann"
    assert scope_user("s1", None, "me") is None  # the session, whoever it belongs to
    assert scope_user("s1", "ann", "me") == "ann"


@pytest.fixture
def retriever(db: str) -> Retriever:
    store = open_store(db)
    for session, user in (("a1", "ann"), ("a2", "ann"), ("b1", "bob")):
        Memory(store, session, user_id=user).put(Message("user", f"{user} waters the roses"))
    return Retriever(store, HashEmbedder())


def sessions(found: list[tuple[int, object]]) -> list[str]:
    return sorted(hit.session_id for _, hit in found)  # type: ignore[attr-defined]


def test_each_line_searches_its_user_or_session(retriever: Retriever) -> None:
    lines = [
        QueryLine(0, "roses"),
        QueryLine(1, "roses", user="bob"),
        QueryLine(2, "roses", session="b1"),
        QueryLine(3, "roses", k=1),
    ]
    found = search_lines(retriever, lines, default_user="ann", mode="lexical")
    by_line: dict[int, list[tuple[int, object]]] = {}
    for index, hit in found.hits:
        by_line.setdefault(index, []).append((index, hit))
    assert sessions(by_line[0]) == ["a1", "a2"]
    assert sessions(by_line[1]) == ["b1"]
    assert sessions(by_line[2]) == ["b1"]  # a named session, whoever's it is
    assert len(by_line[3]) == 1
    assert found.pending == 0


def test_the_given_user_and_session_apply_to_lines_without_their_own(retriever: Retriever) -> None:
    found = search_lines(
        retriever, [QueryLine(0, "roses")], default_user="ann", user="bob", mode="lexical"
    )
    assert sessions(found.hits) == ["b1"]
    found = search_lines(
        retriever, [QueryLine(0, "roses")], default_user="ann", session_id="a2", mode="lexical"
    )
    assert sessions(found.hits) == ["a2"]
    found = search_lines(retriever, [QueryLine(0, "roses")], default_user="ann")
    assert sessions(found.hits) == ["a1", "a2"]  # hybrid: the messages are embedded first


def test_a_named_session_must_exist(retriever: Retriever) -> None:
    with pytest.raises(SessionNotFound):
        search_lines(retriever, [QueryLine(0, "roses", session="zz")], default_user="ann")


def test_the_stores_ownership_check_finds_only_the_users_session(retriever: Retriever) -> None:
    from memcli.store.base import require_session

    store = retriever.store
    assert require_session(store, "a1").user_id == "ann"
    assert require_session(store, "a1", "ann") == store.get_session("a1")
    for session, user, said in (
        ("zz", None, "no session 'zz'"),
        ("a1", "bob", "no session 'a1' of user 'bob'"),
    ):
        with pytest.raises(SessionNotFound) as ours:
            require_session(store, session, user)
        assert str(ours.value).startswith(said)
        assert ours.value.hint == "Run `memcli sessions` to see the sessions"

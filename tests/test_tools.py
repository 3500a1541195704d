"""memcli.tools: the tools `memcli mcp` serves, called as a library (no MCP)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memcli import Memory, Message
from memcli.blocks.facts import FactBlock
from memcli.config import load_settings
from memcli.errors import InputError, MemcliError, SessionNotFound, UsageError
from memcli.store import facts as fact_store
from memcli.store.sqlite import SQLiteStore
from memcli.tokens import TiktokenTokenizer
from memcli.tools import AgentTools


def tools_for(tmp_path: Path, user: str = "ana", **flags: object) -> AgentTools:
    s = load_settings({"MEMCLI_HOME": str(tmp_path)}, {"user": user, **flags})
    return AgentTools(SQLiteStore(tmp_path / "t.db"), s, s.user)


def turns(n: int) -> list[dict[str, str]]:
    out = []
    for i in range(n):
        out.append({"role": "user", "content": f"question {i} about the garden and the roses"})
        out.append({"role": "assistant", "content": f"answer {i}: prune the roses in winter"})
    return out


def test_put_messages_flushes_as_memory_does(tmp_path: Path) -> None:
    tools = tools_for(tmp_path, token_limit=200, flush_size=40)
    result = tools.put_messages(turns(10), "g")

    # The same messages through Memory with the same budget: the same flushes and window.
    twin = Memory(SQLiteStore(tmp_path / "twin.db"), "g", budget=Memory(tools.store, "g").budget)
    flushes = twin.put_messages([Message.from_dict(m) for m in turns(10)])
    assert result["session"] == "g" and result["stored"] == 20
    assert result["flushes"] == len(flushes) > 0
    assert result["archived_messages"] == sum(len(f.message_ids) for f in flushes)
    assert result["active_messages"] == len(twin.get_all(status="active"))
    info = tools.store.get_session("g")
    assert info is not None and info.user_id == "ana" and info.token_limit == 200


def test_put_without_a_session_makes_a_new_one(tmp_path: Path) -> None:
    tools = tools_for(tmp_path)
    result = tools.put_messages([{"role": "user", "content": "hello"}])
    assert [s["session"] for s in tools.sessions()] == [result["session"]]


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        ([{"role": "user", "content": "ok"}, {"role": "robot", "content": "x"}], "message 1"),
        ([{"role": "user"}], "message 0: missing content"),
        ([{"role": "user", "content": "ok", "timestamp": "yesterday"}], "message 0"),
        ([], "no messages"),
        ({"role": "user", "content": "ok"}, "must be a list"),
    ],
)
def test_a_bad_message_stores_nothing(tmp_path: Path, messages: object, error: str) -> None:
    tools = tools_for(tmp_path)
    with pytest.raises(InputError, match=error):
        tools.put_messages(messages, "s")
    assert tools.store.get_session("s") is None


def test_another_users_session_is_not_theirs(tmp_path: Path) -> None:
    """Every read tool says "no session" for another user's name, as for a missing one (the
    same words: no oracle); a put into that name makes the user's own session of it."""
    tools = tools_for(tmp_path)
    Memory(tools.store, "bobs", user_id="bob").put(Message("user", "Bob's secret garden"))
    with pytest.raises(SessionNotFound) as caught:
        tools.context("bobs")
    with pytest.raises(SessionNotFound) as missing:
        tools.context("nobodys")
    said = (caught.value.message, caught.value.hint)
    assert said == (missing.value.message.replace("nobodys", "bobs"), missing.value.hint)
    assert "user 'bob'" not in str(caught.value.message) + str(caught.value.hint)
    with pytest.raises(SessionNotFound):
        tools.context("bobs")
    with pytest.raises(SessionNotFound):
        tools.session("bobs")
    with pytest.raises(SessionNotFound):
        tools.search("garden", session="bobs", mode="lexical")
    assert tools.search("secret garden", mode="lexical") == []
    assert tools.sessions() == []
    put = tools.put_messages([{"role": "user", "content": "hi"}], "bobs")
    assert put["session"] == "bobs" and put["stored"] == 1
    assert [r["session"] for r in tools.sessions()] == ["bobs"]
    assert [m["content"] for m in tools.session("bobs")["messages"]] == ["hi"]
    assert tools.search("secret garden", session="bobs", mode="lexical") == []
    assert len(tools.store.get_messages("bobs")) == 1  # bob's: untouched


def test_context_is_what_memory_get_returns(tmp_path: Path) -> None:
    tools = tools_for(tmp_path, token_limit=200, flush_size=40)
    tools.put_messages(turns(6), "g")
    memory = Memory(tools.store, "g", tokenizer=TiktokenTokenizer())
    assert tools.context("g") == [m.to_dict() for m in memory.get()]
    assert tools.context("g", "and the tulips?") == [
        m.to_dict() for m in memory.get("and the tulips?")
    ]
    shown = tools.session("g")
    assert shown["active_messages"] == len(shown["messages"]) == len(memory.get_all("active"))


def test_search_lexical_finds_the_users_messages(tmp_path: Path) -> None:
    tools = tools_for(tmp_path)
    tools.put_messages(
        [
            {"role": "user", "content": "My sister Marta lives in Porto."},
            {"role": "assistant", "content": "Porto is a lovely city."},
        ],
        "s",
    )
    hits = tools.search("Marta", mode="lexical", k=1)
    assert len(hits) == 1 and "Marta" in hits[0]["text"] and hits[0]["session"] == "s"
    with pytest.raises(UsageError, match="unknown search mode"):
        tools.search("Marta", mode="psychic")
    with pytest.raises(UsageError, match="empty"):
        tools.search("  ")


def test_facts_go_to_the_users_first_fact_block_with_history(tmp_path: Path) -> None:
    tools = tools_for(tmp_path)
    tools.blocks = lambda session: [FactBlock(name="about_me")]
    added = tools.add_fact("Ana is vegetarian")
    fact = added["fact"]
    assert added["added"] and fact["block"] == "about_me" and fact["origin"] == "api"
    assert tools.add_fact("ana is  VEGETARIAN") == {"added": False, "fact": fact}
    assert tools.update_fact(fact["id"], "Ana is vegan")["fact"]["text"] == "Ana is vegan"
    assert [f["text"] for f in tools.list_facts()] == ["Ana is vegan"]
    assert tools.list_facts("other") == []
    deleted = tools.delete_fact(fact["id"])["deleted"]
    assert deleted["text"] == "Ana is vegan" and deleted["state"] == "deleted"  # as it is now
    assert tools.list_facts() == []
    history = fact_store.fact_history(tools.store, "user:ana", fact_id=fact["id"])
    assert [c.action for c in history] == ["added", "edited", "deleted"]
    with pytest.raises(MemcliError, match=f"fact {fact['id']} of user 'ana' is deleted"):
        tools.delete_fact(fact["id"])  # deleted already: said so


def test_another_users_fact_cannot_be_changed(tmp_path: Path) -> None:
    tools = tools_for(tmp_path)
    [bob] = fact_store.add_facts(tools.store, "facts", "user:bob", ["Bob plays chess"])
    for call in (
        lambda: tools.update_fact(bob.id, "Bob plays go"),
        lambda: tools.delete_fact(bob.id),
    ):
        with pytest.raises(MemcliError, match="no fact"):
            call()
    with pytest.raises(UsageError, match="empty"):
        tools.update_fact(bob.id, " ")
    assert [f.text for f in fact_store.list_facts(tools.store, None, "user:bob")] == [
        "Bob plays chess"
    ]
    assert tools.list_facts() == []


def test_fact_topics_through_the_tools(tmp_path: Path) -> None:
    tools = tools_for(tmp_path)
    tools.blocks = lambda session: [FactBlock(name="about_me")]
    added = tools.add_fact("Ana is vegetarian", topics=["Food", "health"])
    assert added["fact"]["topics"] == ["food", "health"]
    assert tools.add_fact("Ana likes tea")["fact"]["topics"] == []
    assert [f["text"] for f in tools.list_facts(topic="food")] == ["Ana is vegetarian"]
    assert len(tools.list_facts()) == 2
    # An update keeps the topics.
    assert tools.update_fact(added["fact"]["id"], "Ana is vegan")["fact"]["topics"] == [
        "food",
        "health",
    ]


def test_remember_extracts_facts_from_a_text_now(tmp_path: Path, llm) -> None:
    """`remember`: the fact block's extraction on the given text, recorded with the tools'
    origin and no session or flush; without a model it is refused in tool terms."""
    tools = tools_for(tmp_path)
    tools.origin = "mcp"
    with pytest.raises(UsageError, match="add_fact"):
        tools.remember("My dog is called Rex")
    llm.script({"content": "<facts><fact>Ana has a dog named Rex</fact></facts>"})
    block = FactBlock(model="openai/test", api_base=llm.api_base, timeout=10)
    tools.blocks = lambda session: [block]
    tools._facts = None  # (made again over the new blocks)
    done = tools.remember("My dog is called Rex")
    assert [f["text"] for f in done["added"]] == ["Ana has a dog named Rex"]
    assert done["changed"] == []
    assert "My dog is called Rex" in llm.requests[0]["messages"][-1]["content"]
    (fact,) = fact_store.list_facts(tools.store, None, "user:ana")
    assert fact.origin == "mcp" and fact.session_id is None and fact.flush_id is None


def test_sessions_give_the_title_and_time_span_on_both_backends(db: str, tmp_path: Path) -> None:
    """`sessions` and `read_session`: the title and the first and last message's time (the
    given timestamps, else when stored), SQLite and PostgreSQL alike; a session without
    messages has none; another user's session is not listed."""
    from datetime import UTC, datetime

    from memcli.store import open_store

    store = open_store(db)
    s = load_settings({"MEMCLI_HOME": str(tmp_path)}, {"user": "ana"})
    tools = AgentTools(store, s, "ana")
    when = [
        datetime(2021, 3, 1, 9, 0, 0, 500000, tzinfo=UTC),
        datetime(2021, 3, 1, 9, 0, 1, tzinfo=UTC),
    ]
    Memory(store, "t", user_id="ana").put_messages(
        [
            Message("user", "first", timestamp=when[0]),
            Message("assistant", "second", timestamp=when[1]),
        ]
    )
    store.describe_session("t", title="A title")
    Memory(store, "plain", user_id="ana").put_messages([Message("user", "hi")])
    Memory(store, "empty", user_id="ana")
    Memory(store, "bo", user_id="bo").put_messages([Message("user", "not ana's")])
    records = {r["session"]: r for r in tools.sessions()}
    assert set(records) == {"t", "plain", "empty"}
    span = ("A title", "2021-03-01T09:00:00.500000Z", "2021-03-01T09:00:01Z")
    t = records["t"]
    assert (t["title"], t["first_message_at"], t["last_message_at"]) == span
    plain = records["plain"]
    assert plain["title"] is None
    assert plain["first_message_at"] == plain["last_message_at"] == plain["updated_at"]
    empty = records["empty"]
    assert (empty["first_message_at"], empty["last_message_at"]) == (None, None)
    page = tools.read_session("t", limit=1)
    assert (page["title"], page["first_message_at"], page["last_message_at"]) == span
    assert tools.sessions(offset=1, limit=1) == [list(records.values())[1]]
    store.close()

"""Memory tools in chat: the model calls search_memory, list_facts, add_fact, update_fact and
delete_fact through real litellm over HTTP to the loopback server, which scripts the tool calls
and keeps every request (the tools offered, the tool messages sent back)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memcli import Memory, Message, SQLiteStore
from memcli.chat import Chat, ReplyDone, ReplyPiece, ToolCalled, ToolsUnavailable
from memcli.chat.session import MAX_TOOL_ROUNDS
from memcli.config import load_settings
from memcli.flush import Budget
from memcli.llm import LLMConfig
from memcli.store import facts as fact_store
from memcli.tool_calls import CHAT_TOOLS, chat_tools
from memcli.tools import AgentTools

ADD = {
    "tool_calls": [{"name": "add_fact", "arguments": {"text": "Ana is vegan"}}],
}


def make_chat(
    tmp_path: Path, llm: Any, model: str = "openai/test", user: str = "ana", **kwargs: Any
) -> Chat:
    store = SQLiteStore(tmp_path / "chat.db")
    settings = load_settings({"MEMCLI_HOME": str(tmp_path)}, {"user": user})
    tools = AgentTools(store, settings, user, origin="chat-tool")
    config = LLMConfig(model, api_base=llm.api_base, timeout=10)
    chat = Chat(store, user_id=user, llm=config, tools=chat_tools(tools), **kwargs)
    chat.open("s1")
    return chat


def play(chat: Chat, text: str) -> list[Any]:
    return list(chat.send(text).events())


def called(events: list[Any]) -> list[Any]:
    return [e.result for e in events if isinstance(e, ToolCalled)]


def extra(message: Message) -> dict[str, Any]:
    return (message.metadata or {}).get("extra", {})


def facts(chat: Chat) -> list[fact_store.Fact]:
    return fact_store.list_facts(chat.store, None, "user:ana")


def test_add_fact_is_stored_with_origin_chat_tool_and_the_calls_are_kept_as_messages(tmp_path, llm):
    llm.script(
        {
            "content": "Noted.",
            "tool_calls": [
                {"name": "add_fact", "arguments": {"text": "Ana is vegan", "topics": ["Food"]}}
            ],
        },
        {"content": "I will remember that you are vegan."},
    )
    chat = make_chat(tmp_path, llm)
    events = play(chat, "I'm vegan, by the way")

    (result,) = called(events)
    assert result.ok and result.name == "add_fact" and result.value["added"] is True
    assert isinstance(events[-1], ReplyDone)
    assert events[-1].text == "I will remember that you are vegan."
    pieces = "".join(e.text for e in events if isinstance(e, ReplyPiece))
    assert pieces == "Noted.I will remember that you are vegan."

    # The fact, and its history, say where it came from.
    (fact,) = facts(chat)
    assert (fact.text, fact.topics, fact.origin) == ("Ana is vegan", ["food"], "chat-tool")
    (change,) = fact_store.fact_history(chat.store, "user:ana")
    assert (change.action, change.origin, change.topics) == ("added", "chat-tool", ["food"])

    # The first request offered exactly the chat's tools; the second sent the call and its result.
    assert llm.tools_offered(0) == list(CHAT_TOOLS)
    sent = llm.requests[1]["messages"]
    assert sent[-2]["role"] == "assistant" and sent[-2]["content"] == "Noted."
    assert sent[-2]["tool_calls"][0]["function"]["name"] == "add_fact"
    (answer,) = llm.tool_messages(1)
    assert answer["tool_call_id"] == sent[-2]["tool_calls"][0]["id"]
    assert answer["content"]["fact"]["id"] == fact.id

    # The session keeps the whole exchange, counted in its token budget.
    stored = chat.mem.get_all()
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert stored[1].metadata is not None and "tool_calls" in stored[1].metadata["extra"]
    assert stored[1].tokens is not None and stored[1].tokens > 20  # the calls count
    assert chat.mem.active_tokens() == sum(m.tokens or 0 for m in stored)

    # The next turn sends the stored calls back as OpenAI's format has them.
    llm.script({"content": "You are vegan."})
    play(chat, "what do you know about me?")
    again = llm.requests[2]["messages"]
    assert [m["role"] for m in again[-5:]] == ["user", "assistant", "tool", "assistant", "user"]
    assert again[-4]["tool_calls"] == sent[-2]["tool_calls"]
    assert again[-3]["tool_call_id"] == answer["tool_call_id"]


def test_search_memory_gives_the_model_the_hits(tmp_path, llm):
    chat = make_chat(tmp_path, llm)
    Memory(chat.store, "old", user_id="ana").put_messages(
        [Message("user", "My sister Marta lives in Porto"), Message("assistant", "Nice city!")]
    )
    Memory(chat.store, "bobs", user_id="bob").put(Message("user", "Marta is my secret"))
    llm.script(
        {
            "tool_calls": [
                {"name": "search_memory", "arguments": {"query": "Marta", "mode": "lexical"}}
            ]
        },
        {"content": "Your sister Marta lives in Porto."},
    )
    events = play(chat, "where does my sister live?")
    (result,) = called(events)
    assert result.ok
    (answer,) = llm.tool_messages(1)
    hits = answer["content"]
    assert hits and "Porto" in hits[0]["text"] and hits[0]["session"] == "old"
    assert all(hit["session"] != "bobs" for hit in hits)  # another user's messages stay hidden
    assert llm.requests[1]["messages"][-2].get("content") is None  # a call without text
    assert events[-1].text == "Your sister Marta lives in Porto."


def test_update_and_delete_are_recorded_in_the_history(tmp_path, llm):
    chat = make_chat(tmp_path, llm)
    [tea, dog] = fact_store.add_facts(
        chat.store,
        "extracted_info",
        "user:ana",
        ["Ana drinks tea", "Ana has a dog"],
        origin="manual",
        topics=[["food"], ["pets"]],
    )
    llm.script(
        {
            "tool_calls": [
                {"name": "list_facts", "arguments": {}},
                {
                    "name": "update_fact",
                    "arguments": {
                        "fact_id": tea.id,
                        "text": "Ana drinks coffee",
                        "topics": ["drinks"],
                    },
                },
                {"name": "delete_fact", "arguments": {"fact_id": dog.id}},
            ]
        },
        {"content": "Updated."},
    )
    events = play(chat, "I switched to coffee and my dog passed away")
    listed, updated, deleted = called(events)
    assert [f["text"] for f in listed.value] == ["Ana drinks tea", "Ana has a dog"]
    assert updated.ok and deleted.ok
    assert [(f.text, f.topics) for f in facts(chat)] == [("Ana drinks coffee", ["drinks"])]
    history = fact_store.fact_history(chat.store, "user:ana")
    assert [(c.fact_id, c.action, c.origin) for c in history] == [
        (tea.id, "added", "manual"),
        (dog.id, "added", "manual"),
        (tea.id, "edited", "chat-tool"),
        (dog.id, "deleted", "chat-tool"),
    ]
    edit = history[2]
    assert (edit.old_text, edit.text, edit.old_topics, edit.topics) == (
        "Ana drinks tea",
        "Ana drinks coffee",
        ["food"],
        ["drinks"],
    )
    assert (history[3].old_text, history[3].old_topics) == ("Ana has a dog", ["pets"])
    assert [m["content"]["fact"]["text"] for m in llm.tool_messages(1)[1:2]] == [
        "Ana drinks coffee"
    ]


@pytest.mark.parametrize(
    ("name", "arguments", "reason"),
    [
        ("add_fact", "{not json", "not JSON"),
        ("add_fact", "[1, 2]", "must be a JSON object"),
        ("remember", {"text": "x"}, "unknown tool 'remember'"),
        ("add_fact", {}, "text: Field required"),
        ("add_fact", {"text": "   "}, "the fact is empty"),
        ("add_fact", '{"text": "bad \\ud800 text"}', "lone surrogate"),
        ("add_fact", {"text": "x", "topics": "food"}, "topics"),
        ("update_fact", {"fact_id": "twelve", "text": "x"}, "fact_id"),
        ("update_fact", {"fact_id": 99, "text": "x"}, "no fact 99 of user 'ana'"),
        ("delete_fact", {"fact_id": 2**70}, "no fact"),
        ("search_memory", {"query": "x", "k": 0, "mode": "lexical"}, "greater than or equal"),
        ("search_memory", {"query": "x", "mode": "psychic"}, "'hybrid', 'lexical' or 'vector'"),
        ("search_facts", {"query": "x", "k": 101}, "less than or equal to 100"),
        ("add_fact", {"text": "x", "colour": "red"}, "colour: Extra inputs are not permitted"),
        ("add_fact", {"text": "x", "block": "nope"}, "no fact block 'nope'"),
        ("add_fact", {"text": "x", "expires": "next week"}, "not a date or time"),
    ],
)
def test_a_bad_call_is_an_error_result_the_model_reads_and_the_chat_goes_on(
    tmp_path, llm, name, arguments, reason
):
    llm.script(
        {"tool_calls": [{"name": name, "arguments": arguments}]},
        {"content": "Sorry, that did not work."},
    )
    chat = make_chat(tmp_path, llm)
    events = play(chat, "remember something")
    (result,) = called(events)
    assert not result.ok and reason in result.value
    (answer,) = llm.tool_messages(1)
    assert reason in answer["content"]["error"]
    assert isinstance(events[-1], ReplyDone) and events[-1].text == "Sorry, that did not work."
    assert facts(chat) == []


def test_another_users_fact_cannot_be_touched(tmp_path, llm):
    chat = make_chat(tmp_path, llm)
    [bobs] = fact_store.add_facts(chat.store, "extracted_info", "user:bob", ["Bob likes chess"])
    llm.script(
        {"tool_calls": [{"name": "delete_fact", "arguments": {"fact_id": bobs.id}}]},
        {"content": "I cannot."},
    )
    (result,) = called(play(chat, "forget bob"))
    assert not result.ok and "no fact" in result.value
    assert fact_store.get_fact(chat.store, bobs.id).deleted_at is None  # type: ignore[union-attr]


def test_tool_rounds_are_capped_then_the_model_is_asked_for_text(tmp_path, llm):
    llm.default = {"tool_calls": [{"name": "list_facts", "arguments": {}}]}
    try:
        chat = make_chat(tmp_path, llm)
        events = play(chat, "loop forever")
    finally:
        llm.default = {"content": "OK"}
    assert len(called(events)) == MAX_TOOL_ROUNDS
    assert len(llm.requests) == MAX_TOOL_ROUNDS + 1
    assert all("tool_choice" not in r for r in llm.requests[:-1])
    assert llm.requests[-1]["tool_choice"] == "none"
    assert isinstance(events[-1], ReplyDone)  # the calls of the last reply are not run
    assert events[-1].text == "" and "rounds of memory tool calls" in events[-1].note
    assert [m.role for m in chat.mem.get_all()].count("tool") == MAX_TOOL_ROUNDS


def test_a_server_that_rejects_tools_is_said_once_and_the_chat_goes_on(tmp_path, llm):
    def server(body: dict[str, Any]) -> dict[str, Any]:
        if "tools" in body:
            return {"status": 400, "message": "this model does not support tools"}
        return {"content": "Hello without tools."}

    llm.default = server
    try:
        chat = make_chat(tmp_path, llm)
        first = play(chat, "hi")
        second = play(chat, "again")
    finally:
        llm.default = {"content": "OK"}
    (notice,) = [e for e in first if isinstance(e, ToolsUnavailable)]
    assert notice.text == (
        "Memory tools are off for openai/test: it does not take tools (the server said: this"
        " model does not support tools). The chat goes on without them."
    )
    assert first[-1].text == "Hello without tools."
    assert not any(isinstance(e, ToolsUnavailable) for e in second)
    assert second[-1].text == "Hello without tools."
    assert ["tools" in r for r in llm.requests] == [True, False, False]
    assert [m.content for m in chat.mem.get_all()] == [
        "hi",
        "Hello without tools.",
        "again",
        "Hello without tools.",
    ]


def test_a_model_litellm_knows_without_tools_is_never_offered_them(tmp_path, llm):
    # litellm's model table marks gpt-5-chat as not supporting function calling.
    llm.script({"content": "Hi."})
    chat = make_chat(tmp_path, llm, model="gpt-5-chat")
    events = play(chat, "hi")
    (notice,) = [e for e in events if isinstance(e, ToolsUnavailable)]
    assert notice.model == "gpt-5-chat" and "model table" in notice.reason
    assert "tools" not in llm.requests[0] and events[-1].text == "Hi."


def test_the_chat_and_the_mcp_server_share_one_definition_of_the_tools(tmp_path):
    from memcli.cli.mcp import build_server
    from memcli.tool_calls import ToolSet, description, tool_functions

    settings = load_settings({"MEMCLI_HOME": str(tmp_path)}, {"user": "ana"})
    tools = AgentTools(SQLiteStore(tmp_path / "t.db"), settings, "ana")
    server = build_server(tools)
    served = {t.name: t for t in server._tool_manager.list_tools()}
    schemas = {
        s["function"]["name"]: s["function"] for s in ToolSet(tool_functions(tools)).schemas()
    }
    assert set(served) == set(schemas) and set(CHAT_TOOLS) <= set(schemas)
    for name, tool in served.items():
        assert tool.parameters == schemas[name]["parameters"]
        assert tool.description == schemas[name]["description"]
    assert json.dumps(schemas["add_fact"]["parameters"]["required"]) == '["text"]'
    assert description(tool_functions(tools)[0]).startswith("Search the user's stored messages")


def test_a_flush_moves_the_calls_and_results_with_their_turn(tmp_path, llm):
    llm.default = {
        "content": "Noted.",
        "tool_calls": [{"name": "list_facts", "arguments": {}}],
    }
    llm.script(*[llm.default, {"content": "Done."}] * 4)
    chat = make_chat(tmp_path, llm, budget_for=lambda info: Budget(400, 0.5, 100))
    try:
        for i in range(4):
            play(chat, f"message {i}: tell me what you know about me")
    finally:
        llm.default = {"content": "OK"}
    archived = chat.mem.get_all(status="archived")
    active = chat.mem.get_all(status="active")
    assert archived and active[0].role == "user"  # whole turns left, calls and results with them
    for window in (archived, active):
        # Each tool message follows the assistant message that called it, in the same window.
        roles = [
            "call" if m.role == "assistant" and "tool_calls" in extra(m) else m.role for m in window
        ]
        assert "tool" in roles
        assert all(roles[j - 1] == "call" for j, role in enumerate(roles) if role == "tool")
    assert chat.mem.active_tokens() == sum(m.tokens or 0 for m in active)


def test_a_reply_that_fails_after_a_tool_call_can_be_retried(tmp_path, llm):
    llm.script(ADD, {"status": 503}, {"content": "Saved, Ana."})
    chat = make_chat(tmp_path, llm)
    events = play(chat, "I'm vegan")
    assert len(called(events)) == 1 and events[-1].error.kind == "server"
    assert chat.pending() is not None and chat.pending().content == "I'm vegan"  # type: ignore[union-attr]
    events = list(chat.retry().events())
    assert events[-1].text == "Saved, Ana." and not called(events)
    assert [m.role for m in chat.mem.get_all()] == ["user", "assistant", "tool", "assistant"]
    assert llm.tool_messages(2)[0]["content"]["fact"]["text"] == "Ana is vegan"
    assert [f.text for f in facts(chat)] == ["Ana is vegan"]

"""memcli.integrations.openai_agents: the Agents SDK's Session over a memcli session, driven by the
SDK's own Runner with its scripted model (agents.testing.ScriptedModel, a `Model`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner, SQLiteSession, function_tool
from agents.memory import Session, SessionSettings
from agents.testing import ScriptedModel, assistant_message, function_call
from helpers import memcli

from memcli import BlockContext, Memory, MemoryBlock, Message, StaticBlock
from memcli.integrations.openai_agents import MemcliSession, item_message, message_item
from memcli.tokens import TiktokenTokenizer


@function_tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"Sunny in {city}, 21 degrees"


def agent(model: ScriptedModel) -> Agent:
    return Agent(name="helper", instructions="Be terse.", model=model, tools=[weather])


def texts(items: Sequence[Any]) -> list[str]:
    """Each item's text as memcli stores it."""
    return [item_message(item, TiktokenTokenizer()).content for item in items]


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_is_an_agents_session() -> None:
    session = MemcliSession("s")
    assert isinstance(session, Session)
    assert session.session_id == "s"


def test_a_second_run_sees_the_first(tmp_path: Path) -> None:
    db = str(tmp_path / "app.db")
    model = ScriptedModel(
        [[assistant_message("Nice to meet you, Ana.")], [assistant_message("Your name is Ana.")]]
    )

    async def go() -> Any:
        await Runner.run(agent(model), "My name is Ana", session=MemcliSession("ana-1", db=db))
        # a session object of its own: the history comes from the database
        session = MemcliSession("ana-1", db=db)
        return await Runner.run(agent(model), "What is my name?", session=session)

    result = run(go())
    assert result.final_output == "Your name is Ana."
    assert texts(model.calls[-1].input) == [
        "My name is Ana",
        "Nice to meet you, Ana.",
        "What is my name?",
    ]
    stored = Memory.from_defaults(session_id="ana-1", db=db).get_all()
    assert [(m.role, m.content) for m in stored] == [
        ("user", "My name is Ana"),
        ("assistant", "Nice to meet you, Ana."),
        ("user", "What is my name?"),
        ("assistant", "Your name is Ana."),
    ]
    shown = memcli("--db", db, "inspect", "ana-1")
    assert shown.code == 0, shown.stderr
    assert "Nice to meet you, Ana." in shown.stdout


def tool_script() -> list[Any]:
    return [
        [function_call("weather", {"city": "Porto"}, call_id="call_1")],
        [assistant_message("It is sunny in Porto.")],
    ]


def test_items_come_back_as_the_sdk_own_session_keeps_them() -> None:
    """The same tool-using run into memcli and into the SDK's SQLiteSession: both give back the
    same items (messages, the function call and its output), and memcli stores each as a
    message whose text search finds."""
    ours, theirs = MemcliSession("s"), SQLiteSession("s")

    async def go() -> tuple[list[Any], list[Any]]:
        await Runner.run(agent(ScriptedModel(tool_script())), "Weather in Porto?", session=ours)
        await Runner.run(agent(ScriptedModel(tool_script())), "Weather in Porto?", session=theirs)
        return await ours.get_items(), await theirs.get_items()

    got, expected = run(go())
    assert got == expected
    assert [item.get("type") for item in got] == [
        None,
        "function_call",
        "function_call_output",
        "message",
    ]
    memory = run(ours.memory())
    assert [(m.role, m.content) for m in memory.get_all()] == [
        ("user", "Weather in Porto?"),
        ("assistant", 'weather({"city":"Porto"})'),
        ("tool", "Sunny in Porto, 21 degrees"),
        ("assistant", "It is sunny in Porto."),
    ]
    # a message put through memcli itself is given as a plain item
    assert message_item(Message("tool", "42")) == {"role": "user", "content": "42"}


class Flushed(MemoryBlock):
    """Long-term memory that shows what left the window: the user messages flushed."""

    def __init__(self, name: str = "flushed", **kwargs: Any) -> None:
        super().__init__(name=name, **kwargs)

    def put(self, batch: Sequence[Message], ctx: BlockContext) -> None:
        said = self.load_state(ctx, [])
        self.save_state(ctx, said + [m.content for m in batch if m.role == "user"])

    def get(self, messages: Sequence[Message], ctx: BlockContext) -> str:
        return "\n".join(self.load_state(ctx, []))


def test_over_budget_the_history_flushes_into_long_term_memory(tmp_path: Path) -> None:
    db = str(tmp_path / "app.db")
    questions = [f"Question {i}: what about topic number {i} today?" for i in range(6)]
    model = ScriptedModel([[assistant_message(f"Answer {i} is short.")] for i in range(6)])
    session = MemcliSession(
        "s",
        db=db,
        token_limit=120,
        chat_history_token_ratio=0.5,
        token_flush_size=20,
        memory_blocks=[Flushed()],
    )

    async def go() -> None:
        for question in questions:
            await Runner.run(agent(model), question, session=session)

    run(go())
    memory = run(session.memory())
    archived = memory.get_all("archived")
    assert archived  # the window flushed
    first = model.calls[0].input
    last = model.calls[-1].input
    assert texts(first) == [questions[0]]
    # the model is sent the window: the flushed turns as long-term memory, not as history
    assert last[0]["role"] == "system"
    assert questions[0] in last[0]["content"]
    assert "<memory>" in last[0]["content"]
    assert questions[0] not in texts(last[1:])
    assert texts(last)[-1] == questions[-1]
    # the memory item is never stored; every item is still there, active or archived
    stored = memory.get_all()
    assert len(stored) == 12
    assert [m.content for m in stored][::2] == questions
    assert all(m.role != "system" for m in stored)
    # a limit as large as the history gives the window, not the flushed turns: memory has them
    items = run(session.get_items(limit=100))
    assert items[0] == {"role": "system", "content": memory.context().memory_text}
    assert questions[0] in items[0]["content"]
    assert texts(items[1:]) == [m.content for m in memory.get_all("active")]
    assert len(items) - 1 < 12


def test_pop_item_and_clear_session_delete_for_good(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    session = MemcliSession("s", db=str(db))
    canary = {"role": "assistant", "content": [{"type": "output_text", "text": "zebra-canary-7"}]}
    items: list[Any] = [
        {"role": "user", "content": "hello"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "hm"}]},
        canary,
    ]

    def files_hold(text: str) -> bool:
        return any(text.encode() in p.read_bytes() for p in tmp_path.glob("app.db*"))

    async def go() -> None:
        await session.add_items(items)
        assert await session.get_items(limit=2) == items[1:]
        assert await session.pop_item() == canary
        assert await session.get_items() == items[:2]
        assert not files_hold("zebra-canary-7")
        await session.add_items([{"role": "user", "content": "tell me about okapi-canary-9"}])
        await session.clear_session()
        assert await session.get_items() == []
        assert await session.pop_item() is None
        assert not files_hold("okapi-canary-9")
        await session.add_items(items[:1])  # the session goes on
        assert await session.get_items() == items[:1]

    run(go())
    assert files_hold("hello")


# -- side by side with the SDK's own SQLiteSession ---------------------------------------------

ITEMS: list[Any] = [
    {"role": "user", "content": "Weather in Porto?"},
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "look"}]},
    {
        "type": "function_call",
        "call_id": "c1",
        "name": "weather",
        "arguments": '{"city":"Porto"}',
    },
    {"type": "function_call_output", "call_id": "c1", "output": "Sunny, 21 degrees"},
    {"role": "assistant", "content": [{"type": "output_text", "text": "Sunny in Porto."}]},
    {"role": "developer", "content": "Answer in Portuguese from now on."},
    {"role": "user", "content": "E amanha?"},
]
LIMITS = (None, 0, 1, 2, 5, 7, 10, -1)
CORE = "Ana is vegetarian."


def window(ours: list[Any], memory_text: str) -> list[Any]:
    """MemcliSession's items without the memory item, to compare with SQLiteSession's. When the
    blocks give memory, `ours` must start with exactly one system item holding it, and the rest
    is compared; when they give none, there must be no such item, and all of `ours` is."""
    if not memory_text:
        assert all(item.get("content") != memory_text for item in ours[:1])
        return ours
    assert ours[0] == {"role": "system", "content": memory_text}
    assert {"role": "system", "content": memory_text} not in ours[1:]
    return ours[1:]


@pytest.mark.parametrize("blocks", ["none", "static"])
def test_every_session_method_gives_what_sqlitesession_gives(tmp_path: Path, blocks: str) -> None:
    """The same calls, with the same inputs, on a MemcliSession and on the SDK's SQLiteSession:
    each returns the same (get_items with and without a limit, from the call or from
    session_settings, add_items, pop_item until empty, clear_session), MemcliSession's items
    compared without its memory item (`window`): present, first, when a block gives memory."""
    made = [StaticBlock(name="core", content=CORE)] if blocks == "static" else []
    ours = MemcliSession("s", db=str(tmp_path / "memcli.db"), memory_blocks=made)
    sdk_db = tmp_path / "sdk.db"
    theirs = SQLiteSession("s", sdk_db)

    async def memory_text() -> str:
        return (await (await ours.memory()).acontext()).memory_text

    async def same(call: str, *args: Any) -> Any:
        got = await getattr(ours, call)(*args)
        expected = await getattr(theirs, call)(*args)
        if call == "get_items":
            got = window(got, await memory_text())
        assert got == expected, (call, args)
        return got

    async def go() -> None:
        assert ours.session_settings == theirs.session_settings == SessionSettings()
        assert await same("get_items") == []
        assert await same("add_items", ITEMS[:4]) is None
        assert await same("add_items", []) is None
        assert await same("add_items", ITEMS[4:]) is None
        for limit in LIMITS:
            await same("get_items", limit)
        assert await same("get_items", 3) == ITEMS[-3:]
        # a limit set on the session (a SessionSettings, or a dict as the SDK takes), the call's
        # limit over it
        for settings in (SessionSettings(limit=2), {"limit": 2}):
            limited = MemcliSession("s", memory=await ours.memory(), session_settings=settings)
            sdk_limited = SQLiteSession("s", sdk_db, session_settings=settings)
            assert limited.session_settings == sdk_limited.session_settings
            assert limited.session_settings == SessionSettings(limit=2)
            for limit in LIMITS:
                got = window(await limited.get_items(limit), await memory_text())
                assert got == await sdk_limited.get_items(limit), limit
            assert window(await limited.get_items(), await memory_text()) == ITEMS[-2:]
        for _ in ITEMS:
            await same("pop_item")
            await same("get_items")
            await same("get_items", 2)
        assert await same("pop_item") is None
        await same("add_items", ITEMS)
        assert await same("clear_session") is None
        assert await same("get_items") == []
        assert await same("pop_item") is None
        await same("add_items", ITEMS[:1])  # the session goes on
        assert await same("get_items") == ITEMS[:1]

    run(go())
    expected_text = "<memory>\n<core>\n" + CORE + "\n</core>\n</memory>"
    assert (run(ours.get_items()) or [None])[0] == (
        {"role": "system", "content": expected_text} if made else ITEMS[0]
    )


def test_a_limit_keeps_the_memory_item_and_the_newest_window_items(tmp_path: Path) -> None:
    """RunConfig's limit reaches get_items: the model is sent the memory item, then the newest
    N items of the window, then the new input; SQLiteSession's Runner sends the same N items.
    A session's own SessionSettings does the same, without RunConfig."""
    questions = [f"Question {i}: what about topic number {i} today?" for i in range(8)]

    def model() -> ScriptedModel:
        return ScriptedModel([[assistant_message(f"Answer {i} is short.")] for i in range(8)])

    ours_model, their_model = model(), model()
    session = MemcliSession(
        "s",
        db=str(tmp_path / "app.db"),
        token_limit=120,
        chat_history_token_ratio=0.5,
        token_flush_size=20,
        memory_blocks=[Flushed()],
    )
    theirs = SQLiteSession("s")
    config = RunConfig(session_settings=SessionSettings(limit=3))

    async def go() -> None:
        for question in questions:
            await Runner.run(agent(ours_model), question, session=session, run_config=config)
            await Runner.run(agent(their_model), question, session=theirs, run_config=config)

    run(go())
    memory = run(session.memory())
    assert memory.get_all("archived")  # the window flushed ...
    assert len(memory.get_all("active")) > 3  # ... and still holds more than the limit
    sent, their_sent = model_input(ours_model), model_input(their_model)
    assert sent[0]["role"] == "system" and "<memory>" in sent[0]["content"]
    assert questions[0] in sent[0]["content"]  # the flushed turns, as memory
    assert sent[1:] == their_sent
    assert len(their_sent) == 3 + 1  # three of the history, and the question
    said = [m.content for m in memory.get_all()]
    before = said.index(questions[-1])
    assert texts(sent[1:]) == said[before - 3 : before + 1]
    # the case: the session's own settings; 2 of the window, after the memory item
    limited = MemcliSession("s", memory=memory, session_settings=SessionSettings(limit=2))
    items = run(limited.get_items())
    assert len(items) == 3
    assert items[0] == {"role": "system", "content": memory.context().memory_text}
    assert texts(items[1:]) == [m.content for m in memory.get_all("active")][-2:]


def model_input(model: ScriptedModel) -> list[Any]:
    """What the model was sent last, as plain items (the SDK may send pydantic objects)."""
    return [
        item.model_dump(mode="json", exclude_unset=True) if hasattr(item, "model_dump") else item
        for item in model.calls[-1].input
    ]


def test_a_system_message_the_memory_was_put_in_comes_back_as_stored(tmp_path: Path) -> None:
    """A system message put through memcli (no item of its own) is given back as stored, not
    with the memory text `get()` put in front of it: the memory is the item before it."""
    memory = Memory.from_defaults(
        session_id="s", db=str(tmp_path / "app.db"), memory_blocks=[StaticBlock(content=CORE)]
    )
    memory.put_messages([Message("system", "Be terse."), Message("user", "hi")])
    items = run(MemcliSession(memory=memory).get_items())
    assert [i["content"] for i in items[1:]] == ["Be terse.", "hi"]
    assert CORE in items[0]["content"]


@function_tool(needs_approval=True)
def delete_file(name: str) -> str:
    """Delete a file."""
    return f"deleted {name}"


@pytest.mark.parametrize("limit", [None, 2])
def test_a_run_resumed_after_an_approval_saves_as_sqlitesession(
    tmp_path: Path, limit: int | None
) -> None:
    """A tool that needs approval interrupts the run; the run resumed from its state saves
    through the SDK's pending-write path (which reads get_items(limit=n) first): the session
    holds what SQLiteSession holds, after the memory item, and the model was sent the same."""
    config = RunConfig(session_settings=SessionSettings(limit=limit))

    async def approve_and_run(session: Any) -> ScriptedModel:
        model = ScriptedModel(
            [
                [function_call("delete_file", {"name": "a.txt"}, call_id="c1")],
                [assistant_message("Done.")],
            ]
        )
        helper = Agent(name="a", instructions="Be terse.", model=model, tools=[delete_file])
        result = await Runner.run(helper, "delete a.txt", session=session, run_config=config)
        assert len(result.interruptions) == 1
        state = result.to_state()
        state.approve(result.interruptions[0])
        result = await Runner.run(helper, state, session=session, run_config=config)
        assert result.final_output == "Done."
        return model

    ours = MemcliSession(
        "s", db=str(tmp_path / "m.db"), memory_blocks=[StaticBlock(name="core", content=CORE)]
    )
    theirs = SQLiteSession("s")

    async def go() -> tuple[Any, ...]:
        our_model, their_model = await approve_and_run(ours), await approve_and_run(theirs)
        return await ours.get_items(), await theirs.get_items(), our_model, their_model

    got, expected, our_model, their_model = run(go())
    memory_text = run(ours.memory()).context().memory_text
    assert CORE in memory_text
    assert window(got, memory_text) == expected
    assert [i.get("type") for i in expected] == [
        None,
        "function_call",
        "function_call_output",
        "message",
    ]
    # what the model was sent after the approval (the run's own input and items)
    assert window(model_input(our_model), memory_text) == model_input(their_model)

"""memcli.integrations.openai_agents: the Agents SDK's Session over a memcli session, driven by the
SDK's own Runner with its scripted model (agents.testing.ScriptedModel, a `Model`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agents import Agent, Runner, SQLiteSession, function_tool
from agents.memory import Session
from agents.testing import ScriptedModel, assistant_message, function_call
from helpers import memcli

from memcli import BlockContext, Memory, MemoryBlock, Message
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
    items = run(session.get_items(limit=100))
    assert len(items) == 12
    assert texts(items)[::2] == questions
    assert all(m.role != "system" for m in memory.get_all())


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

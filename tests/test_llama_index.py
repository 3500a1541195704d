"""memcli.integrations.llama_index: LlamaIndex's BaseMemory over a memcli Memory, and a real
LlamaIndex agent keeping its memory in memcli, its LLM the loopback server over HTTP."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers import memcli, no_blocks  # noqa: F401 (a fixture)
from llama_index.core.agent.workflow import ReActAgent
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseGen,
    ImageBlock,
    LLMMetadata,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)
from llama_index.core.llms import CustomLLM
from llama_index.core.memory.types import BaseMemory
from llm_server import LLMServer

from memcli import Memory, Message
from memcli.integrations.llama_index import MemcliMemory, from_chat_message, to_chat_message
from memcli.tokens import TiktokenTokenizer, message_tokens

CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}


class LoopbackLLM(CustomLLM):
    """A LlamaIndex LLM that sends the chat to an OpenAI-compatible server over HTTP."""

    api_base: str

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="test-model", is_chat_model=True)

    def _post(self, messages: list[dict[str, Any]]) -> str:
        body = json.dumps({"model": "test-model", "messages": messages}).encode()
        request = urllib.request.Request(
            f"{self.api_base}/chat/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)["choices"][0]["message"]["content"]

    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        text = self._post([{"role": m.role.value, "content": m.content or ""} for m in messages])
        return ChatResponse(message=ChatMessage(role="assistant", content=text))

    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        response = self.chat(messages)
        response.delta = response.message.content
        yield response

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return CompletionResponse(text=self._post([{"role": "user", "content": prompt}]))

    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        response = self.complete(prompt)
        response.delta = response.text
        yield response


def chats() -> list[ChatMessage]:
    """Messages of every kind an agent puts: text, a tool call and its result, LlamaIndex-only
    roles, several blocks, a name."""
    return [
        ChatMessage(role="system", content="You are terse."),
        ChatMessage(role="user", content="What is 1 + 1?", additional_kwargs={"name": "ana"}),
        ChatMessage(role="assistant", content=None, additional_kwargs={"tool_calls": [CALL]}),
        ChatMessage(role="tool", content="2", additional_kwargs={"tool_call_id": "call_1"}),
        ChatMessage(role="developer", content="Answer in words."),
        ChatMessage(role="chatbot", content="Two."),
        ChatMessage(
            role="assistant",
            blocks=[
                ThinkingBlock(content="1 + 1 = 2"),
                TextBlock(text="It is two."),
                ToolCallBlock(tool_call_id="call_2", tool_name="add", tool_kwargs={"a": 2}),
            ],
        ),
        ChatMessage(
            role="user",
            blocks=[
                TextBlock(text="And this?"),
                ImageBlock(url="https://example.com/a.png"),
                TextBlock(text="Thanks."),
            ],
        ),
    ]


def test_is_a_llama_index_memory() -> None:
    memory = MemcliMemory.from_defaults(session_id="s")
    assert isinstance(memory, BaseMemory)
    assert memory.session_id == "s"
    assert isinstance(memory.memory, Memory)


def test_messages_come_back_as_they_were_put(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    memory = MemcliMemory.from_defaults(session_id="s", db=str(db))
    for chat in chats():
        memory.put(chat)
    assert memory.get_all() == chats()
    # a new process opening the database reads the same messages
    again = MemcliMemory.from_defaults(session_id="s", db=str(db))
    assert again.get_all() == chats()
    assert again.get() == chats()


def test_stored_as_memcli_messages() -> None:
    stored = [from_chat_message(chat) for chat in chats()]
    assert [m.role for m in stored] == [
        "system",
        "user",
        "assistant",
        "tool",
        "system",
        "assistant",
        "assistant",
        "user",
    ]
    assert stored[1].name == "ana"
    assert stored[2].content == ""
    # `memcli export` writes the OpenAI record back
    assert stored[2].export_record() == {"role": "assistant", "content": None, "tool_calls": [CALL]}
    assert stored[3].export_record()["tool_call_id"] == "call_1"
    assert stored[6].content == "It is two."
    assert stored[7].content == "And this?\nThanks."  # the text blocks, as ChatMessage.content
    assert stored[0].metadata is None  # a plain text message stores nothing beside memcli's fields
    assert to_chat_message(Message("user", "hi")) == ChatMessage(role="user", content="hi")
    # a tool-calling reply memcli read from an OpenAI record
    record = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    assert to_chat_message(Message.from_dict(record)) == chats()[2]


def test_operations_equal_memcli_own() -> None:
    """Every operation through the adapter leaves the session as memcli's own would, flushes
    included (a small budget makes puts flush)."""
    budget = {"token_limit": 60, "chat_history_token_ratio": 0.5, "token_flush_size": 10}
    adapter = MemcliMemory.from_defaults(session_id="a", **budget)
    own = Memory.from_defaults(session_id="b", db=adapter.memory.store, **budget)

    def same() -> None:
        def view(messages: list[Message]) -> list[tuple[Any, ...]]:
            return [(m.role, m.content, m.status, m.flush_id is None, m.tokens) for m in messages]

        assert view(adapter.memory.get_all()) == view(own.get_all())
        assert adapter.get_all() == [to_chat_message(m) for m in own.get_all()]
        assert adapter.get() == [to_chat_message(m) for m in own.get()]
        assert adapter.get("next?") == [to_chat_message(m) for m in own.get("next?")]

    texts = [("user", f"question number {i} about the weather") for i in range(8)]
    for role, text in texts:
        adapter.put(ChatMessage(role=role, content=text))
        own.put(Message(role, text))
        same()
    assert any(m.status == "archived" for m in own.get_all())  # the puts flushed
    adapter.put_messages(
        [ChatMessage(role="assistant", content="sunny"), ChatMessage(content="ok")]
    )
    own.put_messages([Message("assistant", "sunny"), Message("user", "ok")])
    same()
    adapter.set([ChatMessage(role="system", content="fresh start")])
    own.set([Message("system", "fresh start")])
    same()
    adapter.reset()
    own.reset()
    same()
    assert adapter.get_all() == []


def test_async_methods() -> None:
    memory = MemcliMemory.from_defaults(session_id="s")

    async def run() -> list[ChatMessage]:
        await memory.aput(ChatMessage(role="user", content="one"))
        await memory.aput_messages([ChatMessage(role="assistant", content="two")])
        assert [m.content for m in await memory.aget()] == ["one", "two"]
        await memory.aset([ChatMessage(role="user", content="three")])
        assert [m.content for m in await memory.aget()] == ["three"]
        await memory.areset()
        return await memory.aget_all()

    assert asyncio.run(run()) == []


def run(agent: ReActAgent, user_msg: str, memory: MemcliMemory) -> Any:
    """`await agent.run(user_msg, memory=memory)` in an event loop of its own."""

    async def go() -> Any:
        return await agent.run(user_msg, memory=memory)

    return asyncio.run(go())


@pytest.mark.usefixtures("no_blocks")
def test_agent_keeps_its_memory_in_memcli(llm: LLMServer, tmp_path: Path) -> None:
    db = str(tmp_path / "app.db")
    agent = ReActAgent(tools=[], llm=LoopbackLLM(api_base=llm.api_base), streaming=False)

    llm.script({"content": "Thought: I can answer without tools.\nAnswer: Nice to meet you, Ana."})
    memory = MemcliMemory.from_defaults(session_id="s", db=db)
    answer = run(agent, "My name is Ana", memory)
    assert "Nice to meet you, Ana." in str(answer)

    stored = Memory.from_defaults(session_id="s", db=db).get_all()  # another reader of the db
    assert [m.role for m in stored] == ["user", "assistant"]
    assert stored[0].content == "My name is Ana"
    assert "Nice to meet you, Ana." in stored[-1].content
    shown = memcli("--db", db, "inspect", "s")
    assert shown.code == 0, shown.stderr
    assert "My name is Ana" in shown.stdout

    # a second run, in a memory opened afresh, sends the first exchange to the LLM
    llm.script({"content": "Thought: I know this.\nAnswer: Your name is Ana."})
    memory = MemcliMemory.from_defaults(session_id="s", db=db)
    answer = run(agent, "What is my name?", memory)
    assert "Your name is Ana." in str(answer)
    sent = llm.requests[-1]["messages"]
    contents = [m["content"] for m in sent]
    first = contents.index("My name is Ana")
    assert any("Nice to meet you, Ana." in c for c in contents[first + 1 :])
    assert contents[-1] == "What is my name?"
    stored = Memory.from_defaults(session_id="s", db=db).get_all()
    assert [m.content for m in stored][::2] == ["My name is Ana", "What is my name?"]
    assert "Your name is Ana." in stored[-1].content


def agent_turn(i: int) -> list[ChatMessage]:
    """One turn of a tool-using agent as LlamaIndex's FunctionAgent stores it: the question, a
    reply that calls a tool (tool-call block and OpenAI's `tool_calls`), the tool's result, the
    answer."""
    from llama_index.core.base.llms.types import ToolCallBlock

    call = {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": "weather", "arguments": json.dumps({"city": f"City {i}"})},
    }
    return [
        ChatMessage(role="user", content=f"What is the weather in City {i} today, please?"),
        ChatMessage(
            role="assistant",
            blocks=[
                ToolCallBlock(
                    tool_call_id=f"call_{i}", tool_name="weather", tool_kwargs={"city": f"City {i}"}
                )
            ],
            additional_kwargs={"tool_calls": [call]},
        ),
        ChatMessage(
            role="tool",
            content=f"Sunny, {10 + i} degrees, light wind from the west",
            additional_kwargs={"tool_call_id": f"call_{i}", "name": "weather"},
        ),
        ChatMessage(role="assistant", content=f"It is sunny in City {i}, {10 + i} degrees."),
    ]


def test_flushes_where_llama_index_memory_does_with_tool_calls() -> None:
    """A 20-turn tool-using agent's messages, put into LlamaIndex's own Memory and into
    MemcliMemory with the same budget: after every put both keep the same messages, and each
    message counts the same tokens under both."""
    from llama_index.core.memory import Memory as LlamaMemory

    budget = {"token_limit": 600, "chat_history_token_ratio": 0.5, "token_flush_size": 100}
    reference = LlamaMemory.from_defaults(session_id="ref", **budget)
    ours = MemcliMemory.from_defaults(session_id="ours", **budget)
    messages = [m for i in range(20) for m in agent_turn(i)]
    for i, message in enumerate(messages):
        reference.put(message)
        ours.put(message)
        assert ours.memory.get_all()[-1].tokens == reference._estimate_token_count(message)
        assert ours.get() == reference.get(), f"after message {i}"
    archived = [m for m in ours.memory.get_all() if m.status == "archived"]
    assert len(archived) > 40  # it flushed, many times
    # memcli's own count of a tool-calling reply (content plus stored metadata) is far higher
    tool_call = from_chat_message(messages[1])
    assert message_tokens(tool_call, TiktokenTokenizer()) > reference._estimate_token_count(
        messages[1]
    )

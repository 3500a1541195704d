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
from llama_index.core.agent.workflow import FunctionAgent, ReActAgent
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
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.llms import CustomLLM
from llama_index.core.llms.mock import MockFunctionCallingLLM, MockLLM
from llama_index.core.memory import (
    FactExtractionMemoryBlock,
    StaticMemoryBlock,
    VectorMemoryBlock,
)
from llama_index.core.memory.types import BaseMemory
from llama_index.core.vector_stores import SimpleVectorStore
from llama_index.core.workflow import Context, JsonSerializer
from llm_server import LLMServer

from memcli import Budget, Memory, Message, StaticBlock, UsageError
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


def scripted_agent(replies: list[str], seen: list[list[str]]) -> FunctionAgent:
    """A FunctionAgent whose LLM (LlamaIndex's mock) answers `replies` in turn, noting in `seen`
    the contents of the messages each call was given."""

    def reply(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        seen.append([m.content or "" for m in messages])
        return ChatMessage(role="assistant", content=replies.pop(0))

    llm = MockFunctionCallingLLM(response_generator=reply, is_chat_model=True)
    return FunctionAgent(tools=[], llm=llm)


def test_a_paused_agent_resumes_over_the_same_session(tmp_path: Path) -> None:
    """The agent's context saved as JSON (`Context.to_dict`) and restored in a new Context
    (`Context.from_dict`, as a paused agent is resumed) holds a MemcliMemory over the same
    session, user, database, budget and blocks: the second run sees the first one's exchange."""
    db = tmp_path / "app.db"
    memory = MemcliMemory.from_defaults(
        session_id="s",
        db=str(db),
        user_id="ana",
        token_limit=5000,
        chat_history_token_ratio=0.5,
        token_flush_size=200,
        memory_blocks=[StaticBlock(name="about", content="Ana lives in Porto.")],
    )
    seen: list[list[str]] = []
    agent = scripted_agent(["Hi Ana.", "Your name is Ana."], seen)

    async def go() -> Any:
        ctx = Context(agent)
        await agent.run("My name is Ana", ctx=ctx, memory=memory)
        saved = json.dumps(ctx.to_dict(serializer=JsonSerializer()))
        restored = Context.from_dict(agent, json.loads(saved), serializer=JsonSerializer())
        answer = await agent.run("What is my name?", ctx=restored)
        return answer, await restored.store.get("memory")

    answer, resumed = asyncio.run(go())
    assert "Your name is Ana." in str(answer)
    assert isinstance(resumed, MemcliMemory)
    assert resumed is not memory
    sent = seen[-1]
    assert sent[-3:] == ["My name is Ana", "Hi Ana.", "What is my name?"]
    assert "Ana lives in Porto." in sent[0]  # the static block, rebuilt from its definition
    assert (resumed.session_id, resumed.user_id) == ("s", "ana")
    assert resumed.memory.budget == Budget(5000, 0.5, 200)
    assert [b.name for b in resumed.memory.memory_blocks] == ["about"]
    stored = Memory.from_defaults(session_id="s", db=str(db)).get_all()
    assert [m.content for m in stored] == [
        "My name is Ana",
        "Hi Ana.",
        "What is my name?",
        "Your name is Ana.",
    ]


def test_saved_fields_reopen_the_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    memory = MemcliMemory.from_defaults(session_id="s", db="app.db", user_id="bo", token_limit=900)
    memory.put(ChatMessage(role="user", content="hello"))
    saved = memory.to_dict()
    assert saved["db"] == str(tmp_path / "app.db")  # absolute: it resumes from anywhere
    assert (saved["session_id"], saved["user_id"], saved["token_limit"]) == ("s", "bo", 900)
    monkeypatch.chdir(tmp_path.parent)
    again = MemcliMemory.from_dict(json.loads(json.dumps(saved)))
    assert again.get_all() == [ChatMessage(role="user", content="hello")]
    # the budget is read from the memcli session when saved: a rebudget since is kept
    memory.memory.rebudget(Budget(token_limit=1200))
    assert memory.to_dict()["token_limit"] == 1200
    # and a stored session resumes with its own budget, not an older saved one
    Memory.from_defaults(session_id="s", db=str(tmp_path / "app.db")).rebudget(Budget(1500))
    assert MemcliMemory.from_dict(saved).memory.budget.token_limit == 1500
    # the constructor takes the fields too, as LlamaIndex's own Memory does
    built = MemcliMemory(session_id="s", db=str(tmp_path / "app.db"))
    assert built.get_all() == again.get_all()
    with pytest.raises(UsageError, match="not both"):
        MemcliMemory(memory.memory, session_id="s")


def test_static_memory_block_becomes_memcli_static_block(tmp_path: Path) -> None:
    block = StaticMemoryBlock(name="core", static_content="Ana is vegetarian.", priority=0)
    memory = MemcliMemory.from_defaults(
        session_id="s", db=str(tmp_path / "a.db"), memory_blocks=[block]
    )
    [ours] = memory.memory.memory_blocks
    assert isinstance(ours, StaticBlock)
    assert (ours.name, ours.content, ours.priority) == ("core", "Ana is vegetarian.", 0)
    memory.put(ChatMessage(role="user", content="What should I cook?"))
    shown = memory.get()
    assert shown[0].role == "system"
    assert "Ana is vegetarian." in (shown[0].content or "")
    again = MemcliMemory.from_dict(memory.to_dict())
    assert again.get() == shown


def test_llama_index_blocks_memcli_cannot_take_over_are_refused() -> None:
    image = StaticMemoryBlock(
        name="look", static_content=[TextBlock(text="Ana"), ImageBlock(url="https://x/a.png")]
    )
    with pytest.raises(UsageError, match="ImageBlock") as refused:
        MemcliMemory.from_defaults(session_id="s", memory_blocks=[image])
    assert "StaticBlock(name='look'" in refused.value.hint

    facts = FactExtractionMemoryBlock(name="facts", llm=MockLLM(), max_facts=30)
    with pytest.raises(UsageError, match="FactExtractionMemoryBlock 'facts'") as refused:
        MemcliMemory.from_defaults(session_id="s", memory_blocks=[facts])
    assert "FactBlock(name='facts'" in refused.value.hint
    assert "max_facts=30" in refused.value.hint

    class TextStore(SimpleVectorStore):
        stores_text: bool = True

    vectors = VectorMemoryBlock(
        name="recall",
        vector_store=TextStore(),
        embed_model=MockEmbedding(embed_dim=8),
        similarity_top_k=3,
    )
    with pytest.raises(UsageError, match="VectorMemoryBlock 'recall'") as refused:
        MemcliMemory.from_defaults(session_id="s", memory_blocks=[vectors])
    assert "VectorBlock(name='recall', similarity_top_k=3" in refused.value.hint

    with pytest.raises(UsageError, match="not a block memcli can use"):
        MemcliMemory.from_defaults(session_id="s", memory_blocks=["core"])

"""A LlamaIndex `BaseMemory` over a memcli `Memory`: `agent.run(msg, memory=MemcliMemory(...))`.

    from memcli.integrations.llama_index import MemcliMemory

    memory = MemcliMemory.from_defaults(session_id="s", db="app.db")
    await agent.run("My name is Ana", memory=memory)

The agent's messages are stored in the memcli session (`memcli --db app.db inspect s` shows them),
flushed and fed to long-term blocks exactly as `Memory.put` does; `get()` returns the active window
with long-term memory inserted. Needs llama-index-core (`pip install memcli[llama-index]`).

A `ChatMessage` becomes a memcli `Message` thus:
- role: memcli's four roles are kept; LlamaIndex's others are stored as the nearest one
  (developer as system, function as tool, chatbot and model as assistant), the original kept in
  `metadata["llama_index"]["role"]`;
- content: the text of its text blocks, joined with a newline (`ChatMessage.content`); a message
  that is not one text block (several, or images, tool calls, thinking) also keeps its blocks,
  as JSON, in `metadata["llama_index"]["blocks"]`, except an assistant's tool calls without text,
  stored as memcli stores OpenAI's `"content": null` (`memcli export` writes it back);
- `additional_kwargs` (`tool_calls`, `tool_call_id`, ...): as JSON in `metadata["extra"]`, where
  memcli keeps the keys of an OpenAI message it has no field for (`memcli export` writes them back
  on the record); a `name` there is the message's `name`.
Each message is counted as LlamaIndex's own `Memory` counts it (`llama_index_tokens`: its text
blocks, 256 for an image, audio, video or document, nothing for tool calls, thinking and cache
points, plus `str(additional_kwargs)` when there are any), not by memcli's rule for a message
(content plus its stored metadata): the same agent flushes at the same points under both.
Read back, each becomes the `ChatMessage` it was. Other metadata of a memcli message (given
through memcli, not LlamaIndex) is not shown to LlamaIndex: LLM integrations send
`additional_kwargs` to the provider.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from llama_index.core.base.llms.types import (
    AudioBlock,
    ChatMessage,
    DocumentBlock,
    ImageBlock,
    MessageRole,
    TextBlock,
    VideoBlock,
)
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.memory.types import BaseMemory

from memcli.errors import InputError
from memcli.memory import Memory
from memcli.messages import EXTRA, ROLES, Message
from memcli.tokens import Tokenizer

__all__ = ["MemcliMemory", "from_chat_message", "llama_index_tokens", "to_chat_message"]

#: The metadata key holding what a memcli message has no field for of a LlamaIndex message.
KEY = "llama_index"
#: The keys that let an assistant message have no content (as in `memcli.messages`).
_CALLS = frozenset(("tool_calls", "function_call"))
#: LlamaIndex roles memcli has not, stored as the nearest memcli role.
_NEAREST = {"developer": "system", "function": "tool", "chatbot": "assistant", "model": "assistant"}


def from_chat_message(message: ChatMessage) -> Message:
    """The memcli `Message` for a LlamaIndex `ChatMessage` (see the module's docstring)."""
    role = MessageRole(message.role).value
    own: dict[str, Any] = {}
    if role not in ROLES:
        own["role"] = role
    blocks = message.blocks
    kwargs = dict(_json(message).get("additional_kwargs") or {})
    if not blocks and role == "assistant" and _CALLS.intersection(kwargs):
        # a tool-calling reply without text: memcli's own way, `"content": null` in export
        kwargs = {"content": None, **kwargs}
    elif not (len(blocks) == 1 and isinstance(blocks[0], TextBlock)):
        try:
            own["blocks"] = [block.model_dump(mode="json") for block in blocks]
        except Exception as exc:  # a block pydantic cannot write as JSON
            raise InputError(
                f"a {role} message has a block memcli cannot store: {exc}",
                "Give the message as text blocks",
            ) from exc
    name = kwargs.pop("name", None)
    if name is not None and not isinstance(name, str):
        kwargs["name"] = name  # not a name memcli can hold: kept with the rest
        name = None
    metadata: dict[str, Any] = {}
    if kwargs:
        metadata[EXTRA] = kwargs
    if own:
        metadata[KEY] = own
    return Message(
        role=_NEAREST.get(role, role),
        content=message.content or "",
        name=name,
        metadata=metadata or None,
    )


#: What LlamaIndex's `Memory` counts for a block that is not text (its default estimates).
MEDIA_TOKENS = 256
_MEDIA = (ImageBlock, AudioBlock, VideoBlock, DocumentBlock)


def llama_index_tokens(message: ChatMessage, tokenizer: Tokenizer) -> int:
    """A message's tokens as LlamaIndex's `Memory._estimate_token_count` counts them: each text
    block's, MEDIA_TOKENS for an image, audio, video or document block, none for the other blocks
    (tool calls, thinking, citations, cache points), plus those of `str(additional_kwargs)` when
    it is not empty."""
    tokens = sum(
        tokenizer.count(block.text)
        if isinstance(block, TextBlock)
        else MEDIA_TOKENS
        if isinstance(block, _MEDIA)
        else 0
        for block in message.blocks
    )
    if message.additional_kwargs:
        tokens += tokenizer.count(str(message.additional_kwargs))
    return tokens


def to_chat_message(message: Message) -> ChatMessage:
    """The LlamaIndex `ChatMessage` a memcli `Message` holds (see the module's docstring)."""
    metadata = message.metadata or {}
    found = metadata.get(KEY)
    own: dict[str, Any] = found if isinstance(found, dict) else {}
    extra = metadata.get(EXTRA)
    kwargs: dict[str, Any] = dict(extra) if isinstance(extra, dict) else {}
    if message.name is not None:
        kwargs["name"] = message.name
    role = own.get("role", message.role)
    if "content" in kwargs and kwargs["content"] is None and not message.content:
        del kwargs["content"]  # a tool-calling reply without text (see `Message.from_dict`)
        return ChatMessage(role=role, blocks=[], additional_kwargs=kwargs)
    stored = own.get("blocks")
    if not isinstance(stored, list):
        return ChatMessage(role=role, content=message.content, additional_kwargs=kwargs)
    chat = ChatMessage(role=role, blocks=stored, additional_kwargs=kwargs)
    if (chat.content or "") != message.content:
        # memcli inserted long-term memory into this message's text: one text block, then the rest
        rest = [block for block in chat.blocks if not isinstance(block, TextBlock)]
        chat.blocks = [TextBlock(text=message.content), *rest]
    return chat


def _json(message: ChatMessage) -> dict[str, Any]:
    """The message as JSON values (LlamaIndex's serializer turns pydantic tool-call objects and
    bytes in `additional_kwargs` into dicts and base64 text)."""
    try:
        return message.model_dump(mode="json", include={"additional_kwargs"})
    except Exception as exc:
        raise InputError(
            f"a message's additional_kwargs are not JSON: {exc}",
            "Give additional_kwargs as JSON values (text, numbers, lists, objects)",
        ) from exc


class MemcliMemory(BaseMemory):
    """LlamaIndex's `BaseMemory` over a memcli `Memory`: what an agent puts is stored in the memcli
    session (flushed and fed to its blocks as `Memory.put` does); `get()` is the active window with
    long-term memory inserted, `get_all()` every message, active and archived. Its vector blocks
    search the flushed messages only, as LlamaIndex's VectorMemoryBlock (`VectorBlock(source=
    "flushed")`), unless one was given another `source`."""

    session_id: str
    _memory: Memory = PrivateAttr()

    def __init__(self, memory: Memory, **data: Any) -> None:
        super().__init__(session_id=memory.session_id, **data)  # type: ignore[call-arg]
        memory.given_tokens = True  # the messages come counted as LlamaIndex counts them
        self._memory = memory
        from memcli.blocks.vector import VectorBlock

        flushed = [
            b for b in memory.memory_blocks if isinstance(b, VectorBlock) and not b.source_given
        ]
        for block in flushed:
            block.source = "flushed"
        if flushed:  # the CLI builds this session's blocks as they are now
            from memcli.blocks.registry import record

            record(memory.store, memory.session_id, memory.memory_blocks)

    @classmethod
    def class_name(cls) -> str:
        return "MemcliMemory"

    @classmethod
    def from_defaults(cls, **kwargs: Any) -> MemcliMemory:
        """Open (or create) a memcli session: the arguments are `memcli.Memory.from_defaults`'s
        (`session_id`, `db`, `user_id`, `token_limit`, `chat_history_token_ratio`,
        `token_flush_size`, `memory_blocks`, `insert_method`, `tokenizer`); `db=None` is an
        in-memory database."""
        return cls(Memory.from_defaults(**kwargs))

    @property
    def memory(self) -> Memory:
        """The memcli `Memory` this adapter writes to."""
        return self._memory

    def _stored(self, messages: Sequence[ChatMessage]) -> list[Message]:
        """The memcli messages, each with its tokens as LlamaIndex counts them."""
        tokenizer = self._memory.tokenizer
        return [
            replace(from_chat_message(m), tokens=llama_index_tokens(m, tokenizer)) for m in messages
        ]

    def get(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:
        """The active messages with long-term memory inserted (`Memory.get(input)`)."""
        return [to_chat_message(m) for m in self._memory.get(input)]

    def get_all(self) -> list[ChatMessage]:
        """Every message of the session in order, active and archived."""
        return [to_chat_message(m) for m in self._memory.get_all()]

    def put(self, message: ChatMessage) -> None:
        self._memory.put_messages(self._stored([message]))

    def put_messages(self, messages: Sequence[ChatMessage]) -> None:
        """Store the messages in one call: one flush for all of them, as `Memory.put_messages`."""
        self._memory.put_messages(self._stored(messages))

    def set(self, messages: Sequence[ChatMessage]) -> None:
        """Replace the active window (archived history is kept), as `Memory.set`."""
        self._memory.set(self._stored(messages))

    def reset(self) -> None:
        """Delete the session's messages, active and archived, as `Memory.reset`."""
        self._memory.reset()

    # The async twins run memcli's (the store's work in a worker thread, the event loop free).

    async def aget(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:
        return [to_chat_message(m) for m in await self._memory.aget(input)]

    async def aget_all(self) -> list[ChatMessage]:
        return [to_chat_message(m) for m in await self._memory.aget_all()]

    async def aput(self, message: ChatMessage) -> None:
        await self._memory.aput_messages(self._stored([message]))

    async def aput_messages(self, messages: list[ChatMessage]) -> None:
        await self._memory.aput_messages(self._stored(messages))

    async def aset(self, messages: list[ChatMessage]) -> None:
        await self._memory.aset(self._stored(messages))

    async def areset(self) -> None:
        await self._memory.areset()

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
from pathlib import Path
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
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.memory import (
    FactExtractionMemoryBlock,
    StaticMemoryBlock,
    VectorMemoryBlock,
)
from llama_index.core.memory.memory import BaseMemoryBlock
from llama_index.core.memory.types import BaseMemory

from memcli.blocks.base import MemoryBlock
from memcli.blocks.static import StaticBlock
from memcli.errors import InputError, UsageError
from memcli.flush import Budget
from memcli.memory import Memory
from memcli.messages import EXTRA, ROLES, Message
from memcli.store import Store, open_store
from memcli.store.base import named
from memcli.tokens import TiktokenTokenizer, Tokenizer

__all__ = [
    "MemcliMemory",
    "from_chat_message",
    "llama_index_tokens",
    "memcli_block",
    "to_chat_message",
]

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
    "flushed")`), unless one was given another `source`.

    Its fields are what opens the same memcli session again, so that LlamaIndex's serialisation
    (`Context.to_dict` / `Context.from_dict`, `to_dict` / `from_dict`, pickle) resumes it: the
    session, its user, the database (a SQLite file's absolute path; a PostgreSQL URL without its
    password, which libpq then takes from PGPASSWORD or ~/.pgpass; None for an in-memory database,
    which a resumed memory opens empty, as LlamaIndex's own `Memory` does with its default
    store), the budget, the insert method, tiktoken's encoding (None for another tokenizer: a
    resumed memory counts with tiktoken's default) and the blocks' definitions (`[[blocks]]`
    tables, URLs without credentials, as memcli records them for the CLI). A resumed session
    keeps the budget stored with it (`Memory.rebudget` changes it); the saved one only makes the
    session again in a database that has lost it.
    """

    session_id: str
    user_id: str = "default"
    db: str | None = None
    token_limit: int = Budget.token_limit
    chat_history_token_ratio: float = Budget.chat_history_token_ratio
    token_flush_size: int | None = None
    insert_method: str = "system"
    encoding: str | None = None
    memory_blocks: list[dict[str, Any]] = Field(default_factory=list)
    _memory: Memory = PrivateAttr()

    def __init__(self, memory: Memory | None = None, **data: Any) -> None:
        """Over `memory`; or, without it, over the session the fields name (opened, or made),
        with `memory_blocks` as `from_defaults` takes them."""
        if memory is None:
            memory = open_memory(**data)
        elif data:
            raise UsageError(
                "MemcliMemory takes a memcli Memory or the fields of one, not both",
                "Pass MemcliMemory(memory), or MemcliMemory.from_defaults(session_id=..., db=...)",
            )
        from memcli.blocks.facts import FactBlock
        from memcli.blocks.vector import VectorBlock

        flushed = [
            b for b in memory.memory_blocks if isinstance(b, VectorBlock) and not b.source_given
        ]
        for block in flushed:
            block.source = "flushed"
            block.use_reference_defaults()  # LlamaIndex's top 2 over the last 5 messages
        facts = [b for b in memory.memory_blocks if isinstance(b, FactBlock)]
        every_fact = [b for b in facts if b.use_reference_defaults()]  # as LlamaIndex's
        if flushed or every_fact:  # the CLI builds this session's blocks as they are now
            from memcli.blocks.registry import record

            record(memory.store, memory.session_key, memory.memory_blocks)
        super().__init__(**saved_fields(memory))  # (the blocks' definitions as they are now)
        memory.given_tokens = True  # the messages come counted as LlamaIndex counts them
        self._memory = memory

    @classmethod
    def class_name(cls) -> str:
        return "MemcliMemory"

    @classmethod
    def from_defaults(cls, **kwargs: Any) -> MemcliMemory:
        """Open (or create) a memcli session: the arguments are `memcli.Memory.from_defaults`'s
        (`session_id`, `db`, `user_id`, `token_limit`, `chat_history_token_ratio`,
        `token_flush_size`, `memory_blocks`, `insert_method`, `tokenizer`); `db=None` is an
        in-memory database. `memory_blocks` may hold LlamaIndex's `StaticMemoryBlock` (made a
        memcli `StaticBlock`: see `memcli_block`)."""
        return cls(open_memory(**kwargs))

    @classmethod
    def from_dict(cls, data: dict[str, Any], **kwargs: Any) -> MemcliMemory:
        """The memory `to_dict` saved, over the same session: a stored session opens with its
        own budget (the saved one makes it again where the database has lost it)."""
        data = {**data, **kwargs}
        data.pop("class_name", None)
        return cls(open_memory(**data, resume=True))

    def to_dict(self, **kwargs: Any) -> dict[str, Any]:
        """The fields (see the class's docstring), read from the memcli `Memory` now (its budget
        may have changed since)."""
        for key, value in saved_fields(self._memory).items():
            setattr(self, key, value)
        return super().to_dict(**kwargs)

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


def open_memory(
    *,
    session_id: str | None = None,
    user_id: str | None = None,
    db: str | Path | Store | None = None,
    token_limit: int | None = None,
    chat_history_token_ratio: float | None = None,
    token_flush_size: int | None = None,
    insert_method: str = "system",
    memory_blocks: Sequence[Any] = (),
    tokenizer: Tokenizer | None = None,
    encoding: str | None = None,
    resume: bool = False,
) -> Memory:
    """`Memory.from_defaults` with the blocks made memcli's (`memcli_block`) and the tokenizer
    tiktoken's `encoding` when given; `resume` opens a stored session with its own budget."""
    store: Store = open_store(db) if db is None or isinstance(db, str | Path) else db
    if resume and session_id is not None and named(store, session_id, user_id) is not None:
        token_limit = chat_history_token_ratio = token_flush_size = None  # the session's own
    if tokenizer is None and encoding is not None:
        tokenizer = TiktokenTokenizer(encoding)
    return Memory.from_defaults(
        session_id=session_id,
        user_id=user_id,
        token_limit=token_limit,
        chat_history_token_ratio=chat_history_token_ratio,
        token_flush_size=token_flush_size,
        insert_method=insert_method,
        memory_blocks=[memcli_block(block, i) for i, block in enumerate(memory_blocks)],
        db=store,
        tokenizer=tokenizer,
    )


def saved_fields(memory: Memory) -> dict[str, Any]:
    """What `MemcliMemory` saves of a memcli `Memory` (see its docstring)."""
    from memcli.credentials import without_credentials

    tokenizer = memory.tokenizer
    return {
        "session_id": memory.session_id,
        "user_id": memory.user_id,
        "db": _location(memory.store),
        "token_limit": memory.budget.token_limit,
        "chat_history_token_ratio": memory.budget.chat_history_token_ratio,
        "token_flush_size": memory.budget.flush_size,
        "insert_method": memory.insert_method,
        "encoding": tokenizer.encoding_name if isinstance(tokenizer, TiktokenTokenizer) else None,
        "memory_blocks": [without_credentials(b.definition()) for b in memory.memory_blocks],
    }


def _location(store: Store) -> str | None:
    """The database as `open_store` takes it again: a SQLite file's absolute path (None: in
    memory), a PostgreSQL URL without its password."""
    from memcli.credentials import strip_credentials

    if store.dialect == "postgresql":
        return strip_credentials(str(getattr(store, "url", "")))
    path = getattr(store, "path", None)
    return None if path is None else str(Path(path).absolute())


def memcli_block(block: Any, index: int = 0) -> MemoryBlock:
    """A memcli block for what `memory_blocks` holds: a memcli block as it is; a definition (a
    `[[blocks]]` table, as `MemcliMemory` saves them) built; LlamaIndex's `StaticMemoryBlock`
    as memcli's `StaticBlock` with its name, priority and text. LlamaIndex's
    `FactExtractionMemoryBlock` and `VectorMemoryBlock` keep their memory in themselves and in a
    LlamaIndex vector store, which memcli cannot take over: UsageError, naming the memcli block
    to use instead (`FactBlock`, `VectorBlock`), as for any other object."""
    if isinstance(block, MemoryBlock):
        return block
    if isinstance(block, dict):
        from memcli.blocks.registry import Defaults, build_block

        return build_block(index, block, Defaults())
    if isinstance(block, StaticMemoryBlock):
        return _static_block(block)
    if isinstance(block, FactExtractionMemoryBlock):
        raise UsageError(
            f"LlamaIndex's FactExtractionMemoryBlock {block.name!r} keeps its facts in itself and"
            " extracts them with a LlamaIndex LLM: memcli cannot take it over",
            f"Use memcli's FactBlock(name={block.name!r}, model='PROVIDER/MODEL',"
            f" max_facts={block.max_facts}, priority={block.priority}): its facts are kept in"
            " the memcli database and extracted through litellm (a litellm model name)",
        )
    if isinstance(block, VectorMemoryBlock):
        raise UsageError(
            f"LlamaIndex's VectorMemoryBlock {block.name!r} keeps its memory in a LlamaIndex"
            " vector store, which memcli cannot read",
            f"Use memcli's VectorBlock(name={block.name!r},"
            f" similarity_top_k={block.similarity_top_k},"
            f" retrieval_context_window={block.retrieval_context_window},"
            f" priority={block.priority}): it searches the flushed messages in the memcli"
            " database",
        )
    what = f"LlamaIndex's {type(block).__name__}" if isinstance(block, BaseMemoryBlock) else None
    raise UsageError(
        f"{what or repr(block)} is not a block memcli can use",
        "Give memcli blocks (memcli.StaticBlock, FactBlock, VectorBlock, SummaryBlock), a"
        " memcli.MemoryBlock subclass, or LlamaIndex's StaticMemoryBlock",
    )


def _static_block(block: StaticMemoryBlock) -> StaticBlock:
    """memcli's static block for LlamaIndex's: its text blocks joined by newlines."""
    others = sorted(
        {type(b).__name__ for b in block.static_content if not isinstance(b, TextBlock)}
    )
    if others:
        raise UsageError(
            f"LlamaIndex's StaticMemoryBlock {block.name!r} holds {', '.join(others)}:"
            " memcli's static block holds text only",
            f"Give its content as text: memcli's StaticBlock(name={block.name!r}, content='...')",
        )
    text = "\n".join(b.text for b in block.static_content if isinstance(b, TextBlock))
    return StaticBlock(name=block.name, content=text, priority=block.priority)

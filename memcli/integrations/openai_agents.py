"""A `Session` of the OpenAI Agents SDK over a memcli session: `Runner.run(agent, text,
session=MemcliSession("ana-1", db="app.db"))`.

    from agents import Agent, Runner
    from memcli.integrations.openai_agents import MemcliSession

    session = MemcliSession("ana-1", db="app.db", user_id="ana", token_limit=8000)
    await Runner.run(agent, "My name is Ana", session=session)
    await Runner.run(agent, "What is my name?", session=session)  # sees the first run

The run's items are stored as messages of the memcli session (`memcli --db app.db inspect ana-1`
shows them), under memcli's token budget: each `add_items` is a `Memory.put_messages`, which
flushes the oldest whole turns out of the window and feeds them to the long-term blocks. Needs
the SDK (`pip install memcli[agents]`); it implements the SDK's `Session` protocol.

- An item (a Responses-API input item: a message, `function_call`, `function_call_output`,
  `reasoning`, ...) is one memcli message: its text as the content (what search and the blocks
  read: a message's text parts, a call's `name(arguments)`, a call output's text, a reasoning
  summary), the item itself, whole, in `metadata["openai_agents"]`, which `get_items` gives back
  exactly. Role: the item's own (developer as system), `tool` for an item whose type ends in
  `_output`, `assistant` for the model's other items. Its tokens are those of the content.
- `get_items()` is what the model is sent: the active window (flushed turns have left it),
  preceded, when the blocks have something to say, by one system message item with the
  long-term memory (memcli's `<memory>` text; never stored). A limit (`get_items(limit=N)`,
  else `session_settings.limit`; the Runner passes `RunConfig(session_settings=...)`'s, resolved
  over the session's as the SDK does) keeps the newest N items of that window, counted as the
  SDK's sessions count them (one per item, N = 0 none, N < 0 all), the memory item still in
  front and not among the N: the memory is what stands for the turns the limit leaves out. A
  message put into the session otherwise (`memcli import`, a memcli `Memory`) is given as a
  `{"role", "content"}` item (a tool message as a user one).
- The SDK reads `get_items(limit=n)` also when a run resumed from a `RunState` (after a tool
  approval) saves its items: it keeps the tail it read, and only if that save failed and the
  state is resumed again does it compare the tail with what it wrote. With a memory item in
  front, that comparison never matches, and the SDK refuses ("Cannot reconcile the pending
  Session write") rather than write the items twice.
- `pop_item()` deletes the newest item for good (no copy left in the database), as
  `Memory.delete_message`, and returns it.
- `clear_session()` deletes the session's items, active and archived, for good (`Memory.reset`,
  then the store's `purge`: nothing of them left in the database's files), as the SDK's own
  sessions do. What the blocks learnt from them (facts, summaries) stays: forget those with
  `memcli facts` or `memcli.forget_user`. To keep a history out of the window without deleting
  it, let the budget flush it.

The memcli `Memory` is opened at the first call, in a worker thread (the event loop never waits
for the database): the constructor does no I/O.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agents.items import TResponseInputItem
from agents.memory.session_settings import (
    SessionSettings,
    coerce_session_settings,
    resolve_session_limit,
)

from memcli.blocks.base import MemoryBlock
from memcli.context import Context
from memcli.errors import UsageError
from memcli.memory import Memory
from memcli.messages import Message
from memcli.store import Store
from memcli.tokens import Tokenizer

__all__ = ["KEY", "MemcliSession", "item_message", "message_item", "window_items"]

#: The metadata key holding the item a memcli message was made of.
KEY = "openai_agents"
#: Item roles memcli has not, stored as the nearest memcli role.
_NEAREST = {"developer": "system"}


def item_message(item: TResponseInputItem | dict[str, Any], tokenizer: Tokenizer) -> Message:
    """The memcli message for an item (see the module's docstring), its tokens counted."""
    stored = _as_json(item)
    text = item_text(stored)
    role = stored.get("role")
    if isinstance(role, str):
        role = _NEAREST.get(role, role)
    else:
        kind = str(stored.get("type", ""))
        role = "tool" if kind.endswith("_output") else "assistant"
    if role not in ("system", "user", "assistant", "tool"):
        raise UsageError(f"an item has the role {role!r}", "Give Responses-API input items")
    return Message(role, text, metadata={KEY: stored}, tokens=tokenizer.count(text))


def message_item(message: Message) -> dict[str, Any]:
    """The item a memcli message holds; a message put otherwise as a `{"role", "content"}` item."""
    stored = (message.metadata or {}).get(KEY)
    if isinstance(stored, dict):
        return stored
    role = "user" if message.role == "tool" else message.role
    return {"role": role, "content": message.content}


def window_items(context: Context, insert_method: str = "system") -> list[dict[str, Any]]:
    """The items of an assembled context's window, without the memory `get()` inserted: the
    memory as a message of its own (it has no id: it is not stored) is left out, and the message
    it was put in front of (the first system message, or with `insert_method="user"` the last
    user message) is given as it is stored."""
    messages = list(context.messages)
    if context.memory_text:
        role = "system" if insert_method == "system" else "user"
        at = [i for i, m in enumerate(messages) if m.role == role and m.id is not None]
        prefix = f"{context.memory_text}\n"
        if at:
            i = at[0] if role == "system" else at[-1]
            if messages[i].content.startswith(prefix):
                messages[i] = messages[i].with_content(messages[i].content[len(prefix) :])
    return [message_item(m) for m in messages if m.id is not None]


def item_text(item: dict[str, Any]) -> str:
    """What of an item is text: a message's text parts (refusals too), a function call's
    `name(arguments)`, an output's text, a reasoning item's summary, joined by newlines."""
    if item.get("type") == "function_call":
        return f"{item.get('name', '')}({item.get('arguments', '')})"
    texts: list[str] = []
    for key in ("content", "output", "summary"):
        _collect(item.get(key), texts)
    return "\n".join(texts)


def _collect(value: Any, texts: list[str]) -> None:
    if isinstance(value, str):
        if value:
            texts.append(value)
    elif isinstance(value, list):
        for part in value:
            if isinstance(part, dict):
                text = part.get("text", part.get("refusal"))
                if isinstance(text, str) and text:
                    texts.append(text)


def _as_json(item: Any) -> dict[str, Any]:
    """The item as JSON values (an SDK or openai model object as its dict)."""
    if hasattr(item, "model_dump"):
        item = item.model_dump(mode="json", exclude_unset=True)
    if not isinstance(item, dict):
        raise UsageError(
            f"an item is a {type(item).__name__}, not an object", "Give Responses-API input items"
        )
    try:
        copied: dict[str, Any] = json.loads(json.dumps(item, ensure_ascii=False))
    except (TypeError, ValueError) as exc:
        raise UsageError(f"an item is not JSON: {exc}", "Give items of JSON values") from None
    return copied


class MemcliSession:
    """The Agents SDK's `Session` over a memcli session (see the module's docstring). The
    arguments are `memcli.Memory.from_defaults`'s (`db` a SQLite file, a `postgresql://` URL or
    a store; None: in memory); or `memory=`, a memcli `Memory` already open."""

    session_settings: SessionSettings | None = None

    def __init__(
        self,
        session_id: str | None = None,
        *,
        db: str | Path | Store | None = None,
        user_id: str | None = None,
        token_limit: int | None = None,
        chat_history_token_ratio: float | None = None,
        token_flush_size: int | None = None,
        memory_blocks: Sequence[MemoryBlock] = (),
        tokenizer: Tokenizer | None = None,
        memory: Memory | None = None,
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> None:
        if memory is not None:
            if session_id not in (None, memory.session_id):
                raise UsageError(
                    f"session_id {session_id!r} is not the memory's ({memory.session_id!r})",
                    "Leave session_id out when passing memory=",
                )
            session_id = memory.session_id
        if session_id is None:
            raise UsageError("a MemcliSession needs a session_id", "Pass e.g. 'ana-1'")
        self.session_id = session_id
        # As the SDK's own sessions: a dict is read as SessionSettings, None is no limit.
        self.session_settings = (
            coerce_session_settings(session_settings)
            if session_settings is not None
            else SessionSettings()
        )
        self._memory = memory
        self._open_args: dict[str, Any] = {
            "session_id": session_id,
            "db": db,
            "user_id": user_id,
            "token_limit": token_limit,
            "chat_history_token_ratio": chat_history_token_ratio,
            "token_flush_size": token_flush_size,
            "memory_blocks": memory_blocks,
            "tokenizer": tokenizer,
        }
        self._opening = threading.Lock()

    def _open(self) -> Memory:
        with self._opening:
            if self._memory is None:
                memory = Memory.from_defaults(**self._open_args)
                memory.given_tokens = True  # each item counts the tokens of its text
                self._memory = memory
            return self._memory

    async def memory(self) -> Memory:
        """The memcli `Memory` of the session (opened in a worker thread the first time)."""
        if self._memory is not None:
            return self._memory
        return await asyncio.to_thread(self._open)

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The memory item (when the blocks give any), then the active window's items: the
        newest `limit` of them (else `session_settings.limit`'s; None: all). See the module's
        docstring."""
        wanted = resolve_session_limit(limit, self.session_settings)
        memory = await self.memory()
        context = await memory.acontext()
        window = window_items(context, memory.insert_method)
        if wanted is not None and wanted >= 0:  # (negative: all, as the SDK's SQLiteSession)
            window = window[max(len(window) - wanted, 0) :]
        if context.memory_text:
            window.insert(0, {"role": "system", "content": context.memory_text})
        return window  # type: ignore[return-value]  # (JSON items: the TypedDicts' values)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Store the items as one `put_messages`: one flush for all of them."""
        if not items:
            return
        memory = await self.memory()
        messages = [item_message(item, memory.tokenizer) for item in items]
        await memory.aput_messages(messages)

    async def pop_item(self) -> TResponseInputItem | None:
        """Delete the newest item for good and return it (None: the session holds none)."""
        memory = await self.memory()
        stored = await memory.aget_all("active") or await memory.aget_all()
        if not stored:
            return None
        newest = stored[-1]
        assert newest.id is not None
        deleted = await memory.adelete_message(newest.id)
        return message_item(deleted)  # type: ignore[return-value]

    async def clear_session(self) -> None:
        """Delete every item of the session for good (see the module's docstring)."""
        memory = await self.memory()
        await memory.areset()
        await asyncio.to_thread(memory.store.purge)

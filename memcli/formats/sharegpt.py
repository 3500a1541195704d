"""ShareGPT, the format of many chat datasets: conversations `{"conversations": [{"from",
"value"}, ...]}` (an optional `id`, `system`), as a JSON array or one per line (JSON Lines).

`from` human / user is a user message; gpt / chatgpt / bard / bing / model / assistant an
assistant message; system a system message; tool / observation / function_response a tool
result. A `function_call` whose value is `{"name", "arguments"}` is an assistant tool call, and
the tool result after it answers it (ids `call_N` by position); other values stay text. The
conversation's `id` is its source id (`sharegpt:ID`); ShareGPT messages have no ids.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from memcli.errors import InputError
from memcli.formats.base import (
    Conversation,
    clean_text,
    message,
    records,
    text_of,
    tool_call,
)
from memcli.formats.reader import Input, Reader, Source

if TYPE_CHECKING:
    from memcli.messages import Message

_HINT = 'Give ShareGPT conversations as {"conversations": [{"from": ..., "value": ...}]}'
_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "assistant": "assistant",
    "system": "system",
    "tool": "tool",
    "observation": "tool",
    "function_response": "tool",
    "function_call": "assistant",
}


def detect(source: Input) -> bool:
    return source.first is not None and isinstance(source.first.get("conversations"), list)


def read(source: Input) -> Source:
    """A JSON array (or object) of conversations, else JSON Lines of them."""
    if source.value is not None:
        found = source.entries()
    else:
        found = source.lines("Write one ShareGPT conversation per line")
    return Source([_conversation(item, at) for at, item in found])


def _conversation(item: Any, at: str) -> Conversation:
    turns = item.get("conversations") if isinstance(item, dict) else None
    if not isinstance(turns, list):
        raise InputError(f"{at}: no conversations list", _HINT)
    messages: list[Message] = []
    system = item.get("system")
    if isinstance(system, str) and system.strip():
        messages.append(message(at, "system", system))
    pending: str | None = None
    for i, turn in enumerate(turns):
        where_ = f"{at}: turn {i}"
        if not isinstance(turn, dict):
            raise InputError(f"{where_}: not an object", _HINT)
        kind = turn.get("from")
        role = _ROLES.get(kind) if isinstance(kind, str) else None
        if role is None:
            raise InputError(f"{where_}: from {kind!r} is not one of {', '.join(_ROLES)}", _HINT)
        text = text_of(turn.get("value"), where_, "value", _HINT)
        call = _call(text) if kind == "function_call" else None
        if call is not None:
            pending = f"call_{i}"
            extra = {"content": None, "tool_calls": [tool_call(pending, *call)]}
            messages.append(message(where_, "assistant", "", metadata={"extra": extra}))
            continue
        if not text.strip():
            continue
        metadata = None
        if role == "tool" and pending is not None:
            metadata, pending = {"extra": {"tool_call_id": pending}}, None
        messages.append(message(where_, role, text, metadata=metadata))
    ident = item.get("id")
    ident = clean_text(str(ident) if isinstance(ident, int) else ident, at, "its id")
    return Conversation(records(messages), source_id=f"sharegpt:{ident}" if ident else None)


def _call(text: str) -> tuple[str, Any] | None:
    """A function_call's name and arguments (None: its value is not such a call)."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    return value["name"], value.get("arguments", {})


READER = Reader(
    "sharegpt",
    "ShareGPT ({conversations: [{from, value}]}), JSON or JSON Lines",
    True,
    detect,
    read,
)

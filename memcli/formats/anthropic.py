"""Anthropic's Messages API JSON: a request or a logged conversation, `{"system": ...,
"messages": [{"role", "content"}, ...], ...}` (one object, or a JSON array of them).

The top-level `system` (text, or text blocks) is the first message, a system message. A
message's `content` is text or content blocks: text blocks are its text; an assistant's
`tool_use` blocks are its OpenAI `tool_calls` (the block's id, name and input); a user's
`tool_result` blocks are `tool` messages answering them (`tool_call_id`), before the user's
text (a message of results only is no user message: nothing is stored empty). Thinking blocks
are the model's reasoning, skipped; images and documents are left out and counted. The format
has no ids of conversations or messages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memcli.errors import InputError
from memcli.formats.base import Conversation, message, records, text_blocks, tool_call
from memcli.formats.reader import Input, Reader, Source

if TYPE_CHECKING:
    from memcli.messages import Message

_HINT = 'Give Messages API JSON as Anthropic takes it: {"system": ..., "messages": [...]}'
#: Block types only Anthropic's format has: a conversation holding one is Anthropic's.
_OWN_BLOCKS = frozenset(
    ("tool_use", "tool_result", "thinking", "redacted_thinking", "document", "server_tool_use")
)
_SKIPPED = frozenset(("thinking", "redacted_thinking"))


def detect(source: Input) -> bool:
    """A Messages API request: a `messages` list with a top-level `system`, or with content
    blocks only Anthropic's format has."""
    value = source.first
    if not isinstance(value, dict) or not isinstance(value.get("messages"), list):
        return False
    if "system" in value:
        return True
    return any(
        isinstance(b, dict) and isinstance(b.get("type"), str) and b["type"] in _OWN_BLOCKS
        for m in value["messages"]
        if isinstance(m, dict) and isinstance(m.get("content"), list)
        for b in m["content"]
    )


def read(source: Input) -> Source:
    return Source([_conversation(item, at) for at, item in source.entries()])


def _conversation(item: Any, at: str) -> Conversation:
    if not isinstance(item, dict) or not isinstance(item.get("messages"), list):
        raise InputError(f"{at}: no messages list", _HINT)
    messages: list[Message] = []
    system, dropped = _text(item.get("system"), f"{at}: system")
    if system.strip():
        messages.append(message(at, "system", system))
    for i, data in enumerate(item["messages"]):
        found, left_out = _message(data, f"{at}: message {i}")
        messages.extend(found)
        dropped += left_out
    return Conversation(records(messages), dropped=dropped)


def _message(data: Any, at: str) -> tuple[list[Message], int]:
    if not isinstance(data, dict):
        raise InputError(f"{at}: not an object", _HINT)
    role = data.get("role")
    if role not in ("user", "assistant"):
        raise InputError(f"{at}: role {role!r} is not user or assistant", _HINT)
    content = data.get("content")
    if isinstance(content, str):
        return ([message(at, role, content)] if content.strip() else []), 0
    if not isinstance(content, list):
        raise InputError(f"{at}: content is neither text nor a list of blocks", _HINT)
    texts, calls, results, dropped = [], [], [], 0
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        here = f"{at}: block {j}"
        if kind == "text":
            text, _ = _text([block], here)
            texts.append(text)
        elif kind in ("tool_use", "server_tool_use"):
            ident, name = block.get("id"), block.get("name")
            if not isinstance(ident, str) or not isinstance(name, str):
                raise InputError(f"{here}: a tool_use block without id and name", _HINT)
            calls.append(tool_call(ident, name, block.get("input", {})))
        elif kind == "tool_result":
            ident = block.get("tool_use_id")
            if not isinstance(ident, str):
                raise InputError(f"{here}: a tool_result block without tool_use_id", _HINT)
            text, left_out = _text(block.get("content"), here)
            dropped += left_out
            if text.strip():
                results.append(
                    message(here, "tool", text, metadata={"extra": {"tool_call_id": ident}})
                )
        elif not isinstance(kind, str) or kind not in _SKIPPED:
            dropped += 1
    text = "\n".join(t for t in texts if t)
    found = list(results)
    if calls:
        extra: dict[str, Any] = {"tool_calls": calls}
        if not text.strip():
            extra, text = {"content": None, **extra}, ""
        found.append(message(at, "assistant", text, metadata={"extra": extra}))
    elif text.strip():
        found.append(message(at, role, text))
    return found, dropped


def _text(value: Any, at: str) -> tuple[str, int]:
    """The text of a `system`, or of a tool result's content: text, or blocks whose text
    blocks are joined (how many blocks of other types were left out)."""
    if value is None:
        return "", 0
    if isinstance(value, str):
        return value, 0
    if not isinstance(value, list):
        raise InputError(f"{at}: neither text nor a list of blocks", _HINT)
    return text_blocks(value, at, _HINT)


READER = Reader(
    "anthropic", "Anthropic Messages API JSON ({system, messages})", False, detect, read
)

"""Claude.ai's data export: `conversations.json`, a list of conversations with `chat_messages`
in order (`sender` human or assistant). A message's text is its `content` blocks of type text
(else its `text`); tool use and results are left out and counted; the `extracted_content` of
its attachments is kept with it (after its text, under the file's name), so it is searchable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memcli.errors import InputError
from memcli.formats.base import Conversation, message, records, where

if TYPE_CHECKING:
    from memcli.messages import Message

_HINT = "Give conversations.json as Claude.ai exported it"
_ROLES = {"human": "user", "assistant": "assistant"}


def read(items: list[Any], name: str) -> list[Conversation]:
    return [_conversation(item, where(name, i, item)) for i, item in enumerate(items)]


def _conversation(item: Any, at: str) -> Conversation:
    if not isinstance(item, dict) or not isinstance(item.get("chat_messages"), list):
        raise InputError(f"{at}: no chat_messages list", _HINT)
    messages: list[Message] = []
    dropped = 0
    for i, data in enumerate(item["chat_messages"]):
        found, left_out = _message(data, f"{at}: message {i}")
        dropped += left_out
        if found is not None:
            messages.append(found)
    ident, title = item.get("uuid"), item.get("name")
    return Conversation(
        records(messages),
        source_id=f"claude:{ident}" if isinstance(ident, str) and ident else None,
        title=title if isinstance(title, str) and title.strip() else None,
        dropped=dropped,
    )


def _message(data: Any, at: str) -> tuple[Message | None, int]:
    if not isinstance(data, dict):
        raise InputError(f"{at}: not an object", _HINT)
    role = _ROLES.get(data.get("sender"))  # type: ignore[arg-type]
    if role is None:
        raise InputError(f"{at}: sender {data.get('sender')!r} is not human or assistant", _HINT)
    texts, dropped = _texts(data, at)
    for attachment in data.get("attachments") or ():
        if isinstance(attachment, dict) and isinstance(attachment.get("extracted_content"), str):
            texts.append(
                f"[{attachment.get('file_name') or 'attachment'}]\n{attachment['extracted_content']}"
            )
    dropped += sum(1 for f in data.get("files") or () if isinstance(f, dict))
    text = "\n\n".join(t for t in texts if t)
    if not text.strip():
        return None, dropped
    return message(at, role, text, timestamp=data.get("created_at")), dropped


def _texts(data: dict[str, Any], at: str) -> tuple[list[str], int]:
    """The message's text blocks (its `text` when it has no blocks), and how many blocks of
    other types (tool use, tool results, images) were left out."""
    blocks = data.get("content")
    if not isinstance(blocks, list) or not blocks:
        text = data.get("text")
        if text is not None and not isinstance(text, str):
            raise InputError(f"{at}: text is not a string", _HINT)
        return [text or ""], 0
    texts, dropped = [], 0
    for block in blocks:
        if isinstance(block, dict) and block.get("type") == "text":
            if not isinstance(block.get("text"), str):
                raise InputError(f"{at}: a text block without text", _HINT)
            texts.append(block["text"])
        else:
            dropped += 1
    return texts, dropped

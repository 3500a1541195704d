"""Claude.ai's data export: `conversations.json`, a list of conversations with `chat_messages`
in order (`sender` human or assistant). A message's text is its `content` blocks of type text
(else its `text`); thinking, tool use and tool results are skipped (they are no part of the
conversation's text, and not counted as left out); the `extracted_content` of its attachments
is kept with it (after its text, under the file's name), so it is searchable. Uploaded files
whose text is not in the export (images, an attachment with no text) are left out and counted.
Each message's `uuid` is its `metadata["source_id"]`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memcli.errors import InputError
from memcli.formats.base import (
    Conversation,
    Limits,
    block_texts,
    clean_text,
    message,
    records,
)
from memcli.formats.reader import Input, Reader, Source

if TYPE_CHECKING:
    from memcli.messages import Message

_HINT = "Give conversations.json as Claude.ai exported it"
_ROLES = {"human": "user", "assistant": "assistant"}


def detect(source: Input) -> bool:
    return source.first is not None and "chat_messages" in source.first


def read(source: Input) -> Source:
    return Source([_conversation(item, at, source.limits) for at, item in source.entries()])


def _conversation(item: Any, at: str, limits: Limits) -> Conversation:
    if not isinstance(item, dict) or not isinstance(item.get("chat_messages"), list):
        raise InputError(f"{at}: no chat_messages list", _HINT)
    messages: list[Message] = []
    dropped = 0
    for i, data in enumerate(item["chat_messages"]):
        found, left_out = _message(data, f"{at}: message {i}", limits)
        dropped += left_out
        if found is not None:
            messages.append(found)
    ident = clean_text(item.get("uuid"), at, "its uuid")
    return Conversation(
        records(messages),
        source_id=f"claude:{ident}" if ident else None,
        title=clean_text(item.get("name"), at, "its name"),
        dropped=dropped,
    )


def _message(data: Any, at: str, limits: Limits) -> tuple[Message | None, int]:
    if not isinstance(data, dict):
        raise InputError(f"{at}: not an object", _HINT)
    sender = data.get("sender")
    role = _ROLES.get(sender) if isinstance(sender, str) else None
    if role is None:
        raise InputError(f"{at}: sender {sender!r} is not human or assistant", _HINT)
    texts, dropped = _texts(data, at)
    kept: set[Any] = set()
    for i, attachment in enumerate(_list(data, "attachments", at)):
        if isinstance(attachment, dict) and isinstance(attachment.get("extracted_content"), str):
            text, file = attachment["extracted_content"], attachment.get("file_name")
            if isinstance(file, str):
                kept.add(file)
            if not text.strip():
                dropped += 1  # a file without text (a scan): left out, as an image is
                continue
            file = file if isinstance(file, str) and file else "attachment"
            if len(text) > limits.max_attachment:
                raise InputError(
                    f"{at}: attachment {i} ({file!r}) holds {len(text):,} characters of text,"
                    f" more than the {limits.max_attachment:,} memcli keeps with a message",
                    "Remove the attachment from the export (or shorten it), then import again",
                )
            texts.append(f"[{file}]\n{text}")
    dropped += sum(
        1
        for f in _list(data, "files", at)
        if isinstance(f, dict)
        and not (isinstance(f.get("file_name"), str) and f["file_name"] in kept)
    )
    text = "\n\n".join(t for t in texts if t)
    if not text.strip():
        return None, dropped
    ident = clean_text(data.get("uuid"), at, "its uuid")
    meta = {"source_id": ident} if ident else None
    return message(at, role, text, timestamp=data.get("created_at"), metadata=meta), dropped


#: Blocks that are no part of the conversation's text: skipped, not counted as left out.
_SKIPPED = frozenset(
    (
        "thinking",
        "redacted_thinking",
        "tool_use",
        "tool_result",
        "server_tool_use",
        "web_search_tool_result",
        "token_budget",
    )
)


def _texts(data: dict[str, Any], at: str) -> tuple[list[str], int]:
    """The message's text blocks (its `text` when it has no blocks), and how many blocks of
    other types (images, documents) were left out; thinking and tool blocks are skipped."""
    blocks = data.get("content")
    if not isinstance(blocks, list) or not blocks:
        text = data.get("text")
        if text is not None and not isinstance(text, str):
            raise InputError(f"{at}: text is not a string", _HINT)
        return [text or ""], 0
    return block_texts(blocks, at, _HINT, _SKIPPED)


def _list(data: dict[str, Any], key: str, at: str) -> list[Any]:
    """A message's list under `key` (none: empty); InputError when it is something else."""
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise InputError(f"{at}: {key} is not a list", _HINT)
    return value


READER = Reader(
    "claude", "Claude.ai's data export (conversations.json, or the .zip)", False, detect, read
)

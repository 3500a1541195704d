"""Open WebUI's chats: its "export all chats" file (a JSON array of `{"id", "title", "chat":
{...}, ...}`) and a single chat's JSON (the same object, or its `chat` alone, one or in an
array). A chat's messages are a tree (`history.messages`: id -> {parentId, role, content,
timestamp}); the conversation is the branch from the root to `history.currentId`, the one
shown last (a chat without a history: its `messages` list). The chat's `title` is the title,
`openwebui:ID` the source id, each message's id its `metadata["source_id"]`; attached files are
left out and counted. Nothing else of the chat (its tree, models, settings) is kept.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memcli.errors import InputError
from memcli.formats.base import Conversation, clean_text, message, records, text_of
from memcli.formats.reader import Input, Reader, Source

if TYPE_CHECKING:
    from memcli.messages import Message

_HINT = "Give the JSON Open WebUI exported (Settings, Data Controls, Export All Chats)"
_ROLES = ("system", "user", "assistant")


def read(source: Input) -> Source:
    return Source([_conversation(item, at) for at, item in source.entries()])


def detect(source: Input) -> bool:
    return is_chat(source.first)


def is_chat(value: Any) -> bool:
    """Whether a JSON object is an Open WebUI chat, or the record of one."""
    if not isinstance(value, dict):
        return False
    chat: dict[str, Any] = value["chat"] if isinstance(value.get("chat"), dict) else value
    history = chat.get("history")
    return isinstance(history, dict) and isinstance(history.get("messages"), dict)


def _conversation(item: Any, at: str) -> Conversation:
    if not is_chat(item):
        raise InputError(f"{at}: not an Open WebUI chat (no history of messages)", _HINT)
    chat = item["chat"] if isinstance(item.get("chat"), dict) else item
    history = chat["history"]
    messages: list[Message] = []
    dropped = 0
    for data in _branch(history, chat.get("messages"), at):
        ident = data.get("id")
        here = f"{at}: message {ident}"
        role = data.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise InputError(f"{here}: role {role!r} is not one of {', '.join(_ROLES)}", _HINT)
        files = data.get("files")
        dropped += len(files) if isinstance(files, list) else 0
        text = text_of(data.get("content"), here, "content", _HINT)
        if not text.strip():
            continue
        when = data.get("timestamp")
        meta = {"source_id": ident} if isinstance(ident, str) and ident else None
        messages.append(message(here, role, text, timestamp=when, metadata=meta))
    ident = clean_text(item.get("id") or chat.get("id"), at, "its id")
    return Conversation(
        records(messages),
        source_id=f"openwebui:{ident}" if ident else None,
        title=clean_text(item.get("title") or chat.get("title"), at, "its title"),
        dropped=dropped,
    )


def _branch(history: dict[str, Any], listed: Any, at: str) -> list[dict[str, Any]]:
    """The messages from the root to `currentId` (none: the chat's `messages` list)."""
    tree: dict[str, Any] = history["messages"]
    current = history.get("currentId")
    if current is None:
        found = [m for m in listed if isinstance(m, dict)] if isinstance(listed, list) else []
        if tree and not found:  # (not one of them would be imported, and no word said)
            raise InputError(
                f"{at}: its history holds {len(tree):,} messages but no currentId, and it has"
                " no messages list",
                _HINT,
            )
        return found
    path: list[dict[str, Any]] = []
    seen: set[str] = set()
    while current is not None:
        if not isinstance(current, str) or not isinstance(tree.get(current), dict):
            raise InputError(f"{at}: message {current!r} is not in the history", _HINT)
        if current in seen:
            raise InputError(f"{at}: message {current!r} is its own ancestor", _HINT)
        seen.add(current)
        node = {"id": current, **tree[current]}
        path.append(node)
        current = node.get("parentId")
    path.reverse()
    return path


READER = Reader(
    "openwebui", "Open WebUI's Export All Chats, or one chat's JSON", False, detect, read
)

"""ChatGPT's data export: `conversations.json`, a list of conversations, each a tree of nodes
(`mapping`: id -> {message, parent, children}). The conversation is the branch from the root
to `current_node`: edits and regenerations on other branches are not imported.

Per node: its id is the message's source id (`metadata["source_id"]`); text parts are the content; other parts (images, audio, files) are left out and
counted (an audio part's transcription is text, and kept); hidden nodes (custom instructions,
the empty system message) are skipped, as are the model's thoughts; `code` (the assistant
writing to the Python tool) is an assistant message, `execution_output` a tool message named
after the tool.

Tool turns (code interpreter, browsing, DALL-E, memory): an assistant message addressed to a
tool (`recipient` other than `all`) is an assistant message with an OpenAI `tool_calls` entry
(the message id as the call's id, the recipient as its name, the text as its arguments), and
the tool's first message after it (by the tool's name) the `tool` message answering it
(`tool_call_id`). A tool message that answers no call is kept, without `tool_call_id`: an
export writes it as text (`memcli.provider_messages.openai_messages`). Each message's id in the
export is its `metadata["source_id"]`.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from memcli.errors import InputError
from memcli.formats.base import Conversation, clean_text, message, records
from memcli.formats.reader import Input, Reader, Source

if TYPE_CHECKING:
    from memcli.messages import Message

_HINT = "Give conversations.json as ChatGPT exported it"
#: Content types that are the model's reasoning, not the conversation: skipped.
_THOUGHTS = frozenset(
    ("thoughts", "reasoning_recap", "user_editable_context", "model_editable_context")
)


def detect(source: Input) -> bool:
    return source.first is not None and isinstance(source.first.get("mapping"), dict)


def read(source: Input) -> Source:
    return Source([_conversation(item, at) for at, item in source.entries()])


def _conversation(item: Any, at: str) -> Conversation:
    if not isinstance(item, dict) or not isinstance(item.get("mapping"), dict):
        raise InputError(f"{at}: no mapping of messages", _HINT)
    mapping: dict[str, Any] = item["mapping"]
    messages: list[Message] = []
    dropped = 0
    calls: dict[str, str] = {}  # the calls not answered yet: tool name -> call id
    for node_id in _branch(mapping, item.get("current_node"), at):
        found, left_out = _message(
            mapping[node_id].get("message"), f"{at}: node {node_id}", node_id, calls
        )
        dropped += left_out
        if found is not None:
            messages.append(found)
    ident = clean_text(item.get("conversation_id") or item.get("id"), at, "its id")
    return Conversation(
        records(messages),
        source_id=f"chatgpt:{ident}" if ident else None,
        title=clean_text(item.get("title"), at, "its title"),
        dropped=dropped,
    )


def _branch(mapping: dict[str, Any], current: Any, at: str) -> list[str]:
    """The node ids from the root to `current_node` (no current node: the last node of the
    first children, as an export without one is read)."""
    if current is None:
        current = next(iter(mapping), None)
        walked: set[str] = set()
        while current is not None:
            node = mapping[current]
            children = node.get("children") if isinstance(node, dict) else None
            if not children or not isinstance(children, list) or current in walked:
                break  # a node without children (or a loop of them): the last
            walked.add(current)
            current = children[-1]
            if not isinstance(current, str) or current not in mapping:
                raise InputError(f"{at}: node {current!r} is not in the mapping", _HINT)
    path: list[str] = []
    seen: set[str] = set()
    while current is not None:
        if not isinstance(current, str) or current not in mapping:
            raise InputError(f"{at}: node {current!r} is not in the mapping", _HINT)
        if current in seen:
            raise InputError(f"{at}: node {current!r} is its own ancestor", _HINT)
        node = mapping[current]
        if not isinstance(node, dict):
            raise InputError(f"{at}: node {current!r} is not an object", _HINT)
        seen.add(current)
        path.append(current)
        current = node.get("parent")
    path.reverse()
    return path


def _message(data: Any, at: str, node_id: str, calls: dict[str, str]) -> tuple[Message | None, int]:
    """A node's message and how many parts of it were left out (None: a node that is not one).
    `calls` holds the tool calls not answered yet, by tool name: a call adds one, its answer
    takes it, a user message clears them."""
    if data is None:
        return None, 0
    if not isinstance(data, dict):
        raise InputError(f"{at}: message is not an object", _HINT)
    author = data.get("author") or {}
    content = data.get("content") or {}
    if not isinstance(author, dict) or not isinstance(content, dict):
        raise InputError(f"{at}: author and content must be objects", _HINT)
    role, kind = author.get("role"), content.get("content_type")
    if not isinstance(kind, str | None):
        raise InputError(f"{at}: content_type is not a string", _HINT)
    meta = data.get("metadata") or {}
    if kind in _THOUGHTS or (
        isinstance(meta, dict) and meta.get("is_visually_hidden_from_conversation")
    ):
        return None, 0
    name = author.get("name") if isinstance(author.get("name"), str) else None
    text, dropped = _text(content, kind, at)
    if kind == "code":
        role = "assistant"
    elif kind == "execution_output":
        role = "tool"
    if role not in ("system", "user", "assistant", "tool"):
        raise InputError(f"{at}: unknown author role {role!r}", _HINT)
    ident: str = data["id"] if isinstance(data.get("id"), str) and data["id"] else node_id
    meta_out: dict[str, Any] = {"source_id": ident}
    when = data.get("create_time")
    recipient = data.get("recipient")
    if role == "user":
        calls.clear()
    if role == "assistant" and isinstance(recipient, str) and recipient not in ("", "all"):
        tool = _TOOL_NAME.sub("_", recipient)[:64]
        calls[recipient] = ident
        call = {
            "id": ident,
            "type": "function",
            "function": {"name": tool, "arguments": _args(text)},
        }
        meta_out["extra"] = {"content": None, "tool_calls": [call]}
        return message(at, "assistant", "", timestamp=when, metadata=meta_out), dropped
    if not text.strip():
        return None, dropped  # an empty system node, an image alone, a tool's empty result
    if role == "tool":
        answered = calls.pop(name, None) if name else None
        if answered is None and not name and calls:
            answered = calls.pop(next(reversed(calls)))
        if answered is not None:
            meta_out["extra"] = {"tool_call_id": answered}
    return message(at, role, text, name=name, timestamp=when, metadata=meta_out), dropped


#: What an OpenAI function name holds (`dalle.text2im` is called `dalle_text2im`).
_TOOL_NAME = re.compile(r"[^A-Za-z0-9_-]")


def _args(text: str) -> str:
    """A call's arguments as OpenAI has them, a JSON object: the text when it is one (DALL-E's
    prompt), else `{"input": text}` (code, a search, a memory)."""
    try:
        if isinstance(json.loads(text), dict):
            return text
    except (ValueError, RecursionError):  # (nested too deep for the parser: text)
        pass
    return json.dumps({"input": text}, ensure_ascii=False)


def _text(content: dict[str, Any], kind: Any, at: str) -> tuple[str, int]:
    """The text of a message's content, and how many non-text parts were left out."""
    if kind in ("code", "execution_output", "tether_quote", "system_error"):
        text = content.get("text")
        return (text, 0) if isinstance(text, str) else ("", 0)
    if kind == "tether_browsing_display":
        result = content.get("result")
        return (result, 0) if isinstance(result, str) else ("", 0)
    if kind not in ("text", "multimodal_text"):
        return "", 1  # a content type memcli does not read: left out, counted
    parts = content.get("parts")
    if not isinstance(parts, list):
        raise InputError(f"{at}: content has no parts", _HINT)
    texts, dropped = [], 0
    for part in parts:
        if isinstance(part, str):
            if part:
                texts.append(part)
        elif isinstance(part, dict) and part.get("content_type") == "audio_transcription":
            if isinstance(part.get("text"), str) and part["text"]:
                texts.append(part["text"])
        else:
            dropped += 1
    return "\n".join(texts), dropped


READER = Reader(
    "chatgpt", "ChatGPT's data export (conversations.json, or the .zip)", False, detect, read
)

"""LM Studio's conversations: a `.conversation.json` file (in LM Studio's `conversations`
folder), `{"name", "createdAt", "messages": [...], "systemPrompt", ...}`. Each message holds
its `versions` (regenerations and edits) and which is shown, `currentlySelected`: that version
is imported. A user version's `content` is a list of parts; an assistant's (`multiStep`) its
`steps`, whose `contentBlock`s hold the text (its reasoning, a block styled `thinking`, and
other steps are skipped). The system prompt (`systemPrompt`, or the chat's prediction config)
is the first message. Text parts are the content; files and images are left out and counted.
The conversation's `name` is its title, `lmstudio:CREATED_AT` its source id; LM Studio messages
have no ids.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memcli.errors import InputError
from memcli.formats.base import Conversation, clean_text, message, records, text_blocks
from memcli.formats.reader import Input, Reader, Source

if TYPE_CHECKING:
    from memcli.messages import Message

_HINT = "Give the .conversation.json as LM Studio saved it"
_ROLES = ("system", "user", "assistant")


def detect(source: Input) -> bool:
    """A `messages` list whose first message holds `versions`."""
    value = source.first
    messages = value.get("messages") if isinstance(value, dict) else None
    return (
        isinstance(messages, list)
        and bool(messages)
        and isinstance(messages[0], dict)
        and "versions" in messages[0]
    )


def read(source: Input) -> Source:
    return Source([_conversation(item, at) for at, item in source.entries()])


def _conversation(item: Any, at: str) -> Conversation:
    if not isinstance(item, dict) or not isinstance(item.get("messages"), list):
        raise InputError(f"{at}: no messages list", _HINT)
    messages: list[Message] = []
    system = _system(item)
    if system:
        messages.append(message(at, "system", system))
    dropped = 0
    for i, data in enumerate(item["messages"]):
        here = f"{at}: message {i}"
        version = _selected(data, here)
        role = version.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise InputError(f"{here}: role {role!r} is not one of {', '.join(_ROLES)}", _HINT)
        if version.get("type") == "multiStep" or "steps" in version:
            texts, left_out = [], 0
            steps = version.get("steps")
            if steps is not None and not isinstance(steps, list):
                raise InputError(f"{here}: steps {steps!r:.60} is not a list of steps", _HINT)
            for step in steps or []:
                style = step.get("style") if isinstance(step, dict) else None
                if not isinstance(step, dict) or step.get("type") != "contentBlock":
                    continue
                if isinstance(style, dict) and style.get("type") == "thinking":
                    continue
                found, n = _parts(step.get("content"), here)
                texts.append(found)
                left_out += n
            text = "\n\n".join(t for t in texts if t)
        else:
            text, left_out = _parts(version.get("content"), here)
        dropped += left_out
        if text.strip():
            messages.append(message(here, role, text))
    created = item.get("createdAt")
    ident = str(created) if isinstance(created, int) and not isinstance(created, bool) else None
    return Conversation(
        records(messages),
        source_id=f"lmstudio:{ident}" if ident else None,
        title=clean_text(item.get("name"), at, "its name"),
        dropped=dropped,
    )


def _selected(data: Any, at: str) -> dict[str, Any]:
    """The version of a message that is shown."""
    versions = data.get("versions") if isinstance(data, dict) else None
    if not isinstance(versions, list) or not versions:
        raise InputError(f"{at}: no versions", _HINT)
    chosen = data.get("currentlySelected", 0)
    if not isinstance(chosen, int) or not 0 <= chosen < len(versions):
        raise InputError(f"{at}: currentlySelected {chosen!r} is not one of its versions", _HINT)
    version = versions[chosen]
    if not isinstance(version, dict):
        raise InputError(f"{at}: version {chosen} is not an object", _HINT)
    return version


def _parts(content: Any, at: str) -> tuple[str, int]:
    """The text of a list of content parts, and how many parts that are not text were left out."""
    if isinstance(content, str):
        return content, 0
    if not isinstance(content, list):
        return "", 0
    return text_blocks(content, at, _HINT)


def _system(item: dict[str, Any]) -> str | None:
    """The conversation's system prompt: its chat's prediction config, else `systemPrompt`."""
    config = item.get("perChatPredictionConfig")
    fields = config.get("fields") if isinstance(config, dict) else None
    for field in fields if isinstance(fields, list) else []:
        if isinstance(field, dict) and field.get("key") == "llm.prediction.systemPrompt":
            value = field.get("value")
            if isinstance(value, str) and value.strip():
                return value
    value = item.get("systemPrompt")
    return value if isinstance(value, str) and value.strip() else None


READER = Reader("lmstudio", "an LM Studio .conversation.json", False, detect, read)

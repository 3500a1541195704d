"""SillyTavern's chats: a `.jsonl` file, a first line describing the chat (`user_name`,
`character_name`, `create_date`, `chat_metadata`) then a message per line (`name`, `is_user`,
`mes`, `send_date`, ...). A message of the user is a user message, any other an assistant
message (a narrator's, `extra.type` narrator, a system message), each under its speaker's
`name`; the shown swipe (`mes`) is the text, other swipes are not imported. `send_date` is
read as ISO 8601, Unix milliseconds or SillyTavern's "June 1, 2024 12:00pm" (taken as UTC).
The chat is `sillytavern:CHARACTER@CREATE_DATE`, titled "CHARACTER - CREATE_DATE"; SillyTavern
messages have no ids.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from memcli.errors import InputError
from memcli.formats.base import Conversation, clean_text, message, records, text_of
from memcli.formats.reader import Input, Reader, Source

if TYPE_CHECKING:
    from memcli.messages import Message

_HINT = "Give the chat's .jsonl as SillyTavern saved it (or exported it)"


def detect(source: Input) -> bool:
    """Whether the first line of JSON Lines is SillyTavern's (its header, or a message), or the
    input is one such object (a chat of one line)."""
    value = source.first
    return (
        isinstance(value, dict)
        and (source.is_lines or isinstance(source.value, dict))
        and (
            ("character_name" in value and "user_name" in value)
            or ("mes" in value and "is_user" in value)
        )
    )


def read(source: Input) -> Source:
    return Source(
        _read(source.lines("Give the chat's .jsonl as SillyTavern saved it"), source.name)
    )


def _read(lines: list[tuple[str, Any]], name: str) -> list[Conversation]:
    header: dict[str, Any] = {}
    if lines and isinstance(lines[0][1], dict) and "mes" not in lines[0][1]:
        header = lines[0][1]
        lines = lines[1:]
    messages: list[Message] = []
    for at, data in lines:
        if not isinstance(data, dict) or "mes" not in data:
            raise InputError(f"{at}: not a SillyTavern message (no mes)", _HINT)
        text = text_of(data.get("mes"), at, "mes", _HINT)
        if not text.strip():
            continue
        role = "user" if data.get("is_user") is True else "assistant"
        extra = data.get("extra")
        if isinstance(extra, dict) and extra.get("type") == "narrator":
            role = "system"
        speaker = data.get("name")
        speaker = speaker if isinstance(speaker, str) and speaker.strip() else None
        when = _time(data.get("send_date"))
        messages.append(message(at, role, text, name=speaker, timestamp=when))
    character = clean_text(header.get("character_name"), name, "character_name")
    created = header.get("create_date")
    created = clean_text(str(created) if isinstance(created, int) else created, name, "create_date")
    ident = f"{character}@{created}" if character and created else None
    title = " - ".join(t for t in (character, created) if t) or None
    return [
        Conversation(
            records(messages), source_id=f"sillytavern:{ident}" if ident else None, title=title
        )
    ]


def _time(value: Any) -> Any:
    """`send_date` as `message` takes it; None for a date no reader understands (a message is
    not refused for its date)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value / 1000 if value > 10**11 else value  # milliseconds, as JavaScript's
    if not isinstance(value, str) or not value.strip():
        return None
    from memcli.messages import parse_time

    try:
        parse_time(value)
        return value
    except InputError:
        pass
    for shape in ("%B %d, %Y %I:%M%p", "%B %d, %Y %I:%M:%S%p", "%b %d, %Y %I:%M%p"):
        try:
            return datetime.strptime(value.strip(), shape).replace(tzinfo=UTC).isoformat()
        except ValueError:
            continue
    return None


READER = Reader("sillytavern", "a SillyTavern chat (.jsonl)", True, detect, read)

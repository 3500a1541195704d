"""LM Studio's conversations: a `.conversation.json` file (in LM Studio's `conversations`
folder), `{"name", "createdAt", "messages": [...], "systemPrompt", ...}`. Each message holds
its `versions` (regenerations and edits) and which is shown, `currentlySelected`: that version
is imported. A user version's `content` is a list of parts; an assistant's (`multiStep`) its
`steps`, whose `contentBlock`s hold the text (its reasoning, a block styled `thinking`, and
other steps are skipped). The system prompt (`systemPrompt`, or the chat's prediction config)
is the first message. Text parts are the content; files and images are left out and counted.
The conversation's `name` is its title, `lmstudio:CREATED_AT` its source id; LM Studio messages
have no ids.

Times (`_dated`): LM Studio writes the conversation's `createdAt`, `userLastMessagedAt` and
`assistantLastMessagedAt` (milliseconds since the epoch), and each step of a reply an
identifier starting with the milliseconds it was made at (`1717243260000-0.27...`); other tools
that write the format put a `createdAt` on a message or a version. Each message is dated by the
first of: its version's, else its own `createdAt`; for a reply, its earliest step's time; for
the system prompt, the conversation's `createdAt`; else the time of the next message dated so
(a prompt by the reply it got), else, after the last one, the conversation's last time for its
role (`userLastMessagedAt`...), else its `createdAt`. A time field is milliseconds (a number of
10^11 or more), seconds (a smaller one) or an ISO 8601 string; anything else is an InputError
naming the message and the field. A step identifier of another form is only an id: it dates
nothing.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from memcli.errors import InputError
from memcli.formats.base import Conversation, clean_text, message, records, text_blocks
from memcli.formats.reader import Input, Reader, Source

if TYPE_CHECKING:
    from datetime import datetime

    from memcli.messages import Message

_HINT = "Give the .conversation.json as LM Studio saved it"
_TIME_HINT = (
    "LM Studio writes milliseconds since 1970; seconds and ISO 8601 (2024-06-01T12:00:00Z)"
    " are read too, between the years 1 and 9999"
)
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
    times: list[datetime | None] = []  # (each message's own time)
    created = item.get("createdAt")
    start = _time(created, at, "createdAt")
    system = _system(item)
    if system:
        messages.append(message(at, "system", system))
        times.append(start)
    dropped = 0
    for i, data in enumerate(item["messages"]):
        here = f"{at}: message {i}"
        version = _selected(data, here)
        own = version.get("createdAt")
        own = _time(data.get("createdAt") if own is None else own, here, "createdAt")
        role = version.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise InputError(f"{here}: role {role!r} is not one of {', '.join(_ROLES)}", _HINT)
        if version.get("type") == "multiStep" or "steps" in version:
            steps = version.get("steps")
            if steps is not None and not isinstance(steps, list):
                raise InputError(f"{here}: steps {steps!r:.60} is not a list of steps", _HINT)
            text, left_out = _steps_text(steps or [], here)
            own = own or _step_time(steps or [])
        else:
            text, left_out = _parts(version.get("content"), here)
        dropped += left_out
        if text.strip():
            messages.append(message(here, role, text))
            times.append(own)
    ident = str(created) if isinstance(created, int) and not isinstance(created, bool) else None
    last = {
        role: _time(item.get(key), at, key)
        for role, key in (("user", "userLastMessagedAt"), ("assistant", "assistantLastMessagedAt"))
    }
    messages = _dated(messages, times, last, start)
    return Conversation(
        records(messages),
        source_id=f"lmstudio:{ident}" if ident else None,
        title=clean_text(item.get("name"), at, "its name"),
        dropped=dropped,
    )


#: A step identifier LM Studio writes: the milliseconds since the epoch it was made at, a dash,
#: a random fraction.
_STEP_TIME = re.compile(r"([0-9]{12,14})-")
#: A time field's number from which on it is milliseconds (10^11 ms is 1973; 10^11 s, 5138).
_MILLISECONDS = 10**11


def _time(value: Any, at: str, field: str) -> datetime | None:
    """A time field of the file (None: there is none): milliseconds since the epoch, seconds
    (a number under `_MILLISECONDS`) or ISO 8601; InputError naming `at` and the field for a
    value that is no time."""
    from memcli.messages import parse_time

    if value is None:
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool)
    try:
        if number and abs(value) >= _MILLISECONDS:
            return parse_time(value / 1000)
        return parse_time(value)
    except (InputError, OverflowError) as exc:  # (OverflowError: an int past a float's range)
        said = exc.message if isinstance(exc, InputError) else ""
        if number:  # (the value as the file has it, not in seconds)
            text = str(value) if len(str(value)) <= 24 else str(value)[:21] + "..."
            said = f"{text} is not a time between the years 1 and 9999"
        raise InputError(f"{at}: {field}: {said}", _TIME_HINT) from None


def _step_time(steps: list[Any]) -> datetime | None:
    """When a reply began: the earliest time its steps' identifiers start with (None: none
    starts with one)."""
    from datetime import UTC, datetime

    found = [
        int(match.group(1))
        for step in steps
        if isinstance(step, dict)
        and isinstance(step.get("stepIdentifier"), str)
        and (match := _STEP_TIME.match(step["stepIdentifier"])) is not None
    ]
    return datetime.fromtimestamp(min(found) / 1000, tz=UTC) if found else None


def _dated(
    messages: list[Message],
    own: list[datetime | None],
    last: dict[str, datetime | None],
    created: datetime | None,
) -> list[Message]:
    """Each message with its time (the module's docstring says which): its own when it has
    one, else the next message's own time, else its role's last time, else `created`."""
    out: list[Message] = []
    later: datetime | None = None  # (the next message's own time, walking back)
    for m, when in zip(reversed(messages), reversed(own), strict=True):
        if when is not None:
            later = when
        when = when or later or last.get(m.role) or created
        out.append(m if when is None else replace(m, timestamp=when))
    return out[::-1]


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


def _steps_text(steps: list[Any], at: str) -> tuple[str, int]:
    """A reply's text: its content steps' (not its reasoning's), and how many parts that are
    not text were left out."""
    texts, left_out = [], 0
    for step in steps:
        style = step.get("style") if isinstance(step, dict) else None
        if not isinstance(step, dict) or step.get("type") != "contentBlock":
            continue
        if isinstance(style, dict) and style.get("type") == "thinking":
            continue
        found, n = _parts(step.get("content"), at)
        texts.append(found)
        left_out += n
    return "\n\n".join(t for t in texts if t), left_out


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

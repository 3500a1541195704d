"""Message: one chat message, as put into memory and as read back from the store."""

from __future__ import annotations

import json
import math
import os
import re
import unicodedata
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from memcli.errors import InputError

ROLES = ("system", "user", "assistant", "tool")
STATUSES = ("active", "archived")
#: Metadata may nest objects and arrays this deep (a deeper value is refused, not stored).
MAX_DEPTH = 100
#: A lone UTF-16 surrogate: not a character, and not encodable as UTF-8 (SQLite, files, pipes).
_SURROGATE = re.compile("[\ud800-\udfff]")
#: Characters JSON leaves raw that readers splitting on Unicode line breaks take for the end of a
#: line (Python's str.splitlines, JavaScript): written escaped, one record stays one line.
_LINE_BREAKS = {"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_TIME_HINT = (
    "Use ISO 8601 (e.g. 2023-05-08T13:56:00Z) or Unix seconds, between the years 1 and 9999"
)


@dataclass(frozen=True)
class Message:
    """A chat message.

    `role`, `content`, `name`, `metadata` and `timestamp` are what the caller gives; `id`, `tokens`,
    `status`, `flush_id` and `session_id` are filled in when the message is read back from a store.
    """

    role: str
    content: str
    name: str | None = None
    metadata: dict[str, Any] | None = None
    timestamp: datetime | None = None
    id: int | None = field(default=None, compare=False)
    tokens: int | None = field(default=None, compare=False)
    status: str | None = field(default=None, compare=False)
    flush_id: int | None = field(default=None, compare=False)
    session_id: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise InputError(
                f"unknown role {self.role!r}",
                f"Use one of: {', '.join(ROLES)}",
            )
        if not isinstance(self.content, str):
            raise InputError(
                f"content must be text, not {type(self.content).__name__}",
                "Give the message content as a string",
            )
        check_text(self.content, "content")
        if self.metadata is not None:
            if not isinstance(self.metadata, dict):
                raise InputError(
                    f"metadata must be an object, not {_json_type(self.metadata)}",
                    'Give metadata as a JSON object, e.g. {"source": "mail"}, or leave it out',
                )
            check_json(self.metadata, "metadata")
        if self.name is not None:
            if not isinstance(self.name, str):
                raise InputError("name must be text", "Give the name as a string")
            check_text(self.name, "name")
        if self.timestamp is not None and self.timestamp.tzinfo is None:
            object.__setattr__(self, "timestamp", self.timestamp.replace(tzinfo=UTC))

    @classmethod
    def plain(cls, role: str, content: str) -> Message:
        """`Message(role, content)` for a role and text already checked, without the checks.

        A transcript of 100,000 lines builds one per line; the dataclass `__init__` of a frozen
        class sets each of the ten fields through `object.__setattr__`, four times slower.
        """
        message = object.__new__(cls)
        fields = message.__dict__
        fields["role"] = role
        fields["content"] = content
        fields.update(_UNSET)
        return message

    def with_content(self, content: str) -> Message:
        """A copy with other content (used when memory is inserted into a message)."""
        return replace(self, content=content, tokens=None)

    def to_dict(self, *, stored: bool = False) -> dict[str, Any]:
        """The message as a JSON-ready dict; `stored` adds id, status, tokens and flush id."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name is not None:
            out["name"] = self.name
        if self.metadata:
            out["metadata"] = self.metadata
        if self.timestamp is not None:
            out["timestamp"] = format_time(self.timestamp)
        if stored:
            out["id"] = self.id
            out["session"] = session_name(self.session_id) if self.session_id else None
            out["status"] = self.status
            out["tokens"] = self.tokens
            out["flush_id"] = self.flush_id
        return out

    @classmethod
    def from_dict(cls, data: Any) -> Message:
        """Build a message from a JSON object; raises InputError naming what is wrong.

        Beside `role`, `content`, `name`, `timestamp` and `metadata` (and `session` and `status`,
        which a transcript's record holds), OpenAI's chat format is read:
        - `content` as an array of content parts: the text parts' texts joined with a newline,
          as LlamaIndex's `ChatMessage.content` joins its text blocks; a part of another type
          (image_url, input_audio, file, refusal) is refused;
        - an assistant message with `tool_calls` (or `function_call`) and `"content": null` or
          no content: its content is empty text, and `null` is kept to be written back.
        Every other key (`tool_calls`, `tool_call_id`, or any key memcli does not know) is kept,
        as given, in `metadata["extra"]`; `export_record` writes them back on the record.
        """
        if not isinstance(data, dict):
            raise InputError(
                "a message must be a JSON object", 'Write {"role": ..., "content": ...}'
            )
        if "role" not in data:
            raise InputError("missing role", 'Every message needs a "role"')
        role = data["role"]
        if not isinstance(role, str):
            raise InputError("role must be text", f"Use one of: {', '.join(ROLES)}")
        extra = {key: value for key, value in data.items() if key not in _RECORD_KEYS}
        if role == DEVELOPER:  # OpenAI's newer name for system: stored so, written back as it came
            role, extra = "system", {"role": DEVELOPER, **extra}
        content: Any = data.get("content")  # not text: refused by __post_init__
        if content is None and role == "assistant" and _CALLS.intersection(data):
            extra = {"content": None, **extra}
            content = ""
        elif "content" not in data:
            raise InputError("missing content", 'Every message needs a "content"')
        elif isinstance(content, list):
            content = _join_parts(content)
        _check_tool_keys(extra)
        timestamp = data.get("timestamp")
        metadata = data.get("metadata")
        # null and {} both mean none; any other non-object is refused by __post_init__
        metadata = None if metadata == {} else metadata
        if extra and (metadata is None or isinstance(metadata, dict)):
            if metadata is not None and EXTRA in metadata:
                raise InputError(
                    f'metadata has a key "{EXTRA}", which holds the keys of a message memcli'
                    f" has no field for ({', '.join(map(repr, extra))})",
                    "Rename that metadata key",
                )
            metadata = {**(metadata or {}), EXTRA: extra}
        return cls(
            role=role,
            content=content,
            name=data.get("name"),
            metadata=metadata,
            timestamp=parse_time(timestamp) if timestamp is not None else None,
        )

    def export_record(self) -> dict[str, Any]:
        """`to_dict` with the keys kept in `metadata["extra"]` (see `from_dict`) back on the
        record, where they came from: `from_dict` reads it back to an equal message."""
        record = self.to_dict()
        extra = (self.metadata or {}).get(EXTRA)
        if not isinstance(extra, dict) or not all(
            key not in _RECORD_KEYS
            or (key == "content" and value is None and not self.content)
            or (key == "role" and value == DEVELOPER and self.role == "system")
            for key, value in extra.items()
        ):
            return record  # not what from_dict keeps there: left in the metadata
        metadata = {key: value for key, value in record["metadata"].items() if key != EXTRA}
        lifted = {"role": self.role, "content": self.content, **extra}
        for key, value in record.items():
            if key not in ("role", "content", "metadata"):
                lifted[key] = value
            elif key == "metadata" and metadata:
                lifted[key] = metadata
        return lifted


#: The key of a message's metadata that holds the keys of its record memcli has no field for.
EXTRA = "extra"
#: OpenAI's role for system instructions in newer models: read as system, its `role` kept in
#: `metadata["extra"]` so that `export_record` writes it back.
DEVELOPER = "developer"
#: The keys of a message record that are not kept in `metadata["extra"]`: the fields of a
#: Message, the record's `session`, and `status` (written by `memcli export --all`; an import
#: puts every message through the engine, which decides what is flushed).
_RECORD_KEYS = frozenset(("role", "content", "name", "timestamp", "metadata", "session", "status"))
#: The keys that let an assistant message have no content (OpenAI's chat format).
_CALLS = frozenset(("tool_calls", "function_call"))
_PARTS_HINT = 'Give the content as text, or as text parts {"type": "text", "text": ...}'


def _join_parts(parts: list[Any]) -> str:
    """The text of OpenAI content parts: each part's text, joined with a newline (as LlamaIndex's
    `ChatMessage.content` joins text blocks); InputError for a part that is not text."""
    texts = []
    for i, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str):
            what = (
                f"{_json_type(part)}" if not isinstance(part, dict) else 'an object without "type"'
            )
            raise InputError(
                f"content must be text or an array of content parts: part {i} is {what}",
                _PARTS_HINT,
            )
        if kind != "text":
            raise InputError(
                f"content part {i} is of type {_short(kind, 40)}: memcli stores text only",
                f"Remove the {_short(kind, 40)} parts or replace them with text parts",
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise InputError(f'content part {i} has no "text" string', _PARTS_HINT)
        others = [key for key in part if key not in ("type", "text")]
        if others:
            raise InputError(
                f"content part {i} has a key {_short(others[0], 40)} memcli does not keep",
                'Give each text part as {"type": "text", "text": ...} only',
            )
        texts.append(text)
    return "\n".join(texts)


def _check_tool_keys(extra: dict[str, Any]) -> None:
    """`tool_calls` an array of objects and `tool_call_id` text, as in OpenAI's format."""
    calls = extra.get("tool_calls")
    if "tool_calls" in extra and (
        not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls)
    ):
        if isinstance(calls, list):
            i, call = next((i, c) for i, c in enumerate(calls) if not isinstance(c, dict))
            what = f"tool_calls[{i}] is {_json_type(call)}"
        else:
            what = f"not {_json_type(calls)}"
        raise InputError(
            f"tool_calls must be an array of objects, {what}",
            'Write tool_calls as OpenAI does: [{"id": ..., "type": "function", "function": ...}]',
        )
    call_id = extra.get("tool_call_id")
    if "tool_call_id" in extra and not isinstance(call_id, str):
        raise InputError(
            f"tool_call_id must be text, not {_json_type(call_id)}",
            "Give the id of the tool call this message answers",
        )


#: The fields a plain message leaves at their defaults.
_UNSET: dict[str, Any] = {
    "name": None,
    "metadata": None,
    "timestamp": None,
    "id": None,
    "tokens": None,
    "status": None,
    "flush_id": None,
    "session_id": None,
}


def format_time(value: datetime) -> str:
    """UTC ISO 8601, seconds precision or finer, with a Z."""
    value = value.astimezone(UTC)
    text = value.isoformat()
    return text.replace("+00:00", "Z")


def parse_time(value: Any) -> datetime:
    """Parse an ISO 8601 time (a naive one is taken as UTC) or a Unix time in seconds; a time
    that is not a number or a string, not finite, or outside the years 1 to 9999 (in UTC) is an
    InputError."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InputError(f"invalid timestamp {_short(value)}", _TIME_HINT)
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"invalid timestamp {value!r}: not a finite number", _TIME_HINT)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(
                value.replace("Z", "+00:00") if value.endswith("Z") else value
            )
        except ValueError:
            raise InputError(f"invalid timestamp {_short(value)}", _TIME_HINT) from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
    try:
        if isinstance(value, str):
            return parsed.astimezone(UTC)
        return datetime.fromtimestamp(value, tz=UTC)
    except (OverflowError, OSError, ValueError):
        # beyond time_t, or a year outside 1-9999, here or once moved to UTC
        raise InputError(f"timestamp {_short(value)} is out of range", _TIME_HINT) from None


def _short(value: Any, width: int = 60) -> str:
    """`repr(value)`, cut to about `width` characters (an error message quotes the value)."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _json_type(value: Any) -> str:
    """The JSON name of a parsed value's type, with the value when short: `false`, `[]`."""
    if value is None or isinstance(value, bool | int | float):
        return (
            json.dumps(value) if not isinstance(value, int) or abs(value) < 10**20 else "a number"
        )
    if isinstance(value, str):
        return f"a string {_short(value, 30)}"
    if isinstance(value, list):
        return "[]" if not value else "an array"
    if isinstance(value, dict):
        return "{}" if not value else "an object"
    return type(value).__name__


def check_text(value: str, what: str) -> None:
    """Raise InputError when `value` holds a lone surrogate (`"\\ud800"` in JSON): it is no
    character, and neither SQLite nor a UTF-8 file can hold it."""
    if value.isascii():
        return
    found = _SURROGATE.search(value)
    if found is not None:
        raise InputError(
            f"{what} holds a lone surrogate {found.group()!r} at character {found.start()}",
            "Text must be valid Unicode: no bytes that are not UTF-8, and in JSON a character"
            " beyond U+FFFF written as a whole surrogate pair (e.g. \\ud83d\\ude00)",
        )


def check_json(value: Any, what: str) -> None:
    """Raise InputError, naming the place (`metadata["a"][2]`), unless `value` is JSON that every
    reader takes back the same: objects with text keys, arrays, valid Unicode text, whole
    numbers, finite floats, true, false, null, nested at most MAX_DEPTH deep."""
    stack: list[tuple[Any, str, int]] = [(value, what, 0)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, str):
            check_text(item, where)
        elif item is None or isinstance(item, bool | int):
            continue
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise InputError(
                    f"{where} is {item!r}, not a finite number",
                    "JSON has no NaN or Infinity: use a finite number, a string or null",
                )
        elif isinstance(item, dict | list | tuple):  # a tuple is stored as a JSON array
            if depth >= MAX_DEPTH:
                raise InputError(
                    f"{what} is nested more than {MAX_DEPTH} levels deep",
                    "Flatten the value",
                )
            if isinstance(item, list | tuple):
                stack.extend((v, f"{where}[{i}]", depth + 1) for i, v in enumerate(item))
                continue
            for key, v in item.items():
                if not isinstance(key, str):
                    raise InputError(f"{where} has a key {key!r} that is not text", "Use text keys")
                prefix, _, path = where.rpartition(": ")
                check_text(key, f"{prefix}: a key in {path}" if prefix else f"a key in {path}")
                stack.append((v, f"{where}[{_short(key, 40)}]", depth + 1))
        else:
            raise InputError(
                f"{where} holds a {type(item).__name__}, which JSON cannot hold",
                "Use objects, arrays, text, numbers, true, false or null",
            )


#: Between a session's name and its user in the key of a session whose name another user's
#: session had first (`session_key`): a control character, which no name can hold (`check_name`).
KEY_SEPARATOR = "\x1f"


def session_key(name: str, user_id: str) -> str:
    """The store's key of `user_id`'s session `name` when another user's session has the name
    itself as its key: sessions are named per user, keys are unique in the store. Never shown:
    `session_name` gives the name back."""
    return f"{name}{KEY_SEPARATOR}{user_id}"


def session_name(key: str) -> str:
    """The name of the session stored under `key` (what its user calls it, and every command,
    tool and the library shows): the key up to `KEY_SEPARATOR`, or the whole key."""
    return key.partition(KEY_SEPARATOR)[0]


def new_session_id() -> str:
    """A short random session id."""
    import uuid

    return uuid.uuid4().hex[:12]


def check_name(value: Any, what: str, example: str = "") -> str:
    """The one rule for a name a person gives (a user, a session, a title): text, valid
    Unicode, without control characters (a newline, a tab, an escape: they split rows and
    move terminals' cursors), not blank; returned with the whitespace around it trimmed.
    InputError (exit 2) naming `what` otherwise; `example` ends its hint (`e.g. --user ana`)."""
    hint = f"Give a name, e.g. {example}" if example else "Give a name"
    if not isinstance(value, str):
        raise InputError(f"{what} must be text, not {_json_type(value)}", hint)
    check_text(value, what)
    name = value.strip()
    if not name:
        raise InputError(f"{what} must not be empty", hint)
    bad = next((c for c in name if unicodedata.category(c) in ("Cc", "Zl", "Zp")), None)
    if bad is not None:
        raise InputError(
            f"{what} holds a control character (U+{ord(bad):04X}) at character {value.index(bad)}",
            "Names are one line of printable text: leave out newlines, tabs and escapes",
        )
    return name


def validate_session_id(value: Any, what: str = "session") -> str:
    """A session id as given (a flag, a record's "session"), by `check_name`'s rule: trimmed;
    InputError when it is blank, holds control characters or is no valid Unicode."""
    return check_name(value, what, "--session work")


def validate_user(value: Any, what: str = "user") -> str:
    """A user name as given (--user, MEMCLI_USER, `user` in the config, a tool's or a Memory's
    user_id), by `check_name`'s rule: trimmed; InputError otherwise."""
    return check_name(value, what, "--user ana")


def to_json_line(record: dict[str, Any]) -> str:
    """One JSON Lines record, without its newline: UTF-8 text as is, datetimes as `format_time`,
    paths as text, and U+0085, U+2028, U+2029 escaped so that every reader, whatever it takes
    for a line break, sees one record per line (`memcli import` reads it back the same)."""
    text = json.dumps(record, ensure_ascii=False, default=_json_default)
    if "\x85" in text or "\u2028" in text or "\u2029" in text:
        for char, escaped in _LINE_BREAKS.items():
            text = text.replace(char, escaped)
    return text


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return format_time(value)
    if hasattr(value, "__fspath__"):
        return os.fspath(value)
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def metadata_json(metadata: dict[str, Any] | None) -> str | None:
    """Metadata as stored: JSON text, or None when there is none."""
    if not metadata:
        return None
    return json.dumps(metadata, ensure_ascii=False, sort_keys=False)

"""Message: one chat message, as put into memory and as read back from the store."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from memcli.errors import InputError

ROLES = ("system", "user", "assistant", "tool")
STATUSES = ("active", "archived")


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
        if self.metadata is not None and not isinstance(self.metadata, dict):
            raise InputError("metadata must be an object", "Give metadata as a JSON object")
        if self.name is not None and not isinstance(self.name, str):
            raise InputError("name must be text", "Give the name as a string")
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
            out["session"] = self.session_id
            out["status"] = self.status
            out["tokens"] = self.tokens
            out["flush_id"] = self.flush_id
        return out

    @classmethod
    def from_dict(cls, data: Any) -> Message:
        """Build a message from a JSON object; raises InputError naming what is wrong."""
        if not isinstance(data, dict):
            raise InputError(
                "a message must be a JSON object", 'Write {"role": ..., "content": ...}'
            )
        if "role" not in data:
            raise InputError("missing role", 'Every message needs a "role"')
        if "content" not in data:
            raise InputError("missing content", 'Every message needs a "content"')
        role = data["role"]
        if not isinstance(role, str):
            raise InputError("role must be text", f"Use one of: {', '.join(ROLES)}")
        timestamp = data.get("timestamp")
        return cls(
            role=role,
            content=data["content"],
            name=data.get("name"),
            metadata=data.get("metadata") or None,
            timestamp=parse_time(timestamp) if timestamp is not None else None,
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
    """Parse an ISO 8601 time (a naive one is taken as UTC) or a Unix time in seconds."""
    if isinstance(value, bool):
        raise InputError(f"invalid timestamp {value!r}", "Use ISO 8601, e.g. 2023-05-08T13:56:00Z")
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, tz=UTC)
    if not isinstance(value, str):
        raise InputError(f"invalid timestamp {value!r}", "Use ISO 8601, e.g. 2023-05-08T13:56:00Z")
    try:
        parsed = datetime.fromisoformat(
            value.replace("Z", "+00:00") if value.endswith("Z") else value
        )
    except ValueError:
        raise InputError(
            f"invalid timestamp {value!r}", "Use ISO 8601, e.g. 2023-05-08T13:56:00Z"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def metadata_json(metadata: dict[str, Any] | None) -> str | None:
    """Metadata as stored: JSON text, or None when there is none."""
    if not metadata:
        return None
    return json.dumps(metadata, ensure_ascii=False, sort_keys=False)

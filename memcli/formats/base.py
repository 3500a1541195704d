"""What every format reader gives: `Conversation`, and the helpers that build its messages and
name its errors (the readers import this, and `memcli.formats` them)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memcli.errors import InputError

if TYPE_CHECKING:
    from memcli.messages import Message
    from memcli.transcripts import Record


#: How a source id made from a conversation's content (`content_ids`) starts.
CONTENT_ID = "sha256:"


@dataclass
class Conversation:
    """One conversation to import: its records in order (each one put call, see `plan_calls`),
    the session it goes to (None: a new one), and what its source says of it: its own id, a
    title, record-level keys to keep (stored on the session), and how many non-text parts were
    left out of its messages."""

    records: list[Record]
    session: str | None = None
    source_id: str | None = None
    title: str | None = None
    keys: dict[str, Any] = field(default_factory=dict)
    dropped: int = 0
    #: Found in a stored session by its source id (set by the import): what it shares with
    #: that session's start is stored, not only what the session ends with.
    matched: bool = False

    @property
    def messages(self) -> list[Message]:
        return [m for r in self.records for m in r.messages]


def where(name: str, i: int, conversation: dict[str, Any]) -> str:
    """How an error names a conversation of an export: its position and title."""
    title = conversation.get("title") or conversation.get("name")
    return f"{name}: conversation {i}" + (f" ({title!r})" if isinstance(title, str) else "")


def message(
    where: str,
    role: str,
    content: Any,
    *,
    name: Any = None,
    timestamp: Any = None,
    metadata: dict[str, Any] | None = None,
) -> Message:
    """A message of an export; InputError naming `where` for a value that is not as it should be."""
    from memcli.messages import Message, parse_time

    try:
        when = parse_time(timestamp) if timestamp is not None else None
        return Message(role, content, name=name, metadata=metadata or None, timestamp=when)
    except InputError as exc:
        raise InputError(f"{where}: {exc.message}", exc.hint) from None


def records(messages: list[Message]) -> list[Record]:
    """An export's messages as records of one message each (one put call each, as a message
    per line is: flushes happen as they did live)."""
    from memcli.transcripts import Record

    return [Record(i, [m]) for i, m in enumerate(messages)]


def content_ids(found: list[Conversation]) -> list[Conversation]:
    """Give each conversation without a source id one from its content: a hash of its first two
    messages (which a conversation that grew still starts with), numbered when several of
    `found` start alike. (One imported into a session it names is found by it later too.)"""
    seen: dict[str, int] = {}
    for c in found:
        if c.source_id is not None or not c.records:
            continue
        first = [(m.role, m.content) for m in c.messages[:2]]
        digest = hashlib.sha256(json.dumps(first, ensure_ascii=False).encode()).hexdigest()
        n = seen[digest] = seen.get(digest, 0) + 1
        c.source_id = f"{CONTENT_ID}{digest[:24]}" + (f"#{n}" if n > 1 else "")
    return found

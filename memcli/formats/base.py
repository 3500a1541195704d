"""What every format reader gives: `Conversation`, and the helpers that build its messages and
name its errors (the readers import this, and `memcli.formats` them)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memcli.errors import InputError

if TYPE_CHECKING:
    from memcli.messages import Message
    from memcli.transcripts import Record


#: How a source id made from a conversation's content (`content_ids`) starts.
CONTENT_ID = "sha256:"
_MiB = 2**20


@dataclass(frozen=True)
class Limits:
    """The bounds an input is read within, each checked before what it bounds is read whole (so
    that memory stays under about 1 GB whatever the input); over one, `InputError` names the
    file or entry and nothing is stored."""

    #: Bytes of a file, of a zip's conversations expanded, of the text read from a database.
    #: Parsed, JSON takes 4.7x its size in memory for text-heavy conversations and up to 12.7x
    #: for conversations of one-word messages (measured: 167 MB -> 790 MB, 174 MB -> 2.2 GB):
    #: 80 MiB keeps the worst at about 1 GB.
    max_bytes: int = 80 * _MiB
    #: How many times its compressed size a zip entry may expand to (past its first MiB).
    max_ratio: int = 100
    #: Files of an export split in a zip (`conversations-000.json`, ...).
    max_parts: int = 1000
    #: Rows read from one table of a database.
    max_rows: int = 2_000_000
    #: Seconds reading a database may take.
    max_seconds: float = 600.0
    #: Characters of an attachment's text kept with its message.
    max_attachment: int = 4 * _MiB


#: The bounds `memcli import` reads within.
LIMITS = Limits()


def clean_text(value: Any, at: str, what: str) -> str | None:
    """A string of a conversation (its id, its title) when it is one and valid Unicode; None when
    it is no string or empty; InputError naming `at` for a lone surrogate (which no store holds)."""
    if not isinstance(value, str) or not value.strip():
        return None
    from memcli.messages import check_text

    try:
        check_text(value, what)
    except InputError as exc:
        raise InputError(f"{at}: {exc.message}", exc.hint) from None
    return value


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
    #: Whose session it is, when the import decided it (a session found or named by its
    #: source id: the importing user's); None: the session's name says (`importing.align`).
    user: str | None = None

    @property
    def messages(self) -> list[Message]:
        return [m for r in self.records for m in r.messages]


def where(name: str, i: int, conversation: Any) -> str:
    """How an error names a conversation of an export: its position and title."""
    if not isinstance(conversation, dict):
        return f"{name}: conversation {i}"
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
    source_id: str | None = None,
) -> Message:
    """A message of an export; InputError naming `where` for a value that is not as it should be.

    `source_id`: the message's own id in the export (a node id, a uuid), kept as
    `metadata["source_id"]`, by which a second import of the export knows it (stored, or deleted
    for good: `memcli.importing`). Every reader of a format whose messages have ids gives it."""
    from memcli.messages import Message, parse_time

    if source_id is not None:
        metadata = {**(metadata or {}), "source_id": source_id}
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
    import hashlib

    seen: dict[str, int] = {}
    for c in found:
        if c.source_id is not None or not c.records:
            continue
        first = [(m.role, m.content) for m in c.messages[:2]]
        digest = hashlib.sha256(json.dumps(first, ensure_ascii=False).encode()).hexdigest()
        n = seen[digest] = seen.get(digest, 0) + 1
        c.source_id = f"{CONTENT_ID}{digest[:24]}" + (f"#{n}" if n > 1 else "")
    return found


def json_lines(data: bytes, name: str, hint: str) -> list[tuple[str, Any]]:
    """The JSON value of each line of JSON Lines that is not blank, with where it is
    (`name:line`); InputError naming the line that is not JSON."""
    found = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if number == 1:
            raw = raw.lstrip(b"\xef\xbb\xbf")
        if not raw.strip():
            continue
        try:
            found.append((f"{name}:{number}", json.loads(raw)))
        except (ValueError, RecursionError):
            raise InputError(f"{name}:{number}: invalid JSON", hint) from None
    return found


def text_of(value: Any, at: str, what: str, hint: str) -> str:
    """A message's text (None: empty); InputError naming `at` when it is not a string."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InputError(f"{at}: {what} is not a string", hint)
    return value


def tool_call(ident: str, name: str, arguments: Any) -> dict[str, Any]:
    """A tool call as OpenAI has it in an assistant message's `tool_calls`."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"id": ident, "type": "function", "function": {"name": name, "arguments": arguments}}


def text_blocks(blocks: list[Any], at: str, hint: str) -> tuple[str, int]:
    """The text of a list of content blocks (`{"type": "text", "text": ...}`) joined by newlines,
    and how many blocks of other types were left out; InputError naming `at` for a text block
    without text."""
    texts, dropped = block_texts(blocks, at, hint)
    return "\n".join(texts), dropped


def block_texts(
    blocks: list[Any], at: str, hint: str, skipped: frozenset[str] = frozenset()
) -> tuple[list[str], int]:
    """The texts of a list of content blocks, and how many blocks of other types were left out
    (blocks whose type is in `skipped` are passed over without counting)."""
    texts, dropped = [], 0
    for block in blocks:
        if isinstance(block, dict) and block.get("type") == "text":
            if not isinstance(block.get("text"), str):
                raise InputError(f"{at}: a text block without text", hint)
            texts.append(block["text"])
        elif not (
            isinstance(block, dict)
            and isinstance(block.get("type"), str)
            and block["type"] in skipped
        ):
            dropped += 1
    return texts, dropped

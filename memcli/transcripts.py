"""Transcript formats: reading, detecting, parsing and writing them, nothing more (storing them is
`memcli.importing`; this module imports nothing of the engine). Every error names the place (file
and line) it comes from.

Formats read:
- JSON Lines, one message per line: `{"role", "content"}` with optional `session`, `name`,
  `timestamp`, `metadata`;
- JSON Lines, one conversation per line: `{"messages": [...]}` (OpenAI fine-tuning files), with an
  optional `session`;
- a JSON array of messages;
- a first `{"type": "session", ...}` record (`SessionRecord`, as `memcli export` writes it).

Messages in OpenAI's chat format are read too (see `Message.from_dict`): content-part arrays
(text parts joined with a newline; other parts refused), assistant `tool_calls` with
`"content": null`, `tool` messages' `tool_call_id`; every key of a message memcli has no field
for is kept in `metadata["extra"]` (counting towards its tokens, as metadata does) and written
back on the record by `export_lines`.
"""

from __future__ import annotations

import json
import json.scanner
import os
import re
import sys
from dataclasses import dataclass
from datetime import UTC
from typing import IO, TYPE_CHECKING, Any, NamedTuple

from memcli.errors import InputError, UsageError
from memcli.flush import Budget
from memcli.messages import ROLES, Message, check_json, session_name, validate_session_id

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence
    from pathlib import Path

    from memcli.store.base import SessionInfo

PUT_MODES = ("message", "batch", "call")
_ROLES = frozenset(ROLES)
#: A `\\uD800`-`\\uDFFF` escape: the only way a surrogate gets into decoded JSON (strict UTF-8
#: decoding refuses encoded ones). A line with one has every string it holds checked.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class _Refused(ValueError):
    """JSON that Python's parser takes but a transcript must not hold."""


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Refused(f"duplicate key {key!r}", "Give each key once")
            seen.add(key)
    return obj


def _constant(name: str) -> Any:
    raise _Refused(f"{name} is not JSON", "Write a finite number, a string or null")


#: The JSON parser of transcripts: Python's, refusing duplicate keys (which the standard parser
#: silently resolves to the last) and NaN / Infinity (which no other JSON reader takes).
_DECODER = json.JSONDecoder(object_pairs_hook=_object, parse_constant=_constant)
_JSON_HINT = "Each line must be one JSON object"


class Record(NamedTuple):
    """One record of a transcript: a message, or a conversation of several, and where it was."""

    line: int
    messages: list[Message]
    session: str | None = None
    is_conversation: bool = False
    #: A conversation line's keys beside `messages` and `session` (`tools`, `weight`, ...).
    keys: dict[str, Any] | None = None
    #: Non-text content parts (images, audio, files) left out of its messages.
    dropped: int = 0


def read_source(
    source: str | Path, stdin: IO[bytes] | None = None, limit: int | None = None
) -> tuple[bytes, str]:
    """The bytes of a file, or of stdin for `-`, and the name errors should use for it; with
    `limit`, InputError for more bytes than that (never read past it)."""
    name = str(source)
    if name == "-":
        if stdin is None:
            stdin = sys.stdin.buffer
        data = stdin.read() if limit is None else stdin.read(limit + 1)
        name = "<stdin>"
    else:
        try:
            with open(source, "rb") as handle:
                if limit is not None and os.fstat(handle.fileno()).st_size > limit:
                    raise _too_big(name, limit)
                data = handle.read() if limit is None else handle.read(limit + 1)
        except FileNotFoundError:
            raise InputError(f"no such file: {name}", "Check the path") from None
        except OSError as exc:
            raise InputError(
                f"cannot read {name}: {exc}", "Check the path and permissions"
            ) from None
    if limit is not None and len(data) > limit:
        raise _too_big(name, limit)
    return data, name


def _too_big(name: str, limit: int) -> InputError:
    return InputError(
        f"{name}: more than {limit:,} bytes, the most memcli reads of one input",
        "Split it into smaller files and import them one by one",
    )


def parse_transcript(data: bytes, name: str = "<input>") -> list[Record]:
    """Parse transcript bytes in any of the formats read."""
    if is_array(data):
        return _parse_array(data, name)
    return list(_parse_lines(data, name))


def is_array(data: bytes) -> bool:
    stripped = data.lstrip()
    if stripped.startswith(b"\xef\xbb\xbf"):
        stripped = stripped[3:].lstrip()
    return stripped.startswith(b"[")


def _decode(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{where}: invalid UTF-8 at byte {exc.start}", "Save the file as UTF-8"
        ) from None


def _is_plain(obj: Any) -> bool:
    """A message that is only a known role and a text, `{"role": ..., "content": "..."}`: the
    common line, which needs no further checks (any other goes through `Message.from_dict`)."""
    return (
        type(obj) is dict
        and len(obj) == 2
        and type(obj.get("role")) is str
        and obj["role"] in _ROLES
        and type(obj.get("content")) is str
    )


def _parse_lines(data: bytes, name: str) -> Iterator[Record]:
    plain = Message.plain
    for number, obj in _line_objects(data, name):
        if _is_plain(obj):
            yield Record(number, [plain(obj["role"], obj["content"])])
        else:
            yield _record(obj, number, f"{name}:{number}")


def _line_objects(data: bytes, name: str, first_line: int = 1) -> Iterator[tuple[int, Any]]:
    """The JSON value of each line that is not blank, with its line number (`data` starting at
    line `first_line` of the source)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + first_line
        start = data.rfind(b"\n", 0, exc.start) + 1
        raise InputError(
            f"{name}:{line}: invalid UTF-8 at byte {exc.start - start}", "Save the file as UTF-8"
        ) from None
    # The C scanner behind json.loads, without its Python wrappers: a third of the time on a
    # long file. A line it cannot take whole goes through _loads, which names the error.
    # (typeshed types make_scanner's argument as itself; a JSONDecoder is what it takes.)
    scan = json.scanner.make_scanner(_DECODER)  # type: ignore[arg-type]
    escapes = _SURROGATE_ESCAPE.search(text) is not None
    for number, raw in enumerate(text.split("\n"), start=first_line):
        if number == 1:
            raw = raw.lstrip("\ufeff")
        try:
            obj, end = scan(raw, 0)
            if end != len(raw) and not raw[end:].isspace():
                raise ValueError
        except (StopIteration, ValueError, RecursionError):
            if not raw or raw.isspace():
                continue
            obj = _loads(raw, f"{name}:{number}")
        if escapes and _SURROGATE_ESCAPE.search(raw):
            _check_strings(obj, f"{name}:{number}")
        yield number, obj


def _check_strings(obj: Any, where: str) -> None:
    """Every string of a record valid Unicode (no lone surrogate); the error names the field."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            check_json(key, f"{where}: a key")
            check_json(value, f"{where}: {key}")
    else:
        check_json(obj, where)


class Columns(NamedTuple):
    """A transcript as the flush policy sees it, without building a Message per line.

    `roles` and `contents` are per message, in order; `metadata` holds `str(metadata)` by position
    for the messages that have some (its tokens count too); `sizes` is how many messages each
    record holds (a conversation line several); `sessions` the sessions the records name.
    """

    roles: list[str]
    contents: list[str]
    metadata: dict[int, str]
    sizes: list[int]
    sessions: set[str]


def parse_columns(data: bytes, name: str = "<input>", first_line: int = 1) -> Columns:
    """Parse transcript bytes into columns: the checks of `parse_transcript`, the same errors
    naming the line. `first_line` > 1: `data` is the rest of a JSON Lines
    source from that line on (errors name the source's line)."""
    columns = Columns([], [], {}, [], set())
    if first_line == 1 and is_array(data):
        for record in _parse_array(data, name):
            _add_record(columns, record)
        return columns
    roles, contents, sizes = columns.roles, columns.contents, columns.sizes
    first = first_line == 1
    for number, obj in _line_objects(data, name, first_line):
        if first and is_session_record(obj):
            first = False
            continue  # the session record `memcli export` writes first: no message
        first = False
        if _is_plain(obj):
            roles.append(obj["role"])
            contents.append(obj["content"])
            sizes.append(1)
        elif not _add_conversation(columns, obj):
            _add_record(columns, _record(obj, number, f"{name}:{number}"))
    return columns


def is_session_record(obj: Any) -> bool:
    """The `{"type": "session", ...}` record `memcli export` writes first (see
    `SessionRecord`): no message, whatever other keys it has."""
    return type(obj) is dict and obj.get("type") == "session" and "role" not in obj


def _add_conversation(columns: Columns, obj: Any) -> bool:
    """Add a `{"messages": [...]}` line of plain messages (`_is_plain`); False, adding nothing,
    for any other line (it takes the checked path)."""
    items = obj.get("messages") if type(obj) is dict and len(obj) == 1 else None
    if type(items) is not list or not all(_is_plain(item) for item in items):
        return False
    columns.roles.extend([item["role"] for item in items])
    columns.contents.extend([item["content"] for item in items])
    columns.sizes.append(len(items))
    return True


def _add_record(columns: Columns, record: Record) -> None:
    for m in record.messages:
        if m.metadata:
            columns.metadata[len(columns.roles)] = str(m.metadata)
        columns.roles.append(m.role)
        columns.contents.append(m.content)
    columns.sizes.append(len(record.messages))
    if record.session is not None:
        columns.sessions.add(record.session)


def call_sizes(sizes: Sequence[int], put: str = "call") -> list[int]:
    """How many messages each put call holds: `plan_calls` on records of these sizes."""
    if put not in PUT_MODES:
        raise InputError(f"unknown put mode {put!r}", f"Use one of: {', '.join(PUT_MODES)}")
    total = sum(sizes)
    if put == "batch":
        return [total] if total else []
    if put == "message":
        return [1] * total
    return [n for n in sizes if n]


def _loads(raw: str, where: str, hint: str = _JSON_HINT, *, whole_file: bool = False) -> Any:
    """`raw` (a line, or with `whole_file` the file) parsed by `_DECODER`; InputError naming
    `where` (with the line of a syntax error in a whole file) and what is wrong."""
    try:
        return _DECODER.decode(raw)
    except json.JSONDecodeError as exc:
        line = f":{exc.lineno}" if whole_file else ""
        raise InputError(f"{where}{line}: invalid JSON ({exc.msg})", hint) from None
    except _Refused as exc:
        message, fix = exc.args
        raise InputError(f"{where}: invalid JSON ({message})", fix) from None
    except RecursionError:
        raise InputError(
            f"{where}: JSON nested too deeply for the parser", "Flatten the record"
        ) from None
    except ValueError:  # a number of more digits than int() takes
        raise InputError(
            f"{where}: invalid JSON (a number of more than {sys.get_int_max_str_digits()} digits)",
            "Write a number this long as a string",
        ) from None


def _parse_array(data: bytes, name: str) -> list[Record]:
    text = _decode(data, name).lstrip("\ufeff")
    items = _loads(text, name, "The file must be one JSON array", whole_file=True)
    if not isinstance(items, list):
        raise InputError(f"{name}: expected a JSON array of messages", "See `memcli import --help`")
    escapes = _SURROGATE_ESCAPE.search(text) is not None
    records = []
    for i, item in enumerate(items):
        if escapes:
            _check_strings(item, f"{name}: item {i}")
        records.append(_record(item, i, f"{name}: item {i}", in_array=True))
    return records


def _record(obj: Any, line: int, where: str, in_array: bool = False) -> Record:
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(obj).__name__}", _FORMATS)
    session = obj.get("session")
    if session is not None:
        try:
            validate_session_id(session)
        except InputError as exc:
            raise InputError(f"{where}: {exc.message}", _FORMATS) from None
    if "messages" in obj and not in_array:
        items = obj["messages"]
        if not isinstance(items, list):
            raise InputError(f"{where}: messages must be a list", _FORMATS)
        plain = Message.plain
        messages = []
        dropped = 0
        for i, item in enumerate(items):
            if _is_plain(item):
                messages.append(plain(item["role"], item["content"]))
                continue
            item, left_out = text_parts(item)
            dropped += left_out
            messages.append(_message(item, f"{where}: message {i}"))
        keys = {k: v for k, v in obj.items() if k not in ("messages", "session")}
        return Record(line, messages, session, True, keys or None, dropped)
    obj, dropped = text_parts(obj)
    return Record(line, [_message(obj, where)], session, dropped=dropped)


def text_parts(obj: Any) -> tuple[Any, int]:
    """A message object whose `content` is an array of content parts, without the parts that
    are not text (`image_url`, `input_audio`, `file`, ...), and how many were left out: memcli
    stores text, and one image does not refuse a transcript."""
    content = obj.get("content") if isinstance(obj, dict) else None
    if not isinstance(content, list):
        return obj, 0
    kept = [p for p in content if not isinstance(p, dict) or p.get("type") in ("text", None)]
    if len(kept) == len(content):
        return obj, 0
    return {**obj, "content": kept}, len(content) - len(kept)


def _message(obj: Any, where: str) -> Message:
    try:
        return Message.from_dict(obj)
    except InputError as exc:
        raise InputError(f"{where}: {exc.message}", exc.hint) from None


_FORMATS = (
    'Write one {"role": ..., "content": ...} per line, one {"messages": [...]} per line,'
    " or a JSON array of messages"
)


def plan_calls(records: Iterable[Record], put: str = "call") -> list[list[Message]]:
    """Group a transcript's messages into put calls.

    `message`: one put per message; `batch`: one put_messages with everything; `call`: one call per
    record (a conversation line is one put_messages call, a single-message line a call of one).
    """
    if put not in PUT_MODES:
        raise InputError(f"unknown put mode {put!r}", f"Use one of: {', '.join(PUT_MODES)}")
    records = list(records)
    if put == "batch":
        everything = [m for r in records for m in r.messages]
        return [everything] if everything else []
    if put == "message":
        return [[m] for r in records for m in r.messages]
    return [list(r.messages) for r in records if r.messages]


def export_lines(
    messages: Iterable[Message], *, with_status: bool = False
) -> Iterator[dict[str, Any]]:
    """Records that `parse_transcript` reads back to the same messages."""
    for m in messages:
        record = m.export_record()
        if m.session_id is not None:
            record["session"] = session_name(m.session_id)
        if with_status:
            record["status"] = m.status
        yield record


@dataclass(frozen=True)
class SessionRecord:
    """The `{"type": "session", ...}` record `memcli export` writes first: the session's id,
    user and budget, so that an import recreates them; and where an import found it: its
    conversation's `title` and `source_id`, and `metadata`, the record-level keys of its source
    (a fine-tuning line's `tools`, `parallel_tool_calls`, ...) to write back."""

    id: str | None = None
    user: str | None = None
    budget: Budget | None = None
    title: str | None = None
    source_id: str | None = None
    metadata: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        record: dict[str, Any] = {"type": "session", "id": self.id, "user": self.user}
        if self.budget is not None:
            record["token_limit"] = self.budget.token_limit
            record["chat_history_token_ratio"] = self.budget.chat_history_token_ratio
            record["token_flush_size"] = self.budget.flush_size
        for key in ("title", "source_id", "metadata"):
            if getattr(self, key):
                record[key] = getattr(self, key)
        return record

    @classmethod
    def of(cls, info: SessionInfo) -> SessionRecord:
        """The session's record; a stored budget that is not valid (edited by hand) is left out,
        so that the session can still be exported."""
        try:
            budget: Budget | None = Budget(
                info.token_limit, info.chat_history_token_ratio, info.token_flush_size
            )
        except UsageError:
            budget = None
        return cls(info.name, info.user_id, budget, info.title, info.source_id, info.metadata)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> SessionRecord:
        """Read a session record; InputError naming `where` for a bad value."""
        id, user = data.get("id"), data.get("user")
        for key, value in (("id", id), ("user", user)):
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise InputError(f"{where}: session {key} must be a non-empty string", _EXPORT)
        budget = None
        values = [data.get(k) for k in _BUDGET_KEYS]
        if any(v is not None for v in values):
            if values[0] is None or values[1] is None:
                raise InputError(
                    f"{where}: a session record gives token_limit and chat_history_token_ratio",
                    _EXPORT,
                )
            try:
                budget = Budget(values[0], values[1], values[2])
            except UsageError as exc:
                raise InputError(f"{where}: {exc.message}", _EXPORT) from None
        title, source_id, metadata = (data.get(k) for k in ("title", "source_id", "metadata"))
        for key, value in (("title", title), ("source_id", source_id)):
            if value is not None and not isinstance(value, str):
                raise InputError(f"{where}: session {key} must be a string", _EXPORT)
        if metadata is not None and not isinstance(metadata, dict):
            raise InputError(f"{where}: session metadata must be an object", _EXPORT)
        return cls(id, user, budget, title, source_id, metadata or None)


_BUDGET_KEYS = ("token_limit", "chat_history_token_ratio", "token_flush_size")
_EXPORT = "Write it as `memcli export` does, or leave the session record out"


def split_session_record(data: bytes, name: str = "<input>") -> tuple[SessionRecord | None, bytes]:
    """The session record on the first line of JSON Lines `data`, if there is one, and the
    data without it (its line left blank, so that errors still name the right lines)."""
    offset = 0
    line = 1
    while offset < len(data):
        end = data.find(b"\n", offset)
        end = len(data) if end < 0 else end
        raw = data[offset:end]
        if line == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        if raw.strip():
            break
        offset, line = end + 1, line + 1
    else:
        return None, data
    if b'"session"' not in raw or not raw.lstrip().startswith(b"{"):
        return None, data
    try:
        obj = json.loads(raw)
    except ValueError:
        return None, data  # the transcript reader names the error
    if not isinstance(obj, dict) or obj.get("type") != "session":
        return None, data
    return SessionRecord.from_dict(obj, f"{name}:{line}"), data[:offset] + data[end:]


# -- writing other formats: OpenAI's chat format, a Markdown transcript --------------------------

#: The formats `memcli export` writes.
EXPORT_FORMATS = ("jsonl", "openai", "markdown")
#: OpenAI's current name for a system message, kept so by an import (a `system` message whose
#: kept keys hold `"role": "developer"`) and written back as it came.
_DEVELOPER = "developer"


def openai_message(m: Message) -> dict[str, Any]:
    """A message in OpenAI's chat format: role, content, name, and the keys of its source
    record that memcli kept (`tool_calls`, `tool_call_id`, `"content": null` of a tool call,
    `weight`, ...: see `Message.from_dict`). memcli's own metadata and the timestamp are left
    out (OpenAI's format has no place for them; `jsonl` keeps them)."""
    record = m.export_record()
    out = {key: value for key, value in record.items() if key not in ("metadata", "timestamp")}
    extra = (m.metadata or {}).get("extra")
    if isinstance(extra, dict):
        for key, value in extra.items():  # (export_record leaves them in metadata when a key
            if key != "role" and key not in out:  # is one memcli has a field for)
                out[key] = value
        if m.role == "system" and extra.get("role") == _DEVELOPER:
            out["role"] = _DEVELOPER
    return out


def session_record_keys(info: Any) -> dict[str, Any] | None:
    """The record-level keys of a conversation line (`tools`, `parallel_tool_calls`, `weight`,
    ...) an import kept on the session: its metadata's `record_keys` when that is an object, else
    its metadata itself (without memcli's own `title` / `source_id`); None when it has none."""
    metadata = getattr(info, "metadata", None)
    if not isinstance(metadata, dict):
        return None
    keys = metadata.get("record_keys", metadata)
    if not isinstance(keys, dict):
        return None
    keys = {k: v for k, v in keys.items() if k not in ("messages", "session", "title", "source_id")}
    return keys or None


def markdown_transcript(
    messages: Iterable[Message],
    session: str | None = None,
    user: str | None = None,
    title: str | None = None,
) -> Iterator[str]:
    """A session as a Markdown transcript for people, in pieces to write one after another: a
    title (the conversation's, else the session's id) with the session and user under it, then
    per message a `##` heading with its role (and speaker name), id, time (UTC) and status when
    archived, and its text as it is (code blocks kept), its tool calls as JSON."""
    if title and title.strip():
        heading = "# " + " ".join(title.split())
    else:
        heading = f"# Session {session}" if session else "# Conversation"
    about = [f"Session: {session}"] if session and title and title.strip() else []
    about += [f"User: {user}"] if user else []
    yield heading + ("\n\n" + "  \n".join(about) + "\n" if about else "\n")
    for m in messages:
        yield "\n" + _markdown_message(m)


def _markdown_message(m: Message) -> str:
    role = m.role
    extra = (m.metadata or {}).get("extra")
    extra = extra if isinstance(extra, dict) else {}
    if role == "system" and extra.get("role") == _DEVELOPER:
        role = _DEVELOPER
    parts = [role.capitalize() + (f" ({m.name})" if m.name else "")]
    if m.id is not None:
        parts.append(f"#{m.id}")
    if m.timestamp is not None:
        parts.append(m.timestamp.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"))
    if m.status == "archived":
        parts.append("archived")
    if extra.get("tool_call_id"):
        parts.append(f"reply to {extra['tool_call_id']}")
    lines = ["## " + " · ".join(parts), ""]
    if m.content:
        lines += [m.content.rstrip("\n"), ""]
    calls = extra.get("tool_calls") or extra.get("function_call")
    if calls:
        fence = _fence(json.dumps(calls, ensure_ascii=False, indent=2))
        lines += [
            "Tool calls:",
            "",
            fence + "json",
            json.dumps(calls, ensure_ascii=False, indent=2),
        ]
        lines += [fence, ""]
    return "\n".join(lines)


def _fence(text: str) -> str:
    """A code fence longer than any run of backticks in `text`."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)

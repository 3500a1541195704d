"""The formats people's conversations come in, detected by their shape: the layer below
`memcli.importing` that turns a file into conversations (it imports nothing of the engine:
messages, errors, `memcli.transcripts` only).

- `transcript`: memcli's own formats (`memcli.transcripts`): a message per line, an OpenAI
  fine-tuning / chat file (one `{"messages": [...]}` conversation per line), a JSON array of
  messages, `memcli export`'s output;
- `chatgpt`: ChatGPT's data export (`conversations.json`, or the `.zip` it comes in);
- `claude`: Claude.ai's data export (`conversations.json`, or its `.zip`);
- `llm`: simonw/llm's `logs.db` (both its schemas) and the output of `llm logs --json`
  (`memcli.formats.llm_logs`);
- `sharegpt`: ShareGPT datasets (`{"conversations": [{"from", "value"}]}`, JSON or JSON Lines);
- `openwebui`: Open WebUI's "export all chats" JSON, or one chat's;
- `sillytavern`: a SillyTavern chat (`.jsonl`);
- `lmstudio`: an LM Studio `.conversation.json`;
- `anthropic`: Anthropic Messages API JSON (`{"system", "messages"}` with content blocks).

Each conversation found carries its id in the source (`source_id`: `chatgpt:ID`, `claude:UUID`,
`llm:ID`, ...; one without gets a hash of its first messages when the import needs one), its
title, and how many non-text parts (images, audio, files) were left out of it. Each message
carries its id in the source, where the format has one, in `metadata["source_id"]`.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
import zlib
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from memcli.errors import InputError
from memcli.formats.base import LIMITS, Conversation, Limits
from memcli.transcripts import SessionRecord, parse_transcript, read_source, split_session_record

if TYPE_CHECKING:
    from pathlib import Path

    from memcli.transcripts import Record

__all__ = ["FORMATS", "LIMITS", "Conversation", "Limits", "Source", "read"]

#: The names `--format` takes (`auto`: by the input's shape).
FORMATS = (
    "auto",
    "transcript",
    "chatgpt",
    "claude",
    "llm",
    "sharegpt",
    "openwebui",
    "sillytavern",
    "lmstudio",
    "anthropic",
)
#: The formats read as JSON Lines (one record a line) as well as JSON.
_LINES = ("sharegpt", "sillytavern")


@dataclass
class Source:
    """What a file holds: its format, and either the records of a transcript (grouped into
    conversations by the import, which knows `--session`) with the session record it starts
    with, or the conversations of an export."""

    format: str
    name: str
    records: list[Record] = field(default_factory=list)
    header: SessionRecord | None = None
    conversations: list[Conversation] = field(default_factory=list)

    @property
    def dropped(self) -> int:
        return sum(r.dropped for r in self.records) + sum(c.dropped for c in self.conversations)


_SQLITE = b"SQLite format 3\x00"
_ZIP = b"PK\x03\x04"
_SPLIT = re.compile(r"(?:^|/)conversations(?:-\d+)?\.json$")


def read(
    source: str | Path,
    stdin: IO[bytes] | None = None,
    format: str = "auto",
    limits: Limits = LIMITS,
) -> Source:
    """Read a file (`-`: stdin) in any format read, validated whole, within `limits`; InputError
    naming the file, and the line, entry or conversation, for anything that is not as its
    format says or is over a limit."""
    if format not in FORMATS:
        raise InputError(f"unknown format {format!r}", f"Use one of: {', '.join(FORMATS)}")
    if _is_sqlite_file(source):  # opened by SQLite, never read whole
        from memcli.formats import llm_logs

        name = str(source)
        return Source("llm", name, conversations=llm_logs.read_db(None, name, name, limits))
    data, name = read_source(source, stdin, limits.max_bytes)
    if data.startswith(_SQLITE):
        from memcli.formats import llm_logs

        return Source("llm", name, conversations=llm_logs.read_db(data, name, None, limits))
    if data.startswith(_ZIP):
        data, name = _unzip(data, name, limits)
    if format == "transcript":
        return _transcript(data, name)
    value = _whole_json(data) if format != "transcript" else None
    kind = format if format != "auto" else _shape(value, data, name)
    if kind == "transcript":
        return _transcript(data, name)
    if kind in _LINES:
        return _lines(kind, value, data, name)
    if value is None:
        raise InputError(
            f"{name}: not a JSON {kind} export", "Give the export's conversations.json"
        )
    items = value if isinstance(value, list) else [value]
    if kind == "chatgpt":
        from memcli.formats import chatgpt

        return Source(kind, name, conversations=chatgpt.read(items, name))
    if kind == "claude":
        from memcli.formats import claude

        return Source(kind, name, conversations=claude.read(items, name, limits))
    if kind == "openwebui":
        from memcli.formats import openwebui

        return Source(kind, name, conversations=openwebui.read(items, name))
    if kind == "lmstudio":
        from memcli.formats import lmstudio

        return Source(kind, name, conversations=lmstudio.read(items, name))
    if kind == "anthropic":
        from memcli.formats import anthropic

        return Source(kind, name, conversations=anthropic.read(items, name))
    from memcli.formats import llm_logs

    return Source("llm", name, conversations=llm_logs.read_json(items, name))


def _lines(kind: str, value: Any, data: bytes, name: str) -> Source:
    """A format read as JSON Lines (or, ShareGPT, as one JSON array or object too)."""
    from memcli.formats.base import json_lines

    if kind == "sillytavern":
        from memcli.formats import sillytavern

        lines = json_lines(data, name, "Give the chat's .jsonl as SillyTavern saved it")
        return Source(kind, name, conversations=sillytavern.read(lines, name))
    from memcli.formats import sharegpt

    if value is not None:
        items = value if isinstance(value, list) else [value]
        return Source(kind, name, conversations=sharegpt.read_array(items, name))
    lines = json_lines(data, name, "Write one ShareGPT conversation per line")
    return Source(kind, name, conversations=sharegpt.read(lines))


def _is_sqlite_file(source: str | Path) -> bool:
    """Whether `source` names a file (not stdin) that starts as an SQLite database does."""
    if str(source) == "-":
        return False
    try:
        with open(source, "rb") as handle:
            return handle.read(len(_SQLITE)) == _SQLITE
    except OSError:
        return False  # read_source says why


def export_kind(data: bytes, name: str = "<input>") -> str | None:
    """Which export a file's bytes are ("chatgpt", "claude", "llm", ...), or None: a transcript, or
    something no reader takes. For a command that reads transcripts only, to say so."""
    if data.startswith(_SQLITE):
        return "llm"
    try:
        if data.startswith(_ZIP):
            data, name = _unzip(data, name)
        kind = _shape(_whole_json(data), data, name)
    except InputError:
        return None
    return None if kind == "transcript" else kind


def _transcript(data: bytes, name: str) -> Source:
    header, rest = split_session_record(data, name)
    return Source("transcript", name, records=parse_transcript(rest, name), header=header)


def _whole_json(data: bytes) -> Any:
    """The file as one JSON value (None: it is not one, e.g. JSON Lines)."""
    stripped = data.lstrip().lstrip(b"\xef\xbb\xbf").lstrip()
    if stripped[:1] not in (b"[", b"{"):
        return None
    try:
        return json.loads(stripped)
    except (ValueError, RecursionError):
        return None  # JSON Lines, or broken JSON: the transcript reader names the error


def _shape(value: Any, data: bytes, name: str) -> str:
    """The format of a file by its shape; InputError naming what it saw when it is none."""
    from memcli.formats import anthropic, lmstudio, openwebui, sillytavern

    items = value if isinstance(value, list) else [value] if isinstance(value, dict) else None
    first = next((item for item in items or () if isinstance(item, dict)), None)
    if first is None and value is None:
        first, name = _first_line(data, name)
        if sillytavern.is_chat_line(first):
            return "sillytavern"
        if first is not None and isinstance(first.get("conversations"), list):
            return "sharegpt"
        if first is not None and not (
            "role" in first or "messages" in first or first.get("type") == "session"
        ):
            raise _unknown(name, first, "a JSON object")
        return "transcript"
    if first is None:
        return "transcript"  # an empty array, or not objects: the reader says what is wrong
    if isinstance(first.get("mapping"), dict):
        return "chatgpt"
    if "chat_messages" in first:
        return "claude"
    if "prompt" in first and "response" in first and "conversation_id" in first:
        return "llm"
    if isinstance(first.get("conversations"), list):
        return "sharegpt"
    if openwebui.is_chat(first):
        return "openwebui"
    if lmstudio.is_conversation(first):
        return "lmstudio"
    if anthropic.is_request(first):
        return "anthropic"
    if isinstance(value, dict) and sillytavern.is_chat_line(value):
        return "sillytavern"  # a chat of one line
    if isinstance(value, dict) and not (
        "role" in first or "messages" in first or first.get("type") == "session"
    ):
        raise _unknown(name, first, "a JSON object")
    if isinstance(value, list) and "role" not in first:
        raise _unknown(name, first, "a JSON array of objects")
    return "transcript"


def _first_line(data: bytes, name: str) -> tuple[dict[str, Any] | None, str]:
    """The first line of JSON Lines as an object, and its place (None: not an object)."""
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if raw.strip():
            try:
                value = json.loads(raw.lstrip(b"\xef\xbb\xbf"))
            except (ValueError, RecursionError):
                return None, name
            return (value if isinstance(value, dict) else None), f"{name}:{number}"
    return None, name


def _unknown(name: str, obj: dict[str, Any], what: str) -> InputError:
    keys = ", ".join(list(obj)[:8]) or "none"
    return InputError(
        f"{name}: {what} with keys {keys}: not a format memcli reads",
        "memcli reads messages ({role, content}) and {messages: [...]} lines (OpenAI),"
        " ChatGPT and Claude.ai exports (conversations.json or the .zip), llm's logs.db and"
        " `llm logs --json`, ShareGPT, Open WebUI chats, SillyTavern .jsonl chats, LM Studio"
        " .conversation.json and Anthropic Messages JSON; or give --format"
        f" ({', '.join(FORMATS[1:])})",
    )


def _unzip(data: bytes, name: str, limits: Limits = LIMITS) -> tuple[bytes, str]:
    """The conversations of an export's zip: its `conversations.json`, or the parts ChatGPT
    splits it into (`conversations-000.json`, ...) joined as one JSON array. Each entry is read
    within `limits` (its declared and its actual size, and how much it expands)."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        entries = sorted(
            (i for i in archive.infolist() if _SPLIT.search(i.filename)), key=lambda i: i.filename
        )
        if not entries:
            raise InputError(
                f"{name}: a zip without conversations.json", "Give the export's zip as it came"
            )
        if len(entries) > limits.max_parts:
            raise InputError(
                f"{name}: a zip of {len(entries):,} conversation files, more than the"
                f" {limits.max_parts:,} memcli reads",
                "Import the conversations in smaller zips or files",
            )
        if len(entries) == 1:
            return _entry(archive, entries[0], name, limits), f"{name}:{entries[0].filename}"
        declared = sum(i.file_size for i in entries)
        if declared > limits.max_bytes:
            raise _over(name, f"its conversations expand to {declared:,} bytes", limits)
        parts = []
        for entry in entries:
            value = _whole_json(_entry(archive, entry, name, limits))
            if not isinstance(value, list):
                raise InputError(
                    f"{name}:{entry.filename}: not a JSON array", "Give the zip as it came"
                )
            parts.extend(value)
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, RuntimeError) as exc:
        raise InputError(f"{name}: not a readable zip ({exc})", "Give the zip as it came") from None
    except NotImplementedError as exc:  # a compression method zipfile does not know
        raise InputError(f"{name}: {exc}", "Give the zip as it came") from None
    return json.dumps(parts).encode(), name


#: An entry may expand by any ratio up to this size (small files compress as they may).
_RATIO_FREE = 2**20
_CHUNK = 2**20


def _entry(archive: zipfile.ZipFile, entry: zipfile.ZipInfo, name: str, limits: Limits) -> bytes:
    """An entry's bytes, read a chunk at a time: InputError (naming it) as soon as it is larger
    than it says, than `limits.max_bytes`, or expands more than `limits.max_ratio` times."""
    at = f"{name}:{entry.filename}"
    most = min(entry.file_size, limits.max_bytes)
    if entry.file_size > limits.max_bytes:
        raise _over(at, f"it expands to {entry.file_size:,} bytes", limits)
    ratio_cap = max(_RATIO_FREE, limits.max_ratio * max(entry.compress_size, 1))
    if entry.file_size > ratio_cap:
        raise _bomb(at, entry, limits)
    chunks, size = [], 0
    with archive.open(entry) as handle:
        while chunk := handle.read(_CHUNK):
            size += len(chunk)
            if size > most:
                raise _over(at, "it holds more bytes than its header says", limits)
            if size > ratio_cap:
                raise _bomb(at, entry, limits)
            chunks.append(chunk)
    return b"".join(chunks)


def _over(at: str, what: str, limits: Limits) -> InputError:
    return InputError(
        f"{at}: {what}, more than the {limits.max_bytes:,} memcli reads of one input",
        "Import the conversations in smaller files",
    )


def _bomb(at: str, entry: zipfile.ZipInfo, limits: Limits) -> InputError:
    return InputError(
        f"{at}: expands from {entry.compress_size:,} bytes to more than"
        f" {limits.max_ratio} times that, as a zip bomb does",
        "Give the export's zip as it came",
    )

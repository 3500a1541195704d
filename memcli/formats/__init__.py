"""The formats people's conversations come in, detected by their shape: the layer below
`memcli.importing` that turns a file into conversations (it imports nothing of the engine:
messages, errors, `memcli.transcripts` only).

`READERS` is the table of the formats memcli reads, in the order their shapes are tried: each
module of the package exports its `Reader` (`memcli.formats.reader`), and `FORMATS`, detection,
`memcli import --help` and the error for an input of no known shape are made from the table.
Adding a format is one module and one entry here (each module's docstring says what its format
holds and what is kept of it); a package adds one with an entry point of the group
`memcli.formats` (`memcli.formats.plugins`, docs/formats.md).

An input is unwrapped first (a zip's conversations: `memcli.formats.archive`; a database file is
opened where it is, never read whole), then read by the first reader whose `detect` knows it (or
the one `--format` names), validated whole (`memcli.formats.reader`).

Each conversation found carries its id in the source (`source_id`: `chatgpt:ID`, `claude:UUID`,
`llm:ID`, ...; one without gets a hash of its first messages when the import needs one), its
title, and how many non-text parts (images, audio, files) were left out of it. Each message
carries its id in the source, where the format has one, in `metadata["source_id"]`.
"""

from __future__ import annotations

from typing import IO, TYPE_CHECKING

from memcli.errors import InputError
from memcli.formats import (
    anthropic,
    chatgpt,
    claude,
    llm_logs,
    lmstudio,
    openwebui,
    sharegpt,
    sillytavern,
    transcript,
)
from memcli.formats.base import LIMITS, Conversation, Limits
from memcli.formats.reader import SQLITE, Input, Reader, Source

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

__all__ = [
    "FORMATS",
    "LIMITS",
    "READERS",
    "Conversation",
    "Input",
    "Limits",
    "Reader",
    "Source",
    "detect",
    "named",
    "names",
    "read",
]

#: The formats memcli reads, in the order their shapes are tried: the first whose `detect`
#: says yes reads the input. The transcript is last: it is what messages are when no export's
#: shape fits.
READERS: tuple[Reader, ...] = (
    chatgpt.READER,
    claude.READER,
    llm_logs.READER,
    sharegpt.READER,
    openwebui.READER,
    lmstudio.READER,
    anthropic.READER,
    sillytavern.READER,
    transcript.READER,
)
#: The names `--format` takes (`auto`: by the input's shape; a plugin's name too).
FORMATS = ("auto", *(r.name for r in READERS))
_BUILT_IN = {r.name: r for r in READERS}


def read(
    source: str | Path,
    stdin: IO[bytes] | None = None,
    format: str = "auto",
    limits: Limits = LIMITS,
) -> Source:
    """Read a file (`-`: stdin) in any format read, validated whole, within `limits`; InputError
    naming the file, and the line, entry or conversation, for anything that is not as its
    format says or is over a limit. `format`: a name of `FORMATS` or of a plugin's format;
    "auto" (and for a database, whatever it says) tells it by the input's shape."""
    reader = None if format == "auto" else named(format)
    found = _input(source, stdin, limits)
    if reader is None or found.is_database:  # (llm's logs.db, whatever --format says)
        reader = detect(found)
    if not reader.lines and found.is_lines:  # (a transcript is not parsed as one JSON value)
        raise InputError(
            f"{found.name}: not a JSON {reader.name} export", "Give the export's conversations.json"
        )
    result = reader.read(found)
    result.format, result.name = reader.name, found.name
    return result


def named(format: str) -> Reader:
    """The reader `--format` names: a built-in one, else an installed plugin's (loaded only
    then); InputError when there is none."""
    reader = _BUILT_IN.get(format)
    if reader is None and format != "auto":
        from memcli.formats import plugins

        reader = plugins.named(format, _BUILT_IN)
    if reader is None:
        raise InputError(f"unknown format {format!r}", f"Use one of: {', '.join(names())}")
    return reader


def names() -> list[str]:
    """What `--format` takes: `FORMATS`, then the formats installed plugins add (whose
    packages are not imported)."""
    from memcli.formats import plugins

    return [*FORMATS, *(name for name in plugins.names() if name not in FORMATS)]


def detect(found: Input) -> Reader:
    """The reader of an input, by its shape: the first of `READERS` whose `detect` says yes,
    else (only then) the first plugin's; an input no reader knows is read as a transcript when
    it holds no JSON object (its reader names the line), else InputError naming what it saw and
    the formats memcli reads."""
    reader = _claimed(READERS, found)
    if reader is None:
        from memcli.formats import plugins

        reader = _claimed(plugins.readers(_BUILT_IN), found)
    if reader is not None:
        return reader
    if found.first is None and not found.is_database:
        _refuse_text(found)
        return transcript.READER
    raise _unknown(found)


#: What a JSON document or JSON Lines file starts with (after a byte-order mark and spaces).
_JSON_START = (b"{", b"[")


def _refuse_text(found: Input) -> None:
    """InputError for an input that is not JSON at all (its first character opens no JSON value:
    a CSV file, Markdown, plain text), naming what it looks like, rather than 'invalid JSON' on
    its line 1. A JSON file with an error in it is left to the transcript reader, which names
    the line."""
    data = found.data.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not data or data.startswith(_JSON_START):
        return
    lines = data.decode("utf-8", "replace").splitlines()[:3]
    hint = (
        "memcli reads JSON: exports (see `memcli import --help`) and JSON Lines transcripts, one"
        ' {"role": ..., "content": ...} object per line'
    )
    if found.name.lower().endswith((".csv", ".tsv")) or _delimited(lines):
        raise InputError(f"{found.name}: CSV is not a format memcli reads", hint)
    raise InputError(f"{found.name}: not JSON (it starts with {lines[0][:40]!r})", hint)


def _delimited(lines: list[str]) -> bool:
    """Whether lines look like a table of delimited values: each of at least two holds the same
    number (one or more) of one delimiter."""
    if len(lines) < 2:
        return False
    return any(
        lines[0].count(sep) > 0 and all(line.count(sep) == lines[0].count(sep) for line in lines)
        for sep in (",", ";", "\t")
    )


def export_kind(data: bytes, name: str = "<input>") -> str | None:
    """Which export a file's bytes are ("chatgpt", "claude", "llm", ...: a built-in format), or
    None: a transcript, or something no reader takes. For a command that reads transcripts only,
    to say so."""
    try:
        reader = _claimed(READERS, _bytes_input(data, name, LIMITS))
    except InputError:
        return None
    return None if reader is None or reader is transcript.READER else reader.name


def _claimed(readers: Iterable[Reader], found: Input) -> Reader | None:
    """The first of `readers` whose format `found` is (input that is no JSON value is asked of
    the readers that read such input only)."""
    return next((r for r in readers if (r.lines or not found.is_lines) and r.detect(found)), None)


def _input(source: str | Path, stdin: IO[bytes] | None, limits: Limits) -> Input:
    """A file as its reader sees it: a database file by its path (SQLite opens it: it is never
    read whole), else its bytes within `limits.max_bytes` (a zip's conversations, unzipped)."""
    if _is_sqlite_file(source):
        return Input(b"", str(source), limits, is_database=True, path=str(source))
    from memcli.transcripts import read_source

    data, name = read_source(source, stdin, limits.max_bytes)
    return _bytes_input(data, name, limits)


def _bytes_input(data: bytes, name: str, limits: Limits) -> Input:
    if data.startswith(SQLITE):
        return Input(data, name, limits, is_database=True)
    from memcli.formats import archive

    if data.startswith(archive.ZIP):
        data, name = archive.unzip(data, name, limits)
    return Input(data, name, limits)


def _is_sqlite_file(source: str | Path) -> bool:
    """Whether `source` names a file (not stdin) that starts as an SQLite database does."""
    if str(source) == "-":
        return False
    try:
        with open(source, "rb") as handle:
            return handle.read(len(SQLITE)) == SQLITE
    except OSError:
        return False  # read_source says why


def _unknown(found: Input) -> InputError:
    """The error of an input no reader knows: what it is, and what memcli reads."""
    if found.is_database:
        what = "an SQLite database"
    else:
        keys = ", ".join(list(found.first or {})[:8]) or "none"
        shape = "a JSON array of objects" if isinstance(found.value, list) else "a JSON object"
        what = f"{shape} with keys {keys}"
    return InputError(
        f"{found.at}: {what}: not a format memcli reads",
        f"memcli reads {'; '.join(r.help for r in READERS)}; or give --format"
        f" ({', '.join(FORMATS[1:])})",
    )

"""memcli's own formats, read by `memcli.transcripts`: a `{"role", "content"}` message per line,
an OpenAI fine-tuning / chat file (one `{"messages": [...]}` conversation per line), a JSON array
of messages, and `memcli export`'s output (its first `{"type": "session"}` record is the session
record). Its records are grouped into conversations by the import, which knows `--session`.

Last in the table: it is what an input of messages is when no export's shape fits.
"""

from __future__ import annotations

from typing import Any

from memcli.formats.reader import Input, Reader, Source


def detect(source: Input) -> bool:
    """Messages, conversations or a session record; JSON holding no object (an empty array);
    an empty input. (Input that is no JSON at all is left to plugins, then read as a transcript
    by `memcli.formats.detect`, so that the error names its line.)"""
    first = source.first
    if source.is_database:
        return False
    if first is None:
        return source.value is not None or not source.data.strip()
    if isinstance(source.value, list):
        return "role" in first
    return _is_record(first)


def _is_record(value: dict[str, Any]) -> bool:
    return "role" in value or "messages" in value or value.get("type") == "session"


def read(source: Input) -> Source:
    from memcli.transcripts import parse_transcript, split_session_record

    header, rest = split_session_record(source.data, source.name)
    return Source(records=parse_transcript(rest, source.name), header=header)


READER = Reader(
    "transcript",
    "{role, content} messages or {messages: [...]} lines (OpenAI)",
    True,
    detect,
    read,
)

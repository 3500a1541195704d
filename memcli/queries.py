"""Query files for `memcli search --queries`: one `{"query": ...}` per line, optional `user`,
`session` and `k`. Every error names the line."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from memcli.errors import InputError

if TYPE_CHECKING:
    from pathlib import Path

_FORMAT = 'Write one {"query": "...", "user": ..., "session": ..., "k": N} per line'


@dataclass(frozen=True)
class QueryLine:
    """One query of a file: `index` is its 0-based line number (what hits carry back)."""

    index: int
    query: str
    user: str | None = None
    session: str | None = None
    k: int | None = None


def read_queries(source: str | Path, stdin: IO[bytes] | None = None) -> list[QueryLine]:
    """Read and check a whole query file (`-` is stdin) before anything is searched."""
    from memcli.transcripts import read_source

    data, name = read_source(source, stdin)
    return parse_queries(data, name)


def parse_queries(data: bytes, name: str = "<input>") -> list[QueryLine]:
    out = []
    for index, raw in enumerate(data.split(b"\n")):
        where = f"{name}:{index + 1}"
        try:
            text = raw.decode("utf-8").strip().lstrip("\ufeff")
        except UnicodeDecodeError:
            raise InputError(f"{where}: invalid UTF-8", "Save the file as UTF-8") from None
        if not text:
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}: invalid JSON ({exc.msg})", _FORMAT) from None
        out.append(_line(obj, index, where))
    return out


def _line(obj: Any, index: int, where: str) -> QueryLine:
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected a JSON object", _FORMAT)
    unknown = sorted(set(obj) - {"query", "user", "session", "k"})
    if unknown:
        raise InputError(f"{where}: unknown key {unknown[0]!r}", _FORMAT)
    query = obj.get("query")
    if not isinstance(query, str) or not query.strip():
        raise InputError(f"{where}: query must be a non-empty string", _FORMAT)
    for key in ("user", "session"):
        value = obj.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise InputError(f"{where}: {key} must be a non-empty string", _FORMAT)
    k = obj.get("k")
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
        raise InputError(f"{where}: k must be a whole number >= 1, not {k!r}", _FORMAT)
    return QueryLine(index, query, obj.get("user"), obj.get("session"), k)

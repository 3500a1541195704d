"""Searches as `memcli search` runs them: one query or a file of them (`--queries`: one
`{"query": ...}` per line, optional `user`, `session` and `k`; every error names the line), each
scoped to a user or a session, through one Retriever. The caller reads the file; this parses it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memcli.errors import InputError, MemcliError
from memcli.store.base import require_session

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from memcli.search.retriever import Retriever
    from memcli.search.types import Hit
    from memcli.search.when import TimeWindow

_FORMAT = 'Write one {"query": "...", "user": ..., "session": ..., "k": N} per line'


@dataclass(frozen=True)
class QueryLine:
    """One query of a file: `index` is its 0-based line number (what hits carry back)."""

    index: int
    query: str
    user: str | None = None
    session: str | None = None
    k: int | None = None


def parse_queries(data: bytes, name: str = "<input>") -> list[QueryLine]:
    """Check a whole query file's bytes (`name` is what errors call it) before anything is searched."""
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


def scope_user(session_id: str | None, user: str | None, default_user: str) -> str | None:
    """The user a search is limited to: `user` when given; else, with no session, the default
    user; else none (a session is searched whoever it belongs to)."""
    if user is not None:
        return user
    return default_user if session_id is None else None


@dataclass
class Found:
    """The hits of a search, each with the index of its query line, and how many stored
    messages were found by their words only (not embedded yet), the most over the queries."""

    hits: list[tuple[int, Hit]] = field(default_factory=list)
    pending: int = 0
    #: The time window each query named (see `SearchResult.window`), by query line index.
    windows: dict[int, TimeWindow] = field(default_factory=dict)


def search_lines(
    retriever: Retriever,
    lines: Sequence[QueryLine],
    *,
    default_user: str,
    user: str | None = None,
    session_id: str | None = None,
    k: int = 5,
    since: datetime | None = None,
    until: datetime | None = None,
    mode: str = "hybrid",
    source: str | None = None,
) -> Found:
    """Each query line searched in turn: its own user, session and k win over the ones given
    here; a named session (by its name, or a unique start of it) must exist: the user's when
    one is given, else any user's (SessionNotFound; a name several users have: UsageError). With `source` (the query
    file's name), an error that a line's own session or user caused names the file and line."""
    found = Found()
    for line in lines:
        target = line.session or session_id
        if target is not None:
            try:
                target = require_session(
                    retriever.store,
                    target,
                    line.user or user,
                    prefix=True,
                    elsewhere="Drop --user, or use --user {owner_arg}",
                ).id
            except MemcliError as exc:
                if source is not None and (line.session or line.user):
                    exc.message = f"{source}:{line.index + 1}: {exc.message}"
                raise
        result = retriever.search(
            line.query,
            k=line.k or k,
            user_id=scope_user(target, line.user or user, default_user),
            session_id=target,
            since=since,
            until=until,
            mode=mode,
        )
        found.pending = max(found.pending, result.pending)
        found.hits += [(line.index, hit) for hit in result.hits]
        if result.window is not None:
            found.windows[line.index] = result.window
    return found


def users_with_matches(retriever: Retriever, query: str, k: int = 50) -> list[str]:
    """The users whose messages match `query`'s words (BM25 over every user's, the best `k`
    messages), in order of their best match: what to say when a user's own search found nothing.
    Lexical only: nothing is embedded for it."""
    result = retriever.search(query, k=k, mode="lexical")
    users: dict[str, None] = {}
    for hit in result.hits:
        info = retriever.store.get_session(hit.session_id)
        if info is not None:
            users.setdefault(info.user_id)
    return list(users)

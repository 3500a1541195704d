"""Searches as `memcli search` runs them: one query or a file of them, each scoped to a user or a
session, through one Retriever."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memcli.sessions import require

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from memcli.queries import QueryLine
    from memcli.ranking import Hit
    from memcli.retrieval import Retriever


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
) -> Found:
    """Each query line searched in turn: its own user, session and k win over the ones given
    here; a named session must exist (SessionNotFound)."""
    found = Found()
    for line in lines:
        target = line.session or session_id
        if target is not None:
            require(retriever.store, target)
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
    return found

"""`memcli sessions`: every session with its user, counts and budget use."""

from __future__ import annotations

from typing import Any

import typer

from memcli.cli import common, output
from memcli.words import shell_arg


def sessions_command(
    ctx: typer.Context, user: common.User = None, json_: common.Json = False
) -> None:
    """List sessions, the latest message first: title, user, messages, and the time of the last
    message (an imported conversation's own time; the day it was last stored, by an import or a
    chat, is shown apart). --json adds the budget's figures, and each session's first_at and
    last_at (its messages' time span), created_at and updated_at.

    Example: memcli sessions --json | jq .session
    """
    s = common.settings(ctx)
    # The default database not made yet: no sessions. One named (--db, MEMCLI_DB, config) that
    # is not there is an error, as on every reading command.
    fresh = s.sources.get("db") == "default" and not common.database_exists(s)
    store = None if fresh else common.open_store(s, must_exist=True)
    infos = [] if store is None else store.list_sessions(user)
    infos.sort(key=lambda i: (i.last_at or i.updated_at, i.updated_at), reverse=True)
    records: list[dict[str, Any]] = [
        {
            "type": "session",
            "session": i.name,
            "user": i.user_id,
            "title": i.title,
            "source_id": i.source_id,
            "metadata": i.metadata,
            "active_messages": i.active_messages,
            "archived_messages": i.archived_messages,
            "active_tokens": i.active_tokens,
            "threshold": i.threshold,
            "token_limit": i.token_limit,
            "flush_size": i.token_flush_size,
            "flushes": i.flushes,
            "first_at": i.first_at,
            "last_at": i.last_at,
            "created_at": i.created_at,
            "updated_at": i.updated_at,
        }
        for i in infos
    ]
    if not infos:  # said on stderr in a pipe too: a mistyped --user is no silent empty list
        _say_none(store, user)
    if output.wants_json(json_):
        output.emit_all(records)
        return
    if not infos:
        return
    titled = any(i.title for i in infos)  # imported conversations, chats: their titles
    # The title gets the room: the budget's figures are in --json and `memcli inspect`.
    output.table(
        None,
        ["session", *(["title"] if titled else []), "user", "messages", "last message", "stored"],
        [
            (
                i.name,
                *([i.title or ""] if titled else []),
                i.user_id,
                i.active_messages + i.archived_messages,
                (i.last_at or i.updated_at).astimezone(),
                f"{i.updated_at.astimezone():%Y-%m-%d}",
            )
            for i in infos
        ],
    )


def _say_none(store: Any, user: str | None) -> None:
    """No sessions: of a user (a mistyped name?) in a database that has some, the users that
    have some, the close names first; else how to start one."""
    others = "" if store is None or user is None else common.close_users(store, str(user))
    if not others:
        output.info("No sessions yet. Start one with `memcli import FILE` or `memcli chat`.")
        return
    output.info(f"No sessions of user {shell_arg(str(user))}.{others}")

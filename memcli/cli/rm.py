"""`memcli rm SESSION`: delete a session and its messages."""

from __future__ import annotations

from typing import Annotated

import typer

from memcli.cli import common, output


def rm_command(
    ctx: typer.Context,
    session: Annotated[
        list[str], typer.Argument(help="One or more session ids.", metavar="SESSION...")
    ],
    json_: common.Json = False,
) -> None:
    """Delete sessions with their messages (active and archived) and flushes.

    Example: memcli rm demo
    """
    s = common.settings(ctx)
    store = common.open_store(s, must_exist=True)
    for session_id in session:
        common.require_session(store, session_id)
    records = []
    for session_id in dict.fromkeys(session):
        count = store.delete_session(session_id)
        output.info(f"Deleted session {session_id} ({output.plural(count, 'message')}).")
        records.append({"type": "deleted", "session": session_id, "messages": count})
    if output.wants_json(json_):
        output.emit_all(records)

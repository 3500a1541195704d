"""`memcli export SESSION`: the session as JSON Lines that `memcli import` reads back."""

from __future__ import annotations

from typing import Annotated

import typer

from memcli.cli import common, output


def export_command(
    ctx: typer.Context,
    session: Annotated[str, typer.Argument(help="The session id (see `memcli sessions`).")],
    all_: Annotated[
        bool, typer.Option("--all", help="Include archived messages, with their status.")
    ] = False,
    user: common.User = None,
    json_: common.Json = False,
) -> None:
    """Write a session's messages as JSON Lines on stdout (active ones, or all with --all).

    The first record is the session's: {"type": "session", "id", "user", "token_limit",
    "chat_history_token_ratio", "token_flush_size"}, so that `memcli import` recreates its budget.

    Export always writes JSON Lines (--json is accepted for scripts that pass it everywhere).
    With --user, only a session of that user is exported (another user's is not found: exit 1).

    Example: memcli export demo --all > demo.jsonl && memcli import demo.jsonl --session copy
    """
    from memcli.transcripts import SessionRecord, export_lines

    del json_  # always JSON Lines
    s = common.settings(ctx)
    store = common.open_store(s, must_exist=True)
    info = common.require_session(store, session, user)
    # Read whole before the first line is written: a damaged database fails here, writing nothing.
    messages = store.read_messages(session, status=None if all_ else "active")
    output.emit_all([SessionRecord.of(info).to_dict()])
    output.emit_all(export_lines(messages, with_status=all_))

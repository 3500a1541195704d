"""`memcli inspect SESSION`: the active window, the budget gauge and the flushes."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from memcli.cli import common, output


def inspect_command(
    ctx: typer.Context,
    session: Annotated[str, typer.Argument(help="The session id (see `memcli sessions`).")],
    all_: Annotated[bool, typer.Option("--all", help="Show archived messages too.")] = False,
    json_: common.Json = False,
) -> None:
    """Show a session: its active messages, the token budget gauge, archived count and flushes.

    Example: memcli inspect demo --all
    """
    s = common.settings(ctx)
    store = common.open_store(s, must_exist=True)
    info = common.require_session(store, session)
    messages = store.get_messages(session, status=None if all_ else "active")
    flushes = store.list_flushes(session)
    summary: dict[str, Any] = {
        "type": "summary",
        "session": info.id,
        "user": info.user_id,
        "active_messages": info.active_messages,
        "archived_messages": info.archived_messages,
        "active_tokens": info.active_tokens,
        "threshold": info.threshold,
        "token_limit": info.token_limit,
        "flush_size": info.token_flush_size,
        "ratio": info.chat_history_token_ratio,
        "flushes": len(flushes),
        "created_at": info.created_at,
        "updated_at": info.updated_at,
    }
    if output.wants_json(json_):
        records = [{"type": "message", **m.to_dict(stored=True)} for m in messages]
        records += [
            {
                "type": "flush",
                "id": f.id,
                "created_at": f.created_at,
                "messages": f.messages,
                "tokens": f.tokens,
                "first_message_id": f.first_message_id,
                "last_message_id": f.last_message_id,
                "reason": f.reason,
            }
            for f in flushes
        ]
        records.append(summary)
        output.emit_all(records)
        return
    console = output.out()
    console.print(
        f"[bold]Session {info.id}[/]  user {info.user_id}  "
        f"budget {info.token_limit:,} × {info.chat_history_token_ratio} "
        f"(flush {info.token_flush_size:,})"
    )
    console.print(output.gauge(info.active_tokens, info.threshold, info.token_limit))
    console.print(
        f"{info.active_messages} active, {info.archived_messages} archived, {len(flushes)} flushes"
    )
    title = "Messages" if all_ else "Active window"
    output.table(
        title,
        ["id", "role", "tokens", "status", "flush", "content"],
        [
            (m.id, m.role, m.tokens, m.status, m.flush_id, output.preview(m.content, 70))
            for m in messages
        ],
    )
    if flushes:
        shown = flushes[-20:]
        output.table(
            f"Flushes ({len(flushes)}{', last 20' if len(flushes) > 20 else ''})",
            ["id", "when", "messages", "tokens", "reason"],
            [(f.id, f.created_at.astimezone(), f.messages, f.tokens, f.reason) for f in shown],
        )

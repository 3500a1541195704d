"""`memcli inspect SESSION`: the active window, the budget gauge and the flushes."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any

import typer

from memcli.cli import common, output


def inspect_command(
    ctx: typer.Context,
    session: common.SessionId,
    all_: Annotated[bool, typer.Option("--all", help="Show archived messages too.")] = False,
    token_limit: common.TokenLimit = None,
    ratio: common.Ratio = None,
    flush_size: common.FlushSize = None,
    limit: Annotated[
        int | None,
        typer.Option("--limit", metavar="N", min=1, help="Only the last N messages."),
    ] = None,
    user: common.User = None,
    json_: common.Json = False,
) -> None:
    """Show a session: its active messages, the token budget gauge, archived count and flushes.

    Budget options are a what-if: the gauge and what the session would flush under that budget
    now; nothing is stored (`memcli import`/`chat --rebudget` store a budget). On a terminal,
    long output goes through $PAGER (default `less`), as git's does.

    With --user, only that user's session (another user's is "no session", exit 1).

    Example: memcli inspect demo --all
    """
    from memcli.sessions import report

    s = common.settings(ctx, user=user)
    asked = common.budget_asked(token_limit, ratio, flush_size)
    store = common.open_store(s, must_exist=True)
    info = common.require_session(store, session, common.asked_user(s))
    session = info.id
    budget = None if asked.is_empty else common.budget_for(s, info, asked)
    r = report(store, session, archived=all_, budget=budget)
    total = len(r.messages)
    if limit is not None:
        r = replace(r, messages=r.messages[-limit:])
    if output.wants_json(json_):
        output.emit_all(r.records())
        return
    with output.paged():
        _show(r, all_, total)


def _show(r: Any, all_: bool, total: int) -> None:
    """The report as tables (`total`: how many messages there were before --limit)."""
    info, messages, flushes = r.info, r.messages, r.flushes
    console = output.out()
    console.print(
        f"[bold]Session {info.name}[/]  user {info.user_id}  "
        f"budget {info.token_limit:,} × {info.chat_history_token_ratio} "
        f"(flush {info.token_flush_size:,})"
    )
    console.print(output.gauge(info.active_tokens, info.threshold, info.token_limit))
    if r.what_if is not None:
        w, b = r.what_if, r.what_if.budget
        console.print(
            f"What if the budget were {b.token_limit:,} × {b.chat_history_token_ratio}"
            f" (flush {b.flush_size:,}): {output.plural(w.messages, 'message')}"
            f" ({output.plural(w.tokens, 'token')}) would flush in {output.plural(w.flushes, 'flush')};"
            " nothing is stored"
        )
        console.print(output.gauge(info.active_tokens - w.tokens, b.threshold, b.token_limit))
    console.print(
        f"{info.active_messages:,} active, {info.archived_messages:,} archived,"
        f" {output.plural(len(flushes), 'flush')}"
    )
    title = "Messages" if all_ else "Active window"
    if len(messages) < total:
        title += f" (last {len(messages):,} of {total:,})"
    # Names and times only when some message has them (an imported transcript often does).
    named = any(m.name for m in messages)
    timed = any(m.timestamp for m in messages)
    columns = ["id", "role", *(["name"] if named else []), *(["time"] if timed else [])]
    output.table(
        title,
        [*columns, "tokens", "status", "flush", "content"],
        [
            (
                m.id,
                m.role,
                *([m.name] if named else []),
                *([m.timestamp.astimezone() if m.timestamp else None] if timed else []),
                m.tokens,
                m.status,
                m.flush_id,
                output.preview(_shown(m), 70),
            )
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


def _shown(m: Any) -> str:
    """A message's content, and the tools it calls (OpenAI's `tool_calls`, kept with the
    message): `→ add_fact({"text": ...})` each."""
    calls = ((m.metadata or {}).get("extra") or {}).get("tool_calls")
    if not isinstance(calls, list):
        return str(m.content)
    shown = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            shown.append(f"→ {function.get('name')}({function.get('arguments', '')})")
    return " ".join([m.content, *shown]).strip()

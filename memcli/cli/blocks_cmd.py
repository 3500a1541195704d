"""`memcli blocks`: the configured blocks, and `backfill` to let them catch up on archived batches."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from memcli.cli import common, output

app = typer.Typer(
    help="Long-term memory blocks: list them, or backfill them with archived batches.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@app.command("list")
def list_command(
    ctx: typer.Context,
    session: Annotated[
        str | None,
        typer.Argument(help="The blocks of this session (default: those of the user's last)."),
    ] = None,
    user: common.User = None,
    json_: common.Json = False,
) -> None:
    """The blocks commands use for a session or user: name, kind, priority, scope, and where each
    definition came from: the config file's [[blocks]], the definitions an application's Memory
    stored for a session, or the defaults. A stored block that cannot be rebuilt is listed with
    the reason.

    Example: memcli blocks list demo
    """
    s = common.settings(ctx, user=user)
    store = common.open_store(s) if common.database_exists(s) else None
    if session is not None:
        if store is None:
            common.open_store(s, must_exist=True)  # says there is no database
        else:
            common.require_session(store, session)
    blocks, problems = common.blocks_with_problems(s, store, session=session)
    records: list[dict[str, Any]] = [
        {
            "type": "block",
            "name": b.name,
            "kind": type(b).__name__,
            "priority": b.priority,
            "scope": b.scope,
            "source": b.origin,
        }
        for b in blocks
    ]
    records += [
        {
            "type": "block",
            "name": table.get("name"),
            "kind": table.get("path", table.get("kind")),
            "priority": table.get("priority"),
            "scope": table.get("scope"),
            "source": origin,
            "error": reason,
        }
        for origin, table, reason in problems
    ]
    if output.wants_json(json_):
        output.emit_all(records)
        return
    output.table(
        None,
        ["name", "kind", "priority", "scope", "source"],
        [
            (r["name"], r["kind"], r["priority"], r["scope"], r["source"])
            for r in records
            if "error" not in r
        ],
    )
    for r in records:
        if "error" in r:
            output.info(f"not rebuilt: {r['error']} ({r['source']})")


@app.command("backfill")
def backfill_command(
    ctx: typer.Context,
    session: Annotated[
        str | None, typer.Argument(help="Only this session (default: all of the user's).")
    ] = None,
    user: common.User = None,
    json_: common.Json = False,
) -> None:
    """Hand each block every archived batch it has not processed (after `import --no-blocks`, a
    block added to the config later, or a failed extraction). A second run does nothing.

    Example: memcli blocks backfill --user alice
    """
    from memcli.blocks.feed import backfill

    s = common.settings(ctx, user=user)
    store = common.open_store(s, must_exist=True)
    if session is not None:
        sessions = [common.require_session(store, session)]
    else:
        sessions = store.list_sessions(s.user)
    blocks = common.make_blocks(s, store, session=session)
    with output.progress("Backfilling") as bar:
        result = backfill(store, blocks, sessions, common.tokenizer(s), bar.advance, bar.total)
    records: list[dict[str, Any]] = [
        {"type": "block", "name": name, "done": result.done[name], "pending": result.pending[name]}
        for name in result.done
    ]
    if result.total == 0:
        output.info("Nothing to backfill: every block has processed every archived batch.")
    else:
        for r in records:
            pending = f", {r['pending']} pending" if r["pending"] else ""
            output.info(f"{r['name']}: {r['done']} batches processed{pending}.")
    if output.wants_json(json_):
        output.emit_all(records)

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
def list_command(ctx: typer.Context, json_: common.Json = False) -> None:
    """The configured blocks: name, kind, priority, scope.

    Example: memcli blocks list
    """
    s = common.settings(ctx)
    blocks = common.make_blocks(s)
    records = [
        {
            "type": "block",
            "name": b.name,
            "kind": type(b).__name__,
            "priority": b.priority,
            "scope": b.scope,
        }
        for b in blocks
    ]
    if output.wants_json(json_):
        output.emit_all(records)
        return
    output.table(
        None,
        ["name", "kind", "priority", "scope"],
        [(r["name"], r["kind"], r["priority"], r["scope"]) for r in records],
    )


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
    blocks = common.make_blocks(s, store)
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

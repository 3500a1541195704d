"""`memcli blocks`: the configured blocks, and `backfill` to let them catch up on archived batches."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from memcli.cli import common, output
from memcli.words import shell_arg

if TYPE_CHECKING:
    from memcli.blocks.feed import FeedResult

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
        typer.Argument(
            help="The blocks of this session (default: those of the user's last).",
            metavar="[SESSION]",
            autocompletion=common.complete_session,
            callback=lambda value: common.session_name(value),
        ),
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
            session = common.require_session(store, session, common.asked_user(s)).id
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
        str | None,
        typer.Argument(
            help="Only this session (default: all of the user's).",
            metavar="[SESSION]",
            autocompletion=common.complete_session,
            callback=lambda value: common.session_name(value),
        ),
    ] = None,
    user: common.User = None,
    model: common.Model = None,
    api_base: common.ApiBase = None,
    json_: common.Json = False,
) -> None:
    """Hand each block every archived batch it has not processed (after `import --no-blocks`, a
    block added to the config later, or a failed extraction). A second run does nothing. Exit 1
    while batches stay pending (the LLM failed); a block without a model is said to have
    batches waiting for one. With --user, SESSION is that user's session of that name.

    Example: memcli blocks backfill --user alice
    """
    from memcli.blocks.feed import backfill
    from memcli.store.index import Scope

    s = common.settings(ctx, user=user, model=model, api_base=api_base)
    store = common.open_store(s, must_exist=True)
    if session is not None:
        sessions = [common.require_session(store, session, common.asked_user(s))]
        session = sessions[0].id
    else:
        sessions = store.list_sessions(s.user)
    blocks = common.make_blocks(s, store, session=session)
    again = "memcli blocks backfill"
    if sessions and session:
        again += f" {common.session_args(store, sessions[0])}"
        again += "" if " --user " in again or not user else f" --user {shell_arg(user)}"
    elif user:
        again += f" --user {shell_arg(user)}"
    done = [0, 0]  # batches processed, of how many

    def advance(n: int) -> None:
        done[0] += n
        bar.advance(n)

    def total(n: int) -> None:
        done[1] = n
        bar.total(n)

    try:
        with output.progress("Backfilling") as bar:
            result = backfill(store, blocks, sessions, common.tokenizer(s), advance, total)
    except KeyboardInterrupt:  # what is done is kept: say how much, and how to go on
        output.info(
            f"Interrupted: the blocks processed {done[0]:,} of {output.plural(done[1], 'batch')};"
            f" the rest are left. `{again}` goes on from there."
        )
        raise
    _report(blocks, result, json_)
    _embed_again(store, blocks, Scope(session_id=session) if session else Scope(user_id=s.user))
    error = result.pending_error(again)
    if error is not None:  # work the LLM failed is left: not a success
        raise error
    note = result.waiting_note(again)
    if note is not None:  # no model: a choice, said, not an error
        output.info(note)


def _embed_again(store: Any, blocks: list[Any], scope: Any) -> None:
    """After `[search] embedding_precision` changed, embed every message of the scope again at
    the new precision for each vector block (`common.precision_note` says so first): a search
    would do it only up to its limit at a time. Nothing is done when no vectors of the other
    precision are stored."""
    from memcli.blocks.vector import VectorBlock

    for block in blocks:
        if not isinstance(block, VectorBlock):
            continue
        retriever = block.retriever(store)
        note = common.precision_note(store, retriever, scope)
        if note is None:
            continue
        output.info(f"{block.name}: {note}")
        with output.progress("Embedding") as bar:
            bar.total(retriever.pending(scope))
            count = retriever.index(scope=scope, progress=bar.advance)
        held = f" (process {retriever.waited_for} embeds the rest)" if retriever.waited_for else ""
        output.info(f"{block.name}: {output.plural(count, 'message')} embedded again{held}.")


def _report(blocks: list[Any], result: FeedResult, json_: bool) -> None:
    """What a backfill did, per block: a line on stderr, a record on stdout in JSON mode."""
    records: list[dict[str, Any]] = [
        {
            "type": "block",
            "name": b.name,
            "done": result.done.get(b.name, 0),
            "pending": result.pending.get(b.name, 0),
            "waiting": result.waiting.get(b.name, 0),
        }
        for b in blocks
        if b.name in result.done or result.waiting.get(b.name)
    ]
    if result.total == 0 and not any(result.waiting.values()):
        output.info("Nothing to backfill: every block has processed every archived batch.")
    else:
        for r in records:
            pending = f", {r['pending']} pending" if r["pending"] else ""
            waiting = f", {r['waiting']} waiting for a model" if r["waiting"] else ""
            output.info(
                f"{r['name']}: {output.plural(r['done'], 'batch')} processed{pending}{waiting}."
            )
    if output.wants_json(json_):
        output.emit_all(records)

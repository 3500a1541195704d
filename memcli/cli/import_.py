"""`memcli import FILE`: put a transcript through the engine, all or nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from memcli.cli import common, output

if TYPE_CHECKING:
    from memcli.importing import Imported


def import_command(
    ctx: typer.Context,
    file: Annotated[
        str, typer.Argument(help="A transcript: JSON Lines or a JSON array; - for stdin.")
    ],
    session: Annotated[
        str | None,
        typer.Option(
            "--session",
            help="Put everything in this session (default: from the records, else new).",
        ),
    ] = None,
    user: common.User = None,
    token_limit: common.TokenLimit = None,
    ratio: common.Ratio = None,
    flush_size: common.FlushSize = None,
    put: Annotated[
        str,
        typer.Option(
            "--put",
            help="How messages are put: one call per record (call), one at a time (message), all at once (batch).",
        ),
    ] = "call",
    no_blocks: Annotated[
        bool,
        typer.Option(
            "--no-blocks",
            help="Store and flush without feeding long-term blocks (they catch up later).",
        ),
    ] = False,
    rebudget: Annotated[
        bool,
        typer.Option(
            "--rebudget",
            help="Store the budget options in a session that has another budget (else an error).",
        ),
    ] = False,
    again: Annotated[
        bool,
        typer.Option("--again", help="Import a second copy of messages the session already holds."),
    ] = False,
    json_: common.Json = False,
) -> None:
    """Import a transcript; messages go through the engine, so flushes happen as they would live.

    Formats: one {"role", "content"} message per line (optional session, name, timestamp, metadata),
    one {"messages": [...]} conversation per line, or a JSON array of messages; a first
    {"type": "session", ...} record (as `memcli export` writes) gives new sessions their budget.
    A malformed record stops the import (exit 2) and nothing of it is stored.

    Running an import again stores nothing twice: messages already stored at the end of the
    session, in the same order, are skipped ("0 new, 419 already stored"); --again imports a
    second copy. A budget option that differs from a stored session's budget is an error unless
    --rebudget is given. Flushes are recomputed: a `status` in the file is not used.

    Example: memcli import chat.jsonl --session demo --token-limit 4000
    """
    from memcli.errors import UsageError
    from memcli.flush import BudgetOverride
    from memcli.importing import Opening, import_transcript, read_import
    from memcli.transcripts import PUT_MODES

    if put not in PUT_MODES:
        raise UsageError(f"unknown --put {put!r}", f"Use one of: {', '.join(PUT_MODES)}")
    s = common.settings(ctx, user=user)
    header, records = read_import(file)  # validated whole before the store is touched
    total = sum(len(r.messages) for r in records)
    if not total:
        output.info("Nothing to import: the input holds no messages.")
        if output.wants_json(json_):
            output.emit_all([_summary(None, blocks_fed=False)])
        return
    store = common.open_store(s)
    blocks = [] if no_blocks else common.make_blocks(s, store, session=session)
    opening = Opening.from_settings(
        s,
        blocks,
        user=user,
        budget=BudgetOverride(token_limit, ratio, flush_size),
        rebudget=rebudget,
    )
    bar = output.progress("Long-term memory")
    fed = _Fed(bar)
    try:
        with _progress(total) as advance, bar:
            result = import_transcript(
                store,
                records,
                opening,
                session_id=session,
                session_record=header,
                again=again,
                put=put,
                feed_blocks=not no_blocks,
                progress=advance,
                block_total=fed.total,
                block_progress=fed.advance,
            )
    except KeyboardInterrupt:
        fed.interrupted(total)
        raise
    _report(result, announce_new=session is None, blocks_fed=bool(blocks), json_=json_)


def _report(result: Imported, *, announce_new: bool, blocks_fed: bool, json_: bool) -> None:
    """What an import did: a line on stderr, and the summary record on stdout in JSON mode."""
    from memcli.memory import budget_text

    for new in result.new_sessions:
        if announce_new:
            output.info(f"New session: {new}")
    for session, change in result.rebudgets.items():
        output.info(
            f"Session {session}: budget {budget_text(change.new)} stored"
            f" (was {budget_text(change.old)}); the change flushed {_count(change.archived)}"
            f" in {change.flushes:,} {'flush' if change.flushes == 1 else 'flushes'}."
        )
    names = ", ".join(result.sessions) or "no session"
    what = (
        f"Imported into {names}: {result.messages:,} new, {result.already_stored:,} already stored;"
        if result.already_stored
        else f"Imported {_count(result.messages)} into {names}:"
    )
    output.info(
        f"{what} {result.flushes:,} {'flush' if result.flushes == 1 else 'flushes'},"
        f" {_count(result.archived)} archived."
    )
    if output.wants_json(json_):
        output.emit_all([_summary(result, blocks_fed=blocks_fed)])
    if result.blocks_pending:  # the messages are stored; the blocks' work is not: exit 1
        output.info(
            f"Error: {result.blocks_pending:,} batches are pending in a block (`memcli check`"
            " shows why: the LLM failed, or the embedding claim was held). The messages are"
            " stored: retry the blocks with `memcli blocks backfill`."
        )
        raise typer.Exit(1)


def _summary(result: Imported | None, *, blocks_fed: bool) -> dict[str, Any]:
    """The summary record (`result` None: nothing was imported)."""
    if result is None:
        from memcli.importing import Imported

        result = Imported()
    return {
        "type": "summary",
        "sessions": result.sessions,
        "new_sessions": result.new_sessions,
        "messages": result.messages,
        "new": result.messages,
        "already_stored": result.already_stored,
        "calls": result.calls,
        "flushes": result.flushes,
        "archived_messages": result.archived,
        "rebudgets": {s: change.to_dict() for s, change in result.rebudgets.items()},
        "blocks_fed": blocks_fed,
        "block_batches": result.blocks_done,
        "block_batches_pending": result.blocks_pending,
    }


def _count(n: int) -> str:
    return f"{n:,} message" if n == 1 else f"{n:,} messages"


class _Fed:
    """The blocks' progress bar, counted: how far the blocks got when Ctrl-C stops an import
    (`todo` is set once the messages are stored)."""

    def __init__(self, bar: output.progress) -> None:
        self.bar = bar
        self.todo: int | None = None
        self.done = 0

    def total(self, n: int) -> None:
        self.todo = n
        self.bar.total(n)

    def advance(self, n: int) -> None:
        self.done += n
        self.bar.advance(n)

    def interrupted(self, messages: int) -> None:
        if self.todo is None:
            output.info("Interrupted before the import was stored: nothing of it was kept.")
            return
        output.info(
            f"Interrupted while feeding long-term blocks: all {messages:,} messages are stored; "
            f"the blocks took {self.done:,} of {self.todo:,} batches. "
            "`memcli blocks backfill` catches them up."
        )


class _progress:
    """A progress bar on stderr, only on a terminal and only for big inputs."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.bar: Any = None

    def __enter__(self) -> Any:
        if self.total < 5000 or not output.stderr_is_tty():
            return lambda n: None
        from rich.progress import Progress

        self.bar = Progress(console=output.err(), transient=True)
        self.bar.start()
        task = self.bar.add_task("Importing", total=self.total)
        return lambda n: self.bar.advance(task, n)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

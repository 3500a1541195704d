"""`memcli import FILE`: put a transcript through the engine, all or nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from memcli.cli import common, output

if TYPE_CHECKING:
    from memcli.transcripts import ImportResult


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
    json_: common.Json = False,
) -> None:
    """Import a transcript; messages go through the engine, so flushes happen as they would live.

    Formats: one {"role", "content"} message per line (optional session, name, timestamp, metadata),
    one {"messages": [...]} conversation per line, or a JSON array of messages. A malformed record
    stops the import (exit 2) and nothing of it is stored.

    Example: memcli import chat.jsonl --session demo --token-limit 4000
    """
    from memcli.errors import UsageError
    from memcli.sessions import Opening, import_transcript
    from memcli.transcripts import PUT_MODES, read_transcript

    if put not in PUT_MODES:
        raise UsageError(f"unknown --put {put!r}", f"Use one of: {', '.join(PUT_MODES)}")
    s = common.settings(ctx, user=user)
    records = read_transcript(file)  # validated whole before the store is touched
    store = common.open_store(s)
    blocks = [] if no_blocks else common.make_blocks(s, store)
    opening = Opening.from_settings(
        s, blocks, user=user, token_limit=token_limit, ratio=ratio, flush_size=flush_size
    )
    total = sum(len(r.messages) for r in records)
    bar = output.progress("Long-term memory")
    fed = _Fed(bar)
    try:
        with _progress(total) as advance, bar:
            result = import_transcript(
                store,
                records,
                opening,
                session_id=session,
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


def _report(result: ImportResult, *, announce_new: bool, blocks_fed: bool, json_: bool) -> None:
    """What an import did: on stderr, and as a summary record with --json."""
    for new in result.new_sessions:
        if announce_new:
            output.info(f"New session: {new}")
    summary: dict[str, Any] = {
        "type": "summary",
        "sessions": result.sessions,
        "new_sessions": result.new_sessions,
        "messages": result.messages,
        "calls": result.calls,
        "flushes": result.flushes,
        "archived_messages": result.archived,
        "blocks_fed": blocks_fed,
        "block_batches": result.blocks_done,
        "block_batches_pending": result.blocks_pending,
    }
    names = ", ".join(result.sessions) or "no session"
    output.info(
        f"Imported {result.messages:,} messages into {names}: "
        f"{result.flushes:,} flushes, {result.archived:,} messages archived."
    )
    if result.blocks_pending:
        output.info(
            f"{result.blocks_pending:,} batches are pending in a block (the LLM failed); "
            "retry with `memcli facts extract --pending` or `memcli blocks backfill`."
        )
    if json_:
        output.emit_all([summary])


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

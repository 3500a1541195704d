"""`memcli import FILE`: put a transcript through the engine, all or nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from memcli.cli import common, output
from memcli.formats import FORMATS, READERS
from memcli.words import shell_arg

if TYPE_CHECKING:
    from memcli.importing import Imported


def import_command(
    ctx: typer.Context,
    file: Annotated[
        str,
        typer.Argument(
            help="The conversations to import, in one of the formats above; - for stdin.",
            metavar="FILE",
        ),
    ],
    format_: Annotated[
        str,
        typer.Option(
            "--format",
            metavar="FORMAT",
            autocompletion=common.choices("memcli.formats", "FORMATS"),
            help=f"The input's format: auto (by its shape), {', '.join(FORMATS[1:])}, or one an"
            " installed package adds.",
        ),
    ] = "auto",
    session: Annotated[
        str | None,
        typer.Option(
            "--session",
            metavar="SESSION",
            help="Put everything in this session (default: from the records, else new).",
            autocompletion=common.complete_session,
            callback=lambda value: common.session_name(value),
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
            metavar="[call|message|batch]",
            autocompletion=common.choices("memcli.transcripts", "PUT_MODES"),
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
    no_extract: Annotated[
        bool,
        typer.Option(
            "--no-extract",
            help="Extract no facts (`memcli facts extract` does it later); the other blocks are fed.",
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
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="Print what would be stored (sessions, messages); write nothing."
        ),
    ] = False,
    model: common.Model = None,
    api_base: common.ApiBase = None,
    json_: common.Json = False,
) -> None:
    """Import a transcript or an export; messages go through the engine, so flushes happen as
    they would live.

    The formats, found by the input's shape (--format says which when it cannot be told):

    FORMATS_TABLE

    A transcript is also a JSON array of messages, or `memcli export`'s output (its first
    {"type": "session", ...} record gives new sessions their budget); its records may name their
    session, name, timestamp and metadata. Each conversation becomes its own session, named
    after its title. Images and other non-text parts are left out and counted. A malformed
    record stops the import (exit 2) and nothing of it is stored.

    Running an import again stores nothing twice: a conversation is found again by its id in the
    source (or its first messages), and the messages already stored at the end of its session,
    in the same order, are skipped ("0 new, 419 already stored"); --again imports a second copy. A budget option that differs from a stored session's budget is an error unless
    --rebudget is given. Flushes are recomputed: a `status` in the file is not used.

    With a model for facts, the facts are extracted after the messages are stored, from every
    imported conversation (short, never-flushed ones too), once the number of requests and
    tokens it will send is said; --no-extract leaves that to `memcli facts extract`, and
    --no-blocks (no block fed at all) implies it.

    Example: memcli import chat.jsonl --session demo --token-limit 4000
    """
    from memcli.errors import UsageError
    from memcli.formats import names, read
    from memcli.importing import Opening, from_source, import_conversations
    from memcli.store.base import named
    from memcli.transcripts import PUT_MODES

    if put not in PUT_MODES:
        raise UsageError(f"unknown --put {put!r}", f"Use one of: {', '.join(PUT_MODES)}")
    if format_ not in FORMATS and format_ not in (known := names()):  # (a plugin's, then)
        raise UsageError(f"unknown --format {format_!r}", f"Use one of: {', '.join(known)}")
    s = common.settings(ctx, user=user, model=model, api_base=api_base)
    asked = common.budget_asked(token_limit, ratio, flush_size)
    source = read(file, format=format_)  # validated whole before the store is touched
    found = from_source(source, session)
    header = source.header
    total = sum(len(c.messages) for c in found)
    if not total:
        output.info("Nothing to import: the input holds no messages.")
        if output.wants_json(json_):
            output.emit_all([_summary(None, blocks_fed=False)])
        return
    if dry_run and not common.database_exists(s):
        store: Any = _empty_store()
    else:
        store = common.open_store(s)
    if no_blocks or dry_run:
        blocks = []
    else:  # (the blocks recorded for the session, when it is stored: the user's of that name)
        whose = user or (header.user if header is not None else None)
        stored = named(store, session, whose) if session is not None else None
        blocks = common.make_blocks(s, store, session=stored.id if stored else None)
    extracting = _fact_blocks_with_a_model(blocks)
    for block in extracting:  # facts come after the import, their cost said first
        block.receives_flushes = False
    opening = Opening.from_settings(
        s,
        blocks,
        user=user,
        budget=asked,
        rebudget=rebudget,
    )
    bar = output.progress("Long-term memory")
    fed = _Fed(bar, _backfill(s.user))
    try:
        with _progress(total) as advance, bar:
            result = import_conversations(
                store,
                found,
                opening,
                session_record=header,
                dry_run=dry_run,
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
    failed = _report(
        result,
        announce_new=session is None,
        blocks_fed=bool(blocks),
        json_=json_,
        backfill=_backfill(s.user),
    )
    if result.messages and not dry_run:
        _embed(store, blocks, [result.keys[name] for name, n in result.sessions.items() if n])
    if extracting and not no_extract and result.sessions:  # (another block's failure aside)
        _extract(s, store, extracting, list(result.keys.values()), json_=json_)
    if failed:
        raise typer.Exit(1)


def _embed(store: Any, blocks: list[Any], sessions: list[str]) -> None:
    """The importer embeds what it stored and no flush handed to a vector block (conversations
    too short to flush, the active tail of the others): a chat searches only what is embedded
    (what is not is found by its words), so it never embeds an import's backlog in front of a
    reply. Another process embedding meanwhile is not waited for: the next search does the rest."""
    from memcli.blocks.vector import VectorBlock
    from memcli.store.index import Scope

    vector = next((b for b in blocks if isinstance(b, VectorBlock)), None)
    if vector is None:
        return
    retriever = vector.retriever(store)
    for session in sessions:
        scope = Scope(session_id=session)
        pending = retriever.pending(scope)
        if not pending:
            continue
        with output.progress("Embedding") as bar:
            bar.total(pending)
            retriever.index(scope=scope, progress=bar.advance, wait=0)


def _formats_table() -> str:
    """The formats of `memcli.formats.READERS`, a line each (`\\b`: click keeps the lines)."""
    width = max(len(r.name) for r in READERS) + 2
    rows = [f"  {r.name + ':':<{width}}{r.help}" for r in READERS]
    return "\n    ".join(["\b", *rows, f"  {'NAME:':<{width}}a format an installed package adds"])


import_command.__doc__ = (import_command.__doc__ or "").replace("FORMATS_TABLE", _formats_table())


def _fact_blocks_with_a_model(blocks: list[Any]) -> list[Any]:
    from memcli.facts import fact_blocks

    return [b for b in fact_blocks(blocks) if b.llm]


def _extract(s: Any, store: Any, blocks: list[Any], sessions: list[str], *, json_: bool) -> None:
    """Extract the facts of the imported sessions, after saying what it will send (requests,
    cl100k tokens); exit 1 while batches stay pending."""
    from memcli.blocks.conversations import plan_extraction, read_batches
    from memcli.tokens import TiktokenTokenizer

    infos = [info for info in map(store.get_session, sessions) if info is not None]
    plan = plan_extraction(store, blocks, infos, TiktokenTokenizer())
    if not plan.batches:
        return
    output.info(
        f"Extracting facts: {output.plural(plan.requests, 'request')} ({plan.tokens:,} cl100k"
        " tokens before the replies; --no-extract skips it)."
    )
    again = f"memcli facts extract --user {shell_arg(s.user)}"
    try:
        with output.progress("Extracting facts") as bar:
            bar.total(len(plan.batches))
            result = read_batches(store, blocks, plan, common.tokenizer(s), bar.advance)
    except KeyboardInterrupt:
        output.info(
            "Interrupted while extracting facts: the messages are stored, and so are the facts"
            f" of every batch read; `{again}` goes on from there."
        )
        raise
    done, still = sum(result.done.values()), sum(result.pending.values())
    output.info(f"Extracted facts from {output.plural(done, 'batch')}; {still} still pending.")
    if output.wants_json(json_):
        output.emit_all([{"type": "extraction", "done": done, "pending": still}])
    error = result.pending_error(again)
    if error is not None:
        error.hint = f"The messages are stored. {error.hint}"
        raise error


def _backfill(user: str) -> str:
    """The command that feeds the blocks what an import left (of the import's user)."""
    return f"memcli blocks backfill --user {shell_arg(user)}"


def _empty_store() -> Any:
    """A store with nothing in it, for a dry run when there is no database yet (none is made)."""
    from memcli.store.sqlite import SQLiteStore

    return SQLiteStore(":memory:")


def _report(
    result: Imported, *, announce_new: bool, blocks_fed: bool, json_: bool, backfill: str
) -> bool:
    """What an import did: a line on stderr, and the summary record on stdout in JSON mode;
    True when batches stay pending in a block (the import then exits 1)."""
    if result.dry_run:
        _report_dry(result, json_=json_)
        return False
    from memcli.memory import budget_text

    for new in result.new_sessions:
        if announce_new:
            title = result.titles.get(new)
            output.info(f"New session: {new}" + (f" ({title})" if title else ""))
    if result.dropped_parts:
        output.info(
            f"Left out {result.dropped_parts:,} non-text"
            f" {'part' if result.dropped_parts == 1 else 'parts'} (images, audio, files)."
        )
    for session, change in result.rebudgets.items():
        output.info(
            f"Session {session}: budget {budget_text(change.new)} stored"
            f" (was {budget_text(change.old)}); the change flushed {_count(change.archived)}"
            f" in {change.flushes:,} {'flush' if change.flushes == 1 else 'flushes'}."
        )
    names = (
        f"{len(result.sessions):,} sessions"
        if len(result.sessions) > 3
        else ", ".join(result.sessions) or "no session"
    )
    what = (
        f"Imported into {names}: {result.messages:,} new, {result.already_stored:,} already stored;"
        if result.already_stored
        else f"Imported {_count(result.messages)} into {names}:"
    )
    output.info(
        f"{what} {result.flushes:,} {'flush' if result.flushes == 1 else 'flushes'},"
        f" {_count(result.archived)} archived."
    )
    if result.undated:
        output.info(_UNDATED.format(_count(result.undated)))
    if output.wants_json(json_):
        output.emit_all([_summary(result, blocks_fed=blocks_fed)])
    if result.blocks_pending:  # the messages are stored; the blocks' work is not: exit 1
        output.info(
            f"Error: {output.plural(result.blocks_pending, 'batch')}"
            f" {'is' if result.blocks_pending == 1 else 'are'} pending in a block (`memcli check`"
            " shows why: the LLM failed, or the embedding claim was held). The messages are"
            f" stored: retry the blocks with `{backfill}`."
        )
    return bool(result.blocks_pending)


#: Said of messages recognised as stored that were stored without the times the file gives.
_UNDATED = (
    "{} already stored had no timestamp where this file gives one (stored by an import that"
    " did not read it): kept as stored."
)


def _report_dry(result: Imported, *, json_: bool) -> None:
    """What an import would store: a line per session, and the totals (on stdout: it is the
    data a dry run asks for)."""
    if output.wants_json(json_):
        output.emit_all([_summary(result, blocks_fed=False)])
    else:
        _dry_table(result)
    output.info(
        f"Dry run: would store {_count(result.messages)} in {len(result.sessions):,}"
        f" {'session' if len(result.sessions) == 1 else 'sessions'}"
        f" ({len(result.new_sessions):,} new), {result.already_stored:,} already stored,"
        f" {result.dropped_parts:,} non-text parts left out; nothing was written."
    )
    if result.undated:
        output.info(_UNDATED.format(_count(result.undated)))


def _dry_table(result: Imported) -> None:
    rows = [
        (
            session,
            "new" if session in result.new_sessions else "stored",  # the session
            count,
            result.skipped.get(session, 0),
            result.titles.get(session, ""),
        )
        for session, count in result.sessions.items()
    ]
    output.table(None, ["session", "state", "new messages", "already stored", "title"], rows)


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
        "already_stored_undated": result.undated,
        "calls": result.calls,
        "flushes": result.flushes,
        "archived_messages": result.archived,
        "rebudgets": {s: change.to_dict() for s, change in result.rebudgets.items()},
        "titles": result.titles,
        "skipped_parts": result.dropped_parts,
        "dry_run": result.dry_run,
        "blocks_fed": blocks_fed,
        "block_batches": result.blocks_done,
        "block_batches_pending": result.blocks_pending,
    }


def _count(n: int) -> str:
    return output.plural(n, "message")


class _Fed:
    """The blocks' progress bar, counted: how far the blocks got when Ctrl-C stops an import
    (`todo` is set once the messages are stored)."""

    def __init__(self, bar: output.progress, backfill: str) -> None:
        self.bar = bar
        self.backfill = backfill
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
            f"the blocks took {self.done:,} of {output.plural(self.todo, 'batch')}. "
            f"`{self.backfill}` catches them up."
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

"""`memcli check`: is the database sound? SQLite's integrity check plus memcli's own, then the
long-term work left unfinished (`memcli.health`)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from memcli.cli import common, output
from memcli.words import plural


def check_command(
    ctx: typer.Context,
    repair: Annotated[
        bool,
        typer.Option(
            "--repair",
            help="Rebuild a damaged full-text index from the messages (the one problem memcli"
            " mends itself) and finish deletes stopped before their cleanup, then check again.",
        ),
    ] = False,
    json_: common.Json = False,
) -> None:
    """Check the database: SQLite's `PRAGMA integrity_check`, FTS5's check of the full-text
    index, then memcli's own bookkeeping (session counters against their messages, flush ids,
    the id high-water mark, vectors of messages that are gone); on PostgreSQL, memcli's own
    checks (with its id sequences). Then the long-term work left unfinished: batches a block
    failed on (with the last error and when they are retried), batches no block was ever
    handed (an interrupted import), failed fact condensations, damaged index files; each with
    the command that finishes it. Exit 0 when all is sound, 1 with each problem listed.

    A damaged full-text index (search and deleting fail on it) is rebuilt by --repair; other
    damage calls for a backup.

    Example: memcli check && cp ~/.local/share/memcli/memcli.db /backup/
    """
    from memcli import forgetting
    from memcli.errors import StoreError
    from memcli.store.check import Problem

    s = common.settings(ctx)
    store = None
    repaired: list[Problem] = []
    try:
        store = common.open_store(s, must_exist=True)
        if repair:
            repaired = store.repair()
            finished = forgetting.finish_deletes(store, s.home / "indexes")
            if finished:
                output.info(f"Finished {finished} delete(s) stopped before their cleanup.")
        for p in repaired:
            output.info(f"Repaired the {p.check}: rebuilt from the messages ({p.message}).")
        problems = store.check()
    except StoreError as error:
        if s.db_url is not None or not s.db_path.exists():
            raise  # (a server that cannot be reached says so)
        problems = [Problem("integrity", error.message)]
    work = [] if problems or store is None else unfinished_work(s, store)
    needed = [a for a in work if a.needed]
    itself = [a for a in work if not a.needed]  # the next search does it
    if output.wants_json(json_):
        output.emit_all(
            [
                *(p.record() for p in problems),
                *(a.record() for a in work),
                {"type": "summary", "problems": len(problems), "attention": len(needed)},
            ]
        )
    else:
        for p in problems:
            where = f" (session {p.session_name})" if p.session is not None else ""
            typer.echo(f"{p.check}{where}: {p.message}" + (f"\n  fix: {p.fix}" if p.fix else ""))
        for a in needed:
            typer.echo(f"{a.kind}: {a.message}\n  fix: {a.fix}")
        if itself:
            typer.echo("Needs nothing (the next search does it by itself):")
            for a in itself:
                typer.echo(f"  {a.kind}: {a.message}\n    fix: {a.fix}")
    if problems:
        if repair and not repaired and any(p.fix for p in problems):
            output.info("Nothing repaired: the database has other problems too.")
        if all(p.fix for p in problems):
            output.info(f"{s.db_label}: {len(problems)} problem(s); run the command under each.")
            raise typer.Exit(1)
        backup = "pg_restore" if s.db_url is not None else "`memcli backup`"
        output.info(
            f"{s.db_label}: {len(problems)} problem(s). Restore a backup ({backup}), or copy out"
            " each session that can still be read whole with `memcli export SESSION --all`."
        )
        raise typer.Exit(1)
    if needed:
        output.info(
            f"{s.db_label}: sound, but {len(needed)} piece(s) of long-term work unfinished;"
            " run the command under each."
        )
        raise typer.Exit(1)
    later = f" ({plural(len(itself), 'piece')} of long-term work the next search does by itself)"
    output.info(f"{s.db_label}: no problems found{later if itself else ''}.")


def unfinished_work(s: Any, store: Any) -> list[Any]:
    """The unfinished work (`memcli.health`), the blocks of each session as `memcli blocks
    backfill` builds them."""
    import json

    from memcli.health import unfinished
    from memcli.store import longterm

    built: dict[str, list[Any]] = {}

    def blocks_for(session: str, user: str) -> list[Any]:
        # Built once per set of definitions (the config's, or those recorded): not per session.
        recorded = None if s.blocks is not None else longterm.block_definitions(store, session)
        key = json.dumps(None if recorded is None else recorded[1], sort_keys=True)
        if key not in built:
            built[key] = common.make_blocks(s, store, session=session, warn=False)
        return built[key]

    return unfinished(store, blocks_for, s.home / "indexes")

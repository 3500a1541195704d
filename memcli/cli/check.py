"""`memcli check`: is the database sound? SQLite's integrity check plus memcli's own."""

from __future__ import annotations

import typer

from memcli.cli import common, output


def check_command(ctx: typer.Context, json_: common.Json = False) -> None:
    """Check the database: SQLite's `PRAGMA integrity_check`, then memcli's own bookkeeping
    (session counters against their messages, flush ids, the id high-water mark, vectors of
    messages that are gone); on PostgreSQL, memcli's own checks (with its id sequences). Exit 0
    when it is sound, 1 with each problem listed.

    Example: memcli check && cp ~/.local/share/memcli/memcli.db /backup/
    """
    from memcli.errors import StoreError
    from memcli.store.check import Problem

    s = common.settings(ctx)
    try:
        problems = common.open_store(s, must_exist=True).check()
    except StoreError as error:
        if s.db_url is not None or not s.db_path.exists():
            raise  # (a server that cannot be reached says so)
        problems = [Problem("integrity", error.message)]
    if output.wants_json(json_):
        output.emit_all(
            [*(p.record() for p in problems), {"type": "summary", "problems": len(problems)}]
        )
    else:
        for p in problems:
            where = f" (session {p.session})" if p.session is not None else ""
            typer.echo(f"{p.check}{where}: {p.message}")
    if problems:
        backup = "pg_restore" if s.db_url is not None else "`memcli backup`"
        output.info(
            f"{s.db_label}: {len(problems)} problem(s). Restore a backup ({backup}), or copy out"
            " each session that can still be read whole with `memcli export SESSION --all`."
        )
        raise typer.Exit(1)
    output.info(f"{s.db_label}: no problems found.")

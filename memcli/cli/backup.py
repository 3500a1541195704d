"""`memcli backup FILE`: a consistent copy of the database, while it is in use."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from memcli.cli import common, output


def backup_command(
    ctx: typer.Context,
    file: Annotated[str, typer.Argument(help="Where to write the copy (a new file).")],
    force: Annotated[bool, typer.Option("--force", help="Overwrite FILE if it exists.")] = False,
) -> None:
    """Copy the database to FILE with SQLite's online backup: one consistent snapshot, taken
    while other memcli processes go on writing. The copy is checked before it is kept. (A
    PostgreSQL database is backed up with pg_dump.)

    Example: memcli backup ~/backups/memcli-$(date +%F).db
    """
    from memcli.errors import StoreError, UsageError

    target = Path(file).expanduser()
    if target.exists() and not force:
        raise UsageError(f"{target} exists", "Pick another file, or pass --force to overwrite it")
    if target.is_dir():
        raise UsageError(f"{target} is a directory", "Give the backup's file name")
    s = common.settings(ctx)
    if s.db_url is None and target.resolve() == s.db_path.resolve():
        raise UsageError("the backup would overwrite the database itself", "Pick another file")
    store = common.open_store(s, must_exist=True)
    problems = store.backup(target)
    if problems:
        for p in problems:
            output.info(f"{p.check}: {p.message}")
        raise StoreError(
            f"the database {s.db_path} is damaged: no backup written",
            "Run `memcli check`; `memcli export SESSION --all` copies out each session that can still be read whole",
        )
    output.info(
        f"Backed up {s.db_path} to {target}. To restore it: stop every memcli process, run "
        f"`memcli --db {target} check`, copy {target} over {s.db_path}, and delete "
        f"{s.db_path}-wal and {s.db_path}-shm if they exist."
    )

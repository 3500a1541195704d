"""`memcli backup FILE`: a consistent copy of the database, while it is in use."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from memcli.cli import common, output


def backup_command(
    ctx: typer.Context,
    file: Annotated[
        str, typer.Argument(help="Where to write the copy (a new file).", metavar="FILE")
    ],
    force: Annotated[bool, typer.Option("--force", help="Overwrite FILE if it exists.")] = False,
) -> None:
    """Copy the database to FILE with SQLite's online backup: one consistent snapshot, taken
    while other memcli processes go on writing. The copy is checked before it is kept.

    A PostgreSQL database is backed up the same way into a SQLite file (`memcli copy`: one
    snapshot, verified); `memcli copy FILE postgresql://...` restores it into a new database.
    (pg_dump backs up the whole PostgreSQL database, roles and all.)

    Example: memcli backup ~/backups/memcli-$(date +%F).db
    """
    from memcli.errors import StoreError, UsageError

    target = Path(file).expanduser()
    if target.exists() and not force:
        raise UsageError(f"{target} exists", "Pick another file, or pass --force to overwrite it")
    if target.is_dir():
        raise UsageError(f"{target} is a directory", "Give the backup's file name")
    s = common.settings(ctx)
    from memcli.store.sqlite import removed_on_failure

    if s.db_url is not None:
        with removed_on_failure(target):  # the directories made for it, if it fails
            _backup_postgresql(s.db_url, s.db_label, target)
        return
    if target.resolve() == s.db_path.resolve():
        raise UsageError("the backup would overwrite the database itself", "Pick another file")
    store = common.open_store(s, must_exist=True)
    with removed_on_failure(target):  # the directories made for it, if it fails
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


def _backup_postgresql(url: str, label: str, target: Path) -> None:
    """The PostgreSQL database copied into a new SQLite file (under a temporary name, checked,
    then renamed to `target`)."""
    import os

    from memcli.cli.copy import copy_with_progress
    from memcli.errors import StoreError
    from memcli.store.sqlite import SQLiteStore

    temporary = target.with_name(f".{target.name}.{os.getpid()}.partial")
    parts = [temporary, *(temporary.with_name(temporary.name + end) for end in ("-wal", "-shm"))]
    try:
        result = copy_with_progress(url, temporary, "Backing up")
        store = SQLiteStore(temporary)
        try:
            problems = store.check()
        finally:
            store.close()
        if problems:
            raise StoreError(
                f"the backup of {label} does not check clean ({problems[0].message})",
                "No backup was written; report it as a bug",
            )
        os.replace(temporary, target)
    finally:
        for part in parts:
            part.unlink(missing_ok=True)
    output.info(
        f"Backed up {label} to {target} ({result.summary()}). To restore it into a new, empty"
        f" database: memcli copy {target} postgresql://..."
    )

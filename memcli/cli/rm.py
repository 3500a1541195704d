"""`memcli rm`: delete sessions, messages of a session, or everything of a user, for good."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer

from memcli.cli import common, output
from memcli.words import shell_arg

if TYPE_CHECKING:
    from memcli.forgetting import Deletion


def rm_command(
    ctx: typer.Context,
    session: Annotated[
        list[str] | None,
        typer.Argument(
            help="Sessions to delete (none: give --user).",
            metavar="[SESSION]...",
            autocompletion=common.complete_session,
        ),
    ] = None,
    message: Annotated[
        list[int] | None,
        typer.Option(
            "--message",
            "-m",
            help="Delete only this message of the SESSION (its id, as inspect and export show"
            " it); repeat for more.",
            metavar="ID",
        ),
    ] = None,
    user: Annotated[
        str | None,
        typer.Option(
            "--user",
            help="Without SESSION: delete everything of this user. With SESSION: only that"
            " user's sessions.",
            metavar="NAME",
            callback=lambda value: common.user_name(value),
        ),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Delete without asking.")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List what would be deleted; delete nothing.")
    ] = False,
    json_: common.Json = False,
) -> None:
    """Delete for good: sessions with their messages and flushes, one message of a session, or
    everything of a user (sessions, messages, facts and their history, summaries, block state,
    full-text rows, vectors and index files).

    Nothing deleted stays in the database's files (SQLite: secure_delete, the full-text index
    merged, VACUUM, the WAL truncated) or in the retrieval index files. On a terminal, rm lists
    what it will delete and asks; --yes deletes without asking. Without a terminal, --message
    and --user need --yes (exit 2 without it); deleting sessions does not ask there.

    Examples: memcli rm demo; memcli rm demo --message 12 --yes;
    memcli rm --user alice --dry-run
    """
    from memcli import forgetting
    from memcli.errors import UsageError

    s = common.settings(ctx)
    store = common.open_store(s, must_exist=True)
    if not dry_run and forgetting.finish_deletes(store, s.home / "indexes"):
        output.info("Finished a delete that was stopped before its cleanup.")
    given = [common.session_name(name, "SESSION") or name for name in session or []]
    deletions = forgetting.plan(store, given, message or [], user)
    for d in deletions:
        if d.forgotten is not None and d.forgotten.is_empty:
            others = common.close_users(store, d.forgotten.user)
            if others:
                output.info(f"Nothing is stored for user {shell_arg(d.forgotten.user)}.{others}")
    wants_json = output.wants_json(json_)
    if dry_run:
        for d in deletions:
            output.info(f"Would delete {d.describe()}.")
        output.info("Nothing deleted (--dry-run).")
        if wants_json:
            output.emit_all([d.record(done=False) for d in deletions])
        return
    asks = any(d.kind != "session" for d in deletions)
    if not yes:
        if sys.stdin.isatty() and output.stderr_is_tty():
            for d in deletions:
                output.info(f"Will delete {d.describe()}.")
            if not typer.confirm("Delete this for good?", default=False, err=True):
                output.info("Nothing deleted.")
                raise typer.Exit(1)
        elif asks:
            raise UsageError(
                "rm --message and rm --user delete for good and ask first, but there is no"
                " terminal to ask on",
                "Pass --yes to delete without asking (--dry-run lists what would go)",
            )
    from memcli import input_history

    for d in deletions:
        if d.forgotten is not None:  # their typed lines too (read from the store: before it goes)
            input_history.forget_user(s.home, store, d.forgotten.user)
    done = forgetting.delete(store, deletions, s.home / "indexes")
    for d in done:
        output.info(_done_line(d))
    if wants_json:
        output.emit_all([d.record() for d in done])


def _done_line(d: Deletion) -> str:
    if d.kind == "session":
        return f"Deleted session {d.session_name} ({output.plural(d.messages, 'message')})."
    if d.kind == "message" and d.message is not None:
        return f"Deleted message {d.message.id} of session {d.session_name}."
    return f"Forgot {d.describe()}."

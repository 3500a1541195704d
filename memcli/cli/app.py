"""The Typer app: global options, command registration, and error handling for `memcli`."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from memcli.cli import (
    blocks_cmd,
    chat,
    common,
    dump,
    export,
    facts,
    import_,
    inspect,
    rm,
    search,
    sessions,
)
from memcli.cli.simulate import app as simulate_app

app = typer.Typer(
    name="memcli",
    help="Local memory for LLM conversations: short-term window, long-term blocks, one SQLite file.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def _global(
    ctx: typer.Context,
    db: Annotated[
        str | None,
        typer.Option(
            "--db", help="The database file (default: $MEMCLI_DB, else $MEMCLI_HOME/memcli.db)."
        ),
    ] = None,
    config: Annotated[
        str | None,
        typer.Option(
            "--config",
            help="A TOML config file (default: $MEMCLI_CONFIG, else the user config dir).",
        ),
    ] = None,
) -> None:
    ctx.obj = common.Globals(db=db, config=config)


app.command("import")(import_.import_command)
app.command("sessions")(sessions.sessions_command)
app.command("inspect")(inspect.inspect_command)
app.command("export")(export.export_command)
app.command("rm")(rm.rm_command)
app.command("chat")(chat.chat_command)
app.command("search")(search.search_command)
app.add_typer(dump.app, name="dump")
app.add_typer(facts.app, name="facts")
app.add_typer(blocks_cmd.app, name="blocks")
app.add_typer(simulate_app, name="simulate")


def main() -> None:
    """The console script: run the app, turning MemcliError into a message and an exit code."""
    from memcli.errors import MemcliError

    try:
        code = app(standalone_mode=False)  # click returns a typer.Exit's code instead of exiting
        if isinstance(code, int) and code:
            sys.exit(code)
    except MemcliError as error:
        from memcli.cli.output import print_error

        print_error(error)
        sys.exit(error.exit_code)
    except BrokenPipeError:
        _quiet_broken_pipe()
    except KeyboardInterrupt:
        sys.stderr.write("\nInterrupted.\n")
        sys.exit(130)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except Exception as error:  # click's usage errors and aborts come through here too
        _click_error(error)


def _click_error(error: Exception) -> None:
    """Show a usage error as click would (exit 2); anything else is a bug: a plain traceback."""
    show = getattr(error, "show", None)
    exit_code = getattr(error, "exit_code", None)
    if callable(show) and isinstance(exit_code, int):
        show()
        sys.exit(exit_code)
    if type(error).__name__ == "Abort":
        sys.stderr.write("Aborted.\n")
        sys.exit(130)
    raise error


def _quiet_broken_pipe() -> None:
    """`memcli ... | head -1`: the reader left; exit quietly without a traceback."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass
    sys.exit(0)

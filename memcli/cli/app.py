"""The Typer app: global options, command registration, and error handling for `memcli`."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
import typer.core

from memcli.cli import common

#: Every command: name, module, attribute, whether it is a group; in the order --help lists them.
COMMANDS = (
    ("chat", "memcli.cli.chat", "chat_command", False),
    ("import", "memcli.cli.import_", "import_command", False),
    ("sessions", "memcli.cli.sessions", "sessions_command", False),
    ("inspect", "memcli.cli.inspect", "inspect_command", False),
    ("export", "memcli.cli.export", "export_command", False),
    ("rm", "memcli.cli.rm", "rm_command", False),
    ("search", "memcli.cli.search", "search_command", False),
    ("check", "memcli.cli.check", "check_command", False),
    ("backup", "memcli.cli.backup", "backup_command", False),
    ("copy", "memcli.cli.copy", "copy_command", False),
    ("dump", "memcli.cli.dump", "app", True),
    ("facts", "memcli.cli.facts", "app", True),
    ("summary", "memcli.cli.summary", "summary_command", False),
    ("blocks", "memcli.cli.blocks_cmd", "app", True),
    ("simulate", "memcli.cli.simulate", "app", True),
    ("info", "memcli.cli.info", "info_command", False),
    ("mcp", "memcli.cli.mcp", "mcp_command", False),
)
_GLOBAL_OPTIONS = ("--db", "--config")


def _show_version(value: bool) -> None:
    if value:
        from memcli import __version__

        sys.stdout.write(f"memcli {__version__}\n")
        raise typer.Exit()


def _global(
    ctx: typer.Context,
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            metavar="PATH|URL",
            help="The database: a SQLite file, or a postgresql:// URL (default: $MEMCLI_DB, else"
            " $MEMCLI_HOME/memcli.db).",
        ),
    ] = None,
    config: Annotated[
        str | None,
        typer.Option(
            "--config",
            metavar="FILE",
            help="A TOML config file (default: $MEMCLI_CONFIG, else the user config dir).",
        ),
    ] = None,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            is_eager=True,
            callback=_show_version,
            expose_value=False,
            help="Print memcli's version and exit.",
        ),
    ] = False,
) -> None:
    ctx.obj = common.Globals(db=db, config=config)


class _Group(typer.core.TyperGroup):
    """The root command. A reader that closes the pipe early (`memcli sessions | head -1`) raises
    BrokenPipeError in whichever command is writing; click would turn it into exit 1, which breaks
    `set -o pipefail` scripts. Here it becomes ReaderGone, which `main` ends with exit 0."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError as error:
            raise ReaderGone from error


class ReaderGone(Exception):
    """Whoever read stdout has stopped reading."""


def build_app(only: str | None = None) -> typer.Typer:
    """The Typer app with every command, or with `only` that one (what a run needs: Typer reads
    every registered command's signature on each start, ~40 ms for all of them)."""
    from importlib import import_module

    app = typer.Typer(
        cls=_Group,
        name="memcli",
        help="Local memory for LLM conversations: short-term window, long-term blocks, one SQLite file.",
        no_args_is_help=True,
        add_completion=True,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    app.callback()(_global)
    for name, module, attribute, is_group in COMMANDS:
        if only is not None and name != only:
            continue
        target = getattr(import_module(module), attribute)
        if is_group:
            app.add_typer(target, name=name)
        else:
            app.command(name)(target)
    return app


def requested_command(argv: list[str]) -> str | None:
    """The command a command line runs, or None when it needs the whole app (--help, a typo)."""
    names = {name for name, *_ in COMMANDS}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in _GLOBAL_OPTIONS:
            i += 2
        elif arg.startswith(tuple(f"{o}=" for o in _GLOBAL_OPTIONS)):
            i += 1
        else:
            return arg if arg in names else None
    return None


def __getattr__(name: str) -> typer.Typer:
    """`from memcli.cli.app import app`: the whole app, built on first use."""
    if name == "app":
        value = build_app()
        globals()["app"] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """The console script: run the app, turning MemcliError into a message and an exit code."""
    from memcli.errors import MemcliError

    try:
        app = build_app(requested_command(sys.argv[1:]))
        # click returns a typer.Exit's code instead of exiting; usage lines and completion scripts
        # name the program `memcli`, also when it runs as `python -m memcli`.
        code = app(standalone_mode=False, prog_name="memcli")
        sys.stdout.flush()  # a reader that left shows here, not in Python's shutdown
        if isinstance(code, int) and code:
            sys.exit(code)
    except MemcliError as error:
        from memcli.cli.output import print_error

        print_error(error)
        sys.exit(error.exit_code)
    except (BrokenPipeError, ReaderGone):
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

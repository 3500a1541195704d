"""The Typer app: global options, command registration, and error handling for `memcli`."""

from __future__ import annotations

import os
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
    ("entities", "memcli.cli.facts", "entities_command", False),
    ("summary", "memcli.cli.summary", "summary_command", False),
    ("blocks", "memcli.cli.blocks_cmd", "app", True),
    ("simulate", "memcli.cli.simulate", "app", True),
    ("info", "memcli.cli.info", "info_command", False),
    ("setup", "memcli.cli.setup", "setup_command", False),
    ("config", "memcli.cli.config_cmd", "app", True),
    ("mcp", "memcli.cli.mcp", "app", True),
)
_GLOBAL_OPTIONS = ("--db", "--config")


def _show_version(value: bool) -> None:
    if value:
        from memcli import __version__

        sys.stdout.write(f"memcli {__version__}\n")
        raise typer.Exit()


#: The shells Typer writes completion scripts for.
SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")


def _completion_shell(value: str) -> str:
    """The shell a completion option names (empty: the one running memcli, else the login shell
    $SHELL names, as when memcli runs under a process that is no shell); exit 2 if unknown."""
    from typer._completion_shared import _get_shell_name

    shell = value or _get_shell_name() or os.path.basename(os.environ.get("SHELL", ""))
    if shell not in SHELLS:
        raise typer.BadParameter(
            f"{shell or 'the current shell'} is not one of {', '.join(SHELLS)}"
            + ("" if value else " (name it: --show-completion zsh)")
        )
    return shell


def _show_completion(ctx: typer.Context, value: str | None) -> None:
    if value is None or ctx.resilient_parsing:
        return
    from typer._completion_shared import get_completion_script

    script = get_completion_script(
        prog_name="memcli", complete_var="_MEMCLI_COMPLETE", shell=_completion_shell(value)
    )
    sys.stdout.write(script + "\n")
    raise typer.Exit()


def _install_completion(ctx: typer.Context, value: str | None) -> None:
    if value is None or ctx.resilient_parsing:
        return
    from typer._completion_shared import install

    shell, path = install(
        shell=_completion_shell(value), prog_name="memcli", complete_var="_MEMCLI_COMPLETE"
    )
    sys.stderr.write(
        f"{shell} completion installed in {path}; it works once the terminal restarts.\n"
    )
    raise typer.Exit()


def _bare_completion_options(argv: list[str]) -> list[str]:
    """`--show-completion` / `--install-completion` without a shell (last, or before another
    option) as `--show-completion=`: the current shell. (Typer's click takes no optional values.)"""
    names = ("--show-completion", "--install-completion")
    return [
        f"{arg}=" if arg in names and (i + 1 == len(argv) or argv[i + 1].startswith("-")) else arg
        for i, arg in enumerate(argv)
    ]


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
    install_completion: Annotated[
        str | None,
        typer.Option(
            "--install-completion",
            metavar="[SHELL]",
            is_eager=True,
            callback=_install_completion,
            expose_value=False,
            help="Install completion for SHELL (bash, zsh, fish, powershell; default: the"
            " current shell).",
        ),
    ] = None,
    show_completion: Annotated[
        str | None,
        typer.Option(
            "--show-completion",
            metavar="[SHELL]",
            is_eager=True,
            callback=_show_completion,
            expose_value=False,
            help="Print the completion script for SHELL (bash, zsh, fish, powershell; default:"
            " the current shell), to copy it or customize the installation.",
        ),
    ] = None,
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
        add_completion=False,  # the global options --show-completion/--install-completion [SHELL]
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    app.callback()(_global)
    if "_MEMCLI_COMPLETE" in os.environ:  # a shell asks for completions: Typer's protocol
        from typer.completion import completion_init

        completion_init()
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
    from memcli.cli.output import fit_streams
    from memcli.errors import MemcliError

    fit_streams()
    try:
        app = build_app(requested_command(sys.argv[1:]))
        # click returns a typer.Exit's code instead of exiting; usage lines and completion scripts
        # name the program `memcli`, also when it runs as `python -m memcli`.
        args = _bare_completion_options(sys.argv[1:])
        code = app(args=args, standalone_mode=False, prog_name="memcli")
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
        _misplaced_global(error, sys.argv[1:])
        _misplaced_option(error, sys.argv[1:])
        _click_error(error)


def _misplaced_global(error: Exception, argv: list[str]) -> None:
    """A global option given after the command (`memcli sessions --db x.db`): say where it goes,
    with the command line moved so (exit 2). Other errors pass."""
    name = getattr(error, "option_name", None)
    if type(error).__name__ != "NoSuchOption" or name not in _GLOBAL_OPTIONS:
        return
    from memcli.cli.output import print_error
    from memcli.errors import UsageError

    moved, rest, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == name and i + 1 < len(argv):
            moved += argv[i : i + 2]
            i += 2
            continue
        if arg.startswith(f"{name}="):
            moved.append(arg)
        else:
            rest.append(arg)
        i += 1
    import shlex

    line = shlex.join(["memcli", *moved, *rest])
    print_error(UsageError(f"{name} goes before the command", f"Run `{line}`"))
    sys.exit(2)


def _misplaced_option(error: Exception, argv: list[str]) -> None:
    """A command's option given before the command (`memcli --user you sessions`): say where
    it goes, with the command line moved so, or that the command has no such option (exit 2).
    Other errors pass."""
    name = getattr(error, "option_name", None)
    if type(error).__name__ != "NoSuchOption" or not name or name in _GLOBAL_OPTIONS:
        return
    at = next((i for i, arg in enumerate(argv) if arg == name or arg.startswith(f"{name}=")), None)
    names = {command for command, *_ in COMMANDS}
    found = next(
        (j for j in range(len(argv)) if argv[j] in names and at is not None and j > at), None
    )
    if at is None or found is None:
        return
    import typer.main

    root = typer.main.get_command(build_app())
    command: Any = root.get_command(None, argv[found])  # type: ignore[attr-defined]
    end = found + 1
    sub = getattr(command, "get_command", None)
    if sub is not None and end < len(argv) and sub(None, argv[end]) is not None:
        command = sub(None, argv[end])
        end += 1
    path = " ".join(argv[found:end])
    param = next((p for p in command.params if name in p.opts), None)
    from memcli.cli.output import print_error
    from memcli.errors import UsageError

    if param is None:
        print_error(
            UsageError(
                f"no option {name}: neither memcli nor `memcli {path}` takes it",
                f"See `memcli --help` and `memcli {path} --help`",
            )
        )
        sys.exit(2)
    takes_value = not param.is_flag and "=" not in argv[at]
    option = argv[at : at + 2] if takes_value and found == at + 2 else [argv[at]]
    between = argv[at + len(option) : found]  # (global options given after it)
    import shlex

    line = shlex.join(["memcli", *argv[:at], *between, *argv[found:end], *option, *argv[end:]])
    print_error(UsageError(f"{name} goes after the command", f"Run `{line}`"))
    sys.exit(2)


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

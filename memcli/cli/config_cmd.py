"""`memcli config`: read and write the settings of the config file (as `gh config` does)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated, Any

import typer

from memcli.cli import common, output

if TYPE_CHECKING:
    from pathlib import Path

    from memcli.config import Field

app = typer.Typer(
    help="Read and write the config file's settings: set, get, unset, list (e.g. `memcli config"
    " set model openai/llama3.2`).",
    no_args_is_help=True,
    rich_markup_mode=None,
)

Key = Annotated[
    str,
    typer.Argument(
        metavar="KEY",
        help="A setting: its name in the file (llm.model, memory.token_limit, user) or its key"
        " alone (model, api_base, token_limit).",
        autocompletion=lambda incomplete: _complete_key(incomplete),
    ),
]


def _file(ctx: typer.Context) -> tuple[Path, str]:
    """The config file the commands read and write: --config, $MEMCLI_CONFIG, else the user
    config dir's (made by `set`)."""
    from memcli.config import config_file

    return config_file(os.environ, common.globals_(ctx).config)


def _complete_key(incomplete: str) -> list[str]:
    from memcli.config import FIELDS, dotted

    names = [n for spec in FIELDS for n in (spec.key, dotted(spec))]
    return sorted({n for n in names if n.startswith(incomplete)})


def shown(value: Any) -> str:
    """A value as `get` prints it and `set` takes it: `true`, `0.7`, `openai/llama3.2`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@app.command("set")
def set_command(
    ctx: typer.Context,
    key: Key,
    value: Annotated[str, typer.Argument(metavar="VALUE", help="The value (checked).")],
) -> None:
    """Write a setting into the config file (made if it is not there; its comments are kept).

    Example: memcli config set model openai/llama3.2; memcli config set api_base http://127.0.0.1:11434/v1
    """
    from memcli.config import dotted, parse_setting, setting, write_setting

    spec = setting(key)
    parsed = parse_setting(spec, value)
    path, _ = _file(ctx)
    write_setting(path, spec, parsed)
    output.info(f"Set {dotted(spec)} = {shown(parsed)} in {path}.")
    _say_overridden(spec)


@app.command("unset")
def unset_command(ctx: typer.Context, key: Key) -> None:
    """Remove a setting from the config file: its environment variable or default applies.

    Example: memcli config unset api_base
    """
    from memcli.config import dotted, file_value, setting, write_setting

    spec = setting(key)
    path, _ = _file(ctx)
    if file_value(path, spec) is None:
        output.info(f"{dotted(spec)} is not set in {path}: nothing to remove.")
        return
    write_setting(path, spec, None)
    output.info(f"Removed {dotted(spec)} from {path}.")
    _say_overridden(spec)


@app.command("get")
def get_command(ctx: typer.Context, key: Key) -> None:
    """Print a setting's value as commands use it (the environment's, else the file's, else the
    default; where from on stderr). Nothing is printed for a setting with no value.

    Example: memcli config get model
    """
    from memcli.config import dotted, setting

    spec = setting(key)
    s = common.settings(ctx)
    value = getattr(s, spec.name)
    source = s.sources.get(spec.name, "default")
    if value is None:
        output.info(f"{dotted(spec)} is not set.")
        return
    output.write(shown(value) + "\n")
    if source != "file":
        output.info(f"({_source(spec, source)})")


@app.command("list")
def list_command(ctx: typer.Context, json_: common.Json = False) -> None:
    """Every setting: its value as commands use it and where it comes from (env, file, default).

    Example: memcli config list --json | jq 'select(.source == "file")'
    """
    from memcli.config import FIELDS, dotted

    s = common.settings(ctx)
    records = [
        {
            "type": "setting",
            "key": dotted(spec),
            "value": getattr(s, spec.name),
            "source": s.sources.get(spec.name, "default"),
            "env": spec.env,
        }
        for spec in FIELDS
    ]
    where = s.config_path if s.config_path is not None else f"{_file(ctx)[0]} (not made yet)"
    output.info(f"Config file: {where}")
    if output.wants_json(json_):
        output.emit_all(records)
        return
    output.table(
        None,
        ["key", "value", "from"],
        [
            (r["key"], "" if r["value"] is None else shown(r["value"]), _source(spec, r["source"]))
            for r, spec in zip(records, FIELDS, strict=True)
        ],
    )


def _source(spec: Field, source: str) -> str:
    if source == "env":
        return f"environment {spec.env}"
    return {"file": "config file", "flag": "flag"}.get(source, "default")


def _say_overridden(spec: Field) -> None:
    """The environment variable that wins over the file, when it is set."""
    if spec.env and os.environ.get(spec.env):
        output.info(
            f"Note: {spec.env} is set in the environment and wins over the file"
            f" (unset {spec.env} to use the file's value)."
        )

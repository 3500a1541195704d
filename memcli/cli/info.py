"""`memcli info`: the version, the database, the home, the config file and where each setting came
from, the model, the blocks and the embedding model's state."""

from __future__ import annotations

from typing import Any

import typer

from memcli.cli import common, output


def info_command(ctx: typer.Context, json_: common.Json = False) -> None:
    """Show what memcli runs with: version, database (path, size), MEMCLI_HOME, the config file,
    each setting with where it came from (flag, env, file or default), the model, the blocks,
    whether the embedding model is exported (nothing is loaded), and where vectors are searched
    (pgvector, or FAISS index files).

    Example: memcli info --json | jq 'select(.type == "setting")'
    """
    from memcli.about import about

    s = common.settings(ctx)
    a = about(s, common.make_blocks(s))
    work = _work_counts(s)
    if output.wants_json(json_):
        output.emit_all(
            [
                *a.records(),
                *({"type": "unfinished", "name": k, "count": n} for k, n in work.items()),
            ]
        )
    else:
        _tables(a, work)
    if a.db_error is not None:  # everything else is shown; the database is not usable
        from memcli.errors import StoreError

        raise StoreError(a.db_error)


def _tables(a: Any, work: dict[str, int]) -> None:
    size = "not created yet" if a.db_bytes is None else output.plural(a.db_bytes, "byte")
    if isinstance(a.db_path, str):
        size = "PostgreSQL"
    config = "none" if a.config_path is None else f"{a.config_path} ({a.config_source})"
    state = "exported" if a.embedding_model_exported else "not exported yet (the first use does it)"
    output.table(
        None,
        ["", ""],
        [
            ("version", a.version),
            ("database", f"{a.db_path} ({size})"),
            ("MEMCLI_HOME", f"{a.home} ({a.home_source})"),
            ("config file", config),
            ("model", a.model or "none"),
            ("embedding model", f"{a.embedding_model_name} in {a.embedding_model_dir}: {state}"),
            ("vector search", a.vector_backend),
        ],
    )
    output.table(
        "Settings",
        ["setting", "value", "from"],
        [(x.name, "" if x.value is None else str(x.value), x.source) for x in a.settings],
    )
    output.table(
        f"Blocks ({'config file' if a.blocks_source == 'file' else 'default'})",
        ["name", "kind", "priority", "scope"],
        [(b["name"], b["kind"], b["priority"], b["scope"]) for b in a.blocks],
    )
    if work:
        output.table(
            "Unfinished (memcli check)",
            ["kind", "count"],
            [(kind, str(n)) for kind, n in work.items()],
        )


#: The kinds of unfinished work `info` counts (`memcli.health`), in this order.
WORK_KINDS = ("pending", "unfed", "unread", "condense", "index")


def _work_counts(s: Any) -> dict[str, int]:
    """How much unfinished work of each kind the database holds (`memcli check` lists it); none
    counted when there is no database yet (nothing is created) or it cannot be read."""
    from memcli.cli.check import unfinished_work
    from memcli.errors import MemcliError

    if s.db_url is None and not s.db_path.exists():
        return {}
    try:
        found = unfinished_work(s, common.open_store(s, must_exist=True))
    except MemcliError:
        return {}
    counts = dict.fromkeys(WORK_KINDS, 0)
    for item in found:
        if item.needed:
            counts[item.kind] += item.count
    return counts

"""What every command shares: options spelled one way, settings, the store, the budget."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

from memcli.errors import SessionNotFound

if TYPE_CHECKING:
    from memcli.config import Settings
    from memcli.flush import Budget
    from memcli.store.base import SessionInfo
    from memcli.store.sqlite import SQLiteStore

TokenLimit = Annotated[
    int | None, typer.Option("--token-limit", help="Token budget of short-term memory plus blocks.")
]
Ratio = Annotated[
    float | None,
    typer.Option(
        "--ratio", help="Share of --token-limit the chat history may hold before it flushes."
    ),
]
FlushSize = Annotated[
    int | None,
    typer.Option("--flush-size", help="Tokens moved out per flush (default: 10% of the limit)."),
]
User = Annotated[str | None, typer.Option("--user", help="The user whose memory this is.")]
Json = Annotated[bool, typer.Option("--json", help="JSON Lines on stdout (the default in a pipe).")]


@dataclass
class Globals:
    """The global options, set by the app's callback."""

    db: str | None = None
    config: str | None = None


def globals_(ctx: typer.Context) -> Globals:
    root = ctx.find_root()
    if not isinstance(root.obj, Globals):
        root.obj = Globals()
    return root.obj


def settings(ctx: typer.Context, **flags: Any) -> Settings:
    """Resolve the settings for this command: flags > MEMCLI_* > TOML > defaults."""
    from memcli.config import load_settings
    from memcli.messages import check_text, validate_session_id

    param = next((p for p in ctx.command.params if p.name == "session"), None)
    if param is not None and isinstance(ctx.params.get("session"), str):
        if param.param_type_name == "option":
            validate_session_id(ctx.params["session"], "--session")  # "" or blank: exit 2
        else:
            check_text(ctx.params["session"], "SESSION")  # bytes of argv that are not UTF-8
    g = globals_(ctx)
    flags = {**flags, "db": g.db}
    return load_settings(os.environ, flags, g.config)


def open_store(s: Settings, *, must_exist: bool = False) -> SQLiteStore:
    from memcli.errors import StoreError
    from memcli.store.sqlite import SQLiteStore

    path = s.db_path
    if must_exist and not path.exists():
        raise StoreError(
            f"no database at {path}",
            "Import a conversation first (`memcli import FILE`) or pick one with --db",
        )
    return SQLiteStore(path)


def require_session(store: SQLiteStore, session_id: str) -> SessionInfo:
    info = store.get_session(session_id)
    if info is None:
        raise SessionNotFound(session_id)
    return info


def budget_for(
    s: Settings,
    info: SessionInfo | None,
    token_limit: int | None,
    ratio: float | None,
    flush_size: int | None,
) -> Budget:
    """A session's budget: flags override what the session was created with; new ones use settings."""
    from memcli.flush import Budget

    if info is not None:
        limit = token_limit if token_limit is not None else info.token_limit
        share = ratio if ratio is not None else info.chat_history_token_ratio
        if flush_size is not None:
            size: int | None = flush_size
        elif token_limit is not None:
            size = None  # a new limit with no flush size: 10% of it, as for a new session
        else:
            size = info.token_flush_size
        return Budget(limit, share, size)
    return Budget(
        token_limit if token_limit is not None else s.token_limit,
        ratio if ratio is not None else s.ratio,
        flush_size if flush_size is not None else s.flush_size,
    )


def tokenizer(s: Settings) -> Any:
    from memcli.tokens import TiktokenTokenizer

    return TiktokenTokenizer(s.encoding)


def make_blocks(s: Settings, store: SQLiteStore | None = None) -> list[Any]:
    """The long-term blocks: the `[[blocks]]` tables of the config file, or without them a vector
    block plus a fact block when a model is configured. Models load only when first used."""
    from memcli.blocks.registry import Defaults, build_blocks
    from memcli.embeddings import SentenceTransformerEmbedder
    from memcli.onnx_embedder import OnnxEmbedder

    defaults = Defaults(
        model=s.model,
        api_base=s.api_base,
        llm_timeout=s.llm_timeout,
        embedder=SentenceTransformerEmbedder(),
        # Queries through ONNX Runtime, as `memcli search` (exported once into the home).
        query_embedder=OnnxEmbedder(s.home / "models"),
    )
    from memcli.blocks.vector import VectorBlock
    from memcli.ranking import SearchOptions

    blocks = build_blocks(s.blocks, defaults)
    for block in blocks:
        if isinstance(block, VectorBlock) and block.search_options is None:
            block.search_options = SearchOptions.from_settings(s)  # the [search] settings
    return blocks

"""What every command shares: options spelled one way, settings, the store, the budget."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from memcli.config import Settings
    from memcli.flush import Budget, BudgetOverride
    from memcli.search.onnx import OnnxEmbedder
    from memcli.search.retriever import Retriever, Retrievers
    from memcli.store.base import SessionInfo
    from memcli.store.postgres import PostgresStore
    from memcli.store.sqlite import SQLiteStore

    AnyStore = SQLiteStore | PostgresStore

TokenLimit = Annotated[
    int | None,
    typer.Option(
        "--token-limit", metavar="N", help="Token budget of short-term memory plus blocks."
    ),
]
Ratio = Annotated[
    float | None,
    typer.Option(
        "--ratio",
        metavar="RATIO",
        help="Share of --token-limit the chat history may hold before it flushes.",
    ),
]
FlushSize = Annotated[
    int | None,
    typer.Option(
        "--flush-size", metavar="N", help="Tokens moved out per flush (default: 10% of the limit)."
    ),
]
User = Annotated[
    str | None,
    typer.Option(
        "--user",
        metavar="NAME",
        help="The user whose memory this is.",
        autocompletion=lambda ctx, incomplete: complete_user(ctx, incomplete),
        callback=lambda value: user_name(value),
    ),
]


def user_name(value: str | None, what: str = "--user") -> str | None:
    """A --user as given, by the one rule for names (`messages.validate_user`): trimmed;
    exit 2 when blank or holding control characters."""
    from memcli.messages import validate_user

    return None if value is None else validate_user(value, what)


def session_name(value: str | None, what: str = "--session") -> str | None:
    """A --session (or SESSION) as given, by the one rule for names: trimmed; exit 2 when
    blank or holding control characters."""
    from memcli.messages import validate_session_id

    return None if value is None else validate_session_id(value, what)


Model = Annotated[
    str | None,
    typer.Option(
        "--model",
        metavar="NAME",
        help="Any litellm model string (default: $MEMCLI_MODEL, else `memcli config set model"
        " NAME`'s [llm] model).",
    ),
]
ApiBase = Annotated[
    str | None,
    typer.Option(
        "--api-base",
        metavar="URL",
        help="The endpoint of an OpenAI-compatible server, e.g. http://127.0.0.1:11434/v1"
        " (default: $MEMCLI_API_BASE, else [llm] api_base).",
    ),
]
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


def database_exists(s: Settings) -> bool:
    """Whether there is a database to read: a SQLite file that exists, or any PostgreSQL URL (a
    database the server does not have is an error when opened)."""
    return s.db_url is not None or s.db_path.exists()


def budget_asked(
    token_limit: int | None, ratio: float | None, flush_size: int | None
) -> BudgetOverride:
    """The budget options of a command, checked (UsageError, exit 2) before it opens anything."""
    from memcli.flush import BudgetOverride

    return BudgetOverride(token_limit, ratio, flush_size).check()


def open_store(s: Settings, *, must_exist: bool = False) -> AnyStore:
    """The settings' database: a PostgreSQL one for a `postgresql://` URL, else a SQLite file
    (with `must_exist`, a file that is not there is an error, not a new database). A database
    named by --db or MEMCLI_DB must be in a folder that exists (the default home is made)."""
    from memcli.store.sqlite import SQLiteStore

    folder_missing = not s.db_path.parent.is_dir() if s.db_url is None else False
    if not must_exist and "db" in s.explicit and folder_missing:
        from memcli.errors import UsageError

        where = {"flag": "--db", "env": "MEMCLI_DB"}.get(
            s.sources.get("db", ""), "db in the config"
        )
        raise UsageError(
            f"no folder {str(s.db_path.parent)!r} for the database {str(s.db_path)!r} ({where})",
            "Create the folder first, or point --db at a file in a folder that exists",
        )
    if s.db_url is not None:
        from memcli.cli import output
        from memcli.store.postgres import PostgresStore

        return PostgresStore(s.db_url, on_migrate=output.info)
    return SQLiteStore(s.db_path, create=not must_exist)


def require_session(store: AnyStore, session_id: str, user: str | None = None) -> SessionInfo:
    """The stored session (of `user`, when given; else of any user: a name several users have
    is exit 2, naming them) that `session_id` names, whole or by a unique start of its name
    (several: the candidates, exit 2); SessionNotFound (exit 1) otherwise, as every command
    says it: a name only other users have is named as theirs (`memcli` runs with the whole
    database: the owner is not hidden from it), a missing one gets the close names. Commands go
    on with the returned session's `id` (the store's key) and show its `name`."""
    from memcli.store.base import require_session

    return require_session(store, session_id, user, prefix=True, elsewhere=OTHER_USERS_SESSION)


def session_named(store: AnyStore, session_id: str | None, user: str | None = None) -> str | None:
    """A session option's key (`SessionInfo.id`): the stored session's that `session_id` names
    (of `user`, when given), whole or by a unique start of its name (several: exit 2); None
    when `session_id` is None or empty. SessionNotFound when it names no session (of `user`)."""
    if not session_id:
        return None
    return require_session(store, session_id, user).id


def session_args(store: AnyStore, info: SessionInfo) -> str:
    """A session as a command's arguments in a hint: its name (as a shell takes it), with
    `--user` when other users have a session of that name too."""
    from memcli.words import shell_arg

    shared = len(store.sessions_named(info.name)) > 1
    return shell_arg(info.name) + (f" --user {shell_arg(info.user_id)}" if shared else "")


#: The hint every command gives for a session of another user than --user.
OTHER_USERS_SESSION = "It belongs to user {owner}: use --user {owner_arg}, or leave --user out"


def close_users(store: Any, user: str) -> str:
    """For a user with nothing stored (a mistyped --user?): " Did you mean 'ana'? The users with
    sessions: ana, bo." (empty when the database has no sessions)."""
    from difflib import get_close_matches

    users = sorted({i.user_id for i in store.list_sessions(None)} - {user})
    if not users:
        return ""
    close = get_close_matches(user, users, n=3, cutoff=0.6)
    from memcli.words import shell_arg

    guess = f" Did you mean --user {' or '.join(shell_arg(u) for u in close)}?" if close else ""
    return f"{guess} The users with sessions: {', '.join(users)}."


def asked_user(s: Settings) -> str | None:
    """The user a command was told (--user or MEMCLI_USER), else None: any user's session."""
    return s.user if "user" in s.explicit else None


def budget_for(s: Settings, info: SessionInfo | None, asked: BudgetOverride) -> Budget:
    """A session's budget: flags override what the session was created with; new ones use settings."""
    from memcli.sessions import budget_for, default_budget

    return budget_for(info, default_budget(s), asked)


def tokenizer(s: Settings) -> Any:
    from memcli.tokens import TiktokenTokenizer

    return TiktokenTokenizer(s.encoding)


def make_blocks(
    s: Settings,
    store: AnyStore | None = None,
    *,
    session: str | None = None,
    user: str | None = None,
    warn: bool = True,
) -> list[Any]:
    """The long-term blocks for a session (or with none, for `user`, default the settings'), by
    this precedence: the config file's `[[blocks]]` (`blocks = []` too); else the definitions an
    application's Memory recorded for the session (for a user: their session recorded last);
    else the defaults, a vector block and a fact block. Each block's `origin` says which. A
    recorded block that cannot be rebuilt here is left out, with a warning. Models load only
    when first used."""
    blocks, problems = blocks_with_problems(s, store, session=session, user=user)
    if warn:
        from memcli.cli import output

        for origin, _, reason in problems:
            output.info(f"warning: {reason} ({origin}); left out")
    return blocks


def blocks_with_problems(
    s: Settings,
    store: AnyStore | None = None,
    *,
    session: str | None = None,
    user: str | None = None,
) -> tuple[list[Any], list[tuple[str, dict[str, Any], str]]]:
    """`make_blocks`, and each recorded definition left out: (origin, table, reason)."""
    from memcli.blocks.registry import Defaults, build_blocks, rebuild
    from memcli.blocks.vector import VectorBlock
    from memcli.errors import ConfigError
    from memcli.search.types import SearchOptions
    from memcli.store import longterm

    defaults = Defaults(
        model=s.model,
        api_base=s.api_base,
        llm_timeout=s.llm_timeout,
        embedder=embedder(s),  # as `memcli search`
        index_dir=s.home / "indexes",
    )
    problems: list[tuple[str, dict[str, Any], str]] = []
    recorded = None
    if s.blocks is None and store is not None:
        recorded = longterm.block_definitions(store, session, user or s.user)
    if s.blocks is not None:
        origin = f"config file {s.config_path}"
        try:
            blocks = build_blocks(s.blocks, defaults)
        except ConfigError as exc:  # said with the file, as the other settings' errors are
            where = f"{s.config_path}: " if s.config_path is not None else ""
            raise ConfigError(f"{where}{exc.message}", exc.hint) from None
    elif recorded is not None:
        origin = f"stored for session {recorded[0]}"
        blocks, failed = rebuild(recorded[1], defaults)
        problems = [(origin, dict(table), reason) for table, reason in failed]
    else:
        origin = "default"
        blocks = build_blocks(None, defaults)
    for block in blocks:
        block.origin = origin
        if isinstance(block, VectorBlock):
            if block.search_options is None:
                block.search_options = SearchOptions.from_settings(s)  # the [search] settings
            block.retrievers = retrievers()  # a session's blocks and the search share one
    return blocks, problems


#: Said on stderr by the command that exports the embedding model (the first to need it).
PREPARING = "Preparing the embedding model (once, about 15 s)…"


def trim_heap() -> None:
    """Give the C heap's free pages back to the system (glibc's `malloc_trim`), in the process of
    a long-running command (the MCP server after each call, the chat after each turn): what a
    call built and let go (a search that first builds the index of a big store: tens of MB of
    rows) stays free inside glibc's heaps, counted in the process's memory, until then. Nothing
    where the C library is not glibc. The CLI's, never the library's: its host's heap is its
    own."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    import ctypes

    try:
        return ctypes.CDLL(None).malloc_trim  # (the process's C library)
    except (OSError, AttributeError, TypeError):  # not glibc: macOS, musl, Windows
        return None


@functools.cache
def retrievers() -> Retrievers:
    """The process's retrievers (`memcli.search.retriever.Retrievers`): the vector blocks of
    every session a command builds (`make_blocks`) and its search (`retriever`) share one per
    store, so that a server holds each store's index once, not once per session it serves."""
    from memcli.search.retriever import Retrievers

    return Retrievers()


def retriever(s: Settings, store: Any, *, announce: bool = False) -> Retriever:
    """The search of `memcli search`: hybrid retrieval over the store with the settings' options;
    the embedder says when it prepares the model (`embedder`), lexical searches never load it;
    with `announce`, a search that first builds for a second or more (the full-text index after
    a bulk import, the vectors of its scope's pending messages) says what and about how long, on
    stderr (not in the chat's screen). Without `announce`, the process's one over `store`
    (`retrievers`), which its sessions' vector blocks share."""
    from memcli.cli import output
    from memcli.search.retriever import Retriever
    from memcli.search.types import SearchOptions

    if not announce:
        return retrievers().get(
            store, embedder(s), SearchOptions.from_settings(s), s.home / "indexes"
        )
    return Retriever(
        store,
        embedder(s),
        SearchOptions.from_settings(s),
        s.home / "indexes",
        on_build=lambda building: output.info(building.describe()),
    )


def embedder(s: Settings) -> OnnxEmbedder:
    """The embedding model of every command: ONNX Runtime at `[search] embedding_precision`,
    exported once into the home's `models` folder; the command that exports it says so
    (`PREPARING`), whatever it is."""
    from memcli.cli import output
    from memcli.search.onnx import OnnxEmbedder

    return OnnxEmbedder(
        s.home / "models",
        on_prepare=lambda: output.info(PREPARING),
        precision=s.embedding_precision,
    )


def precision_note(store: Any, retriever: Retriever, scope: Any = None) -> str | None:
    """What to say when the scope's messages (a `Scope`; None: the store's) wait for vectors
    because the store's were made by the embedding model at its other precision (`[search]
    embedding_precision` changed): the two are never compared, so the messages are embedded
    again. None when that is not so."""
    from memcli.search.onnx import PRECISIONS, vectors_name
    from memcli.store.vectors import vector_models
    from memcli.words import plural

    precision = getattr(retriever.embedder, "precision", None)
    if precision is None:
        return None
    models = vector_models(store)
    others = [
        p
        for p in PRECISIONS
        if p != precision and any(m.startswith(f"{vectors_name(p)}/") for m in models)
    ]
    if not others:
        return None
    waiting = retriever.pending(scope)
    if not waiting:
        return None
    return (
        f"This store's vectors were made by the embedding model at {others[0]}, and [search]"
        f" embedding_precision is {precision}: the two are never compared, so"
        f" {plural(waiting, 'message')} {'is' if waiting == 1 else 'are'} embedded again"
        f' (or set embedding_precision = "{others[0]}" to use the old vectors).'
    )


# -- shell completion ---------------------------------------------------------------------------
# Typer calls these with what the shell has typed so far; they open nothing that is not there and
# never fail (a completion that raises prints a traceback into the user's prompt).


def choices(module: str, name: str) -> Any:
    """Completion of a choice-valued option: the values of the tuple `module.name` (imported
    only when a shell asks) that start with what is typed."""

    def complete(incomplete: str) -> list[str]:
        from importlib import import_module

        values: tuple[str, ...] = getattr(import_module(module), name)
        return [v for v in values if v.startswith(incomplete)]

    return complete


def _completion_store(ctx: typer.Context) -> Any:
    """The store the command being completed would open (--db / MEMCLI_DB / the home's), read
    only; None when there is no database."""
    from memcli.config import load_settings

    root = ctx.find_root()
    flags = {"db": root.params.get("db")}
    s = load_settings(os.environ, flags, root.params.get("config"))
    return open_store(s, must_exist=True) if database_exists(s) else None


def complete_session(ctx: typer.Context, incomplete: str) -> list[str]:
    """Session ids of the database the command would open (of its --user, when given) starting
    with what is typed, newest first."""
    try:
        store = _completion_store(ctx)
        if store is None:
            return []
        user = ctx.params.get("user")
        names = [i.name for i in store.list_sessions(user) if i.name.startswith(incomplete)]
        return list(dict.fromkeys(names))
    except Exception:  # noqa: BLE001 (a completion never fails: it offers nothing)
        return []


def complete_user(ctx: typer.Context, incomplete: str) -> list[str]:
    """The users of the database the command would open, starting with what is typed."""
    try:
        store = _completion_store(ctx)
        if store is None:
            return []
        users = dict.fromkeys(i.user_id for i in store.list_sessions())
        return sorted(u for u in users if u.startswith(incomplete))
    except Exception:  # noqa: BLE001
        return []


#: A command's SESSION argument: a stored session's id, completed from the database.
SessionId = Annotated[
    str,
    typer.Argument(
        help="The session id, or a unique start of it (see `memcli sessions`).",
        metavar="SESSION",
        autocompletion=complete_session,
        callback=lambda value: session_name(value, "SESSION"),
    ),
]

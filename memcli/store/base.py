"""The Store protocol: everything the engine asks of a database, and the records it returns."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from memcli.credentials import (
    libpq_keywords,
    redact_keywords,
    redact_url,  # noqa: F401 (the stores show their URLs with it)
)
from memcli.errors import SessionNotFound, UsageError
from memcli.messages import session_name
from memcli.words import shell_arg

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence
    from contextlib import AbstractContextManager

    from memcli.messages import Message
    from memcli.store.forget import Forgotten


@dataclass(frozen=True)
class SessionInfo:
    """A session: its user, the budget it was created with, and its counts.

    `name` is what its user calls it (unique within the user: two users may each have `main`);
    `id` is the store's key for it (unique in the database: the name itself unless another
    user's session had that key first, then `messages.session_key`). Every command, tool and
    the library take and show the name; only the store's own calls take the id."""

    id: str
    user_id: str
    token_limit: int
    chat_history_token_ratio: float
    token_flush_size: int
    created_at: datetime
    updated_at: datetime
    active_messages: int = 0
    archived_messages: int = 0
    active_tokens: int = 0
    flushes: int = 0
    #: Where an import found it: the conversation's id in its source (or a hash of its first
    #: messages), its title, and the record-level keys of its source (a fine-tuning line's
    #: `tools`, `parallel_tool_calls`, ...), which an export writes back.
    source_id: str | None = None
    title: str | None = None
    metadata: dict[str, Any] | None = None
    #: The time span of its messages (each message's own timestamp, else when it was stored):
    #: when the conversation happened, not when it was imported. None: no messages.
    first_at: datetime | None = None
    last_at: datetime | None = None

    @property
    def name(self) -> str:
        """What its user calls it (`messages.session_name` of its key)."""
        return session_name(self.id)

    @property
    def threshold(self) -> float:
        return self.token_limit * self.chat_history_token_ratio


@dataclass(frozen=True)
class FlushRecord:
    """One flush: which messages left short-term memory, when, and how many tokens they held."""

    id: int
    session_id: str
    created_at: datetime
    messages: int
    tokens: int
    first_message_id: int
    last_message_id: int
    reason: str


class WindowEntry(NamedTuple):
    """What the flush policy needs of an active message."""

    id: int
    role: str
    tokens: int


class NewMessage(NamedTuple):
    """A message about to be stored, with its token count."""

    message: Message
    tokens: int


class FlushPlan(NamedTuple):
    """A flush about to be stored: its messages' ids (a message stored by the same call stands as
    -1 for its first, -2, ...), their tokens, and why the batch has its shape."""

    message_ids: list[int]
    tokens: int
    reason: str


#: What a PostgreSQL database's URL starts with (anything else given as `db` is a SQLite file).
POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres_url(db: object) -> bool:
    """Whether `db` names a PostgreSQL database (a `postgresql://` or `postgres://` URL)."""
    return isinstance(db, str) and db.lower().startswith(POSTGRES_SCHEMES)


def refuse_keyword_string(db: object) -> None:
    """A UsageError when `db` is a libpq keyword string (`host=db dbname=memcli password=...`),
    which would otherwise name a SQLite file (its password in the file's name): memcli takes a
    PostgreSQL database as a URL. The message shows the string with its password as ***."""
    if not isinstance(db, str) or is_postgres_url(db):
        return
    pairs = libpq_keywords(db)
    if pairs is None:
        return
    raise UsageError(
        f"the database {redact_keywords(pairs)!r} is a libpq keyword string; memcli takes a"
        " PostgreSQL database as a URL",
        "Write it as postgresql://USER:PASSWORD@HOST:PORT/DBNAME (a password holding /, ?, #, @"
        " or a space is written with %2F, %3F, %23, %40 or %20 in their place)",
    )


class Cursor(Protocol):
    """What a statement returns (a DB-API cursor of sqlite3 or psycopg)."""

    rowcount: int

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class SQLStore(Protocol):
    """What the SQL of `memcli.store.longterm` and `memcli.store.index` runs on."""

    #: The columns `message_from_row` reads, in its order.
    MESSAGE_COLUMNS: str
    #: Which SQL the backend speaks: "sqlite" or "postgresql". The one attribute every backend
    #: difference outside the backend's own module is chosen by.
    dialect: str
    #: Opened read-only (a file or its directory not writable; a PostgreSQL hot standby or
    #: read-only role): a transaction raises.
    read_only: bool

    @property
    def lock(self) -> AbstractContextManager[Any]:
        """Held by a transaction for its whole length (reentrant): statements that must run
        together on the connection, outside a transaction, hold it too."""
        ...

    def transaction(self, wait: bool = True) -> AbstractContextManager[None]:
        """All writes inside happen together or not at all (nested calls join the outer one).
        An outermost one waits its turn for the write lock; with `wait=False` it raises
        `StoreBusy` at once when another process holds it or the database is read-only."""
        ...

    def can_write_now(self) -> bool:
        """Whether a write transaction would start without waiting (inside one: True)."""
        ...

    def hold_lock(self, name: str) -> None:
        """Inside a write transaction: hold the write lock called `name` until it ends, so that
        a read-then-write on what it guards (a user's facts, a session's summary) is not raced
        by another process (SQLite: its transaction already holds the database's lock)."""
        ...

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        """Run one statement (errors become StoreError). Portable SQL with `?` placeholders: a
        backend whose driver wants others translates them."""
        ...

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Cursor: ...

    def rows_for_ids(
        self, sql: str, ids: Sequence[Any], params: Sequence[Any] = ()
    ) -> list[tuple[Any, ...]]:
        """The rows `sql` selects for many ids, `{ids}` in it standing for their placeholders."""
        ...

    def execute_for_ids(self, sql: str, ids: Sequence[Any], params: Sequence[Any] = ()) -> int:
        """Change rows by many ids (as `rows_for_ids`); return how many changed."""
        ...

    def message_from_row(self, row: Sequence[Any]) -> Message: ...


class Store(SQLStore, Protocol):
    """What the engine needs of a backend. Every SQL statement lives behind it: in the store, or
    in the SQL helpers of memcli.store that run on it (`SQLStore`)."""

    #: Counts outermost transactions; nothing else writes while one is open.
    txn_serial: int

    @property
    def transaction_depth(self) -> int:
        """0 outside a transaction, 1 in an outermost one, more when nested."""
        ...

    def close(self) -> None: ...

    # sessions
    def get_session(self, session_id: str) -> SessionInfo | None: ...

    def create_session(
        self,
        name: str,
        user_id: str,
        token_limit: int,
        ratio: float,
        flush_size: int,
    ) -> SessionInfo:
        """The new session `name` of `user_id` (or theirs of that name stored meanwhile), under
        a key of its own (`SessionInfo.id`)."""
        ...

    def sessions_named(self, name: str, user_id: str | None = None) -> list[SessionInfo]:
        """The sessions called `name` (of `user_id`; None: of every user)."""
        ...

    def update_session_budget(
        self, session_id: str, token_limit: int, ratio: float, flush_size: int
    ) -> None: ...

    def list_sessions(self, user_id: str | None = None) -> list[SessionInfo]: ...

    def describe_session(
        self,
        session_id: str,
        *,
        source_id: str | None = None,
        title: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """Store where a session came from (the values given; None leaves one as it is)."""
        ...

    def message_times(self, session_ids: Sequence[str]) -> dict[str, tuple[datetime, datetime]]:
        """The conversation's own time span of each of these sessions that holds messages: its
        first and last message's time (by order; a message's `timestamp`, else when it was
        stored). A session without messages, or not stored, is left out."""
        ...

    def find_sources(self, user_id: str, source_id: str) -> list[str]:
        """The sessions of `user_id` imported from the conversation `source_id`, oldest first."""
        ...

    def delete_session(self, session_id: str) -> int:
        """Delete the session and its messages and flushes; return how many messages went."""
        ...

    def session_version(self, session_id: str) -> int:
        """A number that changes whenever the session's messages change."""
        ...

    # messages
    def append_messages(self, session_id: str, messages: Sequence[NewMessage]) -> list[int]:
        """Store messages as active, after every earlier one; return their ids."""
        ...

    def put_window(
        self,
        session_id: str,
        version: int,
        messages: Sequence[NewMessage],
        flushes: Sequence[FlushPlan],
    ) -> tuple[list[int], list[int], int] | None:
        """Outside a transaction: if the session is still at `version`, append the messages and
        archive the flushes, at once; return the messages' ids, the flushes' ids and the
        session's new version. None, having written nothing, when another writer came first."""
        ...

    def active_window(self, session_id: str) -> list[WindowEntry]: ...

    def get_messages(
        self, session_id: str, status: str | None = None, ids: Sequence[int] | None = None
    ) -> list[Message]: ...

    def iter_messages(self, session_id: str, status: str | None = None) -> Iterator[Message]: ...

    def archive(self, session_id: str, message_ids: Sequence[int], tokens: int, reason: str) -> int:
        """Mark these active messages archived under a new flush; return the flush id."""
        ...

    def delete_active(self, session_id: str) -> int: ...

    def delete_messages(self, session_id: str) -> int: ...

    def list_flushes(self, session_id: str) -> list[FlushRecord]: ...

    # deleting for good (see memcli.store.forget)
    def delete_message(self, session_id: str, message_id: int) -> Message | None:
        """Delete one message of the session for good, keeping the session's counters, its
        flush's record and the facts naming it consistent; return the message as it was (None:
        the session holds no message of that id)."""
        ...

    def survey_user(self, user_id: str) -> Forgotten:
        """What `forget_user` would delete of the user, deleting nothing."""
        ...

    def forget_user(self, user_id: str) -> Forgotten:
        """Delete everything of the user for good: sessions, messages, flushes, facts and their
        history, summaries, block state, full-text entries and vectors; then `purge()`."""
        ...

    def purge(self) -> None:
        """Make what was deleted physically gone from the database's files (and the retrieval
        index files beside a SQLite database)."""
        ...

    def prepare_delete(self) -> None:
        """Before a delete for good, outside a transaction: StoreDamaged, nothing deleted, when
        the delete could not be completed (SQLite: the full-text index is damaged)."""
        ...


#: How the CLI's hints say where to see the sessions.
SESSIONS_CLI = "Run `memcli sessions` to see the sessions"


def named(store: Store, name: str, user: str | None = None) -> SessionInfo | None:
    """The session called `name`: `user`'s (another user's session of that name is another
    session, never theirs), or with `user` None any user's; None when there is none. With None
    and several users' sessions of that name, UsageError (exit 2) naming their users."""
    found = store.sessions_named(name, user)
    if len(found) > 1:
        from memcli.errors import UsageError

        users = [i.user_id for i in found]
        raise UsageError(
            f"{len(found)} users have a session {name!r}: {', '.join(users)}",
            f"Say whose, e.g. --user {shell_arg(users[0])} (the library: user_id=)",
        )
    return found[0] if found else None


def by_prefix(store: Store, name: str, user: str | None = None) -> SessionInfo | None:
    """The session `name` names (`named`), else the one session (of `user`, when given) whose
    name starts with `name` (`my-pass` for `my-passport-number-3a1001`); None when none does.
    UsageError (exit 2) listing them when several do."""
    info = named(store, name, user)
    if info is not None or not name:
        return info
    found = [i for i in store.list_sessions(user) if i.name.startswith(name)]
    if len(found) > 1:
        from memcli.errors import UsageError

        shown = found[:10]
        more = f" and {len(found) - len(shown)} more" if len(found) > len(shown) else ""
        users = len({i.user_id for i in found}) > 1
        raise UsageError(
            f"{len(found)} sessions start with {name!r}: "
            + ", ".join(
                shell_arg(i.name) + (f" (user {i.user_id})" if users else "") for i in shown
            )
            + more,
            "Give more of the name (or the whole of it)",
        )
    return found[0] if found else None


def require_session(
    store: Store,
    session_id: str,
    user: str | None = None,
    *,
    then: str | None = None,
    prefix: bool = False,
    elsewhere: str | None = None,
) -> SessionInfo:
    """The stored session called `session_id` (of `user`, when given: another user's session of
    that name is not theirs); SessionNotFound when there is none. Its hint: the closest names,
    then `then` (the CLI's `memcli sessions` when None; `then` alone when no name is close).
    With `prefix`, a unique start of a name names its session too (`by_prefix`: several are a
    UsageError). `elsewhere` is the hint when only other users have a session of that name
    (`{owner}` and `{owner_arg}` in it stand for one of them): for the CLI, which reads the
    whole database; without it (the tools, the library) that case is not told from none."""
    info = by_prefix(store, session_id, user) if prefix else named(store, session_id, user)
    if info is None:
        hint = None
        if elsewhere is not None and user is not None:
            others = sorted({i.user_id for i in store.sessions_named(session_id)} - {user})
            if others:
                hint = elsewhere.replace("{owner_arg}", shell_arg(others[0]))
                hint = hint.replace("{owner}", others[0])
        hint = hint or suggestion(store, session_id, user, then=then or SESSIONS_CLI) or then
        raise SessionNotFound(session_id, user, hint)
    return info


def stored_session(store: Store, key: str) -> SessionInfo:
    """The session stored under `key` (a `SessionInfo.id` a command or tool resolved before);
    SessionNotFound naming it when it went meanwhile."""
    info = store.get_session(key)
    if info is None:
        raise SessionNotFound(session_name(key), None, SESSIONS_CLI)
    return info


def suggestion(
    store: Store,
    session_id: str,
    user: str | None,
    *,
    new: bool = False,
    then: str = SESSIONS_CLI,
) -> str | None:
    """ "Did you mean ...?" for a session name that is not there (`new`: that was just started,
    so not itself): the closest names among the sessions of `user` (None: of every user), then
    `then`, as a hint; None when no name is close."""
    from difflib import get_close_matches

    ids = sorted({i.name for i in store.list_sessions(user) if not (new and i.name == session_id)})
    close = get_close_matches(session_id, ids, n=3, cutoff=0.6)
    if not close:
        return None
    names = " or ".join(shell_arg(c) for c in close)
    return f"Did you mean {names}? {then}"

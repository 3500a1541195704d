"""The SQL of a copy between two stores (`memcli copy`): which tables go, in which order, and how
their rows move, for a SQLite file or a PostgreSQL database on either side.

Table-driven: `TABLES` lists every table a copy moves, in foreign-key order (a row's parents
before it), and `SKIPPED` every table it leaves to the destination, with the reason. The columns
are read from the source's catalogue (generated columns left out) and must be the destination's:
a column added by a migration goes with its table, unnamed here. A table of the source named in
neither list fails the copy before anything is written (`plan`): data is never dropped silently.
A new table is one line in TABLES (or in SKIPPED, with its reason).

Rows stream in batches of BATCH: a cursor on the source (a server-side one on PostgreSQL), and
`executemany` (SQLite) or COPY (PostgreSQL) on the destination, so a copy holds one batch in
memory whatever the size of the database.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

from memcli.errors import StoreError
from memcli.store.base import Store

#: Rows per batch read from the source and written to the destination.
BATCH = 2000

Rows = list[tuple[Any, ...]]


def vector_rows(src: Store, dst: Store, columns: Sequence[str], rows: Rows) -> Rows:
    """The stored message vectors, as the destination stores them: the bytes of
    `retrieval_vectors.vector` (BLOB, BYTEA) are float16 on SQLite and float32 on PostgreSQL
    (`memcli.store.vectors.STORED`), converted here, and only here (pgvector's column is filled
    by the destination from its bytes)."""
    from memcli.store import vectors as vsql

    del src
    dim, vector = columns.index("dim"), columns.index("vector")
    out = []
    for row in rows:
        values = list(row)
        if isinstance(values[dim], int) and vsql.fits(values[vector], values[dim]):
            values[vector] = vsql.encode(dst.dialect, bytes(values[vector]), values[dim])
        out.append(tuple(values))
    return out


@dataclass(frozen=True)
class Table:
    """A table a copy moves: its name, the key its rows are read in order of (its primary key),
    the rows that stay behind (`where`: a SQL condition on the rows that go), and a function that
    turns a batch of source rows into destination rows (`adapt`), where the backends differ."""

    name: str
    key: str
    where: str = ""
    adapt: Callable[[Store, Store, Sequence[str], Rows], Rows] | None = None

    def condition(self) -> str:
        return f" WHERE {self.where}" if self.where else ""


#: Every table a copy moves, parents before children (messages point at flushes, flushes at
#: sessions).
TABLES: tuple[Table, ...] = (
    Table("sessions", "id"),
    Table("flushes", "id"),
    Table("messages", "id"),
    Table("block_definitions", "session_id"),
    Table("block_flushes", "block, scope_key, flush_id"),
    Table("block_state", "block, scope_key"),
    Table("facts", "id"),
    Table("fact_history", "id"),
    Table("fact_topics", "fact_id, topic"),
    Table("summaries", "session_id, block, version"),
    Table("retrieval_vectors", "id", adapt=vector_rows),
    # How far the vectors of each model reach (`embedded:MODEL`: the destination does not embed
    # those messages again) and how many were added and deleted. Left behind: how far the
    # full-text index reaches (the destination's starts empty and catches up by itself), and a
    # claim to embed held by a process working on the source.
    Table("retrieval_state", "key", where="key <> 'fts_through' AND key NOT LIKE 'embedding:%'"),
    Table("retrieval_redo", "message_id"),
    # What a re-import skips of the messages deleted for good.
    Table("deleted_sources", "session_id, message_id"),
    # What a block read of active messages outside any flush (`memcli facts extract`).
    Table("block_reads", "block, scope_key, session_id, first_message_id"),
    # The HTTP MCP server's tokens (their hashes): a copy serves the same clients.
    Table("mcp_tokens", "id"),
    # How far each user's and session's vectors reach (`memcli.store.vectors`).
    Table("retrieval_marks", "model, scope_key"),
)

#: The tables a copy leaves to the destination, and why.
SKIPPED: dict[str, str] = {
    "migrations": "the schema version: the destination is migrated to the latest schema itself",
    "counters": "id high-water marks: the destination takes the source's (`settle`)",
    "unfinished_deletes": "the source's own cleanup owed after a delete (its files, not the rows)",
    "retrieval_fts": "the full-text index: the destination builds its own from the messages",
    **{
        f"retrieval_fts_{part}": "part of SQLite's full-text index (built by the destination)"
        for part in ("data", "idx", "docsize", "config", "content")
    },
}

#: The `counters` rows a copy knows how to carry: the message id high-water mark.
KNOWN_COUNTERS = ("message_id",)


def _quoted(names: Sequence[str]) -> str:
    return ", ".join(f'"{name}"' for name in names)


def _fail(store: Any, exc: Exception, what: str) -> StoreError:
    error: StoreError = store._error(exc, what)
    return error


# -- reading the source in one snapshot -----------------------------------------------------------


@contextmanager
def snapshot(store: Any) -> Iterator[None]:
    """Read the store in one snapshot (every table as of one moment, whatever other processes
    write meanwhile); the store's lock is held throughout."""
    with store.lock:
        if store.transaction_depth:
            raise StoreError("a copy inside a write transaction", "A bug in memcli")
        store._execute_now(store.SNAPSHOT_BEGIN)
        try:
            yield
        finally:
            store._quiet_rollback()


#: Columns a database derives from others, left to the destination: pgvector's copy of a
#: vector's bytes (filled before a search), and the copies of its message's user and time (set
#: when the vector is stored); a message's copy of its session's user (set when it is stored).
DERIVED = {
    ("messages", "user_id"),
    ("retrieval_vectors", "embedding"),
    ("retrieval_vectors", "user_id"),
    ("retrieval_vectors", "at_ms"),
}


def catalogue(store: Any) -> dict[str, list[str]]:
    """The store's tables and their columns (generated and hidden ones left out), in order."""
    return dialect(store).catalogue(store)


@dataclass(frozen=True)
class Step:
    """One table of a copy, with the columns it moves."""

    table: Table
    columns: list[str]


def plan(src: Any, dst: Any) -> list[Step]:
    """What a copy from `src` to `dst` moves, table by table; StoreError, before anything is
    written, for a table of the source this copy does not know, or a table or column the two
    databases do not share (their schemas differ: different memcli versions)."""
    have, want = catalogue(src), catalogue(dst)
    listed = {table.name for table in TABLES}
    unknown = sorted(name for name in have if name not in listed and name not in SKIPPED)
    if unknown:
        raise StoreError(
            f"the source {src.where} holds tables that `memcli copy` does not know:"
            f" {', '.join(unknown)}; nothing was copied",
            "Copy with the memcli version that made them (a newer one, or the one with the"
            " extension that added them)",
        )
    steps = []
    for table in TABLES:
        for store, tables in ((src, have), (dst, want)):
            if table.name not in tables:
                raise StoreError(
                    f"the database {store.where} has no table {table.name}; nothing was copied",
                    "Open it with this memcli version first, so that it is migrated",
                )
        columns = have[table.name]
        if sorted(columns) != sorted(want[table.name]):
            raise StoreError(
                f"the table {table.name} has columns {', '.join(columns)} in {src.where} but"
                f" {', '.join(want[table.name])} in {dst.where}; nothing was copied",
                "Both databases must be at the same schema: use one memcli version for both",
            )
        steps.append(Step(table, columns))
    return steps


def count_rows(store: Any, table: Table) -> int:
    """How many rows of the table a copy moves."""
    return int(store._query_one(f'SELECT COUNT(*) FROM "{table.name}"{table.condition()}')[0])


def stream_rows(store: Any, step: Step) -> Generator[Rows, None, None]:
    """The rows a copy moves, in batches of BATCH, in key order; inside `snapshot`."""
    sql = (
        f'SELECT {_quoted(step.columns)} FROM "{step.table.name}"{step.table.condition()}'
        f" ORDER BY {step.table.key}"
    )
    cursor = dialect(store).read_cursor(store)
    try:
        try:
            cursor.execute(sql)
        except store.DATABASE_ERRORS as exc:
            raise _fail(store, exc, f"cannot read {step.table.name}") from None
        while True:
            try:
                batch = cursor.fetchmany(BATCH)
            except store.DATABASE_ERRORS as exc:
                raise _fail(store, exc, f"cannot read {step.table.name}") from None
            if not batch:
                return
            yield [tuple(row) for row in batch]
    finally:
        cursor.close()


def writer(store: Any, step: Step) -> AbstractContextManager[Callable[[Rows], None]]:
    """A function that writes batches of rows into the table; inside a write transaction of the
    store. PostgreSQL: one COPY for the whole table; SQLite: an `executemany` per batch."""
    return dialect(store).writer(store, step)


# -- ids ---------------------------------------------------------------------------------------------


def highest_message_id(store: Any) -> int:
    """The highest message id the store ever gave out (deleted messages' included); StoreError
    for a `counters` row a copy does not know how to carry."""
    names = [row[0] for row in store._query("SELECT name FROM counters")]
    unknown = sorted(set(names) - set(KNOWN_COUNTERS))
    if unknown:
        raise StoreError(
            f"the source {store.where} holds counters that `memcli copy` does not know:"
            f" {', '.join(unknown)}; nothing was copied",
            "Copy with the memcli version that made them",
        )
    marks = [
        "COALESCE((SELECT MAX(id) FROM messages), 0)",
        "COALESCE((SELECT value FROM counters WHERE name = 'message_id'), 0)",
    ]
    return int(store._query_one(dialect(store).highest_of(marks))[0])


def settle(dst: Any, message_id: int) -> None:
    """After the rows: the destination gives out ids above every id it now holds, and message
    ids above the source's high-water mark (`counters`; PostgreSQL's sequences move past them);
    PostgreSQL gathers the new rows' statistics."""
    if message_id:
        dst.execute("INSERT INTO counters (name, value) VALUES ('message_id', ?)", (message_id,))
    dialect(dst).settle(dst)


def claim(store: Any) -> None:
    """Inside the copy's write transaction: keep other writers out of the tables it writes until
    it ends (PostgreSQL: a lock on them, readers not blocked; SQLite's write transaction holds
    the database's write lock already)."""
    dialect(store).claim(store)


def rows_present(store: Any) -> dict[str, int]:
    """The tables a copy writes (and `counters`) that hold rows, with their counts."""
    found = {}
    for name in [table.name for table in TABLES] + ["counters"]:
        count = int(store._query_one(f'SELECT COUNT(*) FROM "{name}"')[0])
        if count:
            found[name] = count
    return found


# -- where the backends differ ------------------------------------------------------------------


class CopyDialect:
    """How a copy reads and writes one backend (`DIALECTS`, by the store's `dialect`)."""

    @staticmethod
    def catalogue(store: Any) -> dict[str, list[str]]:
        """The store's tables and their columns (generated, hidden and derived ones left out)."""
        raise NotImplementedError

    @staticmethod
    def read_cursor(store: Any) -> Any:
        """A cursor that reads the rows of a table a batch at a time."""
        raise NotImplementedError

    @staticmethod
    def writer(store: Any, step: Step) -> AbstractContextManager[Callable[[Rows], None]]:
        """A function that writes batches of rows into the table (see `writer`)."""
        raise NotImplementedError

    @staticmethod
    def highest_of(marks: list[str]) -> str:
        """A SELECT of the highest message id of `marks` (SQL expressions) and any the backend
        keeps elsewhere."""
        raise NotImplementedError

    @staticmethod
    def settle(store: Any) -> None:
        """After the rows: what the backend needs to give out ids above those copied."""
        raise NotImplementedError

    @staticmethod
    def claim(store: Any) -> None:
        """Keep other writers out of the tables the copy writes until its transaction ends."""
        raise NotImplementedError


class SQLiteCopy(CopyDialect):
    """How a copy reads and writes a SQLite file."""

    @staticmethod
    def catalogue(store: Any) -> dict[str, list[str]]:
        tables: dict[str, list[str]] = {}
        names = store._query(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%'"
            " ESCAPE '\\' ORDER BY name"
        )
        for (name,) in names:
            columns = store._query(f"SELECT name, hidden FROM pragma_table_xinfo('{name}')")
            tables[name] = [column for column, hidden in columns if hidden == 0]
        return tables

    @staticmethod
    def read_cursor(store: Any) -> Any:
        return store.conn.cursor()

    @staticmethod
    @contextmanager
    def writer(store: Any, step: Step) -> Iterator[Callable[[Rows], None]]:
        name, columns = step.table.name, step.columns
        sql = f'INSERT INTO "{name}" ({_quoted(columns)}) VALUES ({", ".join("?" * len(columns))})'
        yield lambda rows: store.executemany(sql, rows)

    @staticmethod
    def highest_of(marks: list[str]) -> str:
        return f"SELECT MAX({', '.join(marks)})"

    @staticmethod
    def settle(store: Any) -> None:
        """Nothing: SQLite gives out ids above the highest it holds by itself."""

    @staticmethod
    def claim(store: Any) -> None:
        """Nothing: SQLite's write transaction holds the database's write lock already."""


class PostgresCopy(CopyDialect):
    """How a copy reads and writes a PostgreSQL database."""

    @staticmethod
    def catalogue(store: Any) -> dict[str, list[str]]:
        tables: dict[str, list[str]] = {}
        rows = store._query(
            "SELECT c.table_name, c.column_name FROM information_schema.columns c"
            " JOIN information_schema.tables t ON t.table_schema = c.table_schema"
            " AND t.table_name = c.table_name"
            " WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE'"
            " AND c.is_generated = 'NEVER' ORDER BY c.table_name, c.ordinal_position"
        )
        for table, column in rows:
            if (table, column) not in DERIVED:
                tables.setdefault(table, []).append(column)
        return tables

    @staticmethod
    def read_cursor(store: Any) -> Any:
        cursor = store.conn.cursor(name="memcli_copy")  # server-side: rows come BATCH at a time
        cursor.itersize = BATCH
        return cursor

    @staticmethod
    @contextmanager
    def writer(store: Any, step: Step) -> Iterator[Callable[[Rows], None]]:
        name, columns = step.table.name, step.columns
        store.execute("SELECT 1")  # (writes what the store buffered, before the COPY)
        cursor = store.conn.cursor()
        try:
            with cursor.copy(f'COPY "{name}" ({_quoted(columns)}) FROM STDIN') as copy:

                def write(rows: Rows) -> None:
                    for row in rows:
                        copy.write_row(row)

                yield write
        except store.DATABASE_ERRORS as exc:
            raise _fail(store, exc, f"cannot write {name} to {store.where}") from None
        finally:
            cursor.close()

    @staticmethod
    def highest_of(marks: list[str]) -> str:
        marks = [
            *marks,
            "(SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM messages_id_seq)",
        ]
        return f"SELECT GREATEST({', '.join(marks)})"

    @staticmethod
    def settle(store: Any) -> None:
        """The sequences move past the copied ids; the new rows' statistics, for the planner:
        without them, reading a session back (the verification, then every command) may scan
        whole tables."""
        store.reset_sequences()
        store.execute(f"ANALYZE {_quoted([table.name for table in TABLES])}")

    @staticmethod
    def claim(store: Any) -> None:
        """A lock on the tables the copy writes (readers not blocked)."""
        names = _quoted([table.name for table in TABLES] + ["counters"])
        store.execute(f"LOCK TABLE {names} IN EXCLUSIVE MODE")


#: How a copy speaks to each backend, by the store's `dialect`: the one place the backends'
#: differences in a copy are chosen.
DIALECTS: dict[str, type[CopyDialect]] = {
    "sqlite": SQLiteCopy,
    "postgresql": PostgresCopy,
}


def dialect(store: Store) -> type[CopyDialect]:
    """How a copy speaks to the store's backend."""
    return DIALECTS[store.dialect]

"""Stores: the protocol and its backends (SQLite, PostgreSQL), and `open_store` to pick one.

Light to import: a backend's module loads when first used (`memcli.store.SQLiteStore` too)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memcli.store.base import (
    FlushRecord,
    NewMessage,
    SessionInfo,
    Store,
    WindowEntry,
    is_postgres_url,
    refuse_keyword_string,
)

if TYPE_CHECKING:
    from pathlib import Path

    from memcli.store.sqlite import SQLiteStore


def open_store(db: str | Path | None = None, *, create: bool = True) -> Store:
    """The store for `db`: a PostgresStore for a `postgresql://` or `postgres://` URL (psycopg
    is imported then), else a SQLiteStore for the file at that path (None: in memory). Without
    `create`, a SQLite file that is not there is a StoreError and nothing is made (a PostgreSQL
    database the server does not have is an error either way)."""
    refuse_keyword_string(db)
    if is_postgres_url(db):
        from memcli.store.postgres import PostgresStore

        assert isinstance(db, str)
        return PostgresStore(db)
    from memcli.store.sqlite import SQLiteStore

    return SQLiteStore(db, create=create)


def __getattr__(name: str) -> Any:
    if name == "SQLiteStore":
        from memcli.store.sqlite import SQLiteStore

        return SQLiteStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FlushRecord",
    "NewMessage",
    "SQLiteStore",
    "SessionInfo",
    "Store",
    "WindowEntry",
    "open_store",
]

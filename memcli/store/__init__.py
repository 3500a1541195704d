"""Stores: the protocol and its backends (SQLite, PostgreSQL), and `open_store` to pick one."""

from __future__ import annotations

from pathlib import Path

from memcli.store.base import (
    FlushRecord,
    NewMessage,
    SessionInfo,
    Store,
    WindowEntry,
    is_postgres_url,
)
from memcli.store.sqlite import SQLiteStore


def open_store(db: str | Path | None = None) -> Store:
    """The store for `db`: a PostgresStore for a `postgresql://` or `postgres://` URL (psycopg
    is imported then), else a SQLiteStore for the file at that path (None: in memory)."""
    if is_postgres_url(db):
        from memcli.store.postgres import PostgresStore

        assert isinstance(db, str)
        return PostgresStore(db)
    return SQLiteStore(db)


__all__ = [
    "FlushRecord",
    "NewMessage",
    "SQLiteStore",
    "SessionInfo",
    "Store",
    "WindowEntry",
    "open_store",
]

"""Stores: the protocol and its backends (SQLite now)."""

from memcli.store.base import FlushRecord, NewMessage, SessionInfo, Store, WindowEntry
from memcli.store.sqlite import SQLiteStore

__all__ = ["FlushRecord", "NewMessage", "SQLiteStore", "SessionInfo", "Store", "WindowEntry"]

"""The tokens of `memcli mcp --http`: each names the user whose memory a request reaches.

A token is shown once, when it is made; the table keeps its SHA-256 only (a token is 32 random
bytes: a hash without salt cannot be reversed by guessing), so a copy of the database lets no
one in. Every statement runs on an SQLStore, SQLite or PostgreSQL.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from memcli.messages import format_time, parse_time

if TYPE_CHECKING:
    from memcli.store.base import SQLStore

#: What every token starts with, so that one found in a file or a log is known for what it is.
PREFIX = "memcli_"


@dataclass(frozen=True)
class Token:
    """A stored token (never the secret): its id, its user, when it was made."""

    id: int
    user_id: str
    created_at: datetime


def digest(token: str) -> str:
    """The hex SHA-256 of a token, as it is stored."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def add_token(store: SQLStore, user_id: str) -> tuple[Token, str]:
    """Make a token for `user_id`: the stored Token and the secret (shown once)."""
    secret = PREFIX + secrets.token_urlsafe(32)
    now = datetime.now(tz=UTC)
    with store.transaction():
        row = store.execute(
            "INSERT INTO mcp_tokens (user_id, token_hash, created_at) VALUES (?, ?, ?)"
            " RETURNING id",
            (user_id, digest(secret), format_time(now)),
        ).fetchone()
    return Token(int(row[0]), user_id, now), secret


def list_tokens(store: SQLStore) -> list[Token]:
    """Every token, oldest first (their users and times, no secret)."""
    rows = store.execute("SELECT id, user_id, created_at FROM mcp_tokens ORDER BY id")
    return [Token(int(i), user, parse_time(made)) for i, user, made in rows]


def remove_token(store: SQLStore, token_id: int) -> Token | None:
    """Delete a token for good; the token it was, or None when there is none of that id."""
    with store.transaction():
        row = store.execute(
            "DELETE FROM mcp_tokens WHERE id = ? RETURNING id, user_id, created_at", (token_id,)
        ).fetchone()
    return None if row is None else Token(int(row[0]), row[1], parse_time(row[2]))


def token_user(store: SQLStore, token: str) -> str | None:
    """The user a token acts as, or None when it is no stored token."""
    row = store.execute(
        "SELECT user_id FROM mcp_tokens WHERE token_hash = ?", (digest(token),)
    ).fetchone()
    return None if row is None else str(row[0])

"""The errors memcli raises, each with the exit code the CLI gives it."""

from __future__ import annotations


class MemcliError(Exception):
    """Base of every error memcli raises on purpose.

    `hint` says how to fix it; the CLI prints `Error: <message>. <hint>` and exits with `exit_code`.
    """

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            # (a message may end with its own stop: a server's "...on that socket?")
            stop = " " if self.message.endswith((".", "?", "!")) else ". "
            return f"{self.message}{stop}{self.hint}"
        return self.message


class UsageError(MemcliError):
    """A bad flag, value or argument."""

    exit_code = 2


class ConfigError(MemcliError):
    """An invalid configuration file or environment variable."""

    exit_code = 2


class InputError(MemcliError):
    """Malformed input: a transcript line, a record on stdin, a reply from an LLM."""

    exit_code = 2


class SessionNotFound(MemcliError):
    """The session does not exist in the store."""

    exit_code = 1

    def __init__(self, session_id: str, user: str | None = None, hint: str | None = None) -> None:
        whose = "" if user is None else f" of user {user!r}"
        super().__init__(
            f"no session {session_id!r}{whose}",
            hint or "Run `memcli sessions` to see the sessions",
        )
        self.session_id = session_id


class MessageNotFound(MemcliError):
    """The session holds no message of that id."""

    exit_code = 1

    def __init__(self, session_id: str, message_id: int) -> None:
        super().__init__(
            f"no message {message_id} in session {session_id!r}",
            f"Run `memcli inspect {session_id} --all` to see its messages' ids",
        )
        self.session_id = session_id
        self.message_id = message_id


class StoreError(MemcliError):
    """The database failed: locked, corrupt, unwritable."""

    exit_code = 1


class ProviderError(MemcliError):
    """The LLM provider failed: `kind` is unreachable, timeout, auth, rate_limit, not_found,
    bad_request, server or error; `status` the HTTP status when there was one."""

    exit_code = 1

    def __init__(
        self, message: str, hint: str | None = None, kind: str = "error", status: int | None = None
    ) -> None:
        super().__init__(message, hint)
        self.kind = kind
        self.status = status

    @property
    def reason(self) -> str:
        """One line for a batch left pending: the kind, the HTTP status when there was one, and
        the message (`server (HTTP 500): LLM call to MODEL failed: ...`)."""
        status = f" (HTTP {self.status})" if self.status is not None else ""
        return f"{self.kind}{status}: {self.message}"


class ModelError(MemcliError):
    """The embedding model is missing or failed to load."""

    exit_code = 1


class StoreDamaged(StoreError):
    """SQLite reports the database file damaged (malformed, or not a database): nothing more is
    written to it; `memcli check` lists what is wrong."""

    exit_code = 1


class StoreBusy(StoreError):
    """The write lock is held by another connection, or the database is read-only, and the caller
    asked not to wait for it."""

    exit_code = 1

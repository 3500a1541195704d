"""`memcli copy SRC DST` in a subprocess: SQLite -> PostgreSQL -> SQLite with every command
reading the same, a destination that holds data refused, and kill -9 at random points leaving
the destination all or nothing."""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from copydata import SESSIONS, build
from helpers import memcli, no_blocks, popen_memcli  # noqa: F401 (a fixture)
from pg import drop_database, new_database

from memcli.store import open_store
from memcli.store.copy import rows_present

pytestmark = pytest.mark.usefixtures("no_blocks")

LIVE = [session for _, session, _ in SESSIONS if session != "gone"]


def views(db: str, full: bool = True) -> dict[str, str]:
    """What the reading commands print for the database, command by command (not `full`: the
    sessions and every session's export)."""
    out = {}
    commands: list[tuple[str, ...]] = [("sessions", "--json")]
    commands += [("export", session, "--all") for session in LIVE]
    if full:
        commands += [("inspect", session, "--all", "--json") for session in LIVE]
        for user in ("ana", "bo"):
            commands += [
                ("facts", "--user", user, "--json"),
                ("facts", "history", "--user", user, "--json"),
            ]
    for command in commands:
        run = memcli("--db", db, *command)
        assert run.code == 0, (command, run.stderr)
        out[" ".join(command)] = run.stdout
    return out


def present(db: str) -> dict[str, int]:
    store: Any = open_store(db)
    try:
        return rows_present(store)
    finally:
        store.close()


def test_round_trip_reads_the_same_in_every_command(tmp_path: Path, pg_url: str) -> None:
    a, b = str(tmp_path / "a.db"), str(tmp_path / "b.db")
    build(a)
    there = memcli("copy", a, pg_url, "--json")
    assert there.code == 0, there.stderr
    [record] = there.records()
    assert record["type"] == "copy" and record["source"] == a
    assert record["counts"]["sessions"] == 3 and record["counts"]["messages"] == 70
    assert "Copied 3 sessions, 70 messages, 18 flushes, 4 facts" in there.stderr
    back = memcli("copy", pg_url, b)
    assert back.code == 0, back.stderr
    assert back.records() == [{**record, "source": back.records()[0]["source"], "destination": b}]
    original = views(a)
    assert views(pg_url) == original
    assert views(b) == original
    assert memcli("--db", b, "check").code == 0
    # The copy lives on: a put there gets new ids and flushes.
    (tmp_path / "more.jsonl").write_text(
        "".join(
            f'{{"role": "{"user" if i % 2 == 0 else "assistant"}", "content": "later {i} {"word " * 30}"}}\n'
            for i in range(10)
        )
    )
    for db in (pg_url, b):
        put = memcli("--db", db, "import", str(tmp_path / "more.jsonl"), "--session", "a1")
        assert put.code == 0, put.stderr
        assert memcli("--db", db, "check").code == 0
    exports = [memcli("--db", db, "export", "a1", "--all").stdout for db in (pg_url, b)]
    assert exports[0] == exports[1]
    assert len(exports[0].splitlines()) == 1 + 30 + 10
    assert exports[0] != original["export a1 --all"]


def test_a_destination_that_holds_data_is_refused_with_exit_2(tmp_path: Path, pg_url: str) -> None:
    a = str(tmp_path / "a.db")
    build(a)
    assert memcli("copy", a, pg_url).code == 0
    before = views(pg_url, full=False)
    again = memcli("copy", a, pg_url)
    assert again.code == 2
    assert "Error: the destination postgresql://" in again.stderr
    assert "is not empty (3 rows in sessions" in again.stderr
    assert views(pg_url, full=False) == before


def test_backup_of_postgresql_is_a_sqlite_file_that_copy_restores(
    tmp_path: Path, pg_url: str, request: pytest.FixtureRequest
) -> None:
    a, backup = str(tmp_path / "a.db"), tmp_path / "backups" / "pg.db"
    build(a)
    assert memcli("copy", a, pg_url).code == 0
    run = memcli("--db", pg_url, "backup", str(backup))
    assert run.code == 0, run.stderr
    assert f"to {backup} (3 sessions, 70 messages" in run.stderr
    assert f"memcli copy {backup} postgresql://" in run.stderr
    assert sorted(p.name for p in backup.parent.iterdir()) == ["pg.db"]  # no partial file left
    assert memcli("--db", str(backup), "check").code == 0
    original = views(a, full=False)
    assert views(str(backup), full=False) == original
    again = memcli("--db", pg_url, "backup", str(backup))
    assert again.code == 2 and "exists" in again.stderr
    restored = new_database(request.getfixturevalue("pg_server"))
    try:
        assert memcli("copy", str(backup), restored).code == 0
        assert views(restored, full=False) == original
    finally:
        drop_database(request.getfixturevalue("pg_server"), restored)


def test_a_missing_source_is_exit_1(tmp_path: Path) -> None:
    run = memcli("copy", str(tmp_path / "nope.db"), str(tmp_path / "b.db"))
    assert run.code == 1
    assert "no database at" in run.stderr


def test_a_failed_copy_removes_the_file_and_directories_it_made(tmp_path: Path) -> None:
    """A copy that fails (a table of SRC this memcli does not know) into a new SQLite file
    leaves neither the file nor the directories made for it; into an existing one, the file."""
    src = _source(tmp_path, 4)
    store: Any = open_store(src)
    with store.transaction():
        store.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    store.close()
    dst = tmp_path / "new" / "dir" / "dst.db"
    run = memcli("copy", src, str(dst))
    assert run.code == 1 and "does not know: notes" in run.stderr
    assert not (tmp_path / "new").exists()
    (tmp_path / "keep").mkdir()
    kept = tmp_path / "keep" / "dst.db"
    open_store(kept).close()  # an empty database that was there before
    assert memcli("copy", src, str(kept)).code == 1
    assert kept.exists()


def test_a_failed_backup_removes_the_directories_it_made(tmp_path: Path) -> None:
    """A backup of a damaged database: exit 1, no backup file and no directory made for it."""
    src = Path(_source(tmp_path, 2000))
    size = src.stat().st_size
    with src.open("r+b") as f:  # 8 KB of garbage in the middle
        f.seek(size // 2 // 4096 * 4096 + 100)
        f.write(random.Random(7).randbytes(8192))
    run = memcli("--db", str(src), "backup", str(tmp_path / "backups" / "b.db"))
    assert run.code == 1 and "damaged" in run.stderr
    assert not (tmp_path / "backups").exists()


def _source(tmp_path: Path, count: int) -> str:
    """A database with one session of `count` messages (imported without blocks)."""
    db = tmp_path / "src.db"
    lines = "".join(
        f'{{"role": "{"user" if i % 2 == 0 else "assistant"}", "content": "message {i} lorem ipsum"}}\n'
        for i in range(count)
    )
    (tmp_path / "t.jsonl").write_text(lines)
    run = memcli("--db", str(db), "import", str(tmp_path / "t.jsonl"), "--session", "big")
    assert run.code == 0, run.stderr
    return str(db)


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_copy_killed_at_random_points_leaves_all_of_it_or_none(
    tmp_path: Path, request: pytest.FixtureRequest, kind: str
) -> None:
    """8 copies of 20,000 messages, each killed with SIGKILL at a random moment (some before the
    commit, some after): each destination holds the whole copy or nothing, and checks clean."""
    src = _source(tmp_path, 20_000)
    server = request.getfixturevalue("pg_server") if kind == "postgresql" else None

    def destination(trial: int) -> str:
        if server is None:
            return str(tmp_path / f"dst{trial}.db")
        url = new_database(server)
        request.addfinalizer(lambda: drop_database(server, url))
        return url

    started = time.monotonic()
    whole = destination(99)
    assert memcli("copy", src, whole).code == 0
    duration = time.monotonic() - started  # how long one whole copy takes here
    rng = random.Random(7)
    outcomes = {"none": 0, "all": 0}
    for trial in range(8):
        dst = destination(trial)
        proc = popen_memcli("copy", src, dst)
        time.sleep(duration * 1.2 * (trial + rng.random()) / 8)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        if server is not None:  # the server ends the killed copy's session (and rolls it back)
            _wait_for_backends(dst)
        found = present(dst)
        assert found in ({}, present(whole)), (trial, found)
        outcomes["all" if found else "none"] += 1
        assert memcli("--db", dst, "check").code == 0
    print(f"kill -9 trials: {outcomes}")


def _wait_for_backends(url: str) -> None:
    """Until no other session is connected to the database (a killed client's is ended by the
    server when it notices the socket closed)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(200):
            others = conn.execute(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()"
            ).fetchone()[0]
            if not others:
                return
            time.sleep(0.05)

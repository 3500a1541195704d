"""Fault injection against real processes: kill -9 during an import, writers at once, a reader
while a writer holds the lock, a read-only database, a damaged file, a backup of a live database.

Each test is bounded (subprocess timeouts); none asserts on time."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import memcli, popen_memcli

from memcli.errors import StoreDamaged, StoreError
from memcli.store.sqlite import SQLiteStore

WORDS = "alpha beta gamma delta lorem ipsum dolor river stone cloud amber willow harbor".split()


def write_transcript(path: Path, count: int, tag: str, seed: int = 0) -> Path:
    """`count` messages, each content unique to (tag, index)."""
    rng = random.Random(f"{tag}-{seed}")
    with path.open("w") as f:
        for i in range(count):
            words = " ".join(rng.choices(WORDS, k=20))
            role = "user" if i % 2 == 0 else "assistant"
            f.write(json.dumps({"role": role, "content": f"{tag} {i} {words}"}) + "\n")
    return path


def session_rows(db: Path, session: str) -> list[tuple[int, str]]:
    """(seq, content) of a session's messages, in order, read with plain sqlite3."""
    conn = sqlite3.connect(db)
    try:
        return conn.execute(
            "SELECT seq, content FROM messages WHERE session_id = ? ORDER BY seq", (session,)
        ).fetchall()
    finally:
        conn.close()


def problems(db: Path) -> list[str]:
    store = SQLiteStore(db)
    try:
        return [f"{p.check}: {p.message}" for p in store.check()]
    finally:
        store.close()


# -- kill -9 -----------------------------------------------------------------------------------------


def test_an_import_killed_at_random_points_leaves_all_of_it_or_none(tmp_path: Path) -> None:
    """20 imports of 2,000 messages, each killed with SIGKILL at a random moment (some before the
    commit, some after): the database stays sound, each session holds all of its import or none,
    and the import run again completes."""
    count = 2000
    db = tmp_path / "m.db"
    source = write_transcript(tmp_path / "t.jsonl", count, "kill")
    base = memcli("--db", str(db), "import", str(source), "--session", "base", "--no-blocks")
    assert base.code == 0, base.stderr
    started = time.monotonic()
    assert (
        memcli("--db", str(db), "import", str(source), "--session", "timed", "--no-blocks").code
        == 0
    )
    duration = time.monotonic() - started  # how long one whole import takes here
    rng = random.Random(12)
    outcomes = {"none": 0, "all": 0}
    for trial in range(20):
        session = f"k{trial}"
        proc = popen_memcli(
            "--db", str(db), "import", str(source), "--session", session, "--no-blocks"
        )
        # Kill points spread over 1.2 import durations, so that some land after the commit.
        time.sleep(duration * 1.2 * (trial + rng.random()) / 20)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        assert problems(db) == [], f"trial {trial}"
        stored = len(session_rows(db, session))
        assert stored in (0, count), f"trial {trial}: {stored} of {count} messages stored"
        outcomes["all" if stored else "none"] += 1
        again = memcli("--db", str(db), "import", str(source), "--session", session, "--no-blocks")
        assert again.code == 0, again.stderr
        assert len(session_rows(db, session)) % count == 0
        assert problems(db) == []
    print(f"kill -9 trials: {outcomes}")


# -- concurrent writers ------------------------------------------------------------------------------


@pytest.mark.parametrize("same_session", [False, True], ids=["different-sessions", "same-session"])
def test_four_imports_at_once_all_succeed(tmp_path: Path, same_session: bool) -> None:
    """Four processes import into one new database at once: each waits its turn, none fails, no
    message is lost or doubled, and each import's messages stay together in order."""
    db = tmp_path / "m.db"
    count = 800
    sources = [write_transcript(tmp_path / f"t{i}.jsonl", count, f"w{i}") for i in range(4)]
    sessions = ["shared"] * 4 if same_session else [f"s{i}" for i in range(4)]
    procs = [
        popen_memcli(
            "--db",
            str(db),
            "import",
            str(src),
            "--session",
            ses,
            "--no-blocks",
            "--token-limit",
            "2000",
        )
        for src, ses in zip(sources, sessions, strict=True)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode()
    assert problems(db) == []
    expected = {
        src: [json.loads(line)["content"] for line in src.read_text().splitlines()]
        for src in sources
    }
    if same_session:
        rows = session_rows(db, "shared")
        assert [seq for seq, _ in rows] == list(range(4 * count))
        contents = [c for _, c in rows]
        blocks = [contents[i : i + count] for i in range(0, 4 * count, count)]
        assert sorted(map(tuple, blocks)) == sorted(map(tuple, expected.values()))
    else:
        for src, ses in zip(sources, sessions, strict=True):
            assert [c for _, c in session_rows(db, ses)] == expected[src]
    store = SQLiteStore(db)
    for info in store.list_sessions():
        assert info.active_tokens <= info.threshold
        assert info.active_messages + info.archived_messages == len(session_rows(db, info.id))


# -- readers and the write lock -----------------------------------------------------------------------


def test_readers_work_while_a_writer_holds_the_lock(tmp_path: Path) -> None:
    """With another connection inside BEGIN IMMEDIATE for the whole test, sessions, inspect,
    export, check, search and dump all succeed (none waits for the write lock); the search finds
    messages that were never added to the full-text index (it cannot write now)."""
    db = tmp_path / "m.db"
    source = write_transcript(tmp_path / "t.jsonl", 300, "read")
    assert memcli("--db", str(db), "import", str(source), "--session", "s", "--no-blocks").code == 0
    writer = sqlite3.connect(db, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("UPDATE sessions SET user_id = 'uncommitted'")
    try:
        listed = memcli("--db", str(db), "sessions", "--json")
        assert listed.code == 0, listed.stderr
        assert [r["user"] for r in listed.records()] == ["default"]
        inspected = memcli("--db", str(db), "inspect", "s", "--json")
        assert inspected.code == 0, inspected.stderr
        exported = memcli("--db", str(db), "export", "s", "--all")
        assert exported.code == 0, exported.stderr
        assert [r["type"] for r in exported.records()[:1]] == ["session"]
        assert len(exported.records()) == 1 + 300
        checked = memcli("--db", str(db), "check", "--json")
        assert checked.code == 0, checked.stdout
        found = memcli(
            "--db", str(db), "search", "read 157", "--mode", "lexical", "-k", "1", "--json"
        )
        assert found.code == 0, found.stderr
        assert "read 157 " in found.records()[0]["text"], found.records()
        # Hybrid search and the context a chat would get embed what is pending when they can
        # write; now they cannot: they rank with the vectors there are (none), and do not wait.
        hybrid = memcli("--db", str(db), "search", "read 157", "-k", "1", "--json")
        assert hybrid.code == 0, hybrid.stderr
        assert "read 157 " in hybrid.records()[0]["text"]
        context = memcli("--db", str(db), "dump", "context", "s", "--json")
        assert context.code == 0, context.stderr
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def test_a_write_waits_for_the_lock_instead_of_failing(tmp_path: Path) -> None:
    """A writer holds the lock for longer than the busy timeout; an import started meanwhile
    retries, and completes once the lock is free."""
    db = tmp_path / "m.db"
    source = write_transcript(tmp_path / "t.jsonl", 50, "wait")
    assert memcli("--db", str(db), "import", str(source), "--session", "a", "--no-blocks").code == 0
    writer = sqlite3.connect(db, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    proc = popen_memcli("--db", str(db), "import", str(source), "--session", "b", "--no-blocks")
    try:
        # The import is waiting (it cannot have stored anything while the lock is held).
        time.sleep(12)  # past SQLite's own busy timeout of 10 s
        assert proc.poll() is None
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert len(session_rows(db, "b")) == 50


def _unshare_available() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _unshare_available(), reason="needs `unshare -rm` for a read-only mount")
@pytest.mark.parametrize("live", [False, True], ids=["closed", "open-elsewhere"])
def test_reading_commands_work_in_a_read_only_directory(tmp_path: Path, live: bool) -> None:
    """The database's directory is bind-mounted read-only (nothing can be written there, even by
    root): reading commands work, a write fails with a clear message. Closed: no -wal/-shm file
    exists (nor can be made). Open elsewhere: a process outside the mount holds it open with a
    committed change still in the WAL, which the readers see."""
    data = tmp_path / "data"
    data.mkdir()
    db = data / "m.db"
    source = write_transcript(tmp_path / "t.jsonl", 200, "ro")
    assert memcli("--db", str(db), "import", str(source), "--session", "s", "--no-blocks").code == 0
    assert not Path(f"{db}-wal").exists()  # the last connection closed cleanly
    holder = None
    if live:
        holder = sqlite3.connect(db, isolation_level=None)
        holder.execute("UPDATE sessions SET token_limit = 1234")
        assert Path(f"{db}-wal").stat().st_size > 0
    commands = [
        ["sessions", "--json"],
        ["inspect", "s", "--json"],
        ["export", "s", "--all"],
        ["search", "ro 42", "--mode", "lexical", "-k", "1", "--json"],
        ["check", "--json"],
        ["import", str(source), "--session", "t", "--no-blocks"],
    ]
    script = f"mount --bind {data} {data} && mount -o remount,bind,ro {data} && " + " ; ".join(
        f"{sys.executable} -m memcli --db {db} "
        + " ".join(f"'{a}'" for a in args)
        + f" > {tmp_path}/out{i} 2> {tmp_path}/err{i}; echo $? > {tmp_path}/rc{i}"
        for i, args in enumerate(commands)
    )
    try:
        subprocess.run(["unshare", "-rm", "sh", "-c", script], check=True, timeout=300)
    finally:
        if holder is not None:
            holder.close()

    def result(i: int) -> tuple[int, str, str]:
        return (
            int((tmp_path / f"rc{i}").read_text()),
            (tmp_path / f"out{i}").read_text(),
            (tmp_path / f"err{i}").read_text(),
        )

    for i in range(5):
        code, out, err = result(i)
        assert code == 0, (commands[i], err)
    listed = json.loads(result(0)[1].splitlines()[0])
    assert listed["session"] == "s"
    assert (listed["token_limit"] == 1234) == live  # the change in the WAL is seen
    assert len(result(2)[1].splitlines()) == 1 + 200  # the session record, the messages
    assert "ro 42 " in json.loads(result(3)[1].splitlines()[0])["text"]
    code, out, err = result(5)
    assert code == 1
    assert "read-only" in err
    assert "Traceback" not in err


# -- damage ------------------------------------------------------------------------------------------


def _damage(db: Path) -> None:
    """8 KB of garbage in the middle of the file (same size)."""
    size = db.stat().st_size
    with db.open("r+b") as f:
        f.seek(size // 2 // 4096 * 4096 + 100)
        f.write(random.Random(7).randbytes(8192))


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_damaged_database_is_reported_never_written_nor_exported_partly(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    source = write_transcript(tmp_path / "t.jsonl", 2000, "dmg")
    assert memcli("--db", str(db), "import", str(source), "--session", "s", "--no-blocks").code == 0
    _damage(db)
    before = _digest(db)

    small = write_transcript(tmp_path / "small.jsonl", 10, "new")
    imported = memcli("--db", str(db), "import", str(small), "--session", "new", "--no-blocks")
    assert imported.code == 1
    assert "is damaged" in imported.stderr and "memcli check" in imported.stderr
    assert "Traceback" not in imported.stderr
    assert _digest(db) == before
    wal = Path(f"{db}-wal")
    assert not wal.exists() or wal.stat().st_size == 0

    out = tmp_path / "export.jsonl"
    with out.open("w") as f:
        exported = subprocess.run(
            [sys.executable, "-m", "memcli", "--db", str(db), "export", "s", "--all"],
            stdout=f,
            stderr=subprocess.PIPE,
            timeout=120,
        )
    assert exported.returncode == 1
    assert out.read_text() == ""
    assert b"is damaged" in exported.stderr and b"Traceback" not in exported.stderr

    checked = memcli("--db", str(db), "check", "--json")
    assert checked.code == 1
    found = [r for r in checked.records() if r["type"] == "problem"]
    assert found and found[0]["check"] == "integrity"
    assert checked.records()[-1] == {"type": "summary", "problems": len(found), "attention": 0}

    backup = memcli("--db", str(db), "backup", str(tmp_path / "b.db"))
    assert backup.code == 1 and not (tmp_path / "b.db").exists()


def test_once_sqlite_reports_damage_the_store_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the size the check before writing covers, SQLite's own errors decide: the first
    statement that meets the damage raises StoreDamaged, and the store refuses every write."""
    import memcli.store.sqlite as sqlite_store

    monkeypatch.setattr(sqlite_store, "QUICK_CHECK_BYTES", 0)  # as for a file larger than it
    db = tmp_path / "m.db"
    source = write_transcript(tmp_path / "t.jsonl", 2000, "big")
    assert memcli("--db", str(db), "import", str(source), "--session", "s", "--no-blocks").code == 0
    _damage(db)
    store = SQLiteStore(db)
    with pytest.raises(StoreDamaged, match="is damaged"):
        list(store.iter_messages("s"))
    with pytest.raises(StoreDamaged, match="does not write"):
        store.create_session("new", "u", 1000, 0.7, 100)
    store.close()
    assert "new" not in {row[0] for row in sqlite3.connect(db).execute("SELECT id FROM sessions")}


def test_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    db.write_bytes(random.Random(3).randbytes(16384))
    with pytest.raises(StoreError, match="damaged"):
        SQLiteStore(db)
    checked = memcli("--db", str(db), "check")
    assert checked.code == 1 and "not a database" in checked.stdout
    imported = memcli(
        "--db", str(db), "import", "-", "--no-blocks", input='{"role":"user","content":"x"}\n'
    )
    assert imported.code == 1 and "Traceback" not in imported.stderr


def test_check_finds_broken_bookkeeping(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    source = write_transcript(tmp_path / "t.jsonl", 300, "book")
    args = ("--db", str(db), "import", str(source), "--no-blocks", "--token-limit", "1000")
    assert memcli(*args, "--session", "a").code == 0
    assert memcli(*args, "--session", "b").code == 0
    clean = memcli("--db", str(db), "check", "--json")
    # (--no-blocks: the vector block's batches are listed as never handed to it, needing nothing)
    assert clean.code == 0 and [r for r in clean.records() if r["type"] != "attention"] == [
        {"type": "summary", "problems": 0, "attention": 0}
    ]
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("UPDATE sessions SET active_tokens = active_tokens + 5 WHERE id = 'a'")
    flush = conn.execute("SELECT MIN(id) FROM flushes WHERE session_id = 'a'").fetchone()[0]
    conn.execute(
        "UPDATE messages SET flush_id = ? WHERE id = (SELECT MAX(id) FROM messages"
        " WHERE session_id = 'b' AND status = 'archived')",
        (flush,),
    )
    conn.execute("UPDATE counters SET value = 3 WHERE name = 'message_id'")
    conn.execute(
        "INSERT INTO retrieval_vectors (message_id, piece, model, dim, vector)"
        " VALUES (999999, 0, 'm', 1, x'00000000')"
    )
    conn.close()
    checked = memcli("--db", str(db), "check", "--json")
    assert checked.code == 1
    found = {(r["check"], r["session"]) for r in checked.records() if r["type"] == "problem"}
    assert found == {
        ("counters", "a"),  # active tokens
        ("flush ids", "b"),  # archived by a flush of session a
        ("flushes", "a"),  # that flush now has one message too many
        ("flushes", "b"),  # and b's one too few
        ("counters", None),  # the id high-water mark
        ("vectors", None),  # a vector of no message
    }


# -- backup ------------------------------------------------------------------------------------------


def test_backup_of_a_live_database_is_consistent(tmp_path: Path) -> None:
    """Backups taken while another process imports are sound, and hold each session whole or not
    at all; an existing file is kept unless --force."""
    db = tmp_path / "m.db"
    first = write_transcript(tmp_path / "a.jsonl", 500, "first")
    assert memcli("--db", str(db), "import", str(first), "--session", "a", "--no-blocks").code == 0
    big = write_transcript(tmp_path / "big.jsonl", 4000, "live")
    writer = popen_memcli("--db", str(db), "import", str(big), "--session", "live", "--no-blocks")
    copies = []
    for i in range(4):
        target = tmp_path / f"b{i}.db"
        made = memcli("--db", str(db), "backup", str(target))
        assert made.code == 0, made.stderr
        assert "To restore it" in made.stderr
        copies.append(target)
    writer.communicate(timeout=300)
    assert writer.returncode == 0
    for target in copies:
        assert problems(target) == []
        assert len(session_rows(target, "a")) == 500
        assert len(session_rows(target, "live")) in (0, 4000)
        assert not Path(f"{target}-wal").exists()
    again = memcli("--db", str(db), "backup", str(copies[0]))
    assert again.code == 2 and "--force" in again.stderr
    forced = memcli("--db", str(db), "backup", str(copies[0]), "--force")
    assert forced.code == 0
    assert len(session_rows(copies[0], "live")) == 4000
    restored = tmp_path / "restored.db"
    shutil.copy(copies[0], restored)
    exported = memcli("--db", str(restored), "export", "live", "--all")
    assert len(exported.records()) == 1 + 4000  # the session record, the messages


def test_export_reads_everything_before_writing(tmp_path: Path) -> None:
    """`read_messages` gives the session from one snapshot: rows written meanwhile do not show."""
    db = tmp_path / "m.db"
    source = write_transcript(tmp_path / "t.jsonl", 100, "snap")
    assert memcli("--db", str(db), "import", str(source), "--session", "s", "--no-blocks").code == 0
    store = SQLiteStore(db)
    messages = store.read_messages("s")
    later = memcli(
        "--db",
        str(db),
        "import",
        "-",
        "--session",
        "s",
        "--no-blocks",
        input='{"role": "user", "content": "later"}\n',
    )
    assert later.code == 0, later.stderr
    assert len(list(messages)) == 100
    assert [m.content for m in store.read_messages("s")][-1] == "later"


def test_backup_makes_the_folder_it_is_asked_to_write_into(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    source = write_transcript(tmp_path / "t.jsonl", 20, "bk")
    assert memcli("--db", str(db), "import", str(source), "--session", "s", "--no-blocks").code == 0
    target = tmp_path / "backups" / "daily" / "m.db"
    made = memcli("--db", str(db), "backup", str(target))
    assert made.code == 0, made.stderr
    assert memcli("--db", str(target), "check").code == 0
    copied = memcli("--db", str(target), "export", "s", "--all")
    assert len(copied.records()) == 1 + 20

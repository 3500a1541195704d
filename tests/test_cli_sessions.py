"""`memcli sessions`, `inspect`, `export`, `rm`: output, exit codes, round trips, pipes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import memcli, no_blocks  # noqa: F401 (a fixture)

# No test here needs the default vector block: no command loads an embedding model.
pytestmark = pytest.mark.usefixtures("no_blocks")


def seed(tmp_path: Path, session: str = "demo", n: int = 10, limit: str = "60") -> None:
    records = []
    for i in range(n):
        records.append(
            {
                "role": "user",
                "content": f"user line {i} about the garden",
                "name": "Ana",
                "timestamp": f"2023-05-0{1 + i % 9}T10:00:00Z",
            }
        )
        records.append(
            {
                "role": "assistant",
                "content": f"assistant line {i} about roses",
                "metadata": {"turn": i},
            }
        )
    path = tmp_path / f"{session}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    run = memcli(
        "import", str(path), "--session", session, "--token-limit", limit, "--flush-size", "10"
    )
    assert run.code == 0, run.stderr


def test_sessions_empty_and_listed(tmp_path: Path) -> None:
    run = memcli("sessions")
    assert run.code == 0 and run.stdout == ""
    seed(tmp_path, "one")
    seed(tmp_path, "two", n=2, limit="1000")
    records = memcli("sessions").records()  # a pipe: JSON Lines without asking
    assert {r["session"] for r in records} == {"one", "two"}
    two = next(r for r in records if r["session"] == "two")
    assert two["active_messages"] == 4 and two["archived_messages"] == 0 and two["threshold"] == 700


@pytest.mark.usefixtures("cli_db")  # on SQLite and on PostgreSQL
def test_inspect_json(tmp_path: Path) -> None:
    seed(tmp_path)
    records = memcli("inspect", "demo", "--json").records()
    messages = [r for r in records if r["type"] == "message"]
    flushes = [r for r in records if r["type"] == "flush"]
    summary = records[-1]
    assert summary["type"] == "summary" and summary["session"] == "demo"
    for key in (
        "active_messages",
        "archived_messages",
        "active_tokens",
        "threshold",
        "token_limit",
        "flushes",
    ):
        assert key in summary
    assert len(messages) == summary["active_messages"]
    assert all(
        {"id", "role", "content", "tokens", "status", "flush_id"} <= set(m) for m in messages
    )
    assert all(m["status"] == "active" for m in messages)
    assert len(flushes) == summary["flushes"] > 0
    every = memcli("inspect", "demo", "--all", "--json").records()
    archived = [r for r in every if r["type"] == "message" and r["status"] == "archived"]
    assert len(archived) == summary["archived_messages"]
    assert all(r["flush_id"] is not None for r in archived)


def test_inspect_table_on_a_terminal(tmp_path: Path) -> None:
    """With a terminal, a table and the gauge (rich; forced to think stdout is a TTY)."""
    seed(tmp_path)
    code = (
        "import sys; sys.stdout.isatty = lambda: True; sys.argv = ['memcli', 'inspect', 'demo'];"
        "from memcli.cli.app import main; main()"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (
        "Session demo" in proc.stdout
        and "threshold" in proc.stdout
        and "Active window" in proc.stdout
    )
    assert "Flushes" in proc.stdout


def test_unknown_session(tmp_path: Path) -> None:
    seed(tmp_path)
    for command in ("inspect", "export", "rm"):
        run = memcli(command, "nope")
        assert run.code == 1
        assert "no session 'nope'" in run.stderr and "memcli sessions" in run.stderr


def test_no_database_yet() -> None:
    run = memcli("inspect", "x")
    assert run.code == 1 and "no database" in run.stderr


#: Every command that only reads the database (and `rm`, `facts edit|rm`: nothing to change).
READING = [
    ("sessions",),
    ("inspect", "s"),
    ("export", "s"),
    ("rm", "s"),
    ("search", "roses"),
    ("check",),
    ("summary", "s"),
    ("dump", "blocks", "s"),
    ("dump", "context", "s"),
    ("facts",),
    ("facts", "search", "tea"),
    ("facts", "history"),
    ("facts", "edit", "1", "tea"),
    ("facts", "rm", "1"),
    ("facts", "extract"),
    ("blocks", "list", "s"),
    ("blocks", "backfill"),
    ("backup", "BACKUP"),
]


@pytest.mark.parametrize(
    ("command", "how"),
    [(c, "flag") for c in READING]
    + [
        (("sessions",), "env"),
        (("check",), "env"),
        (("facts",), "config"),
        (("search", "x"), "config"),
    ],
    ids=lambda x: " ".join(x) if isinstance(x, tuple) else x,
)
def test_a_reading_command_on_a_missing_database_creates_nothing(
    tmp_path: Path, command: tuple[str, ...], how: str
) -> None:
    """A mistyped database path, however given: exit 1 naming it, and neither the file nor
    its directory made."""
    db = tmp_path / "typo" / "memcli.db"
    args = [a.replace("BACKUP", str(tmp_path / "b.db")) for a in command]
    if how == "flag":
        run = memcli("--db", str(db), *args)
    elif how == "env":
        run = memcli(*args, env={"MEMCLI_DB": str(db)})
    else:
        config = tmp_path / "memcli.toml"
        config.write_text(f"db = {json.dumps(str(db))}\nblocks = []\n")
        run = memcli("--config", str(config), *args)
    assert run.code == 1, run.stderr
    assert f"no database at {db}" in run.stderr and "memcli import" in run.stderr
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "typo").exists() and not (tmp_path / "b.db").exists()


def test_sessions_on_a_fresh_home_lists_none_and_creates_nothing(isolated: Path) -> None:
    """The default database not made yet is no error for `sessions`: there are none."""
    run = memcli("sessions")
    assert run.code == 0 and run.stdout == ""
    assert not list(isolated.glob("*.db"))


def test_writing_commands_create_the_database(tmp_path: Path) -> None:
    db = tmp_path / "new" / "dir" / "memcli.db"
    refused = memcli("--db", str(db), "facts", "add", "Ana likes tea", "--user", "ana")
    assert refused.code == 2 and f"no folder '{db.parent}'" in " ".join(refused.stderr.split())
    assert not (tmp_path / "new").exists()  # a typo in --db makes no folders
    db.parent.mkdir(parents=True)
    added = memcli("--db", str(db), "facts", "add", "Ana likes tea", "--user", "ana")
    assert added.code == 0, added.stderr
    assert db.exists()
    listed = memcli("--db", str(db), "facts", "--user", "ana", "--json").records()
    assert [f["text"] for f in listed] == ["Ana likes tea"]
    other = tmp_path / "other.db"
    seed(tmp_path, "t")  # (into the default database)
    imported = memcli("--db", str(other), "import", str(tmp_path / "t.jsonl"), "--session", "t")
    assert imported.code == 0 and other.exists()


@pytest.mark.usefixtures("cli_db")  # on SQLite and on PostgreSQL
def test_export_round_trip(tmp_path: Path) -> None:
    seed(tmp_path)
    exported = memcli("export", "demo", "--all")
    assert exported.code == 0
    head, *records = exported.records()  # the session's record, then its messages
    assert head["type"] == "session" and head["token_limit"] == 60
    assert len(records) == 20 and {r["status"] for r in records} == {"active", "archived"}
    path = tmp_path / "export.jsonl"
    path.write_text(exported.stdout)
    run = memcli(
        "import", str(path), "--session", "copy", "--token-limit", "60", "--flush-size", "10"
    )
    assert run.code == 0, run.stderr
    original = memcli("inspect", "demo", "--all", "--json").records()
    copy = memcli("inspect", "copy", "--all", "--json").records()

    def shape(records: list[dict]) -> list[tuple]:
        return [
            (
                r["role"],
                r["content"],
                r.get("name"),
                r.get("metadata"),
                r.get("timestamp"),
                r["status"],
                r["tokens"],
            )
            for r in records
            if r["type"] == "message"
        ]

    assert shape(copy) == shape(original)
    active_only = memcli("export", "demo").records()[1:]
    assert all("status" not in r for r in active_only)
    assert len(active_only) == original[-1]["active_messages"]


def test_a_user_with_nothing_stored_is_said_so(tmp_path: Path) -> None:
    """A user name with no sessions (mistyped, as often as not): `sessions` (on a terminal or in
    a pipe) names the users that have some, and `rm --user` says nothing is stored rather than
    "forgot"."""
    seed(tmp_path, "one")
    code = (
        "import sys; sys.stdout.isatty = lambda: True;"
        " sys.argv = ['memcli', 'sessions', '--user', 'nobody'];"
        "from memcli.cli.app import main; main()"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "No sessions of user nobody. The users with sessions: default." in proc.stderr
    run = memcli("sessions", "--user", "defautl")  # a pipe: said on stderr too, close name first
    assert run.code == 0 and run.stdout == "", run.stderr
    assert "No sessions of user defautl. Did you mean --user default? The users" in run.stderr
    run = memcli("rm", "--user", "nobody", "--yes")
    assert run.code == 0 and "user 'nobody': nothing is stored for this user" in run.stderr
    run = memcli("rm", "--user", "defualt", "--yes")  # a typo: the close name, nothing deleted
    said = " ".join(run.stderr.split())
    assert run.code == 0 and "Nothing is stored for user defualt. Did you mean --user default?" in said
    assert [r["session"] for r in memcli("sessions").records()] == ["one"]


@pytest.mark.usefixtures("cli_db")  # on SQLite and on PostgreSQL
def test_rm(tmp_path: Path) -> None:
    seed(tmp_path, "a", n=1)
    seed(tmp_path, "b", n=1)
    run = memcli("rm", "a", "--json")
    assert run.code == 0 and run.records() == [{"type": "deleted", "session": "a", "messages": 2}]
    assert [s["session"] for s in memcli("sessions").records()] == ["b"]


def test_closed_pipe_is_quiet(tmp_path: Path) -> None:
    seed(tmp_path, n=200, limit="100000")
    proc = subprocess.run(
        f"{sys.executable} -m memcli inspect demo --json | head -1",
        shell=True,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["type"] == "message"
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


def test_global_db_option(tmp_path: Path) -> None:
    db = tmp_path / "elsewhere.db"
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"role": "user", "content": "hi"}) + "\n")
    assert memcli("--db", str(db), "import", str(path), "--session", "x").code == 0
    assert db.exists()
    assert memcli("sessions").records() == []
    assert [r["session"] for r in memcli("--db", str(db), "sessions").records()] == ["x"]
    assert [r["session"] for r in memcli("sessions", env={"MEMCLI_DB": str(db)}).records()] == ["x"]


def test_bad_config_is_a_usage_error(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[memory]\ntoken_limit = 'x'\n")
    run = memcli("--config", str(config), "sessions")
    assert run.code == 2 and str(config) in run.stderr


def terminal_run(*args: str) -> subprocess.CompletedProcess[str]:
    """memcli with stdout taken for a terminal (rich tables), 200 columns wide."""
    code = (
        f"import sys; sys.stdout.isatty = lambda: True; sys.argv = ['memcli', *{list(args)!r}];"
        "from memcli.cli.app import main; main()"
    )
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    proc.stdout = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout)  # bold headers
    return proc


def test_inspect_shows_names_and_times_when_messages_have_them(tmp_path: Path) -> None:
    seed(tmp_path)
    proc = terminal_run("inspect", "demo", "--all")
    assert proc.returncode == 0, proc.stderr
    header = next(line for line in proc.stdout.splitlines() if "role" in line)
    assert [c.strip() for c in header.split("┃")][:4] == ["id", "role", "name", "time"]
    assert "Ana" in proc.stdout and "2023-05-0" in proc.stdout
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"role": "user", "content": "no name, no time"}) + "\n")
    assert memcli("import", str(plain), "--session", "plain").code == 0
    proc = terminal_run("inspect", "plain")
    header = next(line for line in proc.stdout.splitlines() if "role" in line)
    assert "name" not in header and "time" not in header
    assert "1 active, 0 archived, 0 flushes" in proc.stdout


def test_counts_of_one_are_singular(tmp_path: Path) -> None:
    path = tmp_path / "single.jsonl"
    path.write_text(json.dumps({"role": "user", "content": "hello"}) + "\n")
    assert memcli("import", str(path), "--session", "single").code == 0
    proc = terminal_run("simulate", "flush", str(path), "--no-chart")
    assert proc.returncode == 0, proc.stderr
    assert "1 message, " in proc.stdout and "1 messages" not in proc.stdout
    proc = terminal_run("inspect", "single")
    assert "0 flushes" in proc.stdout
    run = memcli("rm", "single")
    assert run.code == 0 and "(1 message)" in run.stderr and "1 messages" not in run.stderr


def test_inspect_limit_shows_the_last_messages(tmp_path: Path) -> None:
    seed(tmp_path, n=10, limit="100000")
    everything = [
        r for r in memcli("inspect", "demo", "--json").records() if r["type"] == "message"
    ]
    run = memcli("inspect", "demo", "--limit", "3", "--json")
    assert run.code == 0, run.stderr
    last = [r for r in run.records() if r["type"] == "message"]
    assert last == everything[-3:] and len(everything) == 20
    assert memcli("inspect", "demo", "--limit", "0").code == 2
    proc = terminal_run("inspect", "demo", "--limit", "2")
    assert proc.returncode == 0, proc.stderr
    assert "Active window (last 2 of 20)" in proc.stdout
    assert "assistant line 9" in proc.stdout and "line 8" not in proc.stdout


def test_inspect_pages_on_a_terminal_only(tmp_path: Path) -> None:
    """On a terminal the tables go through $PAGER (here one that keeps what it is given); in a
    pipe, $PAGER is never run."""
    seed(tmp_path)
    kept = tmp_path / "paged.txt"
    pager = f"cat > {kept}"
    code = (
        "import sys; sys.stdout.isatty = lambda: True; sys.argv = ['memcli', 'inspect', 'demo'];"
        "from memcli.cli.app import main; main()"
    )
    env = {**os.environ, "COLUMNS": "200", "PAGER": pager}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""  # all of it went to the pager
    assert "Session demo" in kept.read_text() and "Active window" in kept.read_text()
    kept.unlink()
    run = memcli("inspect", "demo", env={"PAGER": pager})
    assert run.code == 0 and run.records() and not kept.exists()


def test_imported_conversations_show_their_titles(tmp_path: Path) -> None:
    export = Path(__file__).parent / "data" / "exports" / "chatgpt-conversations.json"
    dry = terminal_run("import", str(export), "--dry-run", "--no-blocks")
    assert dry.returncode == 0, dry.stderr
    assert "Sourdough in Bern" in dry.stdout and "new messages" in dry.stdout
    assert "Dry run: would store 9 messages in 2 sessions (2 new)" in dry.stderr
    assert memcli("sessions", "--json").records() == []  # nothing written
    assert memcli("import", str(export), "--no-blocks").code == 0
    proc = terminal_run("sessions")
    assert proc.returncode == 0, proc.stderr
    header = next(line for line in proc.stdout.splitlines() if "session" in line)
    assert [c.strip() for c in header.split("┃")][:3] == ["session", "title", "user"]
    assert "Zurich museum day" in proc.stdout
    records = memcli("sessions", "--json").records()
    assert {r["title"] for r in records} == {"Sourdough in Bern", "Zurich museum day"}
    assert all(r["source_id"].startswith("chatgpt:") for r in records)

"""The output contract of every data command: JSON Lines in a pipe, "not found" exits 1, and a
reader that stops reading early (`| head -1`) ends the command quietly with exit 0."""

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


def seed(tmp_path: Path, session: str = "demo", n: int = 6) -> None:
    records = []
    for i in range(n):
        records += [
            {"role": "user", "content": f"user line {i} about the garden", "name": "Ana"},
            {"role": "assistant", "content": f"assistant line {i} about roses"},
        ]
    path = tmp_path / f"{session}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    run = memcli(
        "import", str(path), "--session", session, "--token-limit", "60", "--flush-size", "10"
    )
    assert run.code == 0, run.stderr


def add_fact(text: str = "Ana grows roses", *more: str) -> int:
    run = memcli("facts", "add", text, *more, "--json")
    assert run.code == 0, run.stderr
    return int(run.records()[0]["id"])


#: Every data command (import's summary is tested with import), as run in a pipe.
DATA_COMMANDS = [
    ["sessions"],
    ["inspect", "demo"],
    ["inspect", "demo", "--all"],
    ["export", "demo"],
    ["export", "demo", "--all"],
    ["rm", "demo"],
    ["search", "garden", "--mode", "lexical"],
    ["facts"],
    ["facts", "add", "Ana likes tulips"],
    ["facts", "edit", "{fact}", "Ana grows white roses"],
    ["facts", "rm", "{fact}"],
    ["facts", "history"],
    ["facts", "history", "{fact}"],
    ["dump", "context", "demo"],
    ["simulate", "flush", "--session", "demo"],
    ["info"],
]


@pytest.mark.parametrize("args", DATA_COMMANDS, ids=" ".join)
def test_data_commands_write_json_lines_in_a_pipe(tmp_path: Path, args: list[str]) -> None:
    seed(tmp_path)
    fact = add_fact()
    run = memcli(*(a.replace("{fact}", str(fact)) for a in args))
    assert run.code == 0, run.stderr
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    assert lines, f"{args}: nothing on stdout in a pipe"
    for line in lines:
        assert isinstance(json.loads(line), dict), line


def test_removed_facts_and_sessions_are_records(tmp_path: Path) -> None:
    seed(tmp_path, "a", n=1)
    first, second = add_fact("one"), add_fact("two")
    run = memcli("facts", "rm", str(first), str(second))
    assert run.code == 0, run.stderr
    assert [(r["type"], r["id"], r["text"]) for r in run.records()] == [
        ("removed", first, "one"),
        ("removed", second, "two"),
    ]
    assert "Removed 2 facts." in run.stderr
    run = memcli("rm", "a")
    assert run.records() == [{"type": "deleted", "session": "a", "messages": 2}]
    assert "(2 messages)" in run.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["inspect", "nope"],
        ["export", "nope"],
        ["rm", "nope"],
        ["dump", "context", "nope"],
        ["dump", "blocks", "nope"],
        ["search", "garden", "--session", "nope", "--mode", "lexical"],
        ["simulate", "flush", "--session", "nope"],
        ["blocks", "backfill", "nope"],
        ["facts", "--session", "nope"],
        ["facts", "rm", "999"],
        ["facts", "edit", "999", "new text"],
        ["facts", "history", "999"],
    ],
    ids=" ".join,
)
def test_not_found_exits_1(tmp_path: Path, args: list[str]) -> None:
    seed(tmp_path)
    run = memcli(*args)
    assert run.code == 1, run.stderr
    assert run.stderr.startswith("Error: no ") and run.stdout == ""


def test_a_fact_of_another_user_is_not_found(tmp_path: Path) -> None:
    seed(tmp_path)
    fact = add_fact("Bo runs", "--user", "bo")
    for args in (["rm", str(fact)], ["edit", str(fact), "Bo walks"]):
        run = memcli("facts", *args, "--user", "ana")
        assert run.code == 1 and f"no fact {fact} of user 'ana'" in run.stderr
    run = memcli("facts", "edit", str(fact), "Bo walks", "--user", "bo")
    assert run.code == 0 and run.records()[0]["text"] == "Bo walks"
    assert memcli("facts", "rm", str(fact)).code == 0  # without --user, any user's


def closed_pipe(*args: str) -> subprocess.CompletedProcess[bytes]:
    """Run memcli with stdout a pipe whose reader has already gone (as `| head -1` ends up)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-m", "memcli", *args],
            stdout=write,
            stderr=subprocess.PIPE,
            timeout=120,
        )
    finally:
        os.close(write)


@pytest.mark.parametrize(
    "args",
    [
        ["sessions"],
        ["export", "demo", "--all"],
        ["search", "garden", "--mode", "lexical"],
        ["inspect", "demo", "--all"],
        ["facts", "history"],
    ],
    ids=" ".join,
)
def test_a_reader_that_left_ends_the_command_with_exit_0(tmp_path: Path, args: list[str]) -> None:
    seed(tmp_path)
    add_fact()
    proc = closed_pipe(*args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == b""


def test_head_under_pipefail(tmp_path: Path) -> None:
    seed(tmp_path, n=600)
    proc = subprocess.run(
        ["bash", "-o", "pipefail", "-c", f"{sys.executable} -m memcli export demo --all | head -1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["type"] == "session" and proc.stderr == ""


def test_export_takes_user_and_json(tmp_path: Path) -> None:
    seed(tmp_path)  # session demo of user "default"
    mine = memcli("export", "demo", "--user", "default", "--json")
    assert mine.code == 0, mine.stderr
    records = mine.records()
    assert records[0]["type"] == "session" and records[0]["user"] == "default"
    theirs = memcli("export", "demo", "--user", "bob")
    assert theirs.code == 1
    assert theirs.stdout == ""
    assert "no session 'demo' of user 'bob'" in theirs.stderr


def narrow_run(*args: str) -> subprocess.CompletedProcess[str]:
    """memcli with stdout taken for a terminal of 50 columns (rich tables), colour off."""
    code = (
        f"import sys; sys.stdout.isatty = lambda: True; sys.argv = ['memcli', *{list(args)!r}];"
        "from memcli.cli.app import main; main()"
    )
    env = {**os.environ, "COLUMNS": "50", "PAGER": "cat"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    proc.stdout = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout)  # bold headers
    return proc


def test_tables_keep_ids_session_names_and_numbers_whole_at_50_columns(tmp_path: Path) -> None:
    session = "a-rather-long-session-name-2024"
    seed(tmp_path, session)
    fact = add_fact("Ana grows roses in a garden that she describes at great length, every day")
    for args, whole in [
        (["sessions"], [session]),
        (["inspect", session, "--all"], [session, "assistant"]),
        # (one block, every fact current: the table leaves block and state out, for the text)
        (["facts"], [f"{fact} │ Ana grows", "manual"]),
        (["search", "garden", "--mode", "lexical"], [session, "0.0"]),
    ]:
        proc = narrow_run(*args)
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert all(len(line) <= 50 for line in lines), proc.stdout
        for word in whole:
            assert any(word in line for line in lines), (args, word, proc.stdout)
    records = memcli("inspect", session, "--all", "--json").records()
    ids = {r["id"] for r in records if r["type"] == "message"}
    shown = narrow_run("inspect", session, "--all").stdout
    assert {int(i) for i in re.findall(r"\bid (\d+) ·", shown)} == ids


#: Text no legacy encoding holds whole: emoji, CJK, Cyrillic (and é, which latin-1 holds).
WORLD = "Hello 🎉 日本語のテキスト, Привет ✓, café"


@pytest.mark.parametrize("encoding", ["latin-1", "ascii"])
def test_a_terminal_in_a_legacy_encoding_gets_every_text_without_a_traceback(
    tmp_path: Path, encoding: str
) -> None:
    """A terminal set to latin-1 or ASCII: tables show what it cannot hold as escapes; JSON
    Lines carry it as JSON escapes, the same records read back; errors too."""
    session = "demo-🎉"
    path = tmp_path / "t.jsonl"
    path.write_text(
        json.dumps({"role": "user", "content": WORLD}, ensure_ascii=False) + "\n", "utf-8"
    )
    assert memcli("import", str(path), "--session", session, "--no-blocks").code == 0
    env = {**os.environ, "PYTHONIOENCODING": encoding, "COLUMNS": "200", "PAGER": "cat"}

    def run(*args: str, tty: bool) -> tuple[int, str, str]:
        code = (
            f"import sys; sys.stdout.isatty = lambda: {tty}; sys.argv = ['memcli', *{list(args)!r}];"
            "from memcli.cli.app import main; main()"
        )
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env)
        return proc.returncode, proc.stdout.decode(encoding), proc.stderr.decode(encoding)

    for args in (["inspect", session], ["sessions"], ["search", "Hello", "--mode", "lexical"]):
        code, out, err = run(*args, tty=True)
        assert code == 0 and "Traceback" not in err, err
        assert "\\U0001f389" in out, out  # the emoji, escaped
    code, out, err = run("inspect", session, "--json", tty=False)
    assert code == 0 and "Traceback" not in err, err
    out.encode("ascii" if encoding == "ascii" else "latin-1")  # it fits the encoding
    records = [json.loads(line) for line in out.splitlines()]
    assert records[0]["content"] == WORLD and records[0]["session"] == session
    code, out, err = run("inspect", "nope-🎉", tty=True)
    assert code == 1 and "Traceback" not in err and "no session 'nope-\\U0001f389'" in err


def wide_run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`narrow_run` at 150 columns, in `cwd`."""
    code = (
        f"import sys; sys.stdout.isatty = lambda: True; sys.argv = ['memcli', *{list(args)!r}];"
        "from memcli.cli.app import main; main()"
    )
    env = {**os.environ, "COLUMNS": "150", "PAGER": "cat"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd
    )
    proc.stdout = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout)
    return proc


def test_tables_have_no_empty_header_row_and_every_column_named(tmp_path: Path) -> None:
    """A list of names and values (`info`'s first table, `simulate flush`'s summary) starts with
    its first row, not an empty header; the `import --dry-run` table names every column."""
    (tmp_path / "c.jsonl").write_text('{"role": "user", "content": "hi"}\n')
    info = wide_run("info", cwd=tmp_path)
    assert info.returncode == 0, info.stderr
    assert info.stdout.splitlines()[0].split("│")[0].strip() == "version", info.stdout
    simulated = wide_run("simulate", "flush", "c.jsonl", cwd=tmp_path)
    lines = simulated.stdout.splitlines()
    summary = lines.index(next(line for line in lines if line.strip() == "Summary"))
    assert lines[summary + 1].startswith("budget"), simulated.stdout
    dry = wide_run("import", "--dry-run", "c.jsonl", cwd=tmp_path)
    header = next(line for line in dry.stdout.splitlines() if "session" in line)
    assert [c.strip() for c in header.split("┃")] == [
        "session",
        "state",
        "new messages",
        "already stored",
        "title",
    ], dry.stdout


def test_counts_of_one_are_singular(tmp_path: Path) -> None:
    """ "1 flush", "1 token", "1 message": never "1 flushes" (output.plural everywhere)."""
    run = memcli("chat", "--plain", input="hi\nmore\n/flush\n/session\n/context\n")
    assert run.code == 0, run.stderr
    said = run.stdout + run.stderr
    assert "Flushed 1 message (1 token)" in said, said
    assert "1 active message, 1 token of" in said and "archived in 1 flush\n" in said, said
    assert "── user (1 token) ──" in said, said
    for wrong in ("1 flushes", "1 tokens", "1 messages"):
        assert not re.search(rf"(?<![\d,]){wrong}", said), said


def test_help_puts_arguments_with_their_command_and_names_every_metavar() -> None:
    """`chat --help` (as `/help`) shows `/session [ID]` in the command column; no option shows
    a type name instead of a metavar (`-k <int range>`, `--model <str>`)."""
    chat = memcli("chat", "--help", env={"COLUMNS": "150"})
    assert re.search(r"^\s*/session \[ID\]\s+show the session", chat.stdout, re.M), chat.stdout
    assert re.search(r"^\s*/search QUERY\s+hybrid search", chat.stdout, re.M), chat.stdout
    assert "--model NAME" in chat.stdout and "--api-base URL" in chat.stdout, chat.stdout
    facts = memcli("facts", "--help", env={"COLUMNS": "150"})
    assert re.search(r"-k N\s", facts.stdout), facts.stdout
    for run in (chat, facts):
        assert not re.search(r"<(int|str|float|int range)>", run.stdout), run.stdout

"""`memcli facts` as people read it (issue 44, item 9): the fact's text gets the table's room
at 140 columns, and --session takes a unique start of a session id as the other commands do."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import llm_config, memcli, no_blocks  # noqa: F401 (a fixture)
from helpers import turns_transcript as transcript

SESSION = "my-passport-number-ends-in-pp-7300-and-m-3a1001"
FACT = "The user's passport number ends in PP-7300 and it expires in March 2027"


@pytest.fixture
def config(tmp_path: Path, llm) -> str:
    """A database with one session (SESSION) and one extracted fact (FACT)."""
    path = llm_config(tmp_path, llm, timeout=5)
    llm.script({"content": f"<facts><fact>{FACT}</fact></facts>"})
    llm.default = {"content": "<facts></facts>"}
    run = memcli("--config", path, "import", transcript(tmp_path, 3), "--session", SESSION)
    assert run.code == 0, run.stderr
    return path


def table(config: str, *args: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """`memcli facts ARGS` on a terminal of 140 columns: its lines."""
    from typer.testing import CliRunner

    from memcli.cli import output
    from memcli.cli.app import app

    monkeypatch.setattr(output, "stdout_is_tty", lambda: True)
    monkeypatch.setenv("COLUMNS", "140")
    output.out.cache_clear()  # (a console made by an earlier test has its width)
    try:
        shown = CliRunner().invoke(app, ["--config", config, "facts", *args])
    finally:
        output.out.cache_clear()
    assert shown.exit_code == 0, shown.output
    return shown.stdout.splitlines()


def test_the_fact_text_gets_the_room_of_a_140_column_table(config, monkeypatch):
    lines = table(config, monkeypatch=monkeypatch)
    header = lines[0]
    assert "fact" in header and "session" in header and "updated" in header
    assert all(len(line) <= 140 for line in lines)
    fact_column = header.split("┃")[1]
    assert len(fact_column) >= 35, header  # was 12 columns: the fact took 8 lines
    rows = [line for line in lines[2:] if line.strip()]
    assert len(rows) <= 2
    assert SESSION in rows[0]  # the session id whole
    assert "2027" in " ".join(rows)


def test_facts_session_takes_a_unique_start_of_a_session_id(config):
    whole = memcli("--config", config, "facts", "extract", "--dry-run", "--session", SESSION)
    assert whole.code == 0, whole.stderr
    start = memcli("--config", config, "facts", "extract", "--dry-run", "--session", "my-pass")
    assert start.code == 0, start.stderr
    assert start.stdout == whole.stdout
    listed = memcli("--config", config, "facts", "--session", "my-pass", "--json")
    assert listed.code == 0, listed.stderr
    assert (
        listed.records()
        == memcli("--config", config, "facts", "--session", SESSION, "--json").records()
    )
    unknown = memcli("--config", config, "facts", "extract", "--dry-run", "--session", "nope")
    assert unknown.code != 0 and "nope" in unknown.stderr

"""`memcli dump blocks` and `memcli dump context`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from clidata import BUDGET, write_chat
from helpers import memcli


def config(tmp_path: Path, extra: str = "") -> str:
    path = tmp_path / "c.toml"
    path.write_text(
        '[[blocks]]\nkind = "static"\nname = "persona"\ncontent = "You are terse."\n\n'
        '[[blocks]]\nkind = "static"\nname = "notes"\npriority = 2\n'
        'content = "' + " ".join(["note"] * 50) + '"\n' + extra
    )
    return str(path)


def test_dump_blocks_and_truncation(tmp_path: Path) -> None:
    c = config(tmp_path)
    assert memcli("--config", c, "import", write_chat(tmp_path / "a.jsonl"), *BUDGET).code == 0
    run = memcli("--config", c, "dump", "blocks", "s1", "--json")
    assert run.code == 0, run.stderr
    persona, notes = run.records()
    assert persona == {
        "type": "block",
        "name": "persona",
        "kind": "StaticBlock",
        "priority": 0,
        "scope": "user",
        "tokens": 4,
        "content": "You are terse.",
        "truncated": None,
        "tokens_after_truncation": 4,
    }
    assert notes["tokens"] == 50 and notes["truncated"] is None
    # A small budget: the notes block (priority 2) would be dropped, the persona (0) never.
    run = memcli(
        "--config",
        c,
        "import",
        "-",
        "--session",
        "tight",
        "--token-limit",
        "40",
        input='{"role": "user", "content": "hello there"}\n',
    )
    assert run.code == 0, run.stderr
    persona, notes = memcli("--config", c, "dump", "blocks", "tight", "--json").records()
    assert persona["truncated"] is None
    assert notes["truncated"] == "dropped" and notes["tokens_after_truncation"] == 0
    assert notes["content"].startswith("note note")
    only = memcli("--config", c, "dump", "blocks", "--block", "persona", "--json").records()
    assert [r["name"] for r in only] == ["persona"]
    run = memcli("--config", c, "dump", "blocks", "--block", "nope")
    assert (
        run.code == 2 and "no block named 'nope'" in run.stderr and "persona, notes" in run.stderr
    )


@pytest.mark.usefixtures("cli_db")  # on SQLite and on PostgreSQL
def test_dump_context_is_what_get_returns(tmp_path: Path) -> None:
    c = config(tmp_path)
    assert memcli("--config", c, "import", write_chat(tmp_path / "a.jsonl"), *BUDGET).code == 0
    run = memcli("--config", c, "dump", "context", "s1", "--input", "and now?", "--json")
    assert run.code == 0, run.stderr
    messages = run.records()
    notes = " ".join(["note"] * 50)
    assert messages[0] == {
        "type": "message",
        "role": "system",
        "content": f"<memory>\n<persona>\nYou are terse.\n</persona>\n<notes>\n{notes}\n</notes>\n</memory>",
    }
    active = memcli("--config", c, "inspect", "s1", "--json").records()
    contents = [r["content"] for r in active if r["type"] == "message"]
    assert [m["content"] for m in messages[1:-1]] == contents
    # Then the input, as the model is sent it (not stored: inspect does not list it).
    assert messages[-1] == {"type": "input", "role": "user", "content": "and now?"}
    assert "and now?" not in contents
    code = (
        "import sys; sys.stdout.isatty = lambda: True; sys.argv = ['memcli', '--config', sys.argv[1],"
        " 'dump', 'context', 's1', '--input', 'and now?']; from memcli.cli.app import main; main()"
    )
    shown = subprocess.run([sys.executable, "-c", code, c], capture_output=True, text=True)
    text = re.sub(r"\x1b\[[0-9;]*m", "", shown.stdout)
    assert text.rstrip().endswith("user (the input, not stored)\nand now?"), shown.stderr
    # In a terminal-less run without --json it is JSON Lines too; unknown sessions are errors.
    assert memcli("--config", c, "dump", "context", "s1").records()[0]["role"] == "system"
    run = memcli("--config", c, "dump", "context", "nope")
    assert run.code == 1 and "no session 'nope'" in run.stderr


@pytest.mark.slow
def test_dump_blocks_with_the_default_vector_block(tmp_path: Path) -> None:
    assert memcli("import", write_chat(tmp_path / "a.jsonl"), *BUDGET).code == 0
    run = memcli("dump", "blocks", "--input", "where do I live?", "--json")
    assert run.code == 0, run.stderr
    vector, facts = run.records()  # the default fact block: no model, no facts yet
    assert (facts["name"], facts["content"]) == ("extracted_info", "")
    assert vector["name"] == "vector_memory" and vector["priority"] == 2
    assert "Porto" in vector["content"] and vector["tokens"] > 0

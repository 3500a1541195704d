"""Budget options: a writing command (import, chat) never changes a stored session's budget
unless --rebudget says so; a reading command (inspect, dump, simulate --session) never stores one."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import memcli, no_blocks  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("no_blocks")


def seed(tmp_path: Path, session: str = "demo") -> str:
    lines = []
    for i in range(20):
        lines.append({"role": "user", "content": f"question {i} about the garden and its roses"})
        lines.append({"role": "assistant", "content": f"answer {i} about planting in spring"})
    path = tmp_path / "seed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    run = memcli("import", str(path), "--session", session, "--token-limit", "4000")
    assert run.code == 0, run.stderr
    return memcli("export", session, "--all").stdout


def test_chat_with_another_budget_is_refused_unless_rebudget(tmp_path: Path) -> None:
    before = seed(tmp_path)
    run = memcli("chat", "--plain", "--session", "demo", "--token-limit", "100", input="hello\n")
    assert run.code == 2
    assert "has the budget 4,000 × 0.7 (flush 400)" in run.stderr and "--rebudget" in run.stderr
    assert memcli("export", "demo", "--all").stdout == before  # the line was not stored either
    what_if = memcli("inspect", "demo", "--token-limit", "100", "--json").records()[-1]["what_if"]
    run = memcli(
        "chat", "--plain", "--session", "demo", "--token-limit", "100", "--rebudget", input="hi\n"
    )
    assert run.code == 0, run.stderr
    assert "budget 100 × 0.7 (flush 10) stored (was 4,000 × 0.7 (flush 400))" in run.stderr
    said = re.search(r"the change flushed (\d+) messages", run.stderr)
    summary = memcli("inspect", "demo", "--json").records()[-1]
    assert summary["token_limit"] == 100
    assert said is not None and 0 < int(said.group(1)) <= summary["archived_messages"]
    assert int(said.group(1)) == what_if["messages"]  # as `inspect --token-limit` foretold
    run = memcli("chat", "--plain", "--session", "demo", "--token-limit", "100", input="ok\n")
    assert run.code == 0, run.stderr  # the budget it has: no error


def test_reading_commands_store_no_budget(tmp_path: Path) -> None:
    before = seed(tmp_path)
    what_if = {"MEMCLI_TOKEN_LIMIT": "50", "MEMCLI_RATIO": "0.2"}
    runs = [
        memcli("simulate", "flush", "--session", "demo", "--token-limit", "100", "--json"),
        memcli("inspect", "demo", "--token-limit", "100", "--ratio", "0.5", "--json"),
        memcli("inspect", "demo", env=what_if),
        memcli("dump", "context", "demo", env=what_if),
        memcli("dump", "blocks", "demo", env=what_if),
    ]
    assert [r.code for r in runs] == [0] * 5, [r.stderr for r in runs]
    summary = [r for r in runs[0].records() if r["type"] == "summary"][0]
    assert summary["token_limit"] == 100  # the what-if was simulated
    inspected = runs[1].records()[-1]
    assert inspected["token_limit"] == 4000  # the session's own budget, and the what-if beside it
    assert inspected["what_if"]["token_limit"] == 100 and inspected["what_if"]["threshold"] == 50
    assert inspected["what_if"]["messages"] > 0 and inspected["what_if"]["flush_size"] == 10
    assert memcli("export", "demo", "--all").stdout == before


def test_dump_with_a_token_limit_is_a_what_if(tmp_path: Path) -> None:
    c = tmp_path / "blocks.toml"
    c.write_text(
        '[[blocks]]\nkind = "static"\nname = "persona"\ncontent = "You are terse."\n\n'
        '[[blocks]]\nkind = "static"\nname = "notes"\npriority = 2\n'
        'content = "' + " ".join(["note"] * 50) + '"\n'
    )
    hello = '{"role": "user", "content": "hello there"}\n'
    run = memcli(
        "--config", str(c), "import", "-", "--session", "t", "--token-limit", "40", input=hello
    )
    assert run.code == 0, run.stderr
    _, notes = memcli("--config", str(c), "dump", "blocks", "t", "--json").records()
    assert notes["truncated"] == "dropped"  # the session's own 40 tokens
    what_if = ("--token-limit", "4000", "--json")
    _, notes = memcli("--config", str(c), "dump", "blocks", "t", *what_if).records()
    assert notes["truncated"] is None and notes["tokens_after_truncation"] == 50
    system = memcli("--config", str(c), "dump", "context", "t", *what_if).records()[0]
    assert system["role"] == "system" and "note note" in system["content"]
    assert "note note" not in memcli("--config", str(c), "dump", "context", "t").stdout
    assert memcli("inspect", "t", "--json").records()[-1]["token_limit"] == 40  # nothing stored

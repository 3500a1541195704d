"""`memcli search`, `memcli blocks backfill` and `memcli import` feeding the vector block."""

from __future__ import annotations

from pathlib import Path

import pytest
from clidata import BUDGET, write_chat
from helpers import memcli

pytestmark = pytest.mark.slow


def test_backfill_then_search(
    tmp_path: Path, vdb: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    if vdb.startswith("postgresql://"):
        monkeypatch.setenv("MEMCLI_DB", vdb)
    chat = write_chat(tmp_path / "chat.jsonl")
    run = memcli("import", chat, "--no-blocks", "--json", *BUDGET)
    assert run.code == 0, run.stderr
    assert run.records()[-1]["blocks_fed"] is False
    # Search covers every stored message, blocks fed or not (issue 6: was "nothing yet").
    run = memcli("search", "cello", "--json")
    assert run.code == 0 and "cello" in run.records()[0]["text"]
    run = memcli("search", "zeppelin", "--mode", "lexical", "--json")
    assert run.code == 0 and run.records() == [] and "No matches" in run.stderr

    run = memcli("blocks", "backfill", "--json")
    assert run.code == 0, run.stderr
    records = {r["name"]: r for r in run.records()}
    vector = records["vector_memory"]
    assert vector["done"] >= 2 and vector["pending"] == vector["waiting"] == 0
    # The fact block has no model: handed nothing, and said so (not "nothing to backfill").
    facts = records["extracted_info"]
    assert facts["done"] == facts["pending"] == 0 and facts["waiting"] == vector["done"]
    assert "waiting for a model" in run.stderr
    run = memcli("blocks", "backfill", "s1", "--json")
    assert run.code == 0 and "Nothing to backfill" not in run.stderr
    assert run.records() == [
        {"type": "block", "name": "vector_memory", "done": 0, "pending": 0, "waiting": 0},
        {
            "type": "block",
            "name": "extracted_info",
            "done": 0,
            "pending": 0,
            "waiting": facts["waiting"],
        },
    ]

    run = memcli("search", "which musical instrument do I play", "-k", "2", "--json")
    assert run.code == 0, run.stderr
    hits = run.records()
    assert [h["rank"] for h in hits] == [1, 2]
    assert hits[0]["type"] == "hit" and "cello" in hits[0]["text"]
    assert hits[0]["session"] == "s1" and hits[0]["message_ids"]
    assert hits[0]["score"] >= hits[1]["score"]
    assert memcli("search", "cello", "--session", "s1", "--json").records()
    assert memcli("search", "cello", "--user", "bob", "--json").records() == []
    run = memcli("search", "cello", "--session", "s1", "--user", "bob")  # refused, as in chat
    assert run.code == 1 and "no session 's1' of user 'bob'" in run.stderr
    assert "--user default" in run.stderr
    run = memcli("search", "cello", "--session", "nope")
    assert run.code == 1 and "no session 'nope'" in run.stderr

    # The index files (beside a SQLite database, under $MEMCLI_HOME/indexes for PostgreSQL
    # without pgvector) are a cache: delete them and search still works.
    home = tmp_path / "home"
    files = [*home.glob("memcli.db.retrieval.*"), *home.glob("indexes/*/retrieval.*")]
    pgvector = request.node.callspec.params["vdb"] == "pgvector"  # (no files: PostgreSQL searches)
    assert len(files) == (0 if pgvector else 2)  # (a flat index's rows and description)
    for path in files:
        path.unlink()
    assert "cello" in memcli("search", "cello", "-k", "1", "--json").records()[0]["text"]


def test_import_feeds_the_vector_block_and_a_second_session_recalls(tmp_path: Path) -> None:
    run = memcli("import", write_chat(tmp_path / "a.jsonl", "first"), "--json", *BUDGET)
    assert run.code == 0, run.stderr
    summary = run.records()[-1]
    assert summary["blocks_fed"] is True and summary["block_batches"] == summary["flushes"] > 0
    # Nothing left for backfill but the fact block's batches, which wait for a model.
    run = memcli("blocks", "backfill", "--json")
    assert run.code == 0 and "vector_memory: 0 batches processed." in run.stderr
    assert [r["waiting"] for r in run.records() if r["name"] == "extracted_info"] == [
        summary["flushes"]
    ]
    second = tmp_path / "b.jsonl"
    second.write_text('{"role": "user", "content": "hello again", "session": "second"}\n')
    assert memcli("import", str(second)).code == 0
    run = memcli("dump", "context", "second", "--input", "what is my dog called?", "--json")
    assert run.code == 0, run.stderr
    messages = run.records()
    assert messages[0]["role"] == "system" and "Rex" in messages[0]["content"]
    assert messages[-2] == {"type": "message", "role": "user", "content": "hello again"}
    assert messages[-1] == {"type": "input", "role": "user", "content": "what is my dog called?"}


def test_queries_table_shows_each_querys_text(tmp_path: Path) -> None:
    import json
    import os
    import re
    import subprocess
    import sys

    chat = write_chat(tmp_path / "chat.jsonl")
    assert memcli("import", chat, "--no-blocks", *BUDGET).code == 0
    queries = tmp_path / "q.jsonl"
    queries.write_text(
        json.dumps({"query": "cello lessons"}) + "\n" + json.dumps({"query": "Douro river"}) + "\n"
    )
    args = ["search", "--queries", str(queries), "--mode", "lexical", "-k", "1"]
    code = (
        f"import sys; sys.stdout.isatty = lambda: True; sys.argv = ['memcli', *{args!r}];"
        "from memcli.cli.app import main; main()"
    )
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    shown = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout)
    rows = [line.split("│") for line in shown.splitlines() if "│" in line]
    firsts = [r for r in rows if r[0].strip()]  # a hit's text may take several lines
    assert [r[0].strip() for r in firsts] == ["cello lessons", "Douro river"]


def test_no_matches_names_the_users_that_have_some(tmp_path: Path) -> None:
    """`memcli search cello` after `import --user alice` says whose messages match and the
    --user to use (stderr); the search itself stays the default user's (no hits)."""
    chat = write_chat(tmp_path / "chat.jsonl")
    assert memcli("import", chat, "--user", "alice", "--no-blocks").code == 0
    run = memcli("search", "cello", "--mode", "lexical", "--json")
    assert run.code == 0 and run.records() == []
    assert "No matches for user default." in run.stderr
    assert "Users with matches: alice. Use --user alice." in run.stderr
    run = memcli("search", "cello", "--json")  # hybrid: the same
    assert run.code == 0 and run.records() == [] and "Use --user alice" in run.stderr
    run = memcli("search", "zeppelin", "--user", "bob", "--mode", "lexical")
    assert run.code == 0 and "No matches." in run.stderr and "--user" not in run.stderr
    assert memcli("search", "cello", "--user", "alice", "--json").records()

"""`memcli check` lists unfinished long-term work (`memcli.health`) besides integrity problems."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import FACTS_BLOCK, llm_config, memcli, popen_memcli
from helpers import turns_transcript as transcript


def write_config(tmp_path: Path, llm, blocks: str = FACTS_BLOCK) -> str:
    return llm_config(tmp_path, llm, blocks, timeout=2)


@pytest.mark.usefixtures("cli_db")  # on SQLite and on PostgreSQL
def test_failed_extraction_makes_check_fail_until_the_retry(llm, tmp_path: Path) -> None:
    config = write_config(tmp_path, llm)
    llm.default = {"status": 500}
    try:
        run = memcli("--config", config, "import", transcript(tmp_path, 3), "--session", "s1")
        assert run.code == 1 and "pending" in run.stderr and "stored" in run.stderr, run.stderr
        run = memcli("--config", config, "check", "--json")
        assert run.code == 1, run.stderr
        assert "of long-term work unfinished" in run.stderr
        records = run.records()
        pending = [r for r in records if r["type"] == "attention" and r["kind"] == "pending"]
        assert [(r["count"], r["status"]) for r in pending] == [(1, 500)]
        assert "batch of user 'default' pending" in pending[0]["message"]
        assert (
            "server (HTTP 500)" in pending[0]["message"]
            and "extracted_info" in pending[0]["message"]
        )
        assert pending[0]["fix"] == "memcli blocks backfill --user default"
        assert records[-1]["type"] == "summary" and records[-1]["problems"] == 0
        info = memcli("--config", config, "info", "--json").records()
        work = {r["name"]: r["count"] for r in info if r["type"] == "unfinished"}
        assert work["pending"] == 1
    finally:
        llm.default = {"content": "<facts></facts>"}
    llm.script(
        {"content": "<facts><fact>Ana likes tea</fact></facts>"},
        {"content": "<facts><fact>Ana likes jazz</fact></facts>"},
    )
    fix = memcli("--config", config, "facts", "extract")
    assert fix.code == 0, fix.stderr
    run = memcli("--config", config, "check")
    assert run.code == 0 and "no problems" in run.stderr, run.stdout + run.stderr
    llm.default = {"content": "OK"}


def test_batches_never_fed_are_listed(llm, tmp_path: Path) -> None:
    config = write_config(tmp_path, llm)
    llm.default = {"content": "<facts></facts>"}
    try:
        run = memcli(
            "--config", config, "import", transcript(tmp_path, 3), "--session", "s1", "--no-blocks"
        )
        assert run.code == 0, run.stderr
        run = memcli("--config", config, "check", "--json")
        assert run.code == 1
        found = [r for r in run.records() if r["type"] == "attention"]
        assert [(r["kind"], r["block"], r["count"]) for r in found] == [
            ("unfed", "extracted_info", 2)
        ]
        assert found[0]["fix"] == "memcli blocks backfill --user default"
        assert memcli("--config", config, "blocks", "backfill").code == 0
        assert memcli("--config", config, "check").code == 0
    finally:
        llm.default = {"content": "OK"}


def test_failed_condensation_is_listed_and_retried(llm, tmp_path: Path) -> None:
    blocks = '[[blocks]]\nkind = "facts"\nmax_facts = 1\n'
    config = write_config(tmp_path, llm, blocks)
    two = "<facts><fact>Ana likes tea</fact><fact>Ana likes jazz</fact></facts>"
    llm.script({"content": two}, {"content": two})  # the condensing reply keeps 2 > max_facts
    llm.default = {"content": "<facts></facts>"}
    try:
        line = '{"role": "user", "content": "I like tea and jazz, and more words here"}\n'
        run = memcli("--config", config, "import", "-", "--session", "s1", input=line * 4)
        assert run.code == 0, run.stderr
        run = memcli("--config", config, "check", "--json")
        assert run.code == 1, run.stderr
        found = [r for r in run.records() if r["type"] == "attention"]
        assert [r["kind"] for r in found] == ["condense"], found
        assert found[0]["error"] == "the reply left 2 facts, over max_facts (1)", found
        assert found[0]["fix"].startswith("memcli facts extract --pending")
        merged = '<facts><fact replaces="1, 2">Ana likes tea and jazz</fact></facts>'
        llm.script({"content": merged})
        assert memcli("--config", config, "facts", "extract", "--pending").code == 0
        assert memcli("--config", config, "check").code == 0
    finally:
        llm.default = {"content": "OK"}


def test_damaged_index_file_is_listed(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    lines = "".join(
        json.dumps({"role": "user", "content": f"message {i} about tea"}) + "\n" for i in range(6)
    )
    assert memcli("--db", str(db), "import", "-", "--session", "s", input=lines).code == 0
    assert memcli("--db", str(db), "search", "tea").code == 0
    assert memcli("--db", str(db), "check").code == 0
    npz = Path(f"{db}.retrieval.npz")
    data = bytearray(npz.read_bytes())
    data[len(data) // 2] ^= 0xFF
    npz.write_bytes(bytes(data))
    run = memcli("--db", str(db), "check", "--json")
    found = [r for r in run.records() if r["type"] == "attention"]
    assert run.code == 1 and [r["kind"] for r in found] == ["index"], run.stdout
    assert "damaged" in found[0]["message"] and found[0]["fix"].startswith("memcli search")
    assert memcli("--db", str(db), "search", "tea").code == 0  # rebuilt
    assert memcli("--db", str(db), "check").code == 0


def test_an_import_killed_while_feeding_leaves_batches_check_lists(llm, tmp_path: Path) -> None:
    """kill -9 while the fact block extracts: the messages are stored, the batches are not fed;
    running the import again stores nothing and feeds nothing, and `check` says so."""

    config = write_config(tmp_path, llm)
    source = transcript(tmp_path, 4)
    _kill_once_the_llm_is_asked(llm, "--config", config, "import", source, "--session", "s1")
    run = memcli("--config", config, "check", "--json")
    assert run.code == 1, run.stderr
    found = [r for r in run.records() if r["type"] == "attention"]
    # (the batches flushed and never fed; the conversation the extraction had started to read)
    assert [(r["kind"], r["block"]) for r in found] == [
        ("unfed", "extracted_info"),
        ("unread", "extracted_info"),
    ], found
    assert found[0]["count"] >= 1 and found[0]["fix"] == "memcli blocks backfill --user default"
    assert found[1]["count"] == 1 and found[1]["fix"] == "memcli facts extract --user default"
    # The import again: nothing new is stored, and the extraction it left is finished.
    again = memcli("--config", config, "import", source, "--session", "s1", "--json")
    summary = [r for r in again.records() if r["type"] == "summary"]
    assert again.code == 0 and summary[-1]["new"] == 0, again.stderr
    assert memcli("--config", config, "check").code == 0
    llm.default = {"content": "OK"}


def test_a_damaged_full_text_index_is_named_and_refuses_deletes(tmp_path: Path) -> None:
    """Garbage in the full-text index's pages: SQLite's integrity check sees nothing, FTS5's
    does; `rm` deletes nothing and says why; `check --repair` rebuilds the index."""
    import sqlite3

    db = tmp_path / "m.db"
    lines = "".join(
        json.dumps({"role": "user", "content": f"message {i} about tea and word{i}"}) + "\n"
        for i in range(60)
    )
    args = ("--db", str(db))
    assert memcli(*args, "import", "-", "--session", "s", "--user", "ana", input=lines).code == 0
    assert memcli(*args, "search", "tea", "--user", "ana", "--mode", "lexical").code == 0
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute(
        "UPDATE retrieval_fts_data SET block = randomblob(length(block))"
        " WHERE id = (SELECT MAX(id) FROM retrieval_fts_data)"
    )
    conn.close()

    run = memcli(*args, "check", "--json")
    problems = [r for r in run.records() if r["type"] == "problem"]
    assert run.code == 1 and [r["check"] for r in problems] == ["full-text index"], run.stdout
    assert "damaged" in problems[0]["message"]
    assert problems[0]["fix"].startswith("memcli check --repair")
    assert "run the command under each" in run.stderr

    for rm in (["s", "--message", "5"], ["--user", "ana"], ["s"]):
        run = memcli(*args, "rm", *rm, "--yes")
        assert run.code == 1, run.stderr
        assert "full-text index" in run.stderr and "nothing was deleted" in run.stderr
        assert "memcli check --repair" in run.stderr and "Traceback" not in run.stderr
        count = sqlite3.connect(db).execute("SELECT COUNT(*) FROM messages").fetchone()[0]
        assert count == 60, rm

    run = memcli(*args, "check", "--repair")
    assert run.code == 0 and "Repaired the full-text index" in run.stderr, run.stderr
    found = memcli(*args, "search", "word42", "--user", "ana", "--mode", "lexical", "--json")
    assert found.code == 0 and "word42" in found.records()[0]["text"]
    assert memcli(*args, "rm", "s", "--message", "5", "--yes").code == 0
    assert memcli(*args, "check").code == 0


def rm_killed_after_commit(db: Path, session: str, message: int) -> None:
    """`memcli rm --message`, stopped between the delete's commit and its cleanup (as a kill
    there would stop it): the store's purge, which runs after the commit, is interrupted."""
    import os
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from memcli.store.sqlite import SQLiteStore\n"
        "def killed(self): raise KeyboardInterrupt\n"
        "SQLiteStore.purge = killed\n"
        "from memcli.cli.app import main\n"
        f"sys.argv = ['memcli', '--db', {str(db)!r}, 'rm', {session!r}, '--message',"
        f" '{message}', '--yes']\n"
        "main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=os.environ, capture_output=True)
    assert proc.returncode == 130, proc.stderr.decode()


def indexed_ids(db: Path) -> list[int]:
    import numpy as np

    npz = Path(f"{db}.retrieval.npz")
    if not npz.exists():
        return []
    with np.load(npz) as data:
        return [int(i) for i in data["message_ids"]]


@pytest.mark.parametrize("finish", ["search", "check --repair", "rm"])
def test_a_delete_stopped_before_its_cleanup_is_listed_and_finished(
    tmp_path: Path, finish: str
) -> None:
    db = tmp_path / "m.db"
    lines = "".join(
        json.dumps({"role": "user", "content": f"message {i} about tea"}) + "\n" for i in range(6)
    )
    assert memcli("--db", str(db), "import", "-", "--session", "s", input=lines).code == 0
    assert memcli("--db", str(db), "search", "tea").code == 0
    ids = [
        r["id"]
        for r in memcli("--db", str(db), "inspect", "s", "--json").records()
        if r["type"] == "message"
    ]
    gone = ids[2]
    assert gone in indexed_ids(db)
    rm_killed_after_commit(db, "s", gone)
    assert gone in indexed_ids(db)  # the vector is still in the index file
    run = memcli("--db", str(db), "check", "--json")
    found = [r for r in run.records() if r["type"] == "attention"]
    assert run.code == 1 and "delete" in [r["kind"] for r in found], run.stdout
    entry = next(r for r in found if r["kind"] == "delete")
    assert entry["count"] == 1 and entry["fix"].startswith("memcli check --repair")
    if finish == "search":
        assert memcli("--db", str(db), "search", "tea").code == 0
    elif finish == "check --repair":
        run = memcli("--db", str(db), "check", "--repair")
        assert "Finished 1 delete(s)" in run.stderr, run.stderr
    else:
        run = memcli("--db", str(db), "rm", "s", "--message", str(gone), "--yes")
        assert run.code == 1 and f"no message {gone}" in run.stderr, run.stderr
        assert "Finished a delete" in run.stderr
    assert gone not in indexed_ids(db)
    run = memcli("--db", str(db), "check")
    assert run.code == 0, run.stdout + run.stderr


def _interrupt_once_the_llm_is_asked(llm, *args: str) -> tuple[int | None, str]:
    """Start `memcli ARGS` against a slow LLM, Ctrl-C it while it waits for a reply: (exit
    code, stderr)."""
    import signal
    import time

    llm.default = {"delay": 30, "content": "<facts></facts>"}
    try:
        before = len(llm.requests)
        proc = popen_memcli(*args)
        deadline = time.monotonic() + 60
        while len(llm.requests) == before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(llm.requests) > before, "the command never asked the LLM"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        llm.default = {"content": "<facts></facts>"}
    return proc.returncode, err.decode()


def test_an_interrupted_import_and_backfill_name_the_user_they_are_about(
    llm, tmp_path: Path
) -> None:
    """Ctrl-C while an import of `--user big` feeds its blocks: the hint is the backfill of
    user big (a bare `memcli blocks backfill` works on `default`); Ctrl-C during that backfill
    exits 130 and says what it did and how to go on."""
    config = write_config(tmp_path, llm)
    source = transcript(tmp_path, 4)
    code, err = _interrupt_once_the_llm_is_asked(
        llm, "--config", config, "import", source, "--session", "s1", "--user", "big"
    )
    assert code == 130, err
    assert "Interrupted while extracting facts: the messages are stored" in err, err
    assert "`memcli facts extract --user big` goes on from there" in err, err
    found = [r for r in memcli("--config", config, "check", "--json").records()]
    assert {r["fix"] for r in found if r["type"] == "attention"} == {
        "memcli blocks backfill --user big",
        "memcli facts extract --user big",  # (the active messages: only extraction reads them)
    }
    code, err = _interrupt_once_the_llm_is_asked(
        llm, "--config", config, "blocks", "backfill", "--user", "big"
    )
    assert code == 130, err
    assert "Interrupted: the blocks processed 0 of 3 batches; the rest are left." in err, err
    assert "`memcli blocks backfill --user big` goes on from there" in err, err
    assert memcli("--config", config, "blocks", "backfill", "--user", "big").code == 0
    found = [r for r in memcli("--config", config, "check", "--json").records()]
    assert [r["kind"] for r in found if r["type"] == "attention"] == ["unread"]
    assert memcli("--config", config, "facts", "extract", "--user", "big").code == 0
    assert memcli("--config", config, "check").code == 0


def test_batches_never_handed_to_the_vector_block_are_listed_as_needing_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The vector block catches up itself (a search embeds what has no vector), but `check`
    still lists the batches it was never handed (an interrupted import used to leave 403 of
    them unsaid), with the backfill of their user; it needs nothing, so check exits 0."""
    db = tmp_path / "m.db"
    lines = "".join(
        json.dumps({"role": "user", "content": f"message {i} about tea"}) + "\n" for i in range(40)
    )
    args = ("--db", str(db), "import", "-", "--no-blocks", "--user", "big", "--token-limit", "60")
    assert memcli(*args, input=lines).code == 0
    run = memcli("--db", str(db), "check", "--json")
    assert run.code == 0, run.stderr
    found = [r for r in run.records() if r["type"] == "attention"]
    assert [(r["kind"], r["block"], r["user"], r["needed"]) for r in found] == [
        ("unfed", "vector_memory", "big", False)
    ], found
    assert found[0]["count"] >= 1 and found[0]["fix"].startswith(
        "memcli blocks backfill --user big"
    )
    assert run.records()[-1] == {"type": "summary", "problems": 0, "attention": 0}
    # On a terminal: listed apart, as needing nothing, and said so in the last line.
    from typer.testing import CliRunner

    from memcli.cli import output
    from memcli.cli.app import app

    monkeypatch.setattr(output, "stdout_is_tty", lambda: True)
    output.out.cache_clear()
    shown = CliRunner().invoke(app, ["--db", str(db), "check"])
    output.out.cache_clear()
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert lines[0] == "Needs nothing (the next search does it by itself):", lines
    assert lines[1].startswith("  unfed: block 'vector_memory'") and lines[2].startswith(
        "    fix: memcli blocks backfill --user big"
    ), lines
    assert (
        "no problems found (1 piece of long-term work the next search does by itself)"
        in " ".join(shown.stderr.split())
    ), shown.stderr
    # A search of the user embeds them: nothing is left to list (no backfill needed).
    assert memcli("--db", str(db), "search", "tea", "--user", "big").code == 0
    after = memcli("--db", str(db), "check", "--json").records()
    assert [r for r in after if r["type"] == "attention"] == []
    assert memcli("--db", str(db), "blocks", "backfill", "--user", "big").code == 0
    after = memcli("--db", str(db), "check", "--json").records()
    assert [r for r in after if r["type"] == "attention"] == []


@pytest.mark.usefixtures("cli_db")  # on SQLite and on PostgreSQL
def test_an_import_killed_while_extracting_facts_leaves_conversations_check_lists(
    llm, tmp_path: Path
) -> None:
    """kill -9 during the facts extraction of an import of short conversations (never
    flushed: only the extraction reads them): `check` and `info` list the conversations left
    unread, with `facts extract` as the fix, which reads them and clears the list."""

    config = write_config(tmp_path, llm)
    source = tmp_path / "five.jsonl"
    source.write_text(
        "".join(
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": f"My pet number {i} is a cat called Tom{i}"},
                        {"role": "assistant", "content": "Noted"},
                    ]
                }
            )
            + "\n"
            for i in range(5)
        )
    )
    _kill_once_the_llm_is_asked(llm, "--config", config, "import", str(source), "--user", "ana")
    assert len(memcli("sessions", "--user", "ana", "--json").records()) == 5
    run = memcli("--config", config, "check", "--json")
    assert run.code == 1, run.stdout + run.stderr
    found = [r for r in run.records() if r["type"] == "attention"]
    assert [(r["kind"], r["block"], r["user"], r["count"]) for r in found] == [
        ("unread", "extracted_info", "ana", 5)
    ], found
    assert found[0]["fix"] == "memcli facts extract --user ana"
    info = memcli("--config", config, "info", "--json").records()
    assert {r["name"]: r["count"] for r in info if r["type"] == "unfinished"}["unread"] == 5
    fix = memcli("--config", config, "facts", "extract", "--user", "ana")
    assert fix.code == 0, fix.stderr
    run = memcli("--config", config, "check")
    assert run.code == 0 and "no problems" in run.stderr, run.stdout + run.stderr
    assert memcli("rm", "--user", "ana", "--yes").code == 0
    llm.default = {"content": "OK"}


def _kill_once_the_llm_is_asked(llm, *args: str) -> None:
    """Start `memcli ARGS` against a slow LLM, kill -9 it while it waits for a reply."""
    import os
    import signal
    import time

    llm.default = {"delay": 30, "content": "<facts></facts>"}
    try:
        before = len(llm.requests)
        proc = popen_memcli(*args)
        deadline = time.monotonic() + 120
        while len(llm.requests) == before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(llm.requests) > before, "the command never asked the LLM"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        llm.default = {"content": "<facts></facts>"}

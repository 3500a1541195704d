"""`memcli facts` and fact extraction during `memcli import`, over HTTP to the loopback LLM."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import llm_config, memcli, no_blocks  # noqa: F401 (a fixture)
from helpers import turns_transcript as transcript


def write_config(tmp_path: Path, llm, timeout: float = 5) -> str:
    return llm_config(tmp_path, llm, timeout=timeout)


@pytest.mark.usefixtures("cli_db")  # on SQLite and on PostgreSQL
def test_import_extracts_then_list_add_edit_rm_history(llm, tmp_path: Path) -> None:
    config = write_config(tmp_path, llm)
    llm.script(
        {"content": "<facts><fact>Ana has a dog named Rex</fact></facts>"},
        {"content": "<facts><fact>Ana lives in Porto</fact></facts>"},
    )
    run = memcli("--config", config, "import", transcript(tmp_path, 3), "--session", "s1", "--json")
    assert run.code == 0, run.stderr
    summary = run.records()[-1]
    assert summary["flushes"] == 2 and summary["block_batches"] == 2

    run = memcli("--config", config, "facts", "--json")
    assert run.code == 0, run.stderr
    facts = run.records()
    assert [f["text"] for f in facts] == ["Ana has a dog named Rex", "Ana lives in Porto"]
    assert all(f["type"] == "fact" and f["session"] == "s1" and f["message_ids"] for f in facts)

    run = memcli("--config", config, "facts", "add", "ana has a DOG named rex")
    assert run.code == 0 and "Already known" in run.stderr
    run = memcli("--config", config, "facts", "add", "Ana is vegetarian", "--json")
    assert run.code == 0
    added = run.records()[0]
    assert added["origin"] == "manual"

    first = facts[0]["id"]
    assert memcli("--config", config, "facts", "edit", str(first), "Ana has two dogs").code == 0
    assert memcli("--config", config, "facts", "rm", str(facts[1]["id"])).code == 0
    texts = [f["text"] for f in memcli("--config", config, "facts", "--json").records()]
    assert texts == ["Ana has two dogs", "Ana is vegetarian"]

    history = memcli("--config", config, "facts", "history", str(first), "--json").records()
    assert [(h["action"], h["text"], h["old_text"]) for h in history] == [
        ("added", "Ana has a dog named Rex", None),
        ("edited", "Ana has two dogs", "Ana has a dog named Rex"),
    ]
    all_changes = memcli("--config", config, "facts", "history", "--json").records()
    assert [h["action"] for h in all_changes] == ["added", "added", "added", "edited", "deleted"]
    # Each change says which path made it: extraction, then `memcli facts` (manual).
    assert [h["origin"] for h in all_changes] == [
        "extracted",
        "extracted",
        "manual",
        "manual",
        "manual",
    ]

    # Another user has no facts.
    run = memcli("--config", config, "facts", "--user", "bob", "--json")
    assert run.code == 0 and run.records() == [] and "No facts" in run.stderr


@pytest.mark.usefixtures("cli_db")  # on SQLite and on PostgreSQL
def test_unknown_fact_id(tmp_path: Path, llm) -> None:
    config = write_config(tmp_path, llm)
    assert memcli("--config", config, "facts", "add", "Ana likes tea").code == 0  # a database
    for args in (["edit", "99", "x"], ["rm", "99"], ["history", "99"]):
        run = memcli("--config", config, "facts", *args)
        assert run.code == 1 and "no fact 99" in run.stderr


@pytest.mark.usefixtures("no_blocks")
def test_fact_id_beyond_sqlite_integers_is_not_found() -> None:
    huge = "99999999999999999999999"
    cases = [
        (["edit", huge, "x"], huge),
        (["rm", huge], huge),
        (["history", huge], huge),
        (["rm", "--", f"-{huge}"], f"-{huge}"),
    ]
    assert memcli("facts", "add", "Ana likes tea").code == 0  # a database
    for args, fact_id in cases:
        run = memcli("facts", *args)
        assert run.code == 1, run.stderr
        assert f"no fact {fact_id}" in run.stderr and "Traceback" not in run.stderr


def test_add_to_a_block_that_is_not_a_fact_block_is_refused(tmp_path: Path) -> None:
    """As the memory tools' add_fact: a fact in another block would never reach the context."""
    config = tmp_path / "c.toml"
    config.write_text('[[blocks]]\nkind = "facts"\nname = "prefs"\n')
    for block in ("nosuch", "extracted_info"):
        run = memcli(
            "--config", str(config), "facts", "add", "Ana likes jazz", "--block", block,
            "--user", "ana",
        )  # fmt: skip
        assert run.code == 2, run.stderr
        assert (
            f"no fact block {block!r}" in run.stderr and "The fact blocks are: prefs" in run.stderr
        )
    every = memcli("--config", str(config), "facts", "--all", "--user", "ana", "--json")
    assert every.code == 0 and every.records() == [], every.stderr
    run = memcli(
        "--config", str(config), "facts", "add", "Ana likes jazz", "--block", "prefs",
        "--user", "ana", "--json",
    )  # fmt: skip
    assert run.code == 0 and run.records()[0]["block"] == "prefs", run.stderr


@pytest.mark.usefixtures("no_blocks")
def test_rm_reports_the_fact_as_removal_left_it() -> None:
    assert memcli("facts", "add", "Ana is vegetarian", "--user", "ana").code == 0
    run = memcli("facts", "rm", "1", "--user", "ana", "--json")
    assert run.code == 0, run.stderr
    (removed,) = run.records()
    assert removed["type"] == "removed" and removed["state"] == "deleted"
    (listed,) = memcli("facts", "--all", "--user", "ana", "--json").records()
    assert {**removed, "type": "fact"} == listed
    again = memcli("facts", "rm", "1", "--user", "ana")  # said as what it is: deleted
    assert again.code == 1 and "fact 1 of user 'ana' is deleted" in again.stderr, again.stderr
    other = memcli("facts", "rm", "1", "--user", "bo")  # not bo's: no fact, deleted or not
    assert other.code == 1 and "no fact 1 of user 'bo'" in other.stderr, other.stderr


@pytest.mark.usefixtures("no_blocks")
def test_fact_text_not_utf8_is_refused() -> None:
    # bytes that are not UTF-8 on the command line (os.fsdecode keeps them as surrogate escapes,
    # which the subprocess turns back into the same bytes)
    run = memcli("facts", "add", os.fsdecode(b"Ana \xff likes tea"))
    assert run.code == 2, run.stderr
    assert "not valid UTF-8 (byte 0xff at byte 4)" in run.stderr and "Traceback" not in run.stderr
    assert memcli("facts", "add", "Ana likes tea").code == 0
    run = memcli("facts", "edit", "1", os.fsdecode(b"Ana \xc3"))
    assert run.code == 2 and "not valid UTF-8" in run.stderr, run.stderr
    assert [f["text"] for f in memcli("facts", "--json").records()] == ["Ana likes tea"]


@pytest.mark.usefixtures("cli_db")  # on SQLite and on PostgreSQL
def test_failed_extraction_is_pending_then_extract_pending(llm, tmp_path: Path) -> None:
    config = write_config(tmp_path, llm, timeout=1)
    llm.script({"status": 500}, {"content": "garbage"})
    run = memcli("--config", config, "import", transcript(tmp_path, 3), "--session", "s1", "--json")
    assert run.code == 1, run.stderr  # the messages are stored, the extraction failed: exit 1
    summary = run.records()[-1]
    assert summary["block_batches_pending"] >= 1
    assert "pending" in run.stderr
    assert memcli("--config", config, "facts", "--json").records() == []

    llm.script(
        {"content": "<facts><fact>Ana likes tea</fact></facts>"},
        {"content": "<facts><fact>Ana likes jazz</fact></facts>"},
    )
    run = memcli("--config", config, "facts", "extract", "--pending", "--json")
    assert run.code == 0, run.stderr
    assert run.records()[-1] == {"type": "summary", "done": 2, "pending": 0}
    texts = [f["text"] for f in memcli("--config", config, "facts", "--json").records()]
    assert sorted(texts) == ["Ana likes jazz", "Ana likes tea"]
    # Nothing left: a second run does nothing and calls no LLM.
    before = len(llm.requests)
    run = memcli("--config", config, "facts", "extract", "--pending", "--json")
    assert run.records()[-1] == {"type": "summary", "done": 0, "pending": 0}
    assert len(llm.requests) == before


@pytest.mark.parametrize(
    ("blocks", "name", "answer"),
    [
        ('[[blocks]]\nkind = "facts"\n', "extracted_info", "<facts></facts>"),
        ('[[blocks]]\nkind = "summary"\n', "session_summary", "<summary>Ana said hi.</summary>"),
    ],
    ids=["facts", "summary"],
)
def test_backfill_exits_1_while_batches_stay_pending(
    llm, tmp_path: Path, blocks: str, name: str, answer: str
) -> None:
    """As `facts extract --pending` and `import`: batches the LLM failed on are not a success."""
    config = llm_config(tmp_path, llm, blocks, timeout=1)
    run = memcli(
        "--config", config, "import", transcript(tmp_path, 3), "--session", "s1", "--no-blocks"
    )
    assert run.code == 0, run.stderr
    llm.default = {"status": 500}
    try:
        run = memcli("--config", config, "blocks", "backfill", "--json")
    finally:
        llm.default = {"content": answer}
    assert run.code == 1, run.stderr
    assert run.records() == [{"type": "block", "name": name, "done": 0, "pending": 2, "waiting": 0}]
    stderr = " ".join(run.stderr.split())
    assert "2 batches are still pending" in stderr and "(HTTP 500)" in stderr, stderr
    assert "Run `memcli blocks backfill` again once the LLM answers" in stderr
    run = memcli("--config", config, "blocks", "backfill", "--json")
    assert run.code == 0, run.stderr
    assert run.records() == [{"type": "block", "name": name, "done": 2, "pending": 0, "waiting": 0}]


def test_extract_without_a_fact_block(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[[blocks]]\nkind = "static"\ncontent = "x"\n')
    assert (
        memcli("--config", str(path), "import", "-", input='{"role":"user","content":"hi"}\n').code
        == 0
    )
    run = memcli("--config", str(path), "facts", "extract", "--pending")
    assert run.code == 2 and "no fact block is configured" in run.stderr


def test_extract_pending_exits_1_while_batches_stay_pending(llm, tmp_path: Path) -> None:
    """A batch left after its automatic retries: `--pending` retries it, exit 1 while it fails."""
    from memcli import FactBlock, Memory, Message, WordTokenizer
    from memcli.store import longterm

    answering = {"poison": False}
    poison_calls = []

    def reply(body: dict) -> dict:
        if "poison" not in body["messages"][-1]["content"]:
            return {"content": "<facts><fact>Ana likes tea</fact></facts>"}
        poison_calls.append(1)
        if not answering["poison"]:
            return {"content": "I'd rather not say."}
        return {"content": "<facts><fact>Ana lives in Porto</fact></facts>"}

    llm.script(*[reply] * 100)
    db = tmp_path / "m.db"
    block = FactBlock(model="openai/test", api_base=llm.api_base, timeout=5)
    memory = Memory.from_defaults(
        session_id="s1",
        user_id="default",
        token_limit=100,
        chat_history_token_ratio=0.1,
        token_flush_size=5,
        db=db,
        memory_blocks=[block],
        tokenizer=WordTokenizer(),
    )
    for text in ["poison"] + [f"later {i}" for i in range(12)]:
        memory.put_messages([Message("user", f"{text} is what I say"), Message("assistant", "ok")])
    assert len(poison_calls) == 1 + block.auto_retries  # then left for `extract --pending`
    assert longterm.pending_flushes(memory.store, "extracted_info", "user:default", retries=3) == []
    memory.store.close()

    config = write_config(tmp_path, llm)
    args = ("--db", str(db), "--config", config, "facts", "extract", "--pending", "--json")
    run = memcli(*args)
    assert run.code == 1, run.stderr
    assert run.records()[-1] == {"type": "summary", "done": 0, "pending": 1}
    assert "1 batch is still pending" in run.stderr
    assert "(extracted_info: malformed reply: \"I'd rather not say" in run.stderr  # and why
    assert len(poison_calls) == 2 + block.auto_retries  # retried, whatever its back-off

    answering["poison"] = True
    run = memcli(*args)
    assert run.code == 0, run.stderr
    assert run.records()[-1] == {"type": "summary", "done": 1, "pending": 0}
    texts = [f["text"] for f in memcli("--db", str(db), "facts", "--json").records()]
    assert texts == ["Ana likes tea", "Ana lives in Porto"]


def _home_protocol(body: dict) -> dict:
    """A model answering in the facts protocol: a new home replaces the home it was shown."""
    import re

    conversation = body["messages"][-1]["content"]
    prompt = body["messages"][0]["content"]
    if "I live in Bern" in conversation:
        return {"content": '<facts><fact entities="Bern">Ana lives in Bern</fact></facts>'}
    if "I moved to Zurich" in conversation:
        home = re.search(r'<fact id="(\d+)"[^>]*>Ana lives in Bern</fact>', prompt)
        assert home is not None, prompt
        return {
            "content": f'<facts><fact entities="Zurich, Ana" replaces="{home.group(1)}">'
            "Ana lives in Zurich</fact></facts>"
        }
    return {"content": "<facts></facts>"}


@pytest.mark.usefixtures("cli_db")  # on SQLite and on PostgreSQL
def test_a_move_supersedes_visible_in_all_and_history_and_restorable(llm, tmp_path: Path) -> None:
    config = write_config(tmp_path, llm)
    llm.default = _home_protocol
    chat = tmp_path / "move.jsonl"
    lines = [
        {"role": "user", "content": "I live in Bern , I say that now"},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "I moved to Zurich , I say that now"},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "turn 2: I say something about myself"},
        {"role": "assistant", "content": "Noted."},
    ]
    chat.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    run = memcli("--config", config, "import", str(chat), "--session", "s1", "--json")
    assert run.code == 0, run.stderr

    current = memcli("--config", config, "facts", "--json").records()
    assert [(f["text"], f["state"]) for f in current] == [("Ana lives in Zurich", "current")]
    zurich = current[0]
    assert zurich["entities"] == ["Ana", "Zurich"] and zurich["valid_from"]
    assert zurich["expires_at"] is None and zurich["superseded_by"] is None
    every = memcli("--config", config, "facts", "--all", "--json").records()
    assert [(f["text"], f["state"], f["superseded_by"]) for f in every] == [
        ("Ana lives in Bern", "superseded", zurich["id"]),
        ("Ana lives in Zurich", "current", None),
    ]
    bern = every[0]["id"]
    history = memcli("--config", config, "facts", "history", str(zurich["id"]), "--json")
    assert [(h["fact_id"], h["action"]) for h in history.records()] == [
        (bern, "added"),
        (zurich["id"], "added"),
        (bern, "superseded"),
    ]
    assert history.records()[2]["reason"] == f"superseded by fact {zurich['id']}"
    assert history.records()[2]["flush_id"] == zurich["flush_id"]
    table = memcli("--config", config, "facts", "--all")
    assert table.code == 0 and "superseded" in table.stdout

    run = memcli("--config", config, "facts", "restore", str(bern), "--json")
    assert run.code == 0, run.stderr
    assert f"fact {zurich['id']} is superseded by it" in run.stderr
    assert [(r["id"], r["state"]) for r in run.records()] == [
        (bern, "current"),
        (zurich["id"], "superseded"),
    ]
    assert [f["text"] for f in memcli("--config", config, "facts", "--json").records()] == [
        "Ana lives in Bern"
    ]
    again = memcli("--config", config, "facts", "restore", str(bern))
    assert again.code == 1 and "is current" in again.stderr
    missing = memcli("--config", config, "facts", "restore", "999")
    assert missing.code == 1 and "no fact 999" in missing.stderr


@pytest.mark.usefixtures("no_blocks")
def test_expiry_entities_and_query() -> None:
    add = ["facts", "add", "--user", "ana"]
    assert memcli(*add, "Ana is in Rome this week", "--expires", "2000-01-01").code == 0
    assert (
        memcli(
            *add, "Ana's sister Eva lives in Lisbon", "--entity", "Eva", "--entity", "Lisbon"
        ).code
        == 0
    )
    assert memcli(*add, "Ana is vegetarian", "--expires", "2999-12-31T18:00:00+02:00").code == 0
    bad = memcli(*add, "x", "--expires", "soon")
    assert bad.code == 2 and "not a date or time" in bad.stderr

    listed = memcli("facts", "--user", "ana", "--json").records()
    assert [f["text"] for f in listed] == ["Ana's sister Eva lives in Lisbon", "Ana is vegetarian"]
    assert listed[1]["expires_at"] == "2999-12-31T16:00:00Z"
    every = memcli("facts", "--user", "ana", "--all", "--json").records()
    assert [(f["text"], f["state"]) for f in every][0] == ("Ana is in Rome this week", "expired")

    entities = memcli("entities", "--user", "ana", "--json").records()
    assert entities == [
        {"type": "entity", "entity": "Eva", "facts": 1},
        {"type": "entity", "entity": "Lisbon", "facts": 1},
    ]
    about = memcli("facts", "--user", "ana", "--entity", "eva", "--json").records()
    assert [f["text"] for f in about] == ["Ana's sister Eva lives in Lisbon"]

    found = memcli(
        "facts",
        "--user",
        "ana",
        "--query",
        "where does her sister live",
        "--mode",
        "lexical",
        "--json",
    )
    assert found.code == 0, found.stderr
    assert found.records()[0]["text"] == "Ana's sister Eva lives in Lisbon"
    assert found.records()[0]["score"] > 0
    assert all(r["text"] != "Ana is in Rome this week" for r in found.records())
    bad_mode = memcli("facts", "--user", "ana", "--query", "x", "--mode", "psychic")
    assert bad_mode.code == 2 and "unknown search mode" in bad_mode.stderr


@pytest.mark.usefixtures("no_blocks")
def test_query_by_meaning_finds_the_fact_without_shared_words() -> None:
    add = ["facts", "add", "--user", "ana"]
    for text in ("Ana owns a red bicycle", "Ana resides in Zurich", "Ana plays the violin"):
        assert memcli(*add, text).code == 0
    found = memcli("facts", "--user", "ana", "--query", "which city is her home", "--json")
    assert found.code == 0, found.stderr
    assert found.records()[0]["text"] == "Ana resides in Zurich"


def test_extract_without_a_model_suggests_what_the_command_has(tmp_path: Path) -> None:
    """`facts extract` has no --model option: its hint names the ways a model is set."""
    db = str(tmp_path / "m.db")
    line = '{"role": "user", "content": "I like tea"}\n'
    assert memcli("--db", db, "import", "-", "--session", "s", input=line).code == 0
    run = memcli("--db", db, "facts", "extract", "--pending")
    assert run.code == 2 and "no model is configured for facts" in run.stderr, run.stderr
    assert "--model" not in run.stderr and "MEMCLI_MODEL" in run.stderr, run.stderr

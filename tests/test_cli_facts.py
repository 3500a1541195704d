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
        {"content": "<facts></facts>"},
    )
    run = memcli("--config", config, "import", transcript(tmp_path, 3), "--session", "s1", "--json")
    assert run.code == 0, run.stderr
    summary, extraction = run.records()[-2:]
    # After the import: the 2 flushed batches and the active turn, its cost said first.
    assert summary["flushes"] == 2
    assert extraction == {"type": "extraction", "done": 3, "pending": 0}
    assert "Extracting facts: 3 requests (" in run.stderr and "cl100k tokens" in run.stderr

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
    listed = memcli("--config", config, "facts", "--json").records()
    assert [f["text"] for f in listed] == ["Ana has two dogs", "Ana is vegetarian"]
    # The edited fact's text is the user's now: its origin says so (its history keeps
    # that it was extracted first).
    assert [f["origin"] for f in listed] == ["manual", "manual"]

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
def test_no_fact_hint_lists_the_facts_of_the_user_asked() -> None:
    # Fact 1 is ana's: bo is sent to his own list, where the ids he can use are.
    assert memcli("facts", "add", "Ana is vegetarian", "--user", "ana").code == 0
    run = memcli("facts", "edit", "1", "Bo is vegan", "--user", "bo")
    assert run.code == 1 and "no fact 1 of user 'bo'" in run.stderr, run.stderr
    assert "Run `memcli facts --user bo` to see the facts" in run.stderr, run.stderr
    run = memcli("facts", "history", "7")  # no --user: every user's list
    assert run.code == 1 and "Run `memcli facts` to see the facts" in run.stderr, run.stderr


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
    llm.script({"status": 500})
    run = memcli("--config", config, "import", transcript(tmp_path, 3), "--session", "s1", "--json")
    assert run.code == 1, run.stderr  # the messages are stored, the extraction failed: exit 1
    # It stops at the first failure: that batch and the 2 after it wait.
    assert run.records()[-1] == {"type": "extraction", "done": 0, "pending": 3}
    assert "pending" in run.stderr and len(llm.requests) == 1
    assert memcli("--config", config, "facts", "--json").records() == []

    llm.script({"content": "<facts><fact>Ana likes tea</fact></facts>"})
    run = memcli("--config", config, "facts", "extract", "--pending", "--json")
    assert run.code == 0, run.stderr
    assert run.records()[-1] == {"type": "summary", "done": 1, "pending": 0}
    llm.script(
        {"content": "<facts><fact>Ana likes jazz</fact></facts>"}, {"content": "<facts></facts>"}
    )
    run = memcli("--config", config, "facts", "extract", "--json")
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
    from fakes import WordTokenizer

    from memcli import FactBlock, Memory, Message
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


@pytest.mark.usefixtures("no_blocks")
def test_the_groups_user_is_every_subcommands_user() -> None:
    """`memcli facts --user ana SUBCOMMAND` acts on ana's facts, as `--user` after it does."""
    run = memcli("facts", "--user", "ana", "add", "Ana likes tea", "--json")
    assert run.code == 0, run.stderr
    assert [f["text"] for f in memcli("facts", "--user", "ana", "--json").records()] == [
        "Ana likes tea"
    ]
    assert memcli("facts", "--json").records() == []  # not the default user's
    run = memcli("facts", "add", "Dee plays chess", "--json")  # the default user's fact 2
    assert run.code == 0 and run.records()[0]["id"] == 2, run.stderr
    for args in (["rm", "2"], ["edit", "2", "x"], ["history", "2"], ["restore", "2"]):
        run = memcli("facts", "--user", "ana", *args)
        assert run.code == 1 and "no fact 2 of user 'ana'" in run.stderr, (args, run.stderr)
    assert [f["text"] for f in memcli("facts", "--json").records()] == ["Dee plays chess"]
    run = memcli("facts", "--user", "ana", "edit", "1", "Ana likes green tea")
    assert run.code == 0, run.stderr
    assert memcli("facts", "--user", "ana", "rm", "1").code == 0
    assert memcli("facts", "--user", "ana", "--json").records() == []


@pytest.mark.usefixtures("no_blocks")
def test_history_of_another_users_fact_is_no_fact() -> None:
    assert memcli("facts", "add", "Ana likes tea", "--user", "ana").code == 0
    run = memcli("facts", "history", "1", "--user", "bo", "--json")
    assert run.code == 1 and "no fact 1 of user 'bo'" in run.stderr, run.stderr
    assert run.stdout == ""  # nothing of ana's fact shown
    run = memcli("facts", "history", "1", "--user", "ana", "--json")
    assert run.code == 0 and [c["text"] for c in run.records()] == ["Ana likes tea"]


@pytest.mark.usefixtures("no_blocks")
def test_the_groups_topic_is_the_subcommands_topic() -> None:
    run = memcli("facts", "--topic", "food", "add", "Ana likes tea", "--user", "ana", "--json")
    assert run.code == 0 and run.records()[0]["topics"] == ["food"], run.stderr
    found = memcli("facts", "--topic", "food", "search", "tea", "--user", "ana", "--json")
    assert [f["text"] for f in found.records()] == ["Ana likes tea"], found.stderr
    found = memcli("facts", "--topic", "work", "search", "tea", "--user", "ana", "--json")
    assert found.code == 0 and found.records() == [], found.stderr
    run = memcli("facts", "--topic", "home", "edit", "1", "Ana likes green tea", "--user", "ana")
    assert run.code == 0, run.stderr
    (fact,) = memcli("facts", "--user", "ana", "--json").records()
    assert fact["text"] == "Ana likes green tea" and fact["topics"] == ["home"]


@pytest.mark.usefixtures("no_blocks")
def test_a_clash_between_the_group_and_the_subcommand_is_refused() -> None:
    assert memcli("facts", "add", "Ana likes tea", "--user", "ana").code == 0
    cases = [
        (["--user", "ana", "rm", "1", "--user", "bo"], "--user 'ana' before `rm` and --user 'bo'"),
        (["--topic", "food", "add", "x", "--topic", "work"], "--topic 'food' before `add`"),
        (["--session", "s1", "rm", "1"], "`memcli facts rm` takes no --session"),
        (["--topic", "food", "history"], "`memcli facts history` takes no --topic"),
    ]
    for args, message in cases:
        run = memcli("facts", *args)
        assert run.code == 2 and message in run.stderr, (args, run.stderr)
    (fact,) = memcli("facts", "--user", "ana", "--all", "--json").records()
    assert fact["state"] == "current" and fact["topics"] == []  # nothing changed
    same = memcli("facts", "--user", "ana", "rm", "1", "--user", "ana")  # the same: no clash
    assert same.code == 0, same.stderr


def test_the_groups_session_is_the_subcommands_session(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[[blocks]]\nkind = "facts"\nscope = "session"\n')
    c = ["--config", str(config)]
    assert memcli(*c, "import", transcript(tmp_path, 1), "--session", "s1").code == 0
    run = memcli(*c, "facts", "--session", "s1", "add", "Ana is in Rome", "--json")
    assert run.code == 0, run.stderr
    listed = memcli(*c, "facts", "--session", "s1", "--json").records()
    assert [f["text"] for f in listed] == ["Ana is in Rome"]
    assert memcli(*c, "facts", "--json").records() == []  # not the user's scope
    found = memcli(*c, "facts", "--session", "s1", "search", "rome", "--json")
    assert [f["text"] for f in found.records()] == ["Ana is in Rome"], found.stderr
    history = memcli(*c, "facts", "--session", "s1", "history", "--json")
    assert [h["text"] for h in history.records()] == ["Ana is in Rome"], history.stderr


def _short_import(tmp_path: Path, config: str, user: str, name: str, text: str) -> None:
    """A two-turn conversation of `user`, too short to flush: every message stays active."""
    path = tmp_path / f"{name}.jsonl"
    lines = [
        {"role": "user", "content": text},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "thanks"},
        {"role": "assistant", "content": "Any time."},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    args = ("--config", config, "import", str(path), "--user", user, "--session", name)
    run = memcli(*args, "--no-extract", "--json")
    assert run.code == 0, run.stderr
    assert run.records()[-1]["flushes"] == 0


def _long_config(tmp_path: Path, llm, db: str | None = None) -> str:
    """The loopback model, and a budget under which a short conversation never flushes; each
    batch of an extraction is a turn (flush size 5 tokens); `db`, when given, the database."""
    path = tmp_path / "config.toml"
    path.write_text(
        (f"db = {json.dumps(db)}\n\n" if db else "")
        + f'[llm]\nmodel = "openai/test"\napi_base = "{llm.api_base}"\ntimeout = 5\n\n'
        "[memory]\ntoken_limit = 10000\ntoken_flush_size = 5\n\n"
        '[[blocks]]\nkind = "facts"\n'
    )
    return str(path)


def test_extract_reads_never_flushed_conversations_of_the_user_only(
    llm, tmp_path: Path, db: str
) -> None:
    """On SQLite and PostgreSQL."""
    config = _long_config(tmp_path, llm, db)
    _short_import(tmp_path, config, "ana", "a1", "My cello lessons are on Mondays")
    _short_import(tmp_path, config, "bo", "b1", "I keep bees on my roof")
    assert llm.requests == []  # --no-extract: nothing sent

    run = memcli("--config", config, "facts", "extract", "--user", "ana", "--dry-run", "--json")
    assert run.code == 0, run.stderr
    [plan] = run.records()
    assert plan["type"] == "plan" and plan["requests"] == 2 and plan["tokens"] > 100
    assert "2 requests" in run.stderr and "cl100k tokens" in run.stderr
    assert llm.requests == []  # a dry run sends nothing

    llm.script(
        {"content": "<facts><fact>Ana has cello lessons on Mondays</fact></facts>"},
        {"content": "<facts></facts>"},
    )
    run = memcli("--config", config, "facts", "extract", "--user", "ana", "--json")
    assert run.code == 0, run.stderr
    assert run.records()[-1] == {"type": "summary", "done": 2, "pending": 0}
    assert len(llm.requests) == 2
    sent = json.dumps([r["messages"] for r in llm.requests])
    assert "cello" in sent and "bees" not in sent  # another user's conversation is not read
    facts = memcli("--config", config, "facts", "--user", "ana", "--json").records()
    assert [f["text"] for f in facts] == ["Ana has cello lessons on Mondays"]
    assert facts[0]["session"] == "a1" and facts[0]["message_ids"]

    # A second run sends nothing, a dry run says so.
    run = memcli("--config", config, "facts", "extract", "--user", "ana", "--json")
    assert run.code == 0 and run.records()[-1] == {"type": "summary", "done": 0, "pending": 0}
    assert len(llm.requests) == 2
    dry = memcli("--config", config, "facts", "extract", "--user", "ana", "--dry-run", "--json")
    assert dry.records() == [{"type": "plan", "requests": 0, "tokens": 0}]


def test_an_interrupted_extraction_goes_on_where_it_stopped(llm, tmp_path: Path) -> None:
    config = _long_config(tmp_path, llm)
    _short_import(tmp_path, config, "ana", "a1", "My cello lessons are on Mondays")
    llm.script({"content": "<facts><fact>Ana plays the cello</fact></facts>"}, {"status": 500})
    run = memcli("--config", config, "facts", "extract", "--session", "a1", "--user", "ana")
    assert run.code == 1 and "1 batch is still pending" in run.stderr, run.stderr
    assert len(llm.requests) == 2
    assert "cello" in json.dumps(llm.requests[0]["messages"])

    llm.script({"content": "<facts><fact>Ana says thanks</fact></facts>"})
    run = memcli("--config", config, "facts", "extract", "--user", "ana", "--json")
    assert run.code == 0, run.stderr
    assert run.records()[-1] == {"type": "summary", "done": 1, "pending": 0}
    assert len(llm.requests) == 3  # only the batch that failed
    third = json.dumps(llm.requests[2]["messages"])
    assert "thanks" in third and "cello lessons" not in third
    texts = [
        f["text"] for f in memcli("--config", config, "facts", "--json", "--user", "ana").records()
    ]
    assert texts == ["Ana plays the cello", "Ana says thanks"]


def test_extract_of_another_users_session_is_no_session(llm, tmp_path: Path) -> None:
    config = _long_config(tmp_path, llm)
    _short_import(tmp_path, config, "bo", "b1", "I keep bees on my roof")
    run = memcli("--config", config, "facts", "extract", "--user", "ana", "--session", "b1")
    assert run.code == 1 and "no session 'b1'" in run.stderr, run.stderr
    assert llm.requests == []


def test_extract_without_a_model_suggests_what_the_command_has(tmp_path: Path) -> None:
    """Its hint names the ways a model is set, with what a local server needs too."""
    db = str(tmp_path / "m.db")
    line = '{"role": "user", "content": "I like tea"}\n'
    assert memcli("--db", db, "import", "-", "--session", "s", input=line).code == 0
    run = memcli("--db", db, "facts", "extract", "--pending")
    assert run.code == 2 and "no model is configured for facts" in run.stderr, run.stderr
    for way in ("memcli config set model", "MEMCLI_MODEL", "MEMCLI_API_BASE", "--api-base"):
        assert way in run.stderr, run.stderr


@pytest.mark.usefixtures("no_blocks")
def test_no_facts_of_a_mistyped_user_names_the_close_users() -> None:
    """`memcli facts --user anaa` for a user with nothing stored: the users that have sessions,
    the close name first (a typo is no silent empty list)."""
    line = '{"role": "user", "content": "hi"}\n'
    assert memcli("import", "-", "--session", "s", "--user", "ana", input=line).code == 0
    run = memcli("facts", "--user", "anaa", "--json")
    assert run.code == 0 and run.records() == []
    said = " ".join(run.stderr.split())
    assert "No facts of user anaa. Did you mean --user ana?" in said, said
    own = memcli("facts", "--user", "ana")
    assert own.code == 0 and "Did you mean" not in own.stderr and "No facts." in own.stderr


def test_import_extracts_facts_even_when_another_block_stays_pending(llm, tmp_path: Path) -> None:
    """A summary block's failed batches exit the import 1, after the facts of the imported
    conversations are extracted (they were skipped: the failure ended the import first)."""
    blocks = '[[blocks]]\nkind = "facts"\n\n[[blocks]]\nkind = "summary"\n'
    config = llm_config(tmp_path, llm, blocks)

    def server(body: dict) -> dict:
        if "<summary>" in json.dumps(body["messages"]):
            return {"status": 500}
        return {"content": "<facts><fact>Ana has a dog named Rex</fact></facts>"}

    llm.default = server
    run = memcli("--config", config, "import", transcript(tmp_path, 3), "--session", "s1", "--json")
    assert run.code == 1, run.stderr
    assert "pending in a block" in run.stderr and "Extracting facts" in run.stderr
    assert run.records()[-1] == {"type": "extraction", "done": 3, "pending": 0}
    texts = [f["text"] for f in memcli("--config", config, "facts", "--json").records()]
    assert texts == ["Ana has a dog named Rex"]

"""Block definitions: a Memory records the blocks it was opened with, and the CLI builds the same
blocks for that session (config file > stored definitions > defaults); a fact block without a
model shows hand-added facts and takes no flushes."""

from __future__ import annotations

import json
import shutil
import sqlite3
import sys
import textwrap
from pathlib import Path

import pytest
from fakes import HashEmbedder, WordTokenizer
from helpers import memcli

from memcli import FactBlock, Memory, MemoryBlock, Message, StaticBlock, VectorBlock
from memcli.blocks.feed import backfill, unprocessed
from memcli.blocks.registry import Defaults, build_block, build_blocks, rebuild
from memcli.flush import Budget
from memcli.store import facts as fact_store
from memcli.store import longterm
from memcli.store.sqlite import SQLiteStore

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def app_blocks() -> list[MemoryBlock]:
    return [
        StaticBlock(name="persona", content="You are a helpful pirate."),
        FactBlock(
            name="facts",
            model="openai/x",
            api_base="http://127.0.0.1:9/v1",
            api_key="sk-very-secret",
            temperature=0,
            max_facts=20,
        ),
    ]


def recorded(db: Path) -> list[tuple[str, str, str]]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT * FROM block_definitions").fetchall()


def test_definitions_rebuild_the_same_blocks_without_secrets() -> None:
    blocks = [*app_blocks(), VectorBlock(name="v", similarity_top_k=4, scope="session")]
    tables = [b.definition() for b in blocks]
    assert "sk-very-secret" not in json.dumps(tables)
    assert tables[1] == {
        "kind": "facts",
        "name": "facts",
        "priority": 1,
        "scope": "user",
        "max_facts": 20,
        "retry_pending": 3,
        "auto_retries": 3,
        "model": "openai/x",
        "api_base": "http://127.0.0.1:9/v1",
        "timeout": 60.0,
        "temperature": 0,
    }
    rebuilt, problems = rebuild(tables, Defaults())
    assert problems == []
    assert [b.definition() for b in rebuilt] == tables
    # The one path: each definition is a [[blocks]] table the registry builds.
    assert build_block(0, tables[0], Defaults()).definition() == tables[0]


def test_custom_blocks_by_path_and_arguments(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    shutil.copy(EXAMPLES / "mention_counter.py", tmp_path / "mention_counter.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    from mention_counter import MentionCounter  # type: ignore[import-not-found]

    table = MentionCounter(who="Tom", priority=4).definition()
    assert table == {
        "kind": "python",
        "path": "mention_counter:MentionCounter",
        "name": "mentions",
        "who": "Tom",
        "priority": 4,
        "scope": "user",
    }
    (again,), problems = rebuild([table], Defaults())
    assert problems == [] and again.definition() == table

    class Local(MemoryBlock):
        def __init__(self, client: object, api_key: str = "", **kwargs: object) -> None:
            super().__init__(**kwargs)

    table = Local(object(), api_key="secret", name="local").definition()
    assert "api_key" not in table and "secret" not in json.dumps(table)
    assert "defined in a script or a function" in table["not_rebuildable"]
    assert "argument 'client' is a object, not JSON" in table["not_rebuildable"]
    blocks, problems = rebuild([table, {"kind": "static", "content": "x"}], Defaults())
    assert [type(b) for b in blocks] == [StaticBlock]
    ((_, reason),) = problems
    assert "cannot be rebuilt from its definition" in reason


def test_memory_records_definitions_only_when_they_change(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    Memory.from_defaults(session_id="s1", db=db, memory_blocks=app_blocks())
    ((session, text, stamp),) = recorded(db)
    assert session == "s1" and "sk-very-secret" not in text
    Memory.from_defaults(session_id="s1", db=db, memory_blocks=app_blocks())
    assert recorded(db) == [(session, text, stamp)]  # the same blocks: nothing written
    Memory.from_defaults(session_id="s1", db=db, memory_blocks=app_blocks()[:1])
    ((_, changed, _),) = recorded(db)
    assert [t["name"] for t in json.loads(changed)] == ["persona"]
    # Blocks built from a definition (origin set, as the CLI builds them) are not recorded.
    store = SQLiteStore(db)
    cli_blocks = build_blocks(None, Defaults(embedder=HashEmbedder()))
    for block in cli_blocks:
        block.origin = "default"
    Memory(store, "s1", memory_blocks=cli_blocks)
    assert recorded(db)[0][1] == changed
    store.delete_session("s1")
    assert recorded(db) == []


def write_app(tmp_path: Path) -> Path:
    """A library application that opens session s1 with its own blocks and talks a little."""
    script = tmp_path / "app.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            from memcli import FactBlock, Memory, Message, StaticBlock

            memory = Memory.from_defaults(
                session_id="s1",
                db=sys.argv[1],
                token_limit=2000,
                memory_blocks=[
                    StaticBlock(name="persona", content="You are a helpful pirate."),
                    FactBlock(name="facts", model="openai/x", api_base="http://127.0.0.1:9/v1"),
                ],
            )
            memory.put(Message("user", "hello"))
            """
        )
    )
    return script


def run_app(tmp_path: Path) -> Path:
    import subprocess

    db = tmp_path / "app.db"
    subprocess.run([sys.executable, str(write_app(tmp_path)), str(db)], check=True)
    return db


def test_the_cli_shows_an_apps_blocks(tmp_path: Path) -> None:
    db = str(run_app(tmp_path))
    run = memcli("--db", db, "dump", "blocks", "s1", "--json")
    assert run.code == 0, run.stderr
    assert [(r["name"], r["kind"], r["content"]) for r in run.records()] == [
        ("persona", "StaticBlock", "You are a helpful pirate."),
        ("facts", "FactBlock", ""),
    ]
    run = memcli("--db", db, "blocks", "list", "s1", "--json")
    assert [(r["name"], r["source"]) for r in run.records()] == [
        ("persona", "stored for session s1"),
        ("facts", "stored for session s1"),
    ]
    # A fact added by hand goes to the app's fact block and into the session's context.
    assert memcli("--db", db, "facts", "add", "Ana is vegetarian").code == 0
    run = memcli("--db", db, "dump", "context", "s1", "--json")
    system, user = run.records()
    assert system["content"] == (
        "<memory>\n<persona>\nYou are a helpful pirate.\n</persona>\n"
        "<facts>\n<fact>Ana is vegetarian</fact>\n</facts>\n</memory>"
    )
    assert user["content"] == "hello"
    # Without a session: the user's last recorded session's blocks.
    run = memcli("--db", db, "blocks", "list", "--json")
    assert [r["source"] for r in run.records()] == ["stored for session s1"] * 2


def test_config_blocks_override_stored_definitions(tmp_path: Path) -> None:
    db = str(run_app(tmp_path))
    config = tmp_path / "c.toml"
    config.write_text('[[blocks]]\nkind = "static"\nname = "mine"\ncontent = "Config wins."\n')
    run = memcli("--config", str(config), "--db", db, "blocks", "list", "s1", "--json")
    assert [(r["name"], r["source"]) for r in run.records()] == [("mine", f"config file {config}")]
    run = memcli("--config", str(config), "--db", db, "dump", "context", "s1", "--json")
    assert "Config wins." in run.records()[0]["content"]


def test_a_stored_block_that_cannot_be_rebuilt_is_left_out_with_the_reason(
    tmp_path: Path,
) -> None:
    db = tmp_path / "app.db"
    store = SQLiteStore(db)
    tables = [
        {"kind": "static", "name": "persona", "content": "Hi."},
        {"kind": "python", "path": "no_such_module:Block", "name": "custom"},
    ]
    Memory(store, "s1", tokenizer=WordTokenizer())
    longterm.save_block_definitions(store, "s1", tables)
    store.close()
    run = memcli("--db", str(db), "dump", "blocks", "s1", "--json")
    assert run.code == 0, run.stderr
    assert [r["name"] for r in run.records()] == ["persona"]
    assert "cannot import module 'no_such_module'" in run.stderr and "left out" in run.stderr
    run = memcli("--db", str(db), "blocks", "list", "s1", "--json")
    assert [(r["name"], "error" in r) for r in run.records()] == [
        ("persona", False),
        ("custom", True),
    ]


def test_facts_added_by_hand_reach_the_context_without_config(tmp_path: Path) -> None:
    """The default blocks hold a fact block even with no model configured."""
    db = tmp_path / "m.db"
    store = SQLiteStore(db)
    Memory(store, "s", user_id="ana", tokenizer=WordTokenizer())  # no blocks: nothing recorded
    store.close()
    run = memcli("--db", str(db), "facts", "add", "Ana is vegetarian", "--user", "ana")
    assert run.code == 0 and "Added fact 1." in run.stderr
    run = memcli("--db", str(db), "dump", "context", "s", "--json")
    assert run.code == 0, run.stderr
    (system,) = run.records()
    assert (
        "<extracted_info>\n<fact>Ana is vegetarian</fact>\n</extracted_info>" in (system["content"])
    )
    run = memcli("--db", str(db), "blocks", "list", "--json")
    assert [(r["name"], r["source"]) for r in run.records()] == [
        ("vector_memory", "default"),
        ("extracted_info", "default"),
    ]
    run = memcli("--db", str(db), "facts", "extract", "--user", "ana")
    assert run.code == 2 and "no model is configured for facts" in run.stderr


def test_a_fact_block_without_a_model_takes_no_flushes_until_one_is_configured(
    tmp_path: Path, llm
) -> None:
    store = SQLiteStore(tmp_path / "m.db")
    fact_store.add_facts(store, "extracted_info", "user:ana", ["Ana has a dog"], origin="manual")
    memory = Memory(
        store,
        "s",
        user_id="ana",
        budget=Budget(30, 0.5, 10),
        tokenizer=WordTokenizer(),
        memory_blocks=[FactBlock()],
    )
    for i in range(6):
        memory.put(Message("user", f"message number {i} with a few words"))
    flushes = store.list_flushes("s")
    assert flushes  # flushed without error, and nothing marked done or pending
    assert store.execute("SELECT COUNT(*) FROM block_flushes").fetchone()[0] == 0
    assert "<fact>Ana has a dog</fact>" in memory.context().memory_text
    # A model configured later: the block catches up on every batch.
    llm.script(*[{"content": "<facts><fact>Ana counts messages</fact></facts>"}] * len(flushes))
    later = FactBlock(model="openai/test", api_base=llm.api_base, timeout=5)
    sessions = [store.get_session("s")]
    assert len(unprocessed(store, [later], sessions)["extracted_info"]) == len(flushes)
    result = backfill(store, [later], sessions, WordTokenizer())
    assert result.done == {"extracted_info": len(flushes)} and result.pending["extracted_info"] == 0
    texts = [f.text for f in fact_store.list_facts(store, "extracted_info", "user:ana")]
    assert texts == ["Ana has a dog", "Ana counts messages"]


def test_backfill_says_which_block_waits_for_a_model(tmp_path: Path, llm) -> None:
    """No model: the fact block took no flushes; backfill names it and how to set a model (exit
    0: running without a model is a choice), and with a model set it processes those batches."""
    config = tmp_path / "c.toml"
    config.write_text(
        "[memory]\ntoken_limit = 100\nchat_history_token_ratio = 0.1\ntoken_flush_size = 5\n\n"
        '[[blocks]]\nkind = "facts"\n'
    )
    chat = tmp_path / "chat.jsonl"
    chat.write_text(
        "".join(
            json.dumps({"role": role, "content": f"turn {i}: I say something about myself"}) + "\n"
            for i in range(3)
            for role in ("user", "assistant")
        )
    )
    args = ("--config", str(config), "blocks", "backfill", "--json")
    assert memcli("--config", str(config), "import", str(chat), "--session", "s1").code == 0
    run = memcli(*args)
    assert run.code == 0, run.stderr
    assert run.records() == [
        {"type": "block", "name": "extracted_info", "done": 0, "pending": 0, "waiting": 2}
    ]
    stderr = " ".join(run.stderr.split())
    assert "Nothing to backfill" not in stderr
    assert "Block 'extracted_info' has 2 batches waiting for a model" in stderr, stderr
    assert "MEMCLI_MODEL" in stderr
    llm.default = {"content": "<facts><fact>Ana talks about herself</fact></facts>"}
    model = {"MEMCLI_MODEL": "openai/test", "MEMCLI_API_BASE": llm.api_base}
    run = memcli(*args, env=model)
    assert run.code == 0, run.stderr
    assert run.records() == [
        {"type": "block", "name": "extracted_info", "done": 2, "pending": 0, "waiting": 0}
    ]
    run = memcli(*args)  # every batch processed: nothing waits any more
    assert run.code == 0 and "Nothing to backfill" in run.stderr, run.stderr


def test_backfill_refuses_a_session_of_another_user(tmp_path: Path) -> None:
    """As `import --session S --user U` refuses it (exit 2), not "Nothing to backfill"."""
    db = str(tmp_path / "m.db")
    line = '{"role": "user", "content": "hello"}\n'
    assert memcli("--db", db, "import", "-", "--session", "s", input=line).code == 0
    run = memcli("--db", db, "blocks", "backfill", "s", "--user", "bob")
    assert run.code == 1, run.stderr
    assert "no session 's' of user 'bob'" in run.stderr
    assert "Nothing to backfill" not in run.stderr
    assert memcli("--db", db, "blocks", "backfill", "s", "--user", "default").code == 0


def test_chat_sends_the_apps_blocks(tmp_path: Path, llm) -> None:
    db = str(run_app(tmp_path))
    llm.script({"content": "Arr."})
    run = memcli(
        "--db", db, "chat", "--session", "s1", "--model", "openai/test",
        "--api-base", llm.api_base, input="who are you?\n",
    )  # fmt: skip
    assert run.code == 0, run.stderr
    sent = llm.requests[-1]["messages"]
    assert "<persona>\nYou are a helpful pirate.\n</persona>" in sent[0]["content"]
    assert [m["content"] for m in sent[1:]] == ["hello", "who are you?"]


def test_no_secret_is_stored_and_the_settings_give_it_back(tmp_path: Path, llm) -> None:
    """A block's endpoint with credentials (`http://user:KEY@host/v1?api_key=...`) is recorded
    without them; a fresh process that has the same endpoint in its settings (MEMCLI_API_BASE)
    calls it with them, and one that has not, without them."""
    import base64

    port = llm.port
    secret_url = f"http://ana:SECRET-KEY@127.0.0.1:{port}/v1?api_key=SECRET-TOO"
    db = tmp_path / "app.db"
    memory = Memory.from_defaults(
        session_id="s1",
        db=db,
        token_limit=40,
        memory_blocks=[FactBlock(name="facts", model="openai/test", api_base=secret_url)],
    )
    memory.store.close()
    ((_, text, _),) = recorded(db)
    assert "SECRET" not in text
    (table,) = json.loads(text)
    assert table["api_base"] == f"http://ana@127.0.0.1:{port}/v1"
    lines = "".join(
        json.dumps({"role": "user" if i % 2 == 0 else "assistant", "content": f"line {i} " * 8})
        + "\n"
        for i in range(8)
    )
    (tmp_path / "t.jsonl").write_text(lines)
    run = memcli(
        "--db", str(db), "import", str(tmp_path / "t.jsonl"), "--session", "s1",
        env={"MEMCLI_API_BASE": secret_url},
    )  # fmt: skip
    assert "SECRET" not in run.stderr + run.stdout
    assert llm.requests, run.stderr  # the stored block extracted, through the endpoint
    basic = "Basic " + base64.b64encode(b"ana:SECRET-KEY").decode()
    assert set(llm.authorizations) == {basic}
    assert "SECRET" not in recorded(db)[0][1]

"""Long work shows progress that moves: the vector block's embedding during an import, the first
export of the embedding model (said by every command that triggers it), Ctrl-C during an import."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fakes import HashEmbedder
from helpers import import_file, memcli, transcript_lines

from memcli import BudgetOverride, Memory, Message, SQLiteStore, TiktokenTokenizer, VectorBlock
from memcli.cli.common import PREPARING


def test_import_progress_moves_as_messages_are_embedded(tmp_path: Path) -> None:
    from memcli.blocks.feed import CHUNK
    from memcli.importing import Opening

    embedder = HashEmbedder(dim=16)
    block = VectorBlock(embedder=embedder)
    store = SQLiteStore(tmp_path / "m.db")
    data = transcript_lines(
        *(
            {"role": "user" if i % 2 == 0 else "assistant", "content": f"message number {i} " * 4}
            for i in range(1600)
        ),
        session="s",
    )
    calls_at_tick: list[int] = []
    ticks: list[int] = []

    def tick(n: int) -> None:
        ticks.append(n)
        calls_at_tick.append(len(embedder.calls))

    opening = Opening(
        TiktokenTokenizer(), default_budget=BudgetOverride(100, 0.7, 20), blocks=[block]
    )
    result = import_file(
        store,
        data,
        opening,
        block_progress=tick,
    )
    assert result.flushes < CHUNK  # one chunk: before, a single tick once everything was embedded
    assert sum(ticks) == result.flushes and len(ticks) >= 3
    assert calls_at_tick[0] < calls_at_tick[-1]  # the first tick came while embedding went on


@pytest.fixture
def unexported(isolated: Path, tmp_path: Path) -> dict[str, str]:
    """A home whose embedding model is not exported, and an environment where exporting fails at
    once (a `torch` that cannot be imported): what a command says before exporting is seen
    without waiting for the export."""
    models = isolated / "models"
    models.unlink()
    models.mkdir()
    fake = tmp_path / "no-torch" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("no torch in this test")\n')
    path = os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")])
    return {"PYTHONPATH": path}


def test_every_command_that_prepares_the_model_says_so_and_lexical_search_does_not(unexported):
    text = "".join(f'{{"role": "user", "content": "cup {i} of tea"}}\n' for i in range(20))
    stored = memcli(
        "import", "-", "--session", "s", "--token-limit", "40", "--no-blocks", input=text
    )
    assert stored.code == 0, stored.stderr
    assert PREPARING not in stored.stderr
    lexical = memcli("search", "tea", "--mode", "lexical", env=unexported)
    assert lexical.code == 0, lexical.stderr
    assert PREPARING not in lexical.stderr
    for args in (
        ["dump", "blocks", "s", "--input", "tea?"],
        ["search", "tea"],
        ["blocks", "backfill"],
        ["chat", "--plain", "--session", "s"],
        ["import", "-", "--session", "s2", "--token-limit", "40"],
    ):
        run = memcli(*args, input=text, env=unexported)
        assert PREPARING in run.stderr, (args, run.stderr)
        said = " ".join(run.stderr.split())
        if args[0] == "chat":  # its long-term work runs beside the chat, which quits without
            # waiting for it: a failure that comes after the last line is the next use's to say
            assert "Install torch" in said or "the next chat in this session" in said, said
            continue
        assert "Install torch" in said, (args, run.stderr)


INTERRUPTING = '''
from memcli import MemoryBlock


class Interrupting(MemoryBlock):
    """A block that is fed slowly enough for the person to press Ctrl-C."""

    def put(self, batch, ctx):
        raise KeyboardInterrupt
'''


def test_ctrl_c_while_blocks_are_fed_says_what_is_stored_and_how_to_catch_up(tmp_path):
    (tmp_path / "interrupting.py").write_text(INTERRUPTING)
    config = tmp_path / "blocks.toml"
    config.write_text('[[blocks]]\nkind = "python"\npath = "interrupting:Interrupting"\n')
    env = {
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        "MEMCLI_CONFIG": str(config),
    }
    text = "".join(f'{{"role": "user", "content": "message {i} with words"}}\n' for i in range(30))
    run = memcli("import", "-", "--session", "cut", "--token-limit", "40", input=text, env=env)
    assert run.code == 130
    stderr = " ".join(run.stderr.split())
    assert "all 30 messages are stored" in stderr and "took 0 of" in stderr
    assert "memcli blocks backfill" in stderr
    shown = memcli("inspect", "cut", "--all", "--json", env=env)
    assert sum(1 for r in shown.records() if r.get("type") == "message") == 30


def test_a_block_that_only_puts_shows_progress_after_each_batch(tmp_path: Path) -> None:
    """The default `put_many` (a block that only overrides `put`) reports each batch as it is
    processed: a backfill's progress moves with the block's work, not once at the end."""
    from fakes import WordTokenizer

    from memcli import MemoryBlock
    from memcli.blocks.feed import backfill

    class Counting(MemoryBlock):
        name = "counting"

        def __init__(self) -> None:
            super().__init__()
            self.puts = 0

        def put(self, batch, ctx) -> None:
            self.puts += 1

    store = SQLiteStore(tmp_path / "m.db")
    memory = Memory.from_defaults(
        session_id="s", token_limit=40, token_flush_size=8, db=store, tokenizer=WordTokenizer()
    )
    for i in range(12):
        memory.put(Message("user" if i % 2 == 0 else "assistant", f"message {i} " * 3))
    flushes = len(store.list_flushes("s"))
    assert flushes >= 3
    block = Counting()
    puts_at_tick: list[int] = []
    result = backfill(
        store,
        [block],
        store.list_sessions(),
        WordTokenizer(),
        progress=lambda n: puts_at_tick.extend([block.puts] * n),
    )
    assert result.done == {"counting": flushes}
    assert puts_at_tick == list(range(1, flushes + 1))

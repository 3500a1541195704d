"""Blocks from `[[blocks]]` config tables: every kind, key checks, a custom block from a module."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fakes import WordTokenizer

from memcli import ConfigError, FactBlock, Memory, Message, StaticBlock, VectorBlock
from memcli.blocks.registry import Defaults, build_blocks
from memcli.config import load_settings

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def settings_from(tmp_path: Path, text: str):
    path = tmp_path / "config.toml"
    path.write_text(text)
    return load_settings({"MEMCLI_HOME": str(tmp_path)}, {}, path)


def test_every_kind_from_config(tmp_path: Path) -> None:
    (tmp_path / "persona.txt").write_text("You are terse.\n")
    s = settings_from(
        tmp_path,
        f"""
[llm]
model = "openai/m"
api_base = "http://127.0.0.1:9/v1"
timeout = 5

[[blocks]]
kind = "static"
name = "persona"
file = "{tmp_path / "persona.txt"}"

[[blocks]]
kind = "facts"
max_facts = 10
scope = "session"
priority = 3

[[blocks]]
kind = "vector"
similarity_top_k = 4
retrieval_context_window = 2
""",
    )
    static, facts, vector = build_blocks(s.blocks, Defaults(s.model, s.api_base, s.llm_timeout))
    assert isinstance(static, StaticBlock) and static.content == "You are terse."
    assert static.priority == 0
    assert isinstance(facts, FactBlock)
    assert (facts.name, facts.max_facts, facts.scope, facts.priority) == (
        "extracted_info",
        10,
        "session",
        3,
    )
    assert facts.llm.model == "openai/m" and facts.llm.timeout == 5
    assert isinstance(vector, VectorBlock)
    assert (vector.similarity_top_k, vector.retrieval_context_window, vector.scope) == (
        4,
        2,
        "user",
    )


def test_defaults_without_config() -> None:
    # A fact block always: without a model it extracts nothing but shows facts added by hand.
    vector, facts = build_blocks(None, Defaults())
    assert isinstance(vector, VectorBlock) and isinstance(facts, FactBlock)
    assert facts.llm is None and not facts.receives_flushes
    vector, facts = build_blocks(None, Defaults(model="openai/x", api_base="http://h/v1"))
    assert isinstance(facts, FactBlock) and facts.receives_flushes
    assert facts.llm is not None and facts.llm.api_base == "http://h/v1"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('kind = "vector"\nsimilarity_topk = 3', r"#1.*unknown key 'similarity_topk'"),
        ('kind = "vector"\nname = "v"\npriority = "high"', r"#1 \('v'\): priority must be int"),
        ('kind = "vector"\nscope = "global"', r"scope must be 'user' or 'session'"),
        ('kind = "vector"\npriority = -1', r"priority must be a whole number >= 0"),
        ('kind = "vector"\nsimilarity_top_k = 0', r"similarity_top_k must be a whole number"),
        ('kind = "static"', r"#1.*exactly one of content and file"),
        ('kind = "static"\nfile = "/nonexistent/x.txt"', r"cannot read file"),
        ('kind = "facts"\nmodel = ""', r"#1.*model must be a model name"),
        ('kind = "vector"\nsearch = {rrf_k = "x"}', r"#1.*bad search options"),
        ('kind = "sql"', r"kind must be one of static, facts, vector, python"),
        ('name = "x"', r"#1 \('x'\): kind must be one of"),
        ('kind = "python"', r"needs path"),
        ('kind = "python"\npath = "nope_module:X"', r"cannot import module 'nope_module'"),
        ('kind = "python"\npath = "memcli.memory:Memory"', r"is not a MemoryBlock subclass"),
        ('kind = "python"\npath = "memcli"', r"path must be 'package.module:ClassName'"),
    ],
)
def test_bad_tables_name_the_block_and_key(tmp_path: Path, table: str, message: str) -> None:
    s = settings_from(tmp_path, f"[[blocks]]\n{table}\n")
    with pytest.raises(ConfigError, match=message):
        build_blocks(s.blocks, Defaults())


def test_duplicate_names(tmp_path: Path) -> None:
    s = settings_from(tmp_path, '[[blocks]]\nkind = "vector"\n\n[[blocks]]\nkind = "vector"\n')
    with pytest.raises(ConfigError, match=r"#2.*already configured"):
        build_blocks(s.blocks, Defaults())


def test_a_custom_blocks_unknown_key_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `kind = "python"` block's other keys go to its constructor; one it does not take is an
    error naming the block and the key (it was passed on and dropped)."""
    shutil.copy(EXAMPLES / "mention_counter.py", tmp_path / "mention_counter.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    table = '[[blocks]]\nkind = "python"\npath = "mention_counter:MentionCounter"\n'
    s = settings_from(tmp_path, table + 'who = "Rex"\nbogus = 1\nwhoo = 2\n')
    with pytest.raises(ConfigError, match=r"'mentions'.*unknown keys 'bogus', 'whoo'"):
        build_blocks(s.blocks, Defaults())


def test_custom_block_from_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copy(EXAMPLES / "mention_counter.py", tmp_path / "mention_counter.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    s = settings_from(
        tmp_path,
        '[[blocks]]\nkind = "python"\npath = "mention_counter:MentionCounter"\nwho = "Rex"\n',
    )
    (block,) = build_blocks(s.blocks, Defaults())
    assert type(block).__name__ == "MentionCounter" and block.name == "mentions"
    db = tmp_path / "m.db"
    memory = Memory.from_defaults(
        session_id="s",
        token_limit=100,
        chat_history_token_ratio=0.1,
        token_flush_size=5,
        db=db,
        memory_blocks=[block],
        tokenizer=WordTokenizer(),
    )
    for text in ("Rex barked at rex", "I walked Rex today", "nothing here at all", "bye"):
        memory.put_messages([Message("user", text), Message("assistant", "ok")])
    assert memory.context().memory_text == (
        "<memory>\n<mentions>\nThe user has mentioned Rex 3 times.\n</mentions>\n</memory>"
    )
    # Its state is in the store: a new Memory (another session of the user) sees it.
    (again,) = build_blocks(s.blocks, Defaults())
    other = Memory.from_defaults(session_id="t", db=db, memory_blocks=[again])
    assert "mentioned Rex 3 times" in other.context().memory_text


def test_custom_block_unknown_argument(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = tmp_path / "strict_block.py"
    module.write_text(
        "from memcli import MemoryBlock\n"
        "class Strict(MemoryBlock):\n"
        "    def __init__(self, name='strict', colour='red'):\n"
        "        super().__init__(name=name)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    s = settings_from(
        tmp_path, '[[blocks]]\nkind = "python"\npath = "strict_block:Strict"\nsize = 3\n'
    )
    with pytest.raises(ConfigError, match=r"Strict takes no argument 'size'"):
        build_blocks(s.blocks, Defaults())


def test_config_example_blocks_build() -> None:
    example = Path(__file__).resolve().parents[1] / "config.example.toml"
    s = load_settings({"MEMCLI_HOME": "/tmp/unused"}, {}, example)
    blocks = build_blocks(s.blocks, Defaults(s.model, s.api_base, s.llm_timeout))
    assert [(type(b).__name__, b.name, b.priority) for b in blocks] == [
        ("StaticBlock", "core_info", 0),
        ("FactBlock", "extracted_info", 1),
        ("VectorBlock", "vector_memory", 2),
    ]

"""A block kind's `[[blocks]]` keys are declared once, by its class (`OPTIONS`); the registry checks
tables against them, each is an argument the class takes, and a table with every one of them builds
the block, whose definition builds it again."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
from fakes import HashEmbedder

from memcli.blocks import LLMBlock, MemoryBlock
from memcli.blocks.registry import CLASSES, KINDS, Defaults, build_block
from memcli.errors import ConfigError

#: Constructor arguments no table holds: objects the application or the settings give, secrets.
NOT_IN_A_TABLE = {"api_key", "llm", "embedder", "search_options", "index_dir"}


def named_arguments(cls: type[MemoryBlock]) -> set[str]:
    """The arguments the class's constructor takes by name, with those it passes on through
    `**kwargs` to an LLMBlock's (whose own `**kwargs` go to litellm)."""
    names: set[str] = set()
    for owner in (cls, LLMBlock) if issubclass(cls, LLMBlock) else (cls,):
        params = inspect.signature(owner.__init__).parameters.values()
        names |= {p.name for p in params if p.name != "self" and p.kind is p.KEYWORD_ONLY}
        names |= {p.name for p in params if p.name != "self" and p.kind is p.POSITIONAL_OR_KEYWORD}
    return names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.KIND)
def test_each_kind_is_its_class_and_its_keys_are_the_classes_arguments(
    cls: type[MemoryBlock],
) -> None:
    assert KINDS[cls.KIND] is cls.OPTIONS
    arguments = named_arguments(cls)
    table_options = set(getattr(cls, "TABLE_OPTIONS", {}))
    # every key is something the class takes (`search` becomes `search_options`; `max_tokens` is
    # litellm's name for reply_tokens, a summary's own cap)
    for key in cls.OPTIONS:
        taken = key in arguments | table_options or (key, cls.KIND) == ("search", "vector")
        assert taken or (key == "max_tokens" and issubclass(cls, LLMBlock)), key
    # and every argument a table can hold is a key (a static block has no scope: never flushed)
    missing = arguments - NOT_IN_A_TABLE - set(cls.OPTIONS)
    assert missing == set(), f"{cls.__name__} takes {missing} that no [[blocks]] table accepts"
    # what it takes from the settings is an argument too
    assert set(cls.SETTINGS) <= arguments, cls.SETTINGS


def test_the_kinds_are_the_error_messages_kinds() -> None:
    with pytest.raises(ConfigError) as caught:
        build_block(0, {"kind": "sql"}, Defaults())
    listed = caught.value.message.split("one of ", 1)[1].split(", not")[0].split(", ")
    assert sorted(listed) == sorted([*KINDS, "python"])


def tables(tmp_path: Path) -> dict[str, list[dict[str, Any]]]:
    """Per kind, tables that together set every key of the kind once at least."""
    persona = tmp_path / "persona.txt"
    persona.write_text("You are a pirate.", encoding="utf-8")
    llm = {
        "name": "b",
        "priority": 3,
        "model": "openai/x",
        "api_base": "http://127.0.0.1:9/v1",
        "timeout": 5,
        "retry_pending": 1,
        "auto_retries": 2,
        "instructions": "system",
        "structured_output": False,
        "temperature": 0.5,
    }
    return {
        "static": [
            {"name": "s", "priority": 0, "content": "You are a pirate."},
            {"name": "s", "priority": 2, "file": str(persona)},
        ],
        "facts": [
            {**llm, "scope": "session", "max_facts": 7, "candidates": 9, "reply_tokens": 300},
            {**llm, "scope": "user", "max_tokens": 200, "token_budget": 300},
        ],
        "summary": [{**llm, "scope": "session", "max_tokens": 99, "reply_tokens": 300}],
        "vector": [
            {
                "name": "v",
                "priority": 4,
                "scope": "session",
                "source": "flushed",
                "similarity_top_k": 3,
                "retrieval_context_window": 2,
                "search": {"lexical_weight": 0.5},
            },
            {"name": "v", "scope": "user", "token_budget": 500},  # (memcli's way, not LlamaIndex's)
        ],
    }


def test_a_table_with_every_key_builds_the_block_and_its_definition_builds_it_again(
    tmp_path: Path,
) -> None:
    defaults = Defaults(embedder=HashEmbedder())
    examples = tables(tmp_path)
    assert set(examples) == set(KINDS)
    for kind, options in KINDS.items():
        assert set().union(*examples[kind]) == set(options), kind  # every key tried
        for table in examples[kind]:
            block = build_block(0, {"kind": kind, **table}, defaults)
            definition = block.definition()
            assert definition["kind"] == kind == block.KIND
            assert set(definition) - {"kind"} <= set(options), definition
            again = build_block(0, definition, defaults)
            assert again.definition() == definition


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_key_of_another_kind_or_type_is_refused_by_name(kind: str) -> None:
    other = next(k for o in KINDS.values() for k in o if k not in KINDS[kind])
    with pytest.raises(ConfigError, match=rf"#1: unknown key {other!r} for kind {kind!r}"):
        build_block(0, {"kind": kind, other: 1}, Defaults())
    with pytest.raises(ConfigError, match=r"#1: name must be str, not 5"):
        build_block(0, {"kind": kind, "name": 5}, Defaults())

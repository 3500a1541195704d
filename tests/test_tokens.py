"""Token counting with the real tiktoken, offline."""

from __future__ import annotations

import pytest

from memcli import ConfigError, Message, TiktokenTokenizer
from memcli.tokens import message_tokens


def test_cl100k_counts() -> None:
    tok = TiktokenTokenizer()
    assert tok.count("") == 0
    assert tok.count("Hello, world!") == 4
    assert tok.count("The capital of France is Paris.") == 7
    # Special tokens count as text, as in LlamaIndex (allowed_special="all").
    assert tok.count("<|endoftext|>") == 1


def test_other_encodings_work_offline() -> None:
    assert TiktokenTokenizer("o200k_base").count("Hello, world!") == 4
    assert TiktokenTokenizer("p50k_base").count("Hello, world!") == 4


def test_unknown_encoding() -> None:
    with pytest.raises(ConfigError, match="unknown tiktoken encoding"):
        TiktokenTokenizer("nope_base").count("x")


def test_message_tokens_include_metadata() -> None:
    tok = TiktokenTokenizer()
    plain = Message("user", "Hello, world!")
    with_meta = Message("user", "Hello, world!", metadata={"source": "mail"})
    assert message_tokens(plain, tok) == 4
    assert message_tokens(with_meta, tok) == 4 + tok.count("{'source': 'mail'}")

"""Token counting with the real tiktoken, offline."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


TRICKY = [
    "",
    " ",
    "hello world",
    "  trailing spaces   ",
    "ends with a newline\n",
    "\n\nstarts with newlines",
    "line\r\nbreaks\r\n",
    "punctuation!!!\n",
    "it's they're we'll I'd",
    "numbers 12345678 and 3.14159",
    "emoji 🙂🚀 and accents: café naïve",
    "中文文本，没有空格。",
    "<|endoftext|> a special token",
    "half a special <| token",
    "surrogate \ud800 alone",
    "tabs\tand\tmore\t",
    "x" * 3000,
]


@pytest.mark.parametrize("encoding", ["cl100k_base", "o200k_base", "p50k_base"])
def test_count_many_counts_each_text_as_count_does(encoding: str) -> None:
    tokenizer = TiktokenTokenizer(encoding)
    texts = TRICKY + TRICKY[::-1]
    assert tokenizer.count_many(texts) == [tokenizer.count(t) for t in texts]
    assert tokenizer.count_many([]) == []


_PIECES = st.sampled_from([" ", "\n", "\r", "\t", "'s", "1", "!", "<|", "|>", "<|endoftext|>"])
_TEXT = st.lists(st.text(max_size=8) | _PIECES, max_size=8).map("".join)


@given(st.lists(_TEXT, max_size=30))
@settings(max_examples=300, deadline=None)
def test_count_many_matches_count_on_any_texts(texts: list[str]) -> None:
    tokenizer = TiktokenTokenizer()
    assert tokenizer.count_many(texts) == [tokenizer.count(t) for t in texts]

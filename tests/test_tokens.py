"""Token counting with the real tiktoken, offline."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memcli import ConfigError, Message, TiktokenTokenizer, WordTokenizer
from memcli.tokens import count_contents, count_messages, count_texts, message_tokens


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
    "a  b",
    "a   b    c",
    " leading space",
    "trailing space ",
    "word\n next",
    "end.\n\nNext paragraph - item",
    "no-break\u00a0space and \u3000 ideographic",
    "\x1c file separator \x1f unit",
    "line\u2028separator here",
    "don't 's 'S 'll 'VE",
    "1234 5678 a 1 b 22",
    "  - indented\n    code here",
]


ENCODINGS = ["cl100k_base", "o200k_base", "p50k_base"]


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_count_is_tiktokens_count_with_special_tokens_allowed(encoding: str) -> None:
    import tiktoken

    tokenizer = TiktokenTokenizer(encoding)
    tokenizer.count("load")  # loads the encoding offline (TIKTOKEN_CACHE_DIR)
    reference = tiktoken.get_encoding(encoding)
    for text in TRICKY:
        assert tokenizer.count(text) == len(reference.encode(text, allowed_special="all")), text


class CountingTokenizer:
    """Counts words, and remembers which texts it was asked to count."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def count(self, text: str) -> int:
        self.asked.append(text)
        return len(text.split())


def test_count_texts_counts_each_distinct_text_once() -> None:
    tokenizer = CountingTokenizer()
    texts = ["ok", "a b c", "ok", "", "a b c", "ok"]
    assert count_texts(texts, tokenizer) == [1, 3, 1, 0, 3, 1]
    assert sorted(tokenizer.asked) == ["", "a b c", "ok"]
    assert count_texts([], tokenizer) == []


@given(st.lists(st.text(max_size=12) | st.sampled_from(TRICKY), max_size=30))
@settings(max_examples=200, deadline=None)
def test_count_texts_is_count_of_each_text(texts: list[str]) -> None:
    tokenizer = TiktokenTokenizer()
    assert count_texts(texts, tokenizer) == [tokenizer.count(t) for t in texts]


def test_count_contents_adds_metadata_where_given() -> None:
    tokenizer = WordTokenizer()
    got = count_contents(["a b", "c", "d e f"], {1: "{'k': 'v w'}"}, tokenizer)
    assert got == [2, 1 + 3, 3]


def test_count_messages_is_content_plus_metadata_text() -> None:
    tok = TiktokenTokenizer()
    messages = [
        Message("user", "hello there <|endoftext|>"),
        Message("assistant", ""),
        Message("tool", "42", metadata={"tool": "calc", "n": 1}),
        Message("user", "hello there <|endoftext|>"),
    ]
    expected = [tok.count(m.content) + (tok.count(str(m.metadata)) if m.metadata else 0)
                for m in messages]  # fmt: skip
    assert count_messages(messages, tok) == expected
    assert [message_tokens(m, tok) for m in messages] == expected

"""Token counting with the real tiktoken, offline."""

from __future__ import annotations

from collections.abc import Sequence

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
def test_count_many_counts_each_text_as_count_does(encoding: str) -> None:
    tokenizer = TiktokenTokenizer(encoding)
    texts = TRICKY + TRICKY[::-1]
    expected = [tokenizer.count(t) for t in texts]
    assert tokenizer.count_many(texts) == expected
    assert tokenizer.count_joined(texts) == expected
    assert tokenizer.count_many([]) == tokenizer.count_joined([]) == []


# Words of every kind the encodings' regexes tell apart (letters by case, marks, digits,
# apostrophes, punctuation, symbols), joined by every kind of white space, one space most often.
_WORD = st.text(
    st.sampled_from("aZé'sStTdLlVvRrMm019!?.,-/_:;()\"\u0301\u00e9\u4e2d\U0001f642\u0394\u02b0"),
    min_size=1,
    max_size=6,
)
_SPACE = st.sampled_from(
    [" "] * 6 + ["  ", "\n", " \n", "\n ", "\t", "\r\n", "\u00a0", "\x1c", "\u3000"]
)
_WORDS_TEXT = st.lists(st.tuples(_SPACE, _WORD), max_size=12).map(
    lambda pairs: "".join(space + word for space, word in pairs)
) | st.lists(st.tuples(_WORD, _SPACE), max_size=12).map(
    lambda pairs: "".join(word + space for word, space in pairs)
)


@pytest.mark.parametrize("encoding", ENCODINGS)
@given(texts=st.lists(_WORDS_TEXT, max_size=20))
@settings(max_examples=300, deadline=None)
def test_counting_word_by_word_is_exact_on_every_encoding(encoding: str, texts: list[str]) -> None:
    tokenizer = TiktokenTokenizer(encoding)
    assert tokenizer.count_many(texts) == [tokenizer.count(t) for t in texts]


def test_texts_of_mostly_new_words_go_to_tiktoken_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    from memcli import tokens

    monkeypatch.setattr(tokens, "BLOCK", 10)
    joined: list[int] = []

    class Spy(TiktokenTokenizer):
        def count_joined(self, texts: Sequence[str]) -> list[int]:
            joined.append(len(texts))
            return super().count_joined(texts)

    tokenizer = Spy()
    prose = ["the cat sat on the mat, and then it slept"] * 30
    assert tokenizer.count_many(prose) == [tokenizer.count(t) for t in prose]
    assert joined == []  # a few words, each counted once
    ids = [" ".join(str(100 + i * 8 + j) for j in range(8)) for i in range(40)]  # all new
    assert tokenizer.count_many(prose + ids) == [tokenizer.count(t) for t in prose + ids]
    assert joined == [30]  # the first share of ids (10) was counted word by word, the rest whole


_PIECES = st.sampled_from([" ", "\n", "\r", "\t", "'s", "1", "!", "<|", "|>", "<|endoftext|>"])
_TEXT = st.lists(st.text(max_size=8) | _PIECES, max_size=8).map("".join)


@given(st.lists(_TEXT, max_size=30))
@settings(max_examples=300, deadline=None)
def test_count_many_matches_count_on_any_texts(texts: list[str]) -> None:
    tokenizer = TiktokenTokenizer()
    assert tokenizer.count_many(texts) == [tokenizer.count(t) for t in texts]

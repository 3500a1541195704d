"""Token counting with the real tiktoken, offline."""

from __future__ import annotations

import random
import tracemalloc
from collections.abc import Callable, Iterator

import pytest
from fakes import WordTokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

from memcli import ConfigError, Message, TiktokenTokenizer, tokens
from memcli.tokens import count_contents, count_messages, count_texts, load_encoding, message_tokens


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


def reference(encoding: str) -> Callable[[str], int]:
    """tiktoken's own count, special tokens allowed."""
    tiktoken_encoding = load_encoding(encoding)
    return lambda text: len(tiktoken_encoding.encode(text, allowed_special="all"))


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_count_is_tiktokens_count_with_special_tokens_allowed(encoding: str) -> None:
    tokenizer = TiktokenTokenizer(encoding)
    expected = reference(encoding)
    for _ in range(3):  # words first seen, seen again (counted and kept), known
        for text in TRICKY:
            assert tokenizer.count(text) == expected(text), text


# Words of every kind the encodings' regexes tell apart (letters by case, marks, digits,
# apostrophes, punctuation, symbols, slashes), joined by every kind of white space and line
# break, one space most often.
_WORD = st.text(
    st.sampled_from("aZé'sStTdLlVvRrMm019!?.,-/_:;()\"\u0301\u00e9\u4e2d\U0001f642\u0394\u02b0"),
    min_size=1,
    max_size=6,
)
_SPACE = st.sampled_from(
    [" "] * 8
    + ["  ", "\n", "\n\n", " \n", "\n ", "\t", "\r\n", "\r", "\n/", "\u00a0", "\x1c", "\u3000"]
    + ["\u2028", "\x85", "\x0b", "\x0c", " \t ", "\n\n\n", "\u200b"]
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
    expected = reference(encoding)
    for text in texts + texts + texts:  # the words are new, seen again, then known
        assert tokenizer.count(text) == expected(text), text


_PIECES = st.sampled_from(
    [" ", "  ", "\n", "\r", "\t", "'s", "1", "!", "/", "<|", "|>", "<|endoftext|>", "\ud800"]
)
_TEXT = st.lists(st.text(max_size=8) | _PIECES, max_size=8).map("".join)


@pytest.mark.parametrize("encoding", ENCODINGS)
@given(texts=st.lists(_TEXT | st.text(), max_size=30))
@settings(max_examples=200, deadline=None)
def test_count_is_exact_on_any_text(encoding: str, texts: list[str]) -> None:
    """Arbitrary Unicode (`st.text()`, without surrogates), with special tokens, lone surrogates
    and every white space mixed in."""
    tokenizer = TiktokenTokenizer(encoding)
    expected = reference(encoding)
    for text in texts + texts:
        assert tokenizer.count(text) == expected(text), text


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_special_tokens_count_as_one_token_anywhere(encoding: str) -> None:
    tokenizer = TiktokenTokenizer(encoding)
    expected = reference(encoding)
    for text in ["<|endoftext|>", "a <|endoftext|> b", "x<|endoftext|>y\n\nz", "<|endoftext|>" * 3]:
        for _ in range(2):
            assert tokenizer.count(text) == expected(text), text
    assert tokenizer.count("<|endoftext|>") == 1


def test_long_texts_of_known_words_are_exact() -> None:
    tokenizer = TiktokenTokenizer()
    expected = reference("cl100k_base")
    paragraph = "The cat sat on the mat.\n\n- It slept; then it ran!\n  Why?  "
    for n in [1, 2, 50, 400]:
        assert tokenizer.count(paragraph * n) == expected(paragraph * n)


def held_bytes() -> int:
    """The bytes memcli/tokens.py allocated that are still alive (tracemalloc must be on): the
    words a tokenizer keeps, since nothing else of its allocations outlives a `count`."""
    snapshot = tracemalloc.take_snapshot()
    traces = snapshot.filter_traces([tracemalloc.Filter(True, tokens.__file__)])
    return sum(stat.size for stat in traces.statistics("filename"))


@pytest.fixture
def traced() -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


def test_the_words_held_stay_bounded(monkeypatch: pytest.MonkeyPatch, traced: None) -> None:
    """3,000 texts of 5 new ids each: with room for 200 words, what the tokenizer holds (about
    100 bytes a word) fills up, is emptied, and stays within 2 x 200 words and one text's."""
    monkeypatch.setattr(tokens, "WORDS", 200)
    tokenizer = TiktokenTokenizer()
    expected = reference("cl100k_base")
    tokenizer.count("warm up")
    start = held_bytes()
    rng = random.Random(3)
    held = []
    for i in range(3000):  # prose with ids, then ids only, then prose again
        words = [f"{rng.getrandbits(40):x}" for _ in range(5)]
        if i < 1000 or i >= 2000:
            words += rng.sample(["the", "cat", "sat", "on", "a", "mat", "and", "then", "slept"], 6)
        text = " ".join(words)
        assert tokenizer.count(text) == expected(text)
        if i % 100 == 99:
            held.append(held_bytes() - start)
    room = (2 * 200 + 20) * 150  # bytes: a short word and its entry in a dict or set
    assert max(held) <= room and held[-1] <= room
    assert min(held) < max(held) // 4  # filled, then emptied


def test_long_words_are_never_held(traced: None) -> None:
    """500 long words, each met twice among known words (kept, they would take about 50 kB)."""
    tokenizer = TiktokenTokenizer()
    count = reference("cl100k_base")
    known = "the cat sat on a mat and then slept"
    tokenizer.count(known)
    tokenizer.count(known)
    start = held_bytes()
    for i in range(500):
        text = f"{known} {i:04}{'x' * tokens.LONGEST}"
        for _ in range(2):
            assert tokenizer.count(text) == count(text)
    assert held_bytes() - start < 2_000


def test_texts_of_new_words_are_counted_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """A text mostly of words never met goes to tiktoken whole, and so do the SKIP texts after
    it; then words met again are counted alone, once; a text of known words costs no call."""
    tokenizer = TiktokenTokenizer()
    encoding = tokenizer.encoding()
    given: list[str] = []

    class Spy:
        def encode_ordinary(self, text: str) -> list[int]:
            given.append(text)
            return encoding.encode_ordinary(text)

    monkeypatch.setattr(tokenizer, "_encoding", Spy())
    prose = "the cat sat on the mat, and then it slept"
    n = len(encoding.encode_ordinary(prose))
    assert [tokenizer.count(prose) for _ in range(tokens.SKIP + 3)] == [n] * (tokens.SKIP + 3)
    assert given[: tokens.SKIP + 1] == [prose] * (tokens.SKIP + 1)
    assert sorted(given[tokens.SKIP + 1 :]) == sorted(
        {"the"} | {" " + w for w in prose.split()[1:]}
    )
    given.clear()
    assert tokenizer.count(prose + " the cat") == n + 2 and given == []
    ids = [" ".join(f"{i}-{j}-{i * j:x}" for j in range(8)) for i in range(tokens.SKIP + 2)]
    held = []
    tracemalloc.start()
    try:
        for text in ids:
            assert tokenizer.count(text) == len(encoding.encode_ordinary(text))
            held.append(held_bytes())
    finally:
        tracemalloc.stop()
    assert given == ids  # each whole, in one call
    assert held[0] == held[tokens.SKIP] < held[tokens.SKIP + 1]  # skipped texts are not cut


@given(st.lists(st.text(max_size=12) | st.sampled_from(TRICKY), max_size=30))
@settings(max_examples=200, deadline=None)
def test_count_texts_is_tiktokens_count_of_each_text(texts: list[str]) -> None:
    expected = reference("cl100k_base")
    assert count_texts(texts, TiktokenTokenizer()) == [expected(t) for t in texts]


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

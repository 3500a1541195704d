"""Token counting: tiktoken (lazy, offline) behind a small protocol, and a message's token count."""

from __future__ import annotations

import importlib.util
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from memcli.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import tiktoken

    from memcli.messages import Message

DEFAULT_ENCODING = "cl100k_base"
#: The special token that separates texts counted in one call (every tiktoken encoding has it).
SEPARATOR = "<|endoftext|>"


class Tokenizer(Protocol):
    """Anything that counts the tokens of a text."""

    def count(self, text: str) -> int: ...


def litellm_tokenizer_dir() -> Path | None:
    """Where litellm's wheel keeps tiktoken's encodings, found without importing litellm."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "litellm_core_utils" / "tokenizers"
    return folder if folder.is_dir() else None


@lru_cache(maxsize=8)
def load_encoding(name: str) -> tiktoken.Encoding:
    """Load a tiktoken encoding offline, from the copies that litellm ships."""
    if "TIKTOKEN_CACHE_DIR" not in os.environ:
        folder = litellm_tokenizer_dir()
        if folder is not None:
            os.environ["TIKTOKEN_CACHE_DIR"] = str(folder)
    import tiktoken

    try:
        return tiktoken.get_encoding(name)
    except ValueError:
        raise ConfigError(
            f"unknown tiktoken encoding {name!r}",
            "Use cl100k_base, o200k_base or p50k_base",
        ) from None
    except Exception as exc:  # a download attempt that fails offline
        raise ConfigError(
            f"cannot load tiktoken encoding {name!r}: {exc}",
            "Use cl100k_base, o200k_base or p50k_base, which work offline",
        ) from None


class TiktokenTokenizer:
    """Counts tokens with a tiktoken encoding, as LlamaIndex does (special tokens allowed)."""

    def __init__(self, encoding: str = DEFAULT_ENCODING) -> None:
        self.encoding_name = encoding
        self._encoding: Any = None

    def encoding(self) -> tiktoken.Encoding:
        """The tiktoken encoding (loaded on first use)."""
        if self._encoding is None:
            self._encoding = load_encoding(self.encoding_name)
        return self._encoding

    def count(self, text: str) -> int:
        if not text:
            return 0
        encoding = self._encoding or self.encoding()
        if "<|" in text:  # every special token starts so; the ordinary path is twice as fast
            return len(encoding.encode(text, allowed_special="all"))
        return len(encoding.encode_ordinary(text))

    def count_many(self, texts: Sequence[str]) -> list[int]:
        """`[count(t) for t in texts]`, several times faster on a transcript's worth of texts.

        A text is cut into words, and each distinct word is counted by tiktoken once and
        remembered: `WordCounts` says where it cuts and why the counts stay exact. A share of
        texts made mostly of words never seen before (ids, hashes) gains nothing from that:
        from such a share on, the rest go to `count_joined`.
        """
        if self.encoding_name not in WORD_ENCODINGS:
            return self.count_joined(texts)
        words = WordCounts(self)
        result: list[int] = []
        for start in range(0, len(texts), BLOCK):
            share = texts[start : start + BLOCK]
            known = len(words.spaced) + len(words.bare)
            counts = words.count(share)
            result += counts
            if len(words.spaced) + len(words.bare) - known > NEW_WORDS * sum(counts):
                return result + self.count_joined(texts[start + BLOCK :])
        return result

    def count_joined(self, texts: Sequence[str]) -> list[int]:
        """`[count(t) for t in texts]` in one call into tiktoken for the texts without special
        tokens: they are joined with SEPARATOR and encoded with only it allowed as special.
        tiktoken encodes the text between two special tokens on its own (its regex runs on
        that stretch alone), so each text's tokens are exactly those between two separators."""
        encoding = self.encoding()
        counts = [0] * len(texts)
        plain = []
        for i, text in enumerate(texts):
            if "<|" in text:  # may hold special tokens (and SEPARATOR): counted on its own
                counts[i] = self.count(text)
            elif text:
                plain.append(i)
        if not plain:
            return counts
        separator = encoding.encode_single_token(SEPARATOR)
        tokens = encoding.encode(
            SEPARATOR.join([texts[i] for i in plain]),
            allowed_special={SEPARATOR},
            disallowed_special=(),
        )
        find = tokens.index
        start = 0
        for i in plain[:-1]:
            end = find(separator, start)
            counts[i] = end - start
            start = end + 1
        counts[plain[-1]] = len(tokens) - start
        return counts


#: The encodings whose regex `WordCounts` relies on (see there); the tests check each.
WORD_ENCODINGS = frozenset({"cl100k_base", "o200k_base", "p50k_base"})
#: `count_many` checks how many words were new after each share of this many texts.
BLOCK = 1000
#: A share in which more words than this share of its tokens were new sends the rest to tiktoken.
NEW_WORDS = 0.25
#: The spaces at which a text may be cut: a single one between two non-space characters.
_CUT = re.compile(r"(?<=\S) (?=\S)")
#: Where a word may be cut in cl100k_base: after a line break, before a non-space character.
_AFTER_BREAKS = re.compile(r"(?<=[\r\n])(?=\S)")


class _Counted(dict[str, int]):
    """Token counts by text, each text counted by `count` the first time it is looked up."""

    def __init__(self, count: Callable[[str], int]) -> None:
        super().__init__()
        self.count = count

    def __missing__(self, text: str) -> int:
        n = self[text] = self.count(text)
        return n


class WordCounts:
    """Counts texts word by word, each distinct word counted by tiktoken once.

    Why it is exact: tiktoken splits a text with its encoding's regex and encodes each match on
    its own; the regex looks only ahead, never behind. A cut is a place that no match runs
    across and where the matches before it do not depend on what follows, so a text's tokens
    are the sum of its pieces' between cuts. Two kinds of cut are used:
    - before a space between two non-space characters, in cl100k_base, o200k_base and p50k_base:
      there a space only ever starts a match (or belongs to a run of white space). So a text's
      tokens are those of its first word plus, for each later word, those of " " + the word;
    - inside a word, after line breaks followed by a non-space character, in cl100k_base only: a
      match holding a line break ends at the end of the run of white space (`\\s*[\\r\\n]`,
      `\\s++$`, punctuation's `[\\r\\n]*`). In o200k_base punctuation's `[\\r\\n/]*` may run on
      into a `/`, and p50k_base splits such a run by what follows it: there a word keeps its
      line breaks, and is counted whole.
    The tests check it against tiktoken on all three encodings, on generated texts of every kind
    of white space. White space is judged by Python, which counts more characters as white space
    than tiktoken's regex does: it may cut less, never wrongly. Texts that may hold special tokens
    (`<|`) are counted whole.
    """

    def __init__(self, tokenizer: TiktokenTokenizer) -> None:
        self.tokenizer = tokenizer
        encode = tokenizer.encoding().encode_ordinary
        lines = tokenizer.encoding_name == "cl100k_base"

        def pieces(word: str) -> list[str]:
            """The word cut after its line breaks (cl100k_base), or [] if it is not cut."""
            parts = _AFTER_BREAKS.split(word) if lines and "\n" in word else []
            return parts if len(parts) > 1 else []

        def spaced(word: str) -> int:
            parts = pieces(word)  # paragraphs: " end.\n\n" + "Next"
            if parts:
                return self.spaced[parts[0]] + sum(self.bare[part] for part in parts[1:])
            return len(encode(" " + word))

        def bare(word: str) -> int:
            parts = pieces(word)
            return sum(self.bare[part] for part in parts) if parts else len(encode(word))

        self.spaced = _Counted(spaced)  # word -> tokens of " " + word (a later word)
        self.bare = _Counted(bare)  # word -> tokens of the word (a first word, or after breaks)

    def count(self, texts: Sequence[str]) -> list[int]:
        """The tokens of each text."""
        spaced, bare = self.spaced.__getitem__, self.bare.__getitem__
        counts = []
        for text in texts:
            if "<|" in text:
                counts.append(self.tokenizer.count(text))
                continue
            if "  " not in text and (text.isprintable() or _lines_apart(text)):
                words = text.split(" ")  # every space a cut: the common case, no regex
            else:
                words = _CUT.split(text)
            first = words[0]
            counts.append(sum(map(spaced, words)) - spaced(first) + bare(first))
        return counts


def _lines_apart(text: str) -> bool:
    """Besides spaces, `text` has only line breaks as white space, never beside a space (a word
    may then hold a line break: paragraphs and lists need no regex)."""
    return " \n" not in text and "\n " not in text and text.replace("\n", "").isprintable()


class WordTokenizer:
    """One token per white-space separated word: a fast stand-in for tests and examples."""

    def count(self, text: str) -> int:
        return len(text.split())


def message_tokens(message: Message, tokenizer: Tokenizer) -> int:
    """A message's tokens: its text, plus `str(metadata)` when it has metadata (as the reference)."""
    total = tokenizer.count(message.content)
    if message.metadata:
        total += tokenizer.count(str(message.metadata))
    return total

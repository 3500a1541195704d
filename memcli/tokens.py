"""Token counting: tiktoken (lazy, offline), word by word with a bounded cache of word counts,
behind a small protocol; and a message's token count (one path for the engine and `simulate`)."""

from __future__ import annotations

import importlib.util
import re
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from memcli.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    import tiktoken

    from memcli.messages import Message

DEFAULT_ENCODING = "cl100k_base"


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


_ENDOFTEXT, _ENDOFPROMPT = "<|endoftext|>", "<|endofprompt|>"
#: The encodings memcli counts with, as tiktoken's `tiktoken_ext.openai_public` defines them:
#: the file litellm's wheel ships (named as tiktoken caches it: the SHA-1 of its URL) and its
#: SHA-256, the split pattern and the special tokens. tests/test_tokens.py checks each against
#: `tiktoken.get_encoding`.
ENCODINGS: dict[str, dict[str, Any]] = {
    "cl100k_base": {
        "file": "9b5ad71b2ce5302211f9c61530b329a4922fc6a4",
        "sha256": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        "pat_str": r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",
        "special_tokens": {
            _ENDOFTEXT: 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            _ENDOFPROMPT: 100276,
        },
    },
    "o200k_base": {
        "file": "fb374d419588a4632f3f557e76b4b70aebbca790",
        "sha256": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        "pat_str": "|".join(
            [
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""\p{N}{1,3}""",
                r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
                r"""\s*[\r\n]+""",
                r"""\s+(?!\S)""",
                r"""\s+""",
            ]
        ),
        "special_tokens": {_ENDOFTEXT: 199999, _ENDOFPROMPT: 200018},
    },
    "p50k_base": {
        "file": "ec7223a39ce59f226a68acc30dc1af2788490e15",
        "sha256": "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069",
        "pat_str": r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s""",
        "special_tokens": {_ENDOFTEXT: 50256},
        "explicit_n_vocab": 50281,
    },
}


@lru_cache(maxsize=8)
def load_encoding(name: str) -> tiktoken.Encoding:
    """Load a tiktoken encoding offline, from the copies that litellm ships: the file is handed
    to tiktoken by its path (`load_tiktoken_bpe`), never through the environment. An encoding
    whose file is not there is tiktoken's own `get_encoding` (its cache, as the host set it)."""
    import tiktoken

    spec = ENCODINGS.get(name)
    folder = litellm_tokenizer_dir()
    if spec is not None and folder is not None and (folder / spec["file"]).is_file():
        from tiktoken.load import load_tiktoken_bpe

        try:
            ranks = load_tiktoken_bpe(str(folder / spec["file"]), expected_hash=spec["sha256"])
        except Exception as exc:  # a damaged file
            raise ConfigError(
                f"cannot load tiktoken encoding {name!r} from {folder / spec['file']}: {exc}",
                "Reinstall litellm (pip install --force-reinstall litellm)",
            ) from None
        return tiktoken.Encoding(
            name,
            pat_str=spec["pat_str"],
            mergeable_ranks=ranks,
            special_tokens=spec["special_tokens"],
            explicit_n_vocab=spec.get("explicit_n_vocab"),
        )
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
    """Counts tokens as tiktoken does with special tokens allowed (as LlamaIndex counts them):
    `count(text) == len(encoding.encode(text, allowed_special="all"))` for every text.

    Every count in memcli goes through `count`: the engine's (each put, the blocks, the window)
    and `memcli simulate`'s. It counts word by word, each word counted by tiktoken once and
    remembered; where a text is cut into words, and why the sum of the words' counts is the
    text's, is told at `cut`. The words remembered, and when tiktoken counts a text whole:
    - a word met for the first time is only noted as seen: ids, hashes, numbers and typos are
      mostly met once, and counting each alone would cost a tiktoken call. A word met again is
      counted alone by tiktoken, and its count kept.
    - a text whose words all have a count kept is the sum of those counts, without tiktoken.
      Otherwise its other words are counted alone, not kept; or, when they are more than
      `NEW_SHARE` of its words (a text of ids, the first texts), the text is counted whole, and
      so are the `SKIP` texts after it, without being cut.
    - the counts kept, and the words seen, are each emptied when they hold more than `WORDS`
      words; words longer than `LONGEST` characters are never kept nor noted.
    Texts that may hold special tokens (`<|`), and all texts in an encoding not in
    `WORD_ENCODINGS`, are counted whole.
    """

    def __init__(self, encoding: str = DEFAULT_ENCODING) -> None:
        self.encoding_name = encoding
        self._encoding: Any = None
        self._by_words = encoding in WORD_ENCODINGS
        self._breaks = AFTER_BREAKS.get(encoding)
        self._alone: dict[str, int] = {}  # word -> tokens of the word (first, or after breaks)
        self._spaced: dict[str, int] = {}  # word -> tokens of " " + word
        self._seen_alone: set[str] = set()  # words met once, without a count
        self._seen_spaced: set[str] = set()
        self._skip = 0  # how many texts to count whole next, without cutting them

    def encoding(self) -> tiktoken.Encoding:
        """The tiktoken encoding (loaded on first use)."""
        if self._encoding is None:
            self._encoding = load_encoding(self.encoding_name)
        return self._encoding

    def count(self, text: str) -> int:
        if not text:
            return 0
        if "<|" in text or not self._by_words:
            return self._whole(text)
        if self._skip:
            self._skip -= 1
            return self._whole(text)
        alone, spaced = self.cut(text)
        try:
            return sum(map(self._alone.__getitem__, alone)) + sum(
                map(self._spaced.__getitem__, spaced)
            )
        except KeyError:  # a word without a count kept
            return self._count_new(text, alone, spaced)

    def cut(self, text: str) -> tuple[list[str], list[str]]:
        """The text cut into words: those counted alone (the first; in cl100k_base and o200k_base,
        also a word's part after line breaks), and those counted after a space (`" " + word`).
        The text's tokens are the sum of theirs; in an encoding of `WORD_ENCODINGS` and for a text
        without special tokens.

        Why: tiktoken cuts a text with its encoding's regex and encodes each match on its own.
        The regexes look only ahead, never behind; so where no match runs across a place and the
        matches before it do not depend on what follows it, the text's tokens are those before
        plus those after, each counted alone. Such places (the cuts):
        1. a space after a non-space character, in all three encodings. A match that holds a
           space holds only white space, or begins with that space (`[^\\r\\n\\p{L}\\p{N}]?+`,
           ` ?`): no match holds a non-space then a space. The matches before end at a letter,
           digit or mark run's end or a possessive run's end, unchanged by what follows; the
           only look-ahead, `\\s+(?!\\S)`, and `$`, ask about white space, which the text
           before does not end with.
        2. after line breaks, before a non-space character, in cl100k_base, and in o200k_base
           unless that character is `/`. Every match that holds a line break ends with it
           (`[\\r\\n]*+`, white space runs), except, in o200k_base, punctuation's
           `[\\r\\n/]*` running on into a `/`. A white space run ending in line breaks is one
           match, whether the text ends there (`\\s++$`) or not (`\\s*[\\r\\n]`). p50k_base
           splits such a run by what follows (`\\s+(?!\\S)`): there a word keeps its breaks.
        White space is judged by Python, which counts more characters as white space than the
        regexes' `\\s` (`\\x1c`..`\\x1f`): it may cut less, never wrongly. The tests check the
        counts against tiktoken on all three encodings, on text with every kind of white space.
        """
        if "  " not in text and (text.isprintable() or _lines_apart(text)):
            spaced = text.split(" ")  # every space a cut: the common case, no regex
        else:
            spaced = CUT.split(text)
        alone = [spaced.pop(0)]
        if self._breaks is None or ("\n" not in text and "\r" not in text):
            return alone, spaced
        split = self._breaks.split
        parts = [split(word) for word in alone + spaced]
        alone = [parts[0][0]] + [part for word in parts for part in word[1:]]
        return alone, [word[0] for word in parts[1:]]

    def _whole(self, text: str) -> int:
        """The text counted by tiktoken in one call."""
        encoding = self._encoding or self.encoding()
        if "<|" in text:  # every special token starts so; the ordinary path is twice as fast
            return len(encoding.encode(text, allowed_special="all"))
        return len(encoding.encode_ordinary(text))

    def _count_new(self, text: str, alone: list[str], spaced: list[str]) -> int:
        """The tokens of a text some of whose words have no count kept (see the class)."""
        if len(self._seen_alone) + len(self._seen_spaced) > WORDS:
            self._seen_alone.clear()
            self._seen_spaced.clear()
        if len(self._alone) + len(self._spaced) > WORDS:
            self._alone.clear()
            self._spaced.clear()
        encode = self.encoding().encode_ordinary
        total = 0
        new: list[str] = []  # the words without a count, as counted alone
        for counts, seen, words, space in (
            (self._alone, self._seen_alone, alone, ""),
            (self._spaced, self._seen_spaced, spaced, " "),
        ):
            for word, n in zip(words, map(counts.get, words), strict=True):
                if n is not None:
                    total += n
                elif word in seen:  # met again: counted alone, and kept
                    seen.discard(word)
                    total += counts.setdefault(word, len(encode(space + word)))
                else:
                    if len(word) <= LONGEST:
                        seen.add(word)
                    new.append(space + word)
        if len(new) > NEW_SHARE * (len(alone) + len(spaced)):
            self._skip = SKIP
            return len(encode(text))
        return total + sum(len(encode(piece)) for piece in new)


#: The encodings whose regexes `TiktokenTokenizer.cut` relies on (the tests check each).
WORD_ENCODINGS = frozenset({"cl100k_base", "o200k_base", "p50k_base"})
#: The cut between words: a space after a non-space character, before one (rule 1 of `cut`;
#: a space before a space stays in the word after it, as in "a  b" -> "a", " b").
CUT = re.compile(r"(?<=\S) (?=\S)")
#: The cuts after line breaks inside a word (rule 2 of `cut`), in the encodings that allow them.
AFTER_BREAKS = {
    "cl100k_base": re.compile(r"(?<=[\r\n])(?=\S)"),
    "o200k_base": re.compile(r"(?<=[\r\n])(?=[^\s/])"),
}
#: The counts kept, and the words seen once, are each emptied when they hold more than this many
#: words. The words of a long English chat fit many times over (LoCoMo's two conversations, 600
#: sessions' worth, have about 3,200 distinct words, punctuation attached), and a text of new
#: words only fills the seen ones; at about 140 bytes a word (LONGEST characters at most), the
#: two hold at most about 11 MB.
WORDS = 40_000
#: A text more than this share of whose words have no count is counted whole. tiktoken takes about
#: 1 us a call on top of the work on the text (on this machine), and a known word in a text
#: costs it about 0.4 us: from about a quarter of new words on, one call on the whole text
#: costs less than one a new word.
NEW_SHARE = 0.25
#: After a text counted whole for its new words, this many texts are counted whole without being
#: cut: texts of ids come in runs (a tool's output, a log), and looking at their words costs about
#: a third of what tiktoken takes on them; every SKIP + 1st text of such a run is still looked at.
SKIP = 16
#: Longer words (hashes, URLs, blobs) are counted by tiktoken each time, never kept nor noted.
LONGEST = 32


def _lines_apart(text: str) -> bool:
    """Besides spaces, `text` has only line breaks as white space, never beside a space (a word
    may then hold a line break: paragraphs and lists need no regex)."""
    return " \n" not in text and "\n " not in text and text.replace("\n", "").isprintable()


def count_texts(texts: Sequence[str], tokenizer: Tokenizer) -> list[int]:
    """`[tokenizer.count(t) for t in texts]`. (A text met again is not looked up whole: with
    `TiktokenTokenizer` its words are, and that costs less than keeping every text.)"""
    count = tokenizer.count
    return [count(text) for text in texts]


def count_contents(
    contents: Sequence[str], metadata: Mapping[int, str], tokenizer: Tokenizer
) -> list[int]:
    """The tokens of messages given by their contents: each content's, plus those of `metadata[i]`
    (`str(message.metadata)`) for the messages that have metadata, as the reference counts.

    Every token count of a message goes through here: the engine's (`count_messages`) and
    `memcli simulate`'s, which reads a transcript as columns, without a Message per line.
    """
    tokens = count_texts(contents, tokenizer)
    extra = count_texts(list(metadata.values()), tokenizer)
    for i, n in zip(metadata, extra, strict=True):
        tokens[i] += n
    return tokens


def count_messages(messages: Sequence[Message], tokenizer: Tokenizer) -> list[int]:
    """Each message's tokens: its content, plus `str(metadata)` when it has metadata."""
    metadata = {i: str(m.metadata) for i, m in enumerate(messages) if m.metadata}
    return count_contents([m.content for m in messages], metadata, tokenizer)


def message_tokens(message: Message, tokenizer: Tokenizer) -> int:
    """One message's tokens (`count_messages` of one)."""
    return count_messages([message], tokenizer)[0]

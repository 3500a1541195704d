"""Token counting: tiktoken (lazy, offline) behind a small protocol, and a message's token count."""

from __future__ import annotations

import importlib.util
import os
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from memcli.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Sequence

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

    def _get(self) -> tiktoken.Encoding:
        if self._encoding is None:
            self._encoding = load_encoding(self.encoding_name)
        return self._encoding

    def count(self, text: str) -> int:
        if not text:
            return 0
        encoding = self._encoding or self._get()
        if "<|" in text:  # every special token starts so; the ordinary path is twice as fast
            return len(encoding.encode(text, allowed_special="all"))
        return len(encoding.encode_ordinary(text))

    def count_many(self, texts: Sequence[str]) -> list[int]:
        """`[count(t) for t in texts]`, in one call into tiktoken for the texts without special
        tokens: they are joined with SEPARATOR and encoded with only it allowed as special.
        tiktoken encodes the text between two special tokens on its own (its regex runs on
        that stretch alone), so each text's tokens are exactly those between two separators.
        One call instead of one per text: no Python between texts, and a thread counting a
        share of them keeps the interpreter's lock released for the whole share."""
        encoding = self._encoding or self._get()
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

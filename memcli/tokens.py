"""Token counting: tiktoken (lazy, offline) behind a small protocol, and a message's token count."""

from __future__ import annotations

import importlib.util
import os
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


class WordTokenizer:
    """One token per white-space separated word: a fast stand-in for tests and examples."""

    def count(self, text: str) -> int:
        return len(text.split())


def count_texts(texts: Sequence[str], tokenizer: Tokenizer) -> list[int]:
    """`[tokenizer.count(t) for t in texts]`, each distinct text counted once (a system prompt on
    every line, "ok", a tool's usual answer)."""
    count = tokenizer.count
    counts = {text: count(text) for text in dict.fromkeys(texts)}
    return [counts[text] for text in texts]


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

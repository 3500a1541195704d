"""Fakes for fast pure-logic tests (every real path is exercised in the default run too)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from memcli.search.embedder import cut

if TYPE_CHECKING:
    from collections.abc import Sequence


class WordTokenizer:
    """One token per white-space separated word: a fast stand-in for tiktoken in tests."""

    def count(self, text: str) -> int:
        return len(text.split())


def importing_fakes(script: str) -> str:
    """A script for another Python process that can `from fakes import WordTokenizer`."""
    return f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n{script}"


class HashEmbedder:
    """A deterministic bag-of-words embedder: words hashed into `dim` buckets, a word a token.
    Texts sharing words are close, which is enough to check retrieval logic."""

    name = "hash"

    def __init__(self, dim: int = 64, max_tokens: int = 64) -> None:
        self._dim = dim
        self._max_tokens = max_tokens
        self.calls: list[int] = []  # how many texts each embed() call was given

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def max_tokens(self) -> int:
        return self._max_tokens

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(len(texts))
        rows = np.zeros((len(texts), self._dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
                rows[i, int.from_bytes(digest, "little") % self._dim] += 1.0
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        return rows / norms

    def split(self, texts: Sequence[str]) -> list[list[str]]:
        return [
            cut(text, [m.span() for m in re.finditer(r"\S+", text)], self._max_tokens)
            for text in texts
        ]

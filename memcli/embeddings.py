"""Embedders: the protocol, the one text splitter every embedder uses (`cut`), and a small
deterministic hash embedder for fast tests. The real model is memcli.onnx_embedder.OnnxEmbedder.

An embedder also splits a text into pieces that each fit its window, so that nothing is cut off
silently when a long text is embedded.
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np

#: A piece may end after a token that ends with one of these (then white space), or at a line end.
SENTENCE_ENDS = (".", "!", "?")


class Embedder(Protocol):
    """Turns texts into L2-normalised float32 rows, and splits texts to fit its window.

    `name` names the vectors it makes (the model, and how it splits texts): vectors stored under
    another name are embedded again rather than compared with these."""

    name: str

    @property
    def dim(self) -> int: ...

    @property
    def max_tokens(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """An (n, dim) float32 array, each row of unit length."""
        ...

    def split(self, texts: Sequence[str]) -> list[list[str]]:
        """Each text as pieces of at most `max_tokens` tokens, in order, covering the whole text."""
        ...


def cut(text: str, offsets: Sequence[tuple[int, int]], limit: int) -> list[str]:
    """Cut `text` into pieces of at most `limit` tokens (given each token's character span),
    preferring a cut after a sentence or line end in the second half of a piece, and never
    losing a character. Pieces of white space alone are dropped."""
    if len(offsets) <= limit:
        return [text]
    pieces = []
    start_token = 0
    start_char = 0
    while len(offsets) - start_token > limit:
        end = start_token + limit  # the first token of the next piece
        for candidate in range(end, start_token + limit // 2, -1):
            before_end = offsets[candidate - 1][1]
            gap = text[before_end : offsets[candidate][0]]
            if "\n" in gap or (gap and text[before_end - 1 : before_end] in SENTENCE_ENDS):
                end = candidate
                break
        cut_char = offsets[end][0]
        pieces.append(text[start_char:cut_char])
        start_token, start_char = end, cut_char
    pieces.append(text[start_char:])
    return [p for p in pieces if p.strip()] or [text]


def _normalise(rows: np.ndarray) -> np.ndarray:
    import numpy as np

    rows = np.asarray(rows, dtype=np.float32)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return rows / norms


class HashEmbedder:
    """A deterministic bag-of-words embedder: words hashed into `dim` buckets, a word a token.
    For tests only; texts sharing words are close, which is enough to check retrieval logic."""

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
        import numpy as np

        self.calls.append(len(texts))
        rows = np.zeros((len(texts), self._dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
                rows[i, int.from_bytes(digest, "little") % self._dim] += 1.0
        return _normalise(rows)

    def split(self, texts: Sequence[str]) -> list[list[str]]:
        return [
            cut(text, [m.span() for m in re.finditer(r"\S+", text)], self._max_tokens)
            for text in texts
        ]

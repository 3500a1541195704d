"""Embedders: the protocol, and the one text splitter every embedder uses (`cut`, and
`embedded_pieces` for which pieces of a text are embedded). The model is
memcli.search.onnx.OnnxEmbedder.

An embedder also splits a text into pieces that each fit its window, so that nothing is cut off
silently when a long text is embedded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np

#: A piece may end after a token that ends with one of these (then white space), or at a line end.
SENTENCE_ENDS = (".", "!", "?")

#: At most this many pieces of one text are embedded (a message's vectors, a query's): about 16,000
#: tokens with the bundled model, embedded in seconds. A longer text gets this many pieces spread
#: evenly through it (so vector search sees every part of it, sampled); its full text is still in
#: the full-text (BM25) index.
MAX_PIECES = 64
#: A text up to this many characters is split whole (and, past MAX_PIECES pieces, every so many
#: pieces are kept); a longer one is not tokenized whole: it is read at MAX_PIECES places spread
#: evenly through it, REGION_CHARS characters at each, and the first piece of each is kept.
WHOLE_CHARS = 100_000
REGION_CHARS = 4_000


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


def segments(text: str, size: int) -> list[str]:
    """`text` in consecutive segments of about `size` characters (none longer), each ending at a
    line end or else white space in its last tenth when there is one: a tokenizer then reads a
    huge text a segment at a time, in bounded memory."""
    out = []
    start = 0
    while len(text) - start > size:
        end = start + size
        low = end - size // 10
        at = text.rfind("\n", low, end)
        if at < 0:
            at = max(text.rfind(" ", low, end), text.rfind("\t", low, end))
        end = at + 1 if at >= 0 else end
        out.append(text[start:end])
        start = end
    out.append(text[start:])
    return out


def embedded_pieces(embedder: Embedder, texts: Sequence[str]) -> list[list[str]]:
    """Each text's pieces that are embedded: all of them up to MAX_PIECES, else MAX_PIECES spread
    evenly through it (see WHOLE_CHARS). The same text always gives the same pieces, so that a
    stored vector's piece number finds its text again."""
    whole = list(dict.fromkeys(t for t in texts if len(t) <= WHOLE_CHARS))
    split = dict(zip(whole, embedder.split(whole), strict=True))
    huge = list(dict.fromkeys(t for t in texts if len(t) > WHOLE_CHARS))
    regions = {t: _regions(t) for t in huge}
    firsts = iter(embedder.split([r for t in huge for r in regions[t]]))
    sampled = {t: [p for _ in regions[t] if (p := next(firsts)[0]).strip()] for t in huge}
    out = []
    for text in texts:
        if text in sampled:
            out.append(sampled[text] or [text[:REGION_CHARS]])
            continue
        pieces = split[text]
        if len(pieces) > MAX_PIECES:
            pieces = [pieces[i * len(pieces) // MAX_PIECES] for i in range(MAX_PIECES)]
        out.append(pieces)
    return out


def _regions(text: str) -> list[str]:
    """REGION_CHARS characters at each of MAX_PIECES places spread evenly through a long text,
    each starting after white space where there is some near."""
    out = []
    for i in range(MAX_PIECES):
        start = i * len(text) // MAX_PIECES
        if start:
            near = [at for at in (text.find(c, start, start + 200) for c in " \n\t") if at >= 0]
            start = min(near) + 1 if near else start
        out.append(text[start : start + REGION_CHARS])
    return out

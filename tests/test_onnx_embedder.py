"""The ONNX Runtime model gives the embeddings sentence-transformers gives; the recall harness runs."""

from __future__ import annotations

import sys
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

from memcli.search.onnx import OnnxEmbedder, bundled_model_dir, onnx_path

ROOT = Path(__file__).resolve().parents[1]

LONG = " ".join(
    f"Sentence {i} is about cellos, kayaks and a puppy called Biscuit." for i in range(40)
)
TEXTS = [
    "Hello there",
    "I went to a LGBTQ support group yesterday and it was so powerful.",
    "",
    "   ",
    "Ünïcödé, 日本語のテキスト, emoji 🎉 and code: `x = [i**2 for i in range(10)]`",
    "What's the date? 2023-05-08T13:56:00Z, $1,234.56 & 100% <b>tags</b>",
    "A much longer passage. " * 20,
    "Caroline: Yes, last May!\nMelanie: That's wonderful, how was it?",
    LONG,  # far beyond the 256-token window: both truncate it the same way
]


@pytest.mark.slow
def test_onnx_matches_sentence_transformers(minilm: OnnxEmbedder) -> None:
    """The only use of sentence-transformers: the reference the ONNX vectors must match, at
    fp32; the int8 model (the default, `minilm`) stays close to it."""
    from sentence_transformers import SentenceTransformer

    assert max(minilm.count([LONG])) > 256
    pieces = minilm.split([LONG])[0]  # what storing and querying embed of a long text
    texts = [*TEXTS, *pieces]
    reference = SentenceTransformer(str(bundled_model_dir()), device="cpu")
    theirs = reference.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    fp32 = OnnxEmbedder(minilm.cache_dir, precision="fp32")
    for embedder, floor in ((fp32, 0.999), (minilm, 0.97)):
        ours = embedder.embed(texts)
        assert ours.shape == (len(texts), 384) and ours.dtype == np.float32
        assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
        cosines = (ours * theirs).sum(axis=1)
        assert cosines.min() > floor, (embedder.precision, cosines)
        # a batch and one text at a time agree (padding changes nothing at fp32; at int8 the
        # activations' scale is the whole run's, so a text's batch-mates move it a little)
        one = np.vstack([embedder.embed([t]) for t in TEXTS[:3]])
        if embedder is fp32:
            assert np.allclose(one, ours[:3], atol=1e-5)
        else:
            assert (one * ours[:3]).sum(axis=1).min() > 0.95  # (0.966 measured)
        assert embedder.is_exported


@pytest.mark.slow
def test_split_keeps_every_character_within_the_window(minilm: OnnxEmbedder) -> None:
    text = "One sentence about cellos. " * 120 + "The very last words."
    pieces = minilm.split([text, "short"])
    assert pieces[1] == ["short"]
    assert len(pieces[0]) > 1 and "".join(pieces[0]) == text
    assert max(minilm.count(pieces[0])) <= minilm.max_tokens
    assert pieces[0][0].endswith(". ")  # cut after a sentence, not inside a word


@pytest.mark.slow
def test_locomo_recall_harness_on_a_slice(minilm: OnnxEmbedder) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import locomo

    assert locomo.DEFAULT_DATA.is_dir(), "the LoCoMo development data is missing"
    args = Namespace(
        data=str(locomo.DEFAULT_DATA),
        db=None,
        conversations="30",
        questions=4,
        turns=60,
        depth=20,
        options=None,
        model_cache=str(minilm.cache_dir),
        precision=minilm.precision,
    )
    report = locomo.run(args)
    assert set(report["variants"]) == {"hybrid", "vector", "lexical"}
    for variant in report["variants"].values():
        overall = variant["overall"]
        assert overall["questions"] >= 1
        for key in ("recall@2", "recall@5", "recall@10", "recall@500tok", "recall@1000tok"):
            assert 0.0 <= overall[key] <= 1.0
        assert overall["recall@2"] <= overall["recall@5"] <= overall["recall@10"]
        assert overall["tokens@10"] > 0
        assert variant["latency_ms"]["mean"] > 0
    assert report["build"]["messages"] == 60


@pytest.mark.slow
def test_the_background_export_is_a_process_that_a_first_use_waits_for(tmp_path: Path) -> None:
    """`prepare_in_background` exports in a child process, not a thread of this one (a daemon
    thread importing torch when the process exits could hold the import lock while a finaliser
    imports: `memcli chat` then hung after a failed first turn); the first use waits for it and
    embeds with what it wrote."""
    import subprocess
    import threading

    told = []
    embedder = OnnxEmbedder(tmp_path / "models", on_prepare=lambda: told.append(True))
    threads = threading.active_count()
    child = embedder.prepare_in_background()
    assert isinstance(child, subprocess.Popen) and threading.active_count() == threads
    assert told == [True]
    assert embedder.prepare_in_background() is None  # one export at a time
    vector = embedder.embed(["a first use waits for the export"])[0]
    assert child.poll() == 0 and embedder.is_exported and len(vector) == 384
    assert onnx_path(tmp_path / "models").is_file()  # the int8 copy is quantised from it
    assert told == [True]  # said once
    assert not [p for p in (tmp_path / "models").iterdir() if p.name.endswith(".tmp")]
    assert embedder.prepare_in_background() is None  # exported


def test_onnxruntime_telemetry_is_off_before_the_session_exists(
    onnx_models: Path, minilm: OnnxEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    import onnxruntime

    from memcli.search import onnx as onnx_module

    calls: list[str] = []
    disable, session = onnxruntime.disable_telemetry_events, onnxruntime.InferenceSession

    def disabled() -> None:
        calls.append("disable_telemetry_events")
        disable()

    def made(*args: object, **kwargs: object) -> object:
        calls.append("InferenceSession")
        return session(*args, **kwargs)

    monkeypatch.setattr(onnxruntime, "disable_telemetry_events", disabled)
    monkeypatch.setattr(onnxruntime, "InferenceSession", made)
    monkeypatch.setattr(onnx_module, "_LOADED", {})  # (not the session `minilm` loaded)
    embedder = OnnxEmbedder(onnx_models)  # (the export `minilm` made: loaded, not exported)
    assert embedder.embed(["hello"]).shape[0] == 1
    assert calls[:2] == ["disable_telemetry_events", "InferenceSession"], calls


@pytest.mark.slow
def test_an_export_started_by_a_process_that_exited_is_kept_and_waited_for(
    tmp_path: Path,
) -> None:
    """A first `memcli chat` starts the export and exits before it is done: the export goes on
    (a child in its own session, named in a lock file), and the next process recognises it in
    progress (no second export, no second "Preparing" note), waits for it and uses its file. A
    lock left by an exporter that died is taken over."""
    import os
    import subprocess

    from memcli.search.onnx import lock_path

    models = tmp_path / "models"
    models.mkdir()
    target = OnnxEmbedder(models).path  # the int8 model, quantised from the fp32 export
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock_path(onnx_path(models)).write_text(str(dead.pid))  # an exporter that died
    first = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from memcli.search.onnx import OnnxEmbedder;"
            "child = OnnxEmbedder(sys.argv[1]).prepare_in_background(); print(child.pid)",
            str(models),
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    child = int(first.stdout)
    assert lock_path(target).read_text() == str(child)  # the export in progress

    told = []
    embedder = OnnxEmbedder(models, on_prepare=lambda: told.append(True))
    assert embedder.preparing  # not exported yet: the chat searches by words meanwhile
    assert embedder.prepare_in_background() is None and told == []  # not started again
    vector = embedder.embed(["the first run's export is waited for"])[0]
    assert len(vector) == 384 and embedder.is_exported
    assert not [p for p in models.iterdir() if p.name.endswith((".tmp", ".export"))]


def test_embedders_of_one_model_share_its_loaded_session(minilm: OnnxEmbedder) -> None:
    """A block's, the search's and an MCP server's users' embedders of the same model use one
    loaded session (each loaded its own, ~90 MB apiece); another thread count is its own."""
    other = OnnxEmbedder(minilm.cache_dir)
    vectors = other.embed(["sourdough starter"])
    assert other._session is minilm._session and other._tokenizer is minilm._tokenizer
    assert np.allclose(vectors, minilm.embed(["sourdough starter"]))
    single = OnnxEmbedder(minilm.cache_dir, threads=1)
    single.embed(["sourdough starter"])
    assert single._session is not minilm._session

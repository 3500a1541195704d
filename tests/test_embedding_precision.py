"""The embedding model at int8 (the default) and fp32: the quantised copy made once from the fp32
export and reused, the setting validated, and a store's vectors of one precision never compared
with the other's (searches and `memcli blocks backfill` embed the messages again, and say so)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from clidata import BUDGET, write_chat
from helpers import memcli

from memcli import Memory, Message
from memcli.config import FIELDS, load_settings
from memcli.errors import ConfigError, ModelError
from memcli.search import onnx
from memcli.search.onnx import PRECISIONS, OnnxEmbedder, onnx_path
from memcli.search.retriever import Retriever
from memcli.store.vectors import vector_models

TEXTS = [
    "I went to a LGBTQ support group yesterday and it was so powerful.",
    "Melanie painted a sunrise over the lake last summer.",
    "What is the capital of France?",
    "Ünïcödé, 日本語のテキスト and code: `x = [i**2 for i in range(10)]`",
]


def test_the_setting_is_validated_and_names_the_choices(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[search]\nembedding_precision = "fp32"\n')
    assert load_settings({}, config_path=config).embedding_precision == "fp32"
    assert load_settings({}).embedding_precision == "int8"  # the default
    config.write_text('[search]\nembedding_precision = "int4"\n')
    with pytest.raises(ConfigError) as caught:
        load_settings({}, config_path=config)
    assert str(config) in caught.value.message and "int8, fp32" in caught.value.message
    # The choices are the model's (config may not import the search: it repeats them).
    spec = next(f for f in FIELDS if f.name == "embedding_precision")
    assert spec.choices == PRECISIONS and spec.default == PRECISIONS[0]
    run = memcli("info", env={"MEMCLI_CONFIG": str(config)})
    assert run.code == 2 and "embedding_precision must be one of int8, fp32" in run.stderr
    with pytest.raises(ModelError):
        OnnxEmbedder(tmp_path, precision="fp16")


def test_the_two_precisions_name_their_vectors_apart(tmp_path: Path) -> None:
    int8, fp32 = OnnxEmbedder(tmp_path), OnnxEmbedder(tmp_path, precision="fp32")
    assert int8.precision == "int8" and fp32.precision == "fp32"
    # fp32 keeps the name stores were embedded under before int8 existed.
    assert fp32.name == onnx.VECTORS and int8.name != fp32.name
    assert fp32.path == onnx_path(tmp_path) and int8.path != fp32.path


@pytest.mark.slow
def test_the_int8_model_is_quantised_once_from_the_fp32_export(
    tmp_path: Path, minilm: OnnxEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The quantised copy is made from the fp32 export (no second torch export), once; later
    embedders load the file it wrote. Its vectors stay close to the fp32 ones."""
    assert minilm.precision == "int8" and minilm.path.is_file()
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(onnx_path(minilm.cache_dir), models)  # the fp32 export only

    exported = onnx_path(models).stat().st_mtime_ns
    monkeypatch.setattr(onnx, "_LOADED", {})
    embedder = OnnxEmbedder(models)
    assert embedder.preparing and embedder.prepare() is True
    # (the export runs in a child process: the fp32 file it was made from is the one copied, not
    # exported again with torch)
    assert embedder.path == models / "all-MiniLM-L6-v2.v1.int8.onnx" and embedder.path.is_file()
    assert onnx_path(models).stat().st_mtime_ns == exported
    made = embedder.path.stat().st_mtime_ns
    assert embedder.path.stat().st_size < onnx_path(models).stat().st_size / 3  # 23 MB, not 90
    again = OnnxEmbedder(models)
    assert not again.preparing and again.prepare() is False
    vectors = again.embed(TEXTS)
    assert embedder.path.stat().st_mtime_ns == made  # reused, not quantised again
    assert not [p for p in models.iterdir() if p.name.endswith((".tmp", ".export"))]
    fp32 = OnnxEmbedder(models, precision="fp32").embed(TEXTS)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    cosines = (vectors * fp32).sum(axis=1)
    assert cosines.min() > 0.98, cosines  # per channel (per tensor gave about 0.95)
    assert not np.allclose(vectors, fp32, atol=1e-4)  # another model indeed


@pytest.mark.slow
@pytest.mark.parametrize(("first", "then"), [("fp32", "int8"), ("int8", "fp32")])
def test_a_store_of_one_precision_is_embedded_again_never_compared(
    vdb: str, minilm: OnnxEmbedder, first: str, then: str
) -> None:
    """Vectors of one precision are never searched with the other's query: a retriever of the
    other precision finds every message waiting for its own vectors, embeds them under its own
    name, and the first precision's vectors are kept for a switch back."""
    memory = Memory.from_defaults(session_id="s", db=vdb, memory_blocks=[])
    for text in TEXTS:
        memory.put(Message("user", text))
    store = memory.store
    old = Retriever(store, OnnxEmbedder(minilm.cache_dir, precision=first))
    assert old.index() == len(TEXTS) and old.pending() == 0
    new = Retriever(store, OnnxEmbedder(minilm.cache_dir, precision=then))
    assert new.model != old.model and new.pending() == len(TEXTS)  # nothing of `first` reused
    hits = new.search("a painting of a sunrise", user_id="default", mode="vector", k=1).hits
    assert "sunrise" in hits[0].text and new.pending() == 0
    assert vector_models(store) == sorted([old.model, new.model])
    assert old.pending() == 0  # the first precision's vectors are still there
    store.close()


@pytest.mark.slow
@pytest.mark.parametrize(("first", "then"), [("fp32", "int8"), ("int8", "fp32")])
def test_cli_switching_precision_says_so_and_backfill_embeds_again(
    tmp_path: Path, first: str, then: str
) -> None:
    config = tmp_path / "config.toml"
    env = {"MEMCLI_CONFIG": str(config)}
    config.write_text(f'[search]\nembedding_precision = "{first}"\n')
    chat = write_chat(tmp_path / "chat.jsonl")
    run = memcli("import", chat, "--json", *BUDGET, env=env)
    assert run.code == 0, run.stderr
    run = memcli("search", "cello", "--json", env=env)
    assert run.code == 0 and "cello" in run.records()[0]["text"]
    assert "embedding_precision" not in run.stderr
    info = memcli("info", "--json", env=env).records()[0]
    assert info["embedding_model_name"] == OnnxEmbedder(tmp_path, precision=first).name

    config.write_text(f'[search]\nembedding_precision = "{then}"\n')
    run = memcli("blocks", "backfill", env=env)
    assert run.code == 0, run.stderr
    said = " ".join(run.stderr.split())
    assert f"made by the embedding model at {first}" in said, said
    assert f"embedding_precision is {then}" in said and "embedded again" in said
    assert "vector_memory: 0 batches processed" in said  # only vectors were missing
    assert "messages embedded again" in said
    run = memcli("blocks", "backfill", env=env)
    assert run.code == 0 and "embedded again" not in run.stderr  # once
    run = memcli("search", "which musical instrument do I play", "--json", env=env)
    assert run.code == 0 and "cello" in run.records()[0]["text"]
    assert "embedding_precision" not in run.stderr and "not embedded yet" not in run.stderr

    config.write_text(f'[search]\nembedding_precision = "{first}"\n')  # and back: nothing new
    run = memcli("search", "cello", "--json", env=env)
    assert run.code == 0 and "embedding_precision" not in run.stderr


@pytest.mark.slow
def test_a_search_says_why_it_embeds_again(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    env = {"MEMCLI_CONFIG": str(config)}
    config.write_text('[search]\nembedding_precision = "fp32"\n')
    run = memcli("import", write_chat(tmp_path / "chat.jsonl"), *BUDGET, env=env)
    assert run.code == 0, run.stderr
    assert memcli("search", "cello", env=env).code == 0
    config.write_text("[search]\n")  # the default, int8
    run = memcli("search", "cello", "--json", env=env)
    assert run.code == 0 and "cello" in run.records()[0]["text"]
    said = " ".join(run.stderr.split())
    assert "made by the embedding model at fp32" in said and "memcli blocks backfill" in said
    assert "lexical" not in said
    run = memcli("search", "cello", "--json", env=env)  # embedded by the first: said once
    assert run.code == 0 and "embedding_precision" not in run.stderr

"""Shared fixtures: an isolated home, no provider keys, the loopback LLM server, the real model."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from llm_server import LLMServer  # noqa: E402

# ../shared from the main checkout, ../../shared from a worktree under /work/wt.
SHARED = next(
    (
        p / "shared"
        for p in Path(__file__).resolve().parents
        if (p / "shared" / "conformance").is_dir()
    ),
    Path(__file__).resolve().parents[2] / "shared",
)
CONFORMANCE = SHARED / "conformance"
LOCOMO = SHARED / "data" / "locomo"
PROVIDER_KEYS = (
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "MISTRAL_API_KEY",
    "GROQ_API_KEY",
    "COHERE_API_KEY",
    "TOGETHER_API_KEY",
    "DEEPSEEK_API_KEY",
    "OPENROUTER_API_KEY",
    "AZURE_API_KEY",
)

# Offline everywhere, set before anything imports litellm or huggingface.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"


@pytest.fixture(scope="session")
def onnx_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for the ONNX export of the bundled model, shared by every test home (the
    export takes about 10 s; the first test that needs it makes it)."""
    return tmp_path_factory.mktemp("onnx-models")


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, onnx_models: Path) -> Path:
    """Point MEMCLI_HOME at tmp_path, turn colour off, clear provider keys and MEMCLI_* settings.
    The home's `models` folder is the session's shared ONNX export."""
    for key in list(os.environ):
        if key.startswith("MEMCLI_") or key in PROVIDER_KEYS:
            monkeypatch.delenv(key, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(onnx_models, target_is_directory=True)
    monkeypatch.setenv("MEMCLI_HOME", str(home))
    monkeypatch.setenv("MEMCLI_CONFIG", str(tmp_path / "no-config.toml"))
    monkeypatch.delenv("MEMCLI_CONFIG")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.setenv("NO_COLOR", "1")
    return home


@pytest.fixture(scope="session")
def llm_server() -> Iterator[LLMServer]:
    """The loopback OpenAI-compatible server, started once; reset its script in each test."""
    server = LLMServer().start()
    yield server
    server.stop()


@pytest.fixture
def llm(llm_server: LLMServer) -> Iterator[LLMServer]:
    """The loopback LLM server with an empty script and no recorded requests."""
    llm_server.reset()
    yield llm_server
    llm_server.reset()


@pytest.fixture(scope="session")
def conformance_dir() -> Path:
    return CONFORMANCE


@pytest.fixture(scope="session")
def locomo_dir() -> Path:
    return LOCOMO


@pytest.fixture(scope="session")
def minilm(onnx_models: Path):
    """The bundled all-MiniLM-L6-v2 (ONNX Runtime, the session's shared export), loaded once."""
    from memcli.onnx_embedder import OnnxEmbedder

    embedder = OnnxEmbedder(onnx_models)
    embedder.embed(["warm up"])
    return embedder

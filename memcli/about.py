"""What memcli is running with: version, database, home, config file and where each setting came
from, the model, the blocks, and whether the embedding model is exported. Nothing is loaded."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memcli.credentials import redact_text, redact_url

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from memcli.config import Settings

#: A value that is one URL and nothing else (its password may hold a space).
_ONE_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\n]*")


@dataclass(frozen=True)
class Setting:
    """One resolved setting and where it came from: flag, env, file or default."""

    name: str
    value: Any
    source: str


@dataclass(frozen=True)
class About:
    version: str
    db_path: Path | str  # a SQLite file, or a PostgreSQL URL without its password
    db_bytes: int | None  # None: no database yet (or on PostgreSQL)
    home: Path
    home_source: str
    config_path: Path | None
    config_source: str
    model: str | None
    settings: tuple[Setting, ...]
    blocks: tuple[dict[str, Any], ...]
    blocks_source: str  # "file" ([[blocks]] tables) or "default"
    embedding_model_dir: Path
    embedding_model_exported: bool
    embedding_model_name: str  # the name its vectors are stored under (the precision in it)
    vector_backend: str  # where vectors are searched: pgvector, or FAISS index files (where)
    db_error: str | None = None  # why a PostgreSQL database cannot be opened (None: it can)

    def records(self) -> list[dict[str, Any]]:
        """JSON Lines: one `info` record, then one `setting` and one `block` record each."""
        head = {
            "type": "info",
            "version": self.version,
            "db": self.db_path,
            "db_bytes": self.db_bytes,
            "home": self.home,
            "home_source": self.home_source,
            "config": self.config_path,
            "config_source": self.config_source,
            "model": self.model,
            "blocks_source": self.blocks_source,
            "embedding_model": self.embedding_model_dir,
            "embedding_model_name": self.embedding_model_name,
            "embedding_model_exported": self.embedding_model_exported,
            "vector_backend": self.vector_backend,
        }
        settings = [
            {"type": "setting", "name": s.name, "value": s.value, "source": s.source}
            for s in self.settings
        ]
        blocks = [{"type": "block", **b} for b in self.blocks]
        return [head, *settings, *blocks]


def about(settings: Settings, blocks: Sequence[Any] = ()) -> About:
    """The facts `memcli info` reports, for these settings and the blocks they build. The
    embedding model's state is read from its files: nothing is loaded or exported."""
    from dataclasses import fields

    from memcli import __version__
    from memcli.search.onnx import OnnxEmbedder

    path = settings.db_path if settings.db_url is None else None
    shown = [
        Setting(
            f.name,
            settings.db_label
            if f.name == "db" and path is None
            else _shown(getattr(settings, f.name)),
            settings.sources.get(f.name, "default"),
        )
        for f in fields(settings)
        if f.name not in ("home", "config_path", "blocks", "explicit", "sources")
    ]
    embedder = OnnxEmbedder(settings.home / "models", precision=settings.embedding_precision)
    backend, error = vector_backend(settings)
    return About(
        version=__version__,
        db_path=path or settings.db_label,
        db_bytes=path.stat().st_size if path is not None and path.is_file() else None,
        home=settings.home,
        home_source=settings.sources.get("home", "default"),
        config_path=settings.config_path,
        config_source=settings.sources.get("config", "default"),
        model=settings.model,
        settings=tuple(shown),
        blocks=tuple(
            {
                "name": b.name,
                "kind": type(b).__name__,
                "priority": b.priority,
                "scope": getattr(b, "scope", None),
            }
            for b in blocks
        ),
        blocks_source="file" if settings.blocks is not None else "default",
        embedding_model_dir=embedder.cache_dir,
        embedding_model_exported=embedder.is_exported,
        embedding_model_name=embedder.name,
        vector_backend=backend,
        db_error=error,
    )


def _shown(value: Any) -> Any:
    """A setting's value as `info` shows it: any URL in it without its password or key (the
    database's and the LLM endpoint's alike; a value that is one URL is read whole, a password
    holding a space included)."""
    if not isinstance(value, str):
        return value
    return redact_url(value) if _ONE_URL.fullmatch(value) else redact_text(value)


def vector_backend(settings: Settings) -> tuple[str, str | None]:
    """Where the database's vectors are searched (a PostgreSQL database is asked whether it has
    pgvector; a SQLite file is not opened: its index files are beside it), and why a PostgreSQL
    database cannot be opened (None: it can)."""
    from pathlib import Path

    from memcli.errors import MemcliError
    from memcli.search.dense import describe

    if settings.db_url is None:
        name = Path(f"{settings.db_path}.retrieval.faiss").name
        return f"FAISS index files beside the database ({name}, .npz, .json)", None
    from memcli.store import open_store

    try:
        store = open_store(settings.db_url)
    except MemcliError as exc:  # why: `memcli info` is the check the README says it is
        return "unknown: the database cannot be opened", str(exc)
    try:
        return describe(store, settings.home / "indexes"), None
    finally:
        store.close()

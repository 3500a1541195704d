"""The files of a FAISS index (`search/dense.py`): where they are, whether they are sound
(`index_health`, for `memcli check` and `memcli info`), their removal after a delete for good,
and the durable writing and checksums they share with the delta file (`search/delta.py`)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import memcli.search.delta as deltafile
from memcli.store import index as sql
from memcli.store import vectors as vsql

#: Bumped when the files' layout changes, so that older files are rebuilt.
FORMAT = 6


def index_path(store: Any, index_dir: str | Path | None, suffix: str) -> Path | None:
    """Where an index keeps a file: beside a SQLite database; under `index_dir` for a
    PostgreSQL one; nowhere for an in-memory database (or a PostgreSQL one without
    `index_dir`)."""
    if store.dialect == "postgresql":
        from memcli.store.pg_index import database_key

        if index_dir is None:
            return None
        return Path(index_dir) / database_key(store) / f"retrieval.{suffix}"
    db = getattr(store, "path", None)
    return None if db is None else Path(f"{db}.retrieval.{suffix}")


def index_health(store: Any, index_dir: str | Path | None = None) -> tuple[str, str, Path] | None:
    """What is wrong with a database's index files, without loading them: ("damaged", why,
    path) when they cannot be used as they are (incomplete, unreadable, a checksum that does
    not match: the next search rebuilds them from the database), ("stale", why, path) when
    vectors were deleted since they were written, or added since an IVF index and its delta
    were (the next search brings them up to date; a flat index reads the rows added since its
    files from the database, as it reads its vectors); None when they are sound, or there are
    none (pgvector, in memory only)."""
    if sql.has_pgvector(store):
        return None
    path, arrays, meta, delta = (
        index_path(store, index_dir, s) for s in ("faiss", "npz", "json", "delta")
    )
    if path is None or arrays is None or meta is None or delta is None:
        return None
    if not meta.exists():
        if path.exists() or arrays.exists() or delta.exists():
            return "damaged", "incomplete (no description: a write was interrupted)", arrays
        return None
    try:
        info = json.loads(meta.read_text())
        if info.get("format") != FORMAT:
            return "stale", f"an older format ({info.get('format')}, now {FORMAT})", arrays
        if file_crc(arrays) != info["crc_npz"]:
            return "damaged", f"{arrays.name} does not match its checksum", arrays
        if info.get("ivf") and not path.exists():
            return "damaged", f"{path.name} is missing", path
        blocks, problem = deltafile.read(delta)
        if problem is not None:
            return "damaged", f"{delta.name}: {problem}", delta
        state = (int(info["added"]), int(info["max_id"]))
        kept = deltafile.chain(blocks, str(info["generation"]), state)
        written = kept[-1].after[0] if kept else state[0]
        added, deleted = vsql.vector_stats(store, str(info["model"]))
        if not info.get("ivf"):
            written = added  # (the rows added since are read from the database)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return "damaged", f"unreadable ({exc})", path
    if (added, deleted) != (written, info["deleted"]):
        behind = f"{added - written} vectors added, {deleted - info['deleted']} deleted"
        return "stale", f"{behind} since it was written", path
    return None


def crc(data: Any) -> int:
    import zlib

    return zlib.crc32(data)


def file_crc(path: Path) -> int:
    import zlib

    crc = 0
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


def write_file(path: Path, data: Any) -> None:
    """Replace a file durably: a temporary file written and flushed to disk, renamed over it, and
    the rename flushed to disk (the directory)."""
    # Its own name per process and thread: two stores of one process may write the same index.
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    deltafile.sync_folder(path.parent)


def remove_index_files(store: Any, index_dir: str | Path | None = None) -> None:
    """Remove the index files of `store`'s database (beside a SQLite file; under `index_dir`
    for a PostgreSQL one), after a delete for good: they hold the deleted messages' vectors and
    session and user names. The next search rebuilds them from the database."""
    faiss_file = index_path(store, index_dir, "faiss")
    if faiss_file is None:
        return
    prefix = faiss_file.name.removesuffix("faiss")  # `<db>.retrieval.` or `retrieval.`
    if faiss_file.parent.is_dir():
        for path in faiss_file.parent.glob(prefix + "*"):
            path.unlink(missing_ok=True)


def finish_deletes(
    store: Any, index_dir: str | Path | None = None, *, deleted: bool = False
) -> int:
    """Finish the deletes for good whose cleanup did not run (the process was stopped between a
    delete's commit and its cleanup: `memcli.store.forget`): purge the database's files, remove
    the index files (they may hold the deleted messages' vectors); return how many there were.
    `deleted`: called right after a delete (purged already): remove the index files whether or
    not one is recorded. Inside a write transaction (a purge cannot run there) or on a read-only
    database, nothing is done."""
    from memcli.store import forget

    if store.transaction_depth or store.read_only:
        return 0
    pending = forget.unfinished_deletes(store)
    if not pending and not deleted:
        return 0
    if pending and not deleted:
        store.purge()
    remove_index_files(store, index_dir)
    if pending:
        with store.transaction():
            forget.clear_unfinished(store, pending[-1])
    return len(pending)

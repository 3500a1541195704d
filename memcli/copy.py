"""Copying everything a database holds into another, between backends or on one: `copy_store`
(what `memcli copy SRC DST` runs).

The source is read in one snapshot (other processes may go on writing to it); the destination,
new or empty, is written in one transaction: all of it or nothing. Before that transaction
commits, the copy is verified: each table's row count, and a digest of every session's export
(the lines `memcli export --all` writes), compared between the two; a difference rolls it back.
Which tables go and how: `memcli.store.copy`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from contextlib import AbstractContextManager, closing, nullcontext
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any

from memcli.errors import StoreError, UsageError
from memcli.messages import session_name
from memcli.store import copy as tables
from memcli.store.base import Store, is_postgres_url

#: `progress(done, total)`: rows written so far, of all the rows the copy moves.
Progress = Callable[[int, int], None]

#: The tables a summary names, with their nouns (singular, plural).
_NOUNS = {
    "sessions": ("session", "sessions"),
    "messages": ("message", "messages"),
    "flushes": ("flush", "flushes"),
    "facts": ("fact", "facts"),
    "fact_history": ("fact history entry", "fact history entries"),
    "block_state": ("block state", "block states"),
    "block_flushes": ("processed batch", "processed batches"),
    "retrieval_vectors": ("vector", "vectors"),
}


@dataclass(frozen=True)
class CopyResult:
    """What a copy moved: rows per table, in the order copied; the databases as messages name
    them (passwords hidden)."""

    source: str
    destination: str
    counts: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        """ "2 sessions, 1,200 messages, 40 flushes, ..." (the tables people know)."""
        parts = []
        for name, (one, many) in _NOUNS.items():
            n = self.counts.get(name, 0)
            parts.append(f"{n:,} {one if n == 1 else many}")
        return ", ".join(parts)

    def record(self) -> dict[str, Any]:
        return {
            "type": "copy",
            "source": self.source,
            "destination": self.destination,
            "counts": dict(self.counts),
        }


def copy_store(
    src: str | Path | Store, dst: str | Path | Store, progress: Progress | None = None
) -> CopyResult:
    """Copy every session, message, flush, block state, fact (with its history and topics) and
    stored vector of `src` into `dst` (each a SQLite file's path, a `postgresql://` URL, or an
    open store), with their ids; then verify the copy and commit it.

    `dst` must be new or hold no data (UsageError otherwise); it is migrated to the latest schema
    first. `src` is opened as every command opens a database (a writable one at an older schema
    is migrated); a read-only one is read. StoreError, and nothing written to `dst`, for a table
    of `src` this memcli does not know, or a copy that does not verify; a SQLite file `dst` that
    the failed copy made is removed (with the directories made for it)."""
    if isinstance(src, str | PathLike) and isinstance(dst, str | PathLike) and _same(src, dst):
        raise UsageError("SRC and DST are the same database", "Copy into another one")
    source = _open(src, must_exist=True)
    try:
        with _removed_on_failure(dst):
            destination = _open(dst, must_exist=False)
            try:
                return _copy(source, destination, progress)
            finally:
                if destination is not dst:
                    destination.close()
    finally:
        if source is not src:
            source.close()


def _same(src: str | Path, dst: str | Path) -> bool:
    if is_postgres_url(src) or is_postgres_url(dst):
        return str(src) == str(dst)
    return Path(src).expanduser().resolve() == Path(dst).expanduser().resolve()


def _removed_on_failure(db: str | Path | Store) -> AbstractContextManager[None]:
    """A SQLite file the copy makes (and the directories made for it) goes if the copy fails."""
    if not isinstance(db, str | PathLike) or is_postgres_url(db):
        return nullcontext()
    from memcli.store.sqlite import removed_on_failure

    return removed_on_failure(db)


def _open(db: str | Path | Store, must_exist: bool) -> Any:
    from memcli.store import open_store

    if not isinstance(db, str | PathLike):
        return db  # an open store
    if not is_postgres_url(db):
        db = Path(db).expanduser()
        if must_exist and not db.exists():
            raise StoreError(f"no database at {db}", "Check the path of SRC")
    return open_store(db)


def _copy(src: Any, dst: Any, progress: Progress | None) -> CopyResult:
    with tables.snapshot(src):
        steps = tables.plan(src, dst)
        counts = {step.table.name: tables.count_rows(src, step.table) for step in steps}
        mark = tables.highest_message_id(src)
        total = sum(counts.values())
        with dst.transaction():
            tables.claim(dst)
            present = tables.rows_present(dst)
            if present:
                held = ", ".join(
                    f"{n:,} {'row' if n == 1 else 'rows'} in {name}" for name, n in present.items()
                )
                raise UsageError(
                    f"the destination {dst.where} is not empty ({held})",
                    "Copy into a new or empty database; a copy never mixes into existing data",
                )
            done = 0
            if progress is not None:
                progress(done, total)
            for step in steps:
                batches = tables.stream_rows(src, step)
                with closing(batches), tables.writer(dst, step) as write:
                    for rows in batches:
                        if step.table.adapt is not None:
                            rows = step.table.adapt(src, dst, step.columns, rows)
                        write(rows)
                        done += len(rows)
                        if progress is not None:
                            progress(done, total)
            tables.settle(dst, mark)
            _verify(src, dst, steps, counts)
    return CopyResult(src.where, dst.where, counts)


def _verify(src: Any, dst: Any, steps: list[tables.Step], counts: dict[str, int]) -> None:
    """Row counts, and every session's export, equal in both (inside the copy's transaction);
    StoreError naming what differs otherwise (the transaction then rolls back)."""
    differences = []
    for step in steps:
        copied = tables.count_rows(dst, step.table)
        if copied != counts[step.table.name]:
            differences.append(
                f"{step.table.name}: {counts[step.table.name]:,} rows in the source,"
                f" {copied:,} in the destination"
            )
    theirs, ours = export_digests(src), export_digests(dst)
    for session in sorted(theirs.keys() | ours.keys()):
        if theirs.get(session) != ours.get(session):
            differences.append(f"session {session_name(session)!r} exports differently")
    if differences:
        shown = "; ".join(differences[:10])
        more = f" (and {len(differences) - 10} more)" if len(differences) > 10 else ""
        raise StoreError(
            f"the copy in {dst.where} differs from {src.where}: {shown}{more}; nothing was"
            " written to the destination",
            "Run `memcli check` on the source; report it as a bug if it finds nothing",
        )


def export_digests(store: Any) -> dict[str, str]:
    """Per session, the SHA-256 of what `memcli export SESSION --all` writes for it."""
    from memcli.messages import to_json_line
    from memcli.transcripts import SessionRecord, export_lines

    digests = {}
    for info in store.list_sessions():
        digest = hashlib.sha256()
        digest.update(to_json_line(SessionRecord.of(info).to_dict()).encode() + b"\n")
        for record in export_lines(store.iter_messages(info.id), with_status=True):
            digest.update(to_json_line(record).encode() + b"\n")
        digests[info.id] = digest.hexdigest()
    return digests

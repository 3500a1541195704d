"""`memcli copy SRC DST`: everything a database holds, into a new or empty one (either backend)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from memcli.cli import common, output

if TYPE_CHECKING:
    from pathlib import Path

    from memcli.copy import CopyResult


def copy_command(
    src: Annotated[
        str, typer.Argument(metavar="SRC", help="A SQLite file or a postgresql:// URL.")
    ],
    dst: Annotated[
        str,
        typer.Argument(metavar="DST", help="A new or empty SQLite file or PostgreSQL database."),
    ],
    json_: common.Json = False,
) -> None:
    """Copy every session, message, flush, block state, fact (with its history and topics) and
    stored vector from SRC to DST, keeping their ids, in one transaction: all of it or nothing.

    DST must be new or empty (exit 2 otherwise); it is brought to the latest schema first. SRC
    is read in one snapshot while other processes go on using it. Before the copy is committed,
    each table's row count and every session's export are compared between the two; a
    difference rolls it back (exit 1). The full-text index is rebuilt by DST itself; vectors are
    copied, not computed again. With --json (or in a pipe), the counts as one record on stdout.

    Example: memcli copy ~/.local/share/memcli/memcli.db postgresql://me@dbhost/memcli
    """
    result = copy_with_progress(src, dst, "Copying")
    output.info(f"Copied {result.summary()} from {result.source} to {result.destination}.")
    later = _pgvector_fill(dst, str(result.destination))
    if later:
        output.info(later)
    if output.wants_json(json_):
        output.emit_all([result.record()])


def copy_with_progress(src: str | Path, dst: str | Path, label: str) -> CopyResult:
    """`copy_store`, with a progress bar on stderr (on a terminal)."""
    from memcli.copy import copy_store

    with output.progress(label) as bar:
        shown = 0

        def advance(done: int, total: int) -> None:
            nonlocal shown
            bar.total(total)
            bar.advance(done - shown)
            shown = done

        return copy_store(src, dst, progress=advance)


def _pgvector_fill(dst: str, shown: str) -> str | None:
    """What the first search of a PostgreSQL destination with pgvector does first, when that
    takes a second or more: add the copied vectors to pgvector's index (the copy moves their
    bytes; `memcli.store.pg_index.fill_embeddings`). A small user's or a session's search
    compares its own from their bytes and leaves that to the store's."""
    from memcli.search.retriever import ANNOUNCE_SECONDS
    from memcli.store import is_postgres_url, open_store
    from memcli.words import duration

    if not is_postgres_url(dst):
        return None
    from memcli.store import pg_index

    store = open_store(dst)
    try:
        count = pg_index.unfilled(store) if pg_index.has_pgvector(store) else 0
    finally:
        store.close()
    seconds = count / pg_index.FILL_RATE
    if seconds < ANNOUNCE_SECONDS:
        return None
    return (
        f"The first search of the store (or of a big user) adds the {count:,} copied vectors"
        f" to pgvector's index (about"
        f" {duration(seconds)}); a search now does it before it is needed: memcli --db"
        f" '{shown}' search hello"
    )

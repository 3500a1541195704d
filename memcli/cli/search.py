"""`memcli search QUERY`: search long-term (vector) memory."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from memcli.cli import common, output


def search_command(
    ctx: typer.Context,
    query: Annotated[str, typer.Argument(help="What to look for.")],
    user: common.User = None,
    session: Annotated[
        str | None, typer.Option("--session", help="Only this session's memory.")
    ] = None,
    k: Annotated[int, typer.Option("-k", "--top", help="How many batches to return.", min=1)] = 5,
    block: Annotated[
        str | None, typer.Option("--block", help="The vector block (default: the first one).")
    ] = None,
    json_: common.Json = False,
) -> None:
    """Search the flushed batches of a user (or of one session) by meaning; best first.

    Example: memcli search "where does Ana live" -k 3
    """
    from memcli.embeddings import SentenceTransformerEmbedder
    from memcli.vectors import search

    s = common.settings(ctx, user=user)
    store = common.open_store(s, must_exist=True)
    name = block or _vector_block_name(s)
    if session is not None:
        common.require_session(store, session)
    user_filter = s.user if (session is None or user is not None) else None
    hits = search(
        store,
        SentenceTransformerEmbedder(),
        query,
        user_id=user_filter,
        session_id=session,
        k=k,
        block=name,
    )
    records: list[dict[str, Any]] = [
        {
            "type": "hit",
            "rank": rank,
            "score": round(hit.score, 4),
            "text": hit.text,
            "session": hit.session_id,
            "message_ids": hit.message_ids,
        }
        for rank, hit in enumerate(hits, start=1)
    ]
    if not hits:
        output.info("No matches.")
    if output.wants_json(json_):
        output.emit_all(records)
        return
    output.table(
        None,
        ["rank", "score", "session", "messages", "text"],
        [(r["rank"], r["score"], r["session"], _ids(r["message_ids"]), r["text"]) for r in records],
    )


def _ids(ids: list[int]) -> str:
    if not ids:
        return ""
    return f"{ids[0]}-{ids[-1]}" if len(ids) > 1 else str(ids[0])


def _vector_block_name(s: Any) -> str:
    """The name of the first configured vector block ("vector_memory" by default)."""
    for table in s.blocks or ():
        if table.get("kind") == "vector":
            return str(table.get("name", "vector_memory"))
    return "vector_memory"

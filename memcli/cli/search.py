"""`memcli search QUERY`: hybrid search (BM25 and vectors, fused) over everything stored for a
user (or one session), short-term and long-term alike."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from memcli.cli import common, output
from memcli.words import shell_arg

if TYPE_CHECKING:
    from datetime import datetime


def search_command(
    ctx: typer.Context,
    query: Annotated[
        str | None,
        typer.Argument(
            help="What to look for (or give --queries).", show_default=False, metavar="[QUERY]"
        ),
    ] = None,
    user: common.User = None,
    session: Annotated[
        str | None,
        typer.Option(
            "--session",
            metavar="SESSION",
            help="Only this session's messages.",
            callback=lambda value: common.session_name(value),
        ),
    ] = None,
    k: Annotated[
        int, typer.Option("-k", "--top", metavar="N", help="How many hits to return.", min=1)
    ] = 5,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            metavar="TIME",
            help="Only messages at or after this time (ISO 8601, UTC if bare).",
        ),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option("--until", metavar="TIME", help="Only messages before this time (ISO 8601)."),
    ] = None,
    explain: Annotated[
        bool, typer.Option("--explain", help="Show each hit's BM25 and vector ranks and scores.")
    ] = False,
    queries: Annotated[
        str | None,
        typer.Option(
            "--queries",
            metavar="FILE",
            help='A file of {"query": ...} lines (optional user, session, k); - for stdin.',
        ),
    ] = None,
    mode: Annotated[
        str,
        typer.Option(
            "--mode",
            metavar="[hybrid|lexical|vector]",
            autocompletion=common.choices("memcli.search.types", "MODES"),
            help="hybrid (words and meaning), lexical (BM25 only) or vector (dense only).",
        ),
    ] = "hybrid",
    json_: common.Json = False,
) -> None:
    """Search every stored message by words and by meaning; best first.

    Examples: memcli search "where does Ana live" -k 3 --since 2024-01-01;
    memcli search --queries questions.jsonl --json
    """
    from memcli.errors import UsageError
    from memcli.search.queries import QueryLine, parse_queries, search_lines
    from memcli.transcripts import read_source

    if (query is None) == (queries is None):
        raise UsageError("give a QUERY or --queries FILE, not both or neither", "See --help")
    s = common.settings(ctx, user=user)
    window = (_time("--since", since), _time("--until", until))
    lines = [QueryLine(0, query or "")]
    if queries is not None:  # the whole file is read and checked before anything is searched
        lines = parse_queries(*read_source(queries))
    store = common.open_store(s, must_exist=True)
    retriever = common.retriever(s, store, announce=True)
    if mode != "lexical":  # said before the search embeds them again (which takes a while)
        from memcli.store.index import Scope

        note = common.precision_note(store, retriever, Scope(user_id=user or s.user))
        if note is not None:
            output.info(f"{note} `memcli blocks backfill` embeds them all at once.")
    found = search_lines(
        retriever,
        lines,
        default_user=s.user,
        user=user,
        session_id=session,
        k=k,
        since=window[0],
        until=window[1],
        mode=mode,
        source=None if queries is None else ("<stdin>" if queries == "-" else queries),
    )
    records = [
        {**hit.to_dict(explain=explain), **({"query_index": i} if queries is not None else {})}
        for i, hit in found.hits
    ]
    if found.pending:
        output.info(
            f"{output.plural(found.pending, 'message')} {'is' if found.pending == 1 else 'are'}"
            " not embedded yet: found by their words only."
            " `memcli blocks backfill` embeds them."
        )
    for at, w in found.windows.items() if explain else ():
        output.info(
            f"{'' if queries is None else f'query {at}: '}{w.text!r}: also searched from"
            f" {w.since.isoformat()} to {w.until.isoformat()}"
        )
    if not records:
        output.info(_no_matches(retriever, query, session, s.user))
    if output.wants_json(json_):
        output.emit_all(records)
    else:
        _table(
            records,
            {line.index: line.query for line in lines} if queries is not None else None,
            explain,
        )


def _table(records: list[dict[str, Any]], texts: dict[int, str] | None, explain: bool) -> None:
    """The hits; with --queries, each row starts with its query's text."""
    by_query = texts is not None
    columns = ["rank", "score", "session", "time", "text"]
    if by_query:
        columns.insert(0, "query")
    if explain:
        columns[-1:-1] = ["bm25", "vector"]
    rows = []
    for r in records:
        row: list[Any] = [r["rank"], r["score"], r["session"], (r["first_time"] or "")[:16]]
        if by_query:
            row.insert(0, output.preview(texts[r["query_index"]], 40) if texts else "")
        if explain:
            row += [
                _explain(r["lexical_rank"], r["lexical_score"]),
                _explain(r["vector_rank"], r["vector_score"]),
            ]
        rows.append([*row, r["text"]])
    output.table(None, columns, rows)


def _no_matches(retriever: Any, query: str | None, session: str | None, user: str) -> str:
    """No matches, and for one query of a user (no --session) that found nothing, the users
    whose messages match and the --user to use (as `sessions --user` names the users)."""
    from memcli.search.queries import users_with_matches

    if query is None or session is not None:
        return "No matches."
    others = [u for u in users_with_matches(retriever, query) if u != user]
    if not others:
        return "No matches."
    return (
        f"No matches for user {shell_arg(user)}. Users with matches:"
        f" {', '.join(map(shell_arg, others))}."
        f" Use --user {shell_arg(others[0])}."
    )


def _time(flag: str, value: str | None) -> datetime | None:
    from memcli.errors import InputError, UsageError
    from memcli.messages import parse_time

    if value is None:
        return None
    try:
        return parse_time(value)
    except InputError:
        raise UsageError(
            f"{flag}: invalid time {value!r}", "Use ISO 8601, e.g. 2023-05-08 or 2023-05-08T13:56Z"
        ) from None


def _explain(rank: int | None, score: float | None) -> str:
    return "-" if rank is None else f"#{rank} {score}"

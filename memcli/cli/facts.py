"""`memcli facts`: list, add, edit, remove facts and see their history; retry pending extraction."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from memcli.cli import common, output

app = typer.Typer(
    help="The facts long-term memory holds about a user: list, search, add, edit, rm, history,"
    " restore, extract.",
    invoke_without_command=True,
    rich_markup_mode=None,
)

Session = Annotated[
    str | None,
    typer.Option(
        "--session",
        metavar="SESSION",
        help="The facts of a session-scoped block (default: the user's).",
    ),
]
Block = Annotated[
    str | None,
    typer.Option("--block", metavar="NAME", help="The fact block (default: the first configured)."),
]
Topics = Annotated[
    list[str] | None,
    typer.Option(
        "--topic",
        metavar="TOPIC",
        help="A topic of the fact (repeatable; lowercased, commas separate topics).",
    ),
]


def _scope(
    ctx: typer.Context, user: str | None, session: str | None, *, create: bool = False
) -> tuple[Any, Any, str]:
    """Settings, store and scope key; a database that is not there is made only with `create`."""
    s = common.settings(ctx, user=user)
    store = common.open_store(s, must_exist=not create)
    if session is not None:
        common.require_session(store, session)
        return s, store, f"session:{session}"
    return s, store, f"user:{s.user}"


def _block_name(s: Any, store: Any, block: str | None, session: str | None) -> str:
    """The named block, else the first fact block of those the session (or user) uses; a named
    block that is not one of them is refused (UsageError, exit 2), as the memory tools refuse it."""
    from memcli.tools import fact_block_name

    blocks = common.make_blocks(s, store, session=session, warn=False)
    return fact_block_name(blocks, block, strict=True)


def _fact_record(f: Any) -> dict[str, Any]:
    from memcli.tools import fact_record

    return {"type": "fact", **fact_record(f)}


def _show(facts: list[Any], json_: bool, scores: list[float] | None = None) -> None:
    records = [_fact_record(f) for f in facts]
    if scores is not None:
        records = [
            {**r, "score": round(score, 6)} for r, score in zip(records, scores, strict=True)
        ]
    if output.wants_json(json_):
        output.emit_all(records)
        return
    output.table(
        None,
        ["id", "block", "fact", "state", "topics", "entities", "origin", "session", "updated"],
        [
            (
                f.id,
                f.block,
                f.text,
                _state(r),
                ", ".join(f.topics),
                ", ".join(f.entities),
                f.origin,
                f.session_id,
                f.updated_at.astimezone(),
            )
            for f, r in zip(facts, records, strict=True)
        ],
    )


def _state(record: dict[str, Any]) -> str:
    """A fact's state as the table shows it: with the fact that superseded it, or its expiry."""
    state = str(record["state"])
    if record["superseded_by"] is not None and state == "superseded":
        return f"superseded by {record['superseded_by']}"
    if record["expires_at"] is not None:
        return f"{state} (expires {record['expires_at']})"
    return state


BlockFilter = Annotated[
    str | None, typer.Option("--block", metavar="NAME", help="Only this block's facts.")
]
TopicFilter = Annotated[
    str | None, typer.Option("--topic", metavar="TOPIC", help="Only the facts of this topic.")
]


EntityFilter = Annotated[
    str | None,
    typer.Option("--entity", metavar="NAME", help="Only the facts about this entity."),
]


@app.callback()
def facts_command(
    ctx: typer.Context,
    user: common.User = None,
    session: Session = None,
    block: BlockFilter = None,
    topic: TopicFilter = None,
    entity: EntityFilter = None,
    everything: Annotated[
        bool,
        typer.Option(
            "--all", help="Also the superseded, retired, expired and deleted facts, with state."
        ),
    ] = False,
    query: Annotated[
        str | None,
        typer.Option(
            "--query",
            metavar="TEXT",
            help="Rank the current facts by meaning and words for TEXT, best first.",
        ),
    ] = None,
    k: Annotated[
        int,
        typer.Option(
            "-k", metavar="N", min=1, max=100, help="With --query: how many facts at most."
        ),
    ] = 10,
    mode: Annotated[
        str,
        typer.Option(
            "--mode",
            metavar="MODE",
            help="With --query: hybrid (words and meaning), lexical (no model) or vector.",
        ),
    ] = "hybrid",
    json_: common.Json = False,
) -> None:
    """List the current facts of a user (or of a session-scoped block), oldest first; with
    --all every version, each with its state; with --query the facts best matching TEXT.

    Examples: memcli facts --user alice; memcli facts --topic food --json;
    memcli facts --query "where does she live"; memcli facts --entity Bern --all
    """
    if ctx.invoked_subcommand is not None:
        return
    from memcli.store import longterm

    s, store, key = _scope(ctx, user, session)
    if query is not None:
        _search(s, store, key, query, k, mode, block, entity, json_)
        return
    facts = longterm.list_facts(
        store, block, key, topic=topic, everything=everything, entity=entity
    )
    if not facts:
        output.info("No facts.")
    _show(facts, json_)


def _search(
    s: Any,
    store: Any,
    key: str,
    query: str,
    k: int,
    mode: str,
    block: str | None,
    entity: str | None,
    json_: bool,
) -> None:
    """`facts --query`: the current facts ranked for the query, best first, with their scores."""
    from memcli.errors import UsageError
    from memcli.search.facts import FactVectors, search_facts
    from memcli.tools import SEARCH_MODES

    if not query.split():
        raise UsageError("the query is empty", "Give the words to look for")
    if mode not in SEARCH_MODES:
        raise UsageError(f"unknown search mode {mode!r}", f"Use one of: {', '.join(SEARCH_MODES)}")
    vectors = FactVectors(common.embedder(s)) if mode != "lexical" else None
    found = search_facts(store, key, query, k, vectors, mode, block=block, entity=entity)
    if not found:
        output.info("No matches.")
    _show([f for f, _ in found], json_, [score for _, score in found])


@app.command("restore")
def restore_command(
    ctx: typer.Context,
    fact_id: Annotated[
        int, typer.Argument(help="The id of an older version (see `facts --all`).", metavar="ID")
    ],
    user: common.User = None,
    json_: common.Json = False,
) -> None:
    """Make a superseded, retired, expired or deleted fact current again (a new change in its
    history); the fact that superseded it is superseded by it in turn. With --user, only that
    user's.

    Example: memcli facts restore 12
    """
    from memcli.store import longterm
    from memcli.tools import fact_owner

    s = common.settings(ctx, user=user)
    store = common.open_store(s, must_exist=True)
    fact = longterm.get_fact(store, fact_id)
    user_given = s.sources.get("user", "default") != "default"
    if fact is None or (user_given and fact_owner(store, fact) != s.user):
        raise _not_found(fact_id)
    restored, displaced = longterm.restore_fact(store, fact_id, origin="manual")
    note = "".join(f"; fact {f.id} is superseded by it" for f in displaced)
    output.info(f"Restored fact {fact_id}{note}.")
    _show([restored, *displaced], json_)


def entities_command(
    ctx: typer.Context,
    user: common.User = None,
    session: Session = None,
    block: BlockFilter = None,
    json_: common.Json = False,
) -> None:
    """The entities (people, places, organisations, things) a user's current facts name, each
    with its number of facts, most first. `memcli facts --entity NAME` lists one's facts.

    Example: memcli entities --user ana
    """
    from memcli.store import longterm

    _, store, key = _scope(ctx, user, session)
    counts = longterm.entity_counts(store, key, block)
    if not counts:
        output.info("No entities.")
    if output.wants_json(json_):
        output.emit_all({"type": "entity", "entity": n, "facts": c} for n, c in counts)
        return
    output.table(None, ["entity", "facts"], counts)


@app.command("add")
def add_command(
    ctx: typer.Context,
    text: Annotated[str, typer.Argument(help="The fact.", metavar="TEXT")],
    user: common.User = None,
    session: Session = None,
    block: Block = None,
    topic: Topics = None,
    entity: Annotated[
        list[str] | None,
        typer.Option("--entity", metavar="NAME", help="An entity the fact is about (repeatable)."),
    ] = None,
    expires: Annotated[
        str | None,
        typer.Option(
            "--expires",
            metavar="DATE",
            help="When the fact stops holding: a date (midnight UTC) or an ISO 8601 time.",
        ),
    ] = None,
    json_: common.Json = False,
) -> None:
    """Add a fact by hand (a duplicate of a current fact, ignoring case and spaces, is not
    added). An expired fact leaves the context and the list (`facts --all` shows it).

    Example: memcli facts add "Ana is in Rome" --user ana --topic travel --entity Rome
    --expires 2026-12-01
    """
    from memcli.store import longterm
    from memcli.tools import check_fact_text, parse_expiry

    check_fact_text(text, "Give the fact's text", topic)
    expires_at = parse_expiry(expires) if expires is not None else None
    s, store, key = _scope(ctx, user, session, create=True)
    added = longterm.add_facts(
        store,
        _block_name(s, store, block, session),
        key,
        [text],
        origin="manual",
        topics=[topic or []],
        entities=[entity or []],
        expires_at=expires_at,
    )
    if not added:
        output.info("Already known; nothing added.")
        return
    output.info(f"Added fact {added[0].id}.")
    _show(added, json_)


@app.command("search")
def search_command(
    ctx: typer.Context,
    query: Annotated[
        str, typer.Argument(help="The words every fact found holds.", metavar="QUERY")
    ],
    user: common.User = None,
    session: Session = None,
    block: BlockFilter = None,
    topic: TopicFilter = None,
    json_: common.Json = False,
) -> None:
    """The facts whose text holds every word of QUERY (ignoring case), oldest first; with
    --topic, only that topic's. (`memcli search` searches the messages.)

    Example: memcli facts search "tea" --topic food
    """
    from memcli.errors import UsageError
    from memcli.store import longterm

    if not query.split():
        raise UsageError("the query is empty", "Give the words to look for")
    _, store, key = _scope(ctx, user, session)
    facts = longterm.find_facts(store, block, key, query, topic=topic)
    if not facts:
        output.info("No matches.")
    _show(facts, json_)


def _not_found(fact_id: int) -> Exception:
    from memcli.errors import MemcliError

    return MemcliError(f"no fact {fact_id}", _LIST_HINT)  # exit 1, as for an unknown session


_LIST_HINT = "Run `memcli facts` to see the facts and their ids"


def _live(s: Any, store: Any, fact_id: int) -> Any:
    """The fact, not deleted; with --user (or MEMCLI_USER), only one of that user's."""
    from memcli.tools import live_fact

    user = s.user if s.sources.get("user", "default") != "default" else None
    return live_fact(store, fact_id, user, _LIST_HINT)


@app.command("edit")
def edit_command(
    ctx: typer.Context,
    fact_id: Annotated[
        int, typer.Argument(help="The fact's id (see `memcli facts`).", metavar="ID")
    ],
    text: Annotated[str, typer.Argument(help="Its new text.", metavar="TEXT")],
    user: common.User = None,
    topic: Annotated[
        list[str] | None,
        typer.Option(
            "--topic",
            metavar="TOPIC",
            help="Replace the fact's topics with these (repeatable; default: keep them).",
        ),
    ] = None,
    json_: common.Json = False,
) -> None:
    """Change a fact's text (and with --topic its topics); the old text stays in its history.
    With --user, only that user's.

    Example: memcli facts edit 12 "Ana lives in Lisbon" --topic home
    """
    from memcli.store import longterm
    from memcli.tools import check_fact_text

    check_fact_text(text, "Give the new text, or use `memcli facts rm`", topic)
    s = common.settings(ctx, user=user)
    store = common.open_store(s, must_exist=True)
    _live(s, store, fact_id)
    changed = longterm.edit_fact(store, fact_id, text, topics=topic, origin="manual")
    assert changed is not None
    output.info(f"Edited fact {fact_id}.")
    _show([changed[1]], json_)


@app.command("rm")
def rm_command(
    ctx: typer.Context,
    fact_ids: Annotated[
        list[int], typer.Argument(help="The ids of the facts to remove.", metavar="ID...")
    ],
    user: common.User = None,
    json_: common.Json = False,
) -> None:
    """Remove facts (kept in the history as deleted). With --user, only that user's.

    Example: memcli facts rm 12 13
    """
    from memcli.store import longterm

    s = common.settings(ctx, user=user)
    store = common.open_store(s, must_exist=True)
    removed = []
    with store.transaction():
        for fact_id in dict.fromkeys(fact_ids):
            _live(s, store, fact_id)
            removed.append(longterm.delete_fact(store, fact_id, origin="manual"))
    output.info(f"Removed {output.plural(len(removed), 'fact')}.")
    if output.wants_json(json_):  # each fact as it is now: deleted
        output.emit_all([{**_fact_record(f), "type": "removed"} for f in removed])


@app.command("history")
def history_command(
    ctx: typer.Context,
    fact_id: Annotated[
        int | None, typer.Argument(help="One fact's history (default: all).", metavar="[ID]")
    ] = None,
    user: common.User = None,
    session: Session = None,
    json_: common.Json = False,
) -> None:
    """Every change to the facts: added, condensed, edited, superseded, retired, restored,
    deleted, oldest first, each with its reason and origin: extracted (fact extraction),
    condensed, manual (`memcli facts`), mcp (`memcli mcp`), chat-tool (the model in `memcli chat
    --memory-tools`), api (a Python caller). For one fact, the changes of all its versions (the
    facts it superseded and that superseded it).

    Example: memcli facts history 12
    """
    from memcli.store import longterm
    from memcli.tools import change_record

    _, store, key = _scope(ctx, user, session)
    ids = None
    if fact_id is not None:
        fact = longterm.get_fact(store, fact_id)
        if fact is None:
            raise _not_found(fact_id)
        key = fact.scope_key
        ids = [f.id for f in longterm.fact_chain(store, fact_id)]
    changes = longterm.fact_history(store, key, fact_ids=ids)
    if output.wants_json(json_):
        output.emit_all({"type": "change", **change_record(c)} for c in changes)
        return
    output.table(
        None,
        ["id", "fact", "action", "origin", "text", "topics", "before", "reason", "when"],
        [
            (
                c.id,
                c.fact_id,
                c.action,
                c.origin,
                c.text,
                _topics_change(c.topics, c.old_topics),
                c.old_text,
                c.reason,
                c.at.astimezone(),
            )
            for c in changes
        ],
    )


def _topics_change(topics: list[str] | None, old: list[str] | None) -> str:
    """A change's topics as the table shows them: the topics after it, or `old -> new` when it
    changed them; empty when none were recorded."""
    after = ", ".join(topics) if topics is not None else ""
    if old is None or topics is None or old == topics:
        return after if topics is not None else ", ".join(old or [])
    return f"{', '.join(old) or '(none)'} -> {after or '(none)'}"


@app.command("extract")
def extract_command(
    ctx: typer.Context,
    pending: Annotated[
        bool,
        typer.Option("--pending", help="Only retry batches whose extraction failed before."),
    ] = False,
    user: common.User = None,
    json_: common.Json = False,
) -> None:
    """Run fact extraction on the user's batches that no fact block has processed, or with
    --pending only on those whose extraction failed (the LLM was down or answered badly).

    Example: memcli facts extract --pending
    """
    from memcli.blocks.facts import FactBlock, extract_pending
    from memcli.blocks.feed import backfill
    from memcli.errors import UsageError

    s = common.settings(ctx, user=user)
    store = common.open_store(s, must_exist=True)
    blocks = [b for b in common.make_blocks(s, store) if isinstance(b, FactBlock)]
    if not any(b.llm for b in blocks):
        raise UsageError(
            "no fact block is configured" if not blocks else "no model is configured for facts",
            "Set a model: MEMCLI_MODEL=NAME in the environment, or `[llm] model` in the config"
            ' file; or add a [[blocks]] kind = "facts" with a model',
        )
    blocks = [b for b in blocks if b.llm]
    tokenizer = common.tokenizer(s)
    if pending:
        result = extract_pending(store, blocks, store.list_sessions(s.user), tokenizer)
    else:
        with output.progress("Extracting facts") as bar:
            result = backfill(
                store, blocks, store.list_sessions(s.user), tokenizer, bar.advance, bar.total
            )
    done, still = sum(result.done.values()), sum(result.pending.values())
    output.info(f"Extracted from {output.plural(done, 'batch')}; {still} still pending.")
    if output.wants_json(json_):
        output.emit_all([{"type": "summary", "done": done, "pending": still}])
    error = result.pending_error("memcli facts extract --pending")
    if error is not None:  # the LLM failed on them again: not a success
        raise error

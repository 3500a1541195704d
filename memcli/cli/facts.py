"""`memcli facts`: list, add, edit, remove facts and see their history; retry pending extraction."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from memcli.cli import common, output
from memcli.words import shell_arg

if TYPE_CHECKING:
    from memcli.config import Settings
    from memcli.facts import Facts

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
        callback=lambda value: common.session_name(value),
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


def _facts(
    ctx: typer.Context,
    user: str | None,
    *,
    create: bool = False,
    warn: bool = False,
    **flags: Any,
) -> tuple[Settings, Facts]:
    """Settings and the facts service (`memcli.facts.Facts`) for a command: the user's facts,
    changes recorded as `manual`. With --user (or MEMCLI_USER), only that user's facts are read
    or changed by id; without, any user's. A database that is not there is made only with
    `create`; with `warn`, a recorded block that cannot be rebuilt is said to be left out."""
    from memcli.facts import Facts

    s = common.settings(ctx, user=user, **flags)
    store = common.open_store(s, must_exist=not create)
    owner = s.user if s.sources.get("user", "default") != "default" else None
    facts = Facts(
        store,
        s.user,
        lambda session: common.make_blocks(s, store, session=session, warn=warn),
        owner=owner,
        origin="manual",
        embedder=lambda: common.embedder(s),
        hint=list_hint(owner),
    )
    return s, facts


def _named(facts: Facts, session: str | None) -> str | None:
    """A --session as the other commands take it: a unique start of a session's id (of --user's
    sessions with --user) names that session; several: the candidates, exit 2."""
    store: Any = facts.store  # (an SQL store: the facts service is built on one)
    return common.session_named(store, session, facts.owner)


def list_hint(user: str | None) -> str:
    """Where a "no fact N" error sends the user to see the ids: their own list with --user."""
    flag = f" --user {shell_arg(user)}" if user is not None else ""
    return f"Run `memcli facts{flag}` to see the facts and their ids"


#: The group's options every subcommand takes over: `memcli facts --user ana rm 1`.
_GROUP_OPTIONS = ("user", "session", "topic")


def _merged(
    ctx: typer.Context, command: str, lists: tuple[str, ...] = (), **given: Any
) -> dict[str, Any]:
    """The subcommand's --user, --session and --topic (`given`), each with the group's
    (`memcli facts --user ana rm 1` removes ana's fact 1): the group's value where the
    subcommand gives none (as a one-item list for the options in `lists`). A value both give,
    differently, is refused (UsageError, exit 2), and so is a group option the subcommand has
    no use for (`memcli facts --session s1 rm 1`)."""
    from memcli.errors import UsageError
    from memcli.messages import validate_session_id

    group = ctx.parent.params if ctx.parent is not None else {}
    merged = dict(given)
    for name in _GROUP_OPTIONS:
        outer = group.get(name)
        if outer is None:
            continue
        if name == "session":
            validate_session_id(outer, "--session")
        if name not in given:
            raise UsageError(
                f"`memcli facts {command}` takes no --{name}",
                f"Leave --{name} out, or use it with a subcommand that takes it",
            )
        value = [outer] if name in lists else outer
        inner = given[name]
        if inner is not None and inner != value:
            raise UsageError(
                f"--{name} {_shown(value)} before `{command}` and --{name} {_shown(inner)}"
                " after it differ",
                f"Give --{name} once",
            )
        merged[name] = value if inner is None else inner
    return merged


def _shown(value: Any) -> str:
    return ", ".join(map(repr, value)) if isinstance(value, list) else repr(value)


def _fact_record(f: Any) -> dict[str, Any]:
    from memcli.facts import fact_record

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
    from memcli.messages import session_name

    columns = ["id", "block", "fact", "state", "topics", "entities", "origin", "session", "updated"]
    rows = [
        (
            f.id,
            f.block,
            f.text,
            _state(r),
            ", ".join(f.topics),
            ", ".join(f.entities),
            f.origin,
            f.session_id and session_name(f.session_id),
            f.updated_at.astimezone(),
        )
        for f, r in zip(facts, records, strict=True)
    ]
    keep = [i for i, column in enumerate(columns) if not _says_nothing(column, rows, i)]
    output.table(None, [columns[i] for i in keep], [[row[i] for i in keep] for row in rows])


#: Columns left out of the facts table when every row has the same value in them (one block,
#: every fact current, no topics, no entities): the room goes to the fact's text.
_DROPPABLE = {"block": None, "state": "current", "topics": "", "entities": ""}


def _says_nothing(column: str, rows: list[tuple[Any, ...]], i: int) -> bool:
    """Whether `column` holds one value in every row, one the table may leave unsaid: the only
    block, `current`, or nothing."""
    if column not in _DROPPABLE or not rows:
        return False
    values = {row[i] for row in rows}
    return len(values) == 1 and _DROPPABLE[column] in (None, *values)


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
        return  # (the subcommand takes --user, --session and --topic over: `_merged`)
    s, facts = _facts(ctx, user)
    if query is not None:
        found = facts.search(
            query, k, mode, session=_named(facts, session), block=block, entity=entity
        )
        if not found:
            output.info("No matches.")
        _show([f for f, _ in found], json_, [score for _, score in found])
        return
    session = _named(facts, session)
    listed = facts.list_facts(
        session=session, block=block, topic=topic, entity=entity, everything=everything
    )
    if not listed:
        stored = facts.store.list_sessions(s.user)
        others = "" if stored or session else common.close_users(facts.store, s.user)
        output.info(f"No facts of user {shell_arg(s.user)}.{others}" if others else "No facts.")
    _show(listed, json_)


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
    _, facts = _facts(ctx, _merged(ctx, "restore", user=user)["user"])
    restored, displaced = facts.restore(fact_id)
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
    _, facts = _facts(ctx, user)
    counts = facts.entities(session=_named(facts, session), block=block)
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
    from memcli.facts import check_fact_text, parse_expiry

    given = _merged(ctx, "add", ("topic",), user=user, session=session, topic=topic)
    # Checked before the database is made: a bad fact makes no file.
    check_fact_text(text, "Give the fact's text", given["topic"])
    expires_at = parse_expiry(expires) if expires is not None else None
    _, facts = _facts(ctx, given["user"], create=True)
    fact, added = facts.add(
        text,
        session=_named(facts, given["session"]),
        block=block,
        topics=given["topic"],
        entities=entity,
        expires=expires_at,
    )
    if not added:
        output.info("Already known; nothing added.")
        return
    output.info(f"Added fact {fact.id}.")
    _show([fact], json_)


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

    if not query.split():
        raise UsageError("the query is empty", "Give the words to look for")
    given = _merged(ctx, "search", user=user, session=session, topic=topic)
    _, facts = _facts(ctx, given["user"])
    found = facts.find(
        query, session=_named(facts, given["session"]), block=block, topic=given["topic"]
    )
    if not found:
        output.info("No matches.")
    _show(found, json_)


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
    from memcli.facts import check_fact_text

    given = _merged(ctx, "edit", ("topic",), user=user, topic=topic)
    check_fact_text(text, "Give the new text, or use `memcli facts rm`", given["topic"])
    _, facts = _facts(ctx, given["user"])
    _, after = facts.edit(fact_id, text, given["topic"])
    output.info(f"Edited fact {fact_id}.")
    _show([after], json_)


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
    _, facts = _facts(ctx, _merged(ctx, "rm", user=user)["user"])
    removed = facts.delete(fact_ids)
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
    from memcli.facts import change_record

    given = _merged(ctx, "history", user=user, session=session)
    _, facts = _facts(ctx, given["user"])
    changes = facts.history(fact_id, session=_named(facts, given["session"])).changes
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
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="Print how many requests and cl100k tokens it would send; send none."
        ),
    ] = False,
    user: common.User = None,
    session: Session = None,
    model: common.Model = None,
    api_base: common.ApiBase = None,
    json_: common.Json = False,
) -> None:
    """Read every stored conversation of the user (or one --session) that no fact block has
    read yet, active (never flushed) messages included, one request per batch of the session's
    flush size. Each batch is recorded as it is done: running it again sends nothing, and a run
    stopped midway goes on where it stopped. With --pending, only retry the batches whose
    extraction failed (the LLM was down or answered badly).

    Example: memcli facts extract --user ana --dry-run
    """
    from memcli.tokens import TiktokenTokenizer

    given = _merged(ctx, "extract", user=user, session=session)
    s, facts = _facts(ctx, given["user"], warn=True, model=model, api_base=api_base)
    session = _named(facts, given["session"])
    if pending:
        if dry_run:
            from memcli.errors import UsageError

            raise UsageError("--dry-run and --pending cannot go together", "Give one of them")
        result = facts.extract(common.tokenizer(s), pending=True, session=session)
    else:
        _, plan = facts.extraction_plan(TiktokenTokenizer(), session, dry_run=dry_run)
        what = (
            f"{output.plural(plan.requests, 'request')} ({plan.tokens:,} cl100k tokens"
            " before the replies)"
        )
        if dry_run:
            output.info(
                f"Dry run: extraction would send {what}; nothing was sent. (Counted with"
                " cl100k_base, the default tokenizer: a model's own may count otherwise.)"
            )
            if output.wants_json(json_):
                output.emit_all(
                    [{"type": "plan", "requests": plan.requests, "tokens": plan.tokens}]
                )
            return
        if plan.requests:
            output.info(f"Extracting facts: {what}.")
        with output.progress("Extracting facts") as bar:
            result = facts.extract(
                common.tokenizer(s),
                session=session,
                plan=plan,
                progress=bar.advance,
                on_total=bar.total,
            )
    done, still = sum(result.done.values()), sum(result.pending.values())
    output.info(f"Extracted from {output.plural(done, 'batch')}; {still} still pending.")
    if output.wants_json(json_):
        output.emit_all([{"type": "summary", "done": done, "pending": still}])
    again = "memcli facts extract --pending" if pending else "memcli facts extract"
    error = result.pending_error(again)
    if error is not None:  # the LLM failed on them again: not a success
        raise error

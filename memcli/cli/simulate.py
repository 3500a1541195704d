"""`memcli simulate flush SOURCE`: what a token budget does to a transcript, without storing it."""

from __future__ import annotations

import sys
from functools import partial
from typing import TYPE_CHECKING, Annotated, Any

import typer

from memcli.cli import common, output

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from memcli.flush import Budget
    from memcli.simulate import Replay, Simulation

app = typer.Typer(
    help="Try token budgets on a transcript: no LLM, no embeddings, nothing stored.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)


@app.command("flush")
def flush_command(
    ctx: typer.Context,
    source: Annotated[
        str | None,
        typer.Argument(
            help="A transcript (JSON Lines or a JSON array); - for stdin.", metavar="[FILE]"
        ),
    ] = None,
    session: Annotated[
        str | None,
        typer.Option(
            "--session",
            metavar="SESSION",
            help="Replay a stored session instead (read only).",
            autocompletion=common.complete_session,
            callback=lambda value: common.session_name(value),
        ),
    ] = None,
    token_limit: Annotated[
        str | None,
        typer.Option(
            "--token-limit", metavar="N[,N...]", help="Token limit, or several: 2000,4000,8000."
        ),
    ] = None,
    ratio: Annotated[
        str | None,
        typer.Option(
            "--ratio", metavar="R[,R...]", help="Chat history ratio, or several: 0.5,0.7."
        ),
    ] = None,
    flush_size: Annotated[
        str | None,
        typer.Option(
            "--flush-size",
            metavar="N[,N...]",
            help="Flush size in tokens, or several (default: 10% of the limit).",
        ),
    ] = None,
    put: Annotated[
        str,
        typer.Option(
            "--put",
            metavar="[call|message|batch]",
            autocompletion=common.choices("memcli.transcripts", "PUT_MODES"),
            help="How messages are put: one call per record (call), one at a time (message), all at once (batch).",
        ),
    ] = "call",
    timeline: Annotated[
        bool | None,
        typer.Option(
            "--timeline/--no-timeline",
            help="Show the timeline of puts and flushes (default: on for one parameter set).",
        ),
    ] = None,
    rows: Annotated[
        int,
        typer.Option(
            "--rows",
            metavar="N",
            min=0,
            help="Longest timeline: its first and last rows, the middle left out (0: all).",
        ),
    ] = 40,
    chart: Annotated[
        bool, typer.Option("--chart/--no-chart", help="Draw the chart in the terminal.")
    ] = True,
    png: Annotated[
        str | None,
        typer.Option(
            "--png",
            metavar="FILE",
            help="Also write the chart to this image file: .png, .svg or .pdf, by its extension.",
        ),
    ] = None,
    user: common.User = None,
    json_: common.Json = False,
) -> None:
    """Replay a transcript through the engine's flush policy and show what each budget does.

    Every combination of the --token-limit, --ratio and --flush-size values is run. One set shows a
    timeline (each put: active tokens against the threshold; each flush: which messages moved, how
    many tokens and why), a summary and a chart of active tokens with the threshold and token_limit
    drawn and the flushes marked. Several sets are compared in one table. Nothing is written to the
    store, no LLM is called and nothing is embedded.

    Long transcripts: runs of puts that flush nothing are folded into one row, and the timeline
    shows its first and last --rows rows (--rows 0 shows every row; --no-timeline hides it).

    --json (the default in a pipe) writes JSON Lines: {"type": "put", ...} for each put call,
    {"type": "flush", "first", "last", "messages", "tokens", "reason"} for each flush (first and
    last are 0-based positions of messages in the source), and one {"type": "summary", ...} per
    parameter set with its parameters; "run" numbers the sets.

    \b
    Examples:
      memcli simulate flush chat.jsonl --token-limit 2000,4000,8000 --ratio 0.5,0.7
      memcli simulate flush --session demo --flush-size 200 --png budget.png
    """
    from memcli.errors import UsageError
    from memcli.simulate import budgets, simulate_many
    from memcli.transcripts import PUT_MODES

    if put not in PUT_MODES:
        raise UsageError(f"unknown --put {put!r}", f"Use one of: {', '.join(PUT_MODES)}")
    if png is not None:  # a name that says no format fails before the transcript is read
        from memcli.charts import chart_format

        chart_format(png)
    if (source is None) == (session is None):
        raise UsageError(
            "give a transcript file or --session ID (one of them)",
            "E.g. `memcli simulate flush chat.jsonl` or `memcli simulate flush --session demo`",
        )
    limits = parse_list(token_limit, int, "--token-limit")
    ratios = parse_list(ratio, float, "--ratio")
    sizes = parse_list(flush_size, int, "--flush-size")
    s = common.settings(ctx, user=user)
    if session is None:  # bad values fail before a long transcript is read
        budget_list = budgets(limits, ratios, sizes, partial(common.budget_for, s, None))
    replay, info = _load(s, source, session, put)
    if session is not None:  # values left out come from the session
        budget_list = budgets(limits, ratios, sizes, partial(common.budget_for, s, info))
    _show(simulate_many(replay, budget_list), put, json_, png, timeline, rows, chart)


def _show(
    sims: list[Simulation],
    put: str,
    json_: bool,
    png: str | None,
    timeline: bool | None,
    rows: int,
    chart: bool,
) -> None:
    """Write the simulations: the PNG if asked, then JSON Lines, or the timeline, summary, chart."""
    if png is not None:
        from memcli.charts import write_chart

        write_chart(sims, png)
        output.info(f"Wrote the chart to {png}")
    if output.wants_json(json_):
        _emit_json(sims, put)
        return
    if not sims[0].summary.messages:
        output.info("The source has no messages: nothing is put, nothing flushes.")
        chart = timeline = False
    show_timeline = timeline if timeline is not None else len(sims) == 1
    if show_timeline:
        for i, sim in enumerate(sims):
            _timeline(sim, rows, f"Set {i + 1}: {_label(sim.budget)}" if len(sims) > 1 else None)
    if len(sims) == 1:
        _summary_one(sims[0], put)
    else:
        _summary_many(sims, put)
    if chart:
        _chart(sims)


def parse_list(text: str | None, kind: Callable[[str], Any], option: str) -> list[Any]:
    """`2000,4000` -> [2000, 4000] (duplicates dropped); None -> [None] (use the default)."""
    from memcli.errors import UsageError

    if text is None:
        return [None]
    values: list[Any] = []
    for item in text.split(","):
        item = item.strip()
        try:
            value = kind(item)
        except ValueError:
            noun = "a whole number" if kind is int else "a number"
            raise UsageError(
                f"{option}: {item!r} is not {noun}",
                f"Give {option} one value or several separated by commas, e.g. {option} {_example(option)}",
            ) from None
        if value not in values:
            values.append(value)
    return values


def _example(option: str) -> str:
    return {"--ratio": "0.5,0.7", "--flush-size": "200,400"}.get(option, "2000,4000")


def _load(s: Any, source: str | None, session: str | None, put: str) -> tuple[Replay, Any]:
    """The replay (tokens counted) and, for a stored session, its info (for its budget)."""
    from memcli.simulate import Replay
    from memcli.transcripts import Record, plan_calls

    if session is not None:
        store = common.open_store(s, must_exist=True)
        try:
            info = common.require_session(store, session, common.asked_user(s))
            messages = store.get_messages(info.id)
        finally:
            store.close()
        records = [Record(i, [m]) for i, m in enumerate(messages)]
        calls = plan_calls(records, put)
        return Replay.from_calls(calls, common.tokenizer(s), stored_tokens=True), info
    assert source is not None
    replay, sessions = Replay.from_source(source, put, common.tokenizer(s))
    if len(sessions) > 1:
        output.info(
            f"The transcript names {len(sessions)} sessions; they are replayed as one"
            " session, as `memcli import --session ID` would store them."
        )
    return replay, None


def _label(b: Budget) -> str:
    return f"limit {b.token_limit:,}, ratio {b.chat_history_token_ratio:g}, flush size {b.flush_size:,}"


# -- JSON Lines -----------------------------------------------------------------------------------


def _emit_json(sims: Sequence[Simulation], put: str) -> None:
    from memcli.simulate import events_json

    write = sys.stdout.write
    for run, sim in enumerate(sims):
        write(events_json(sim.events, run))
        write(output.json_line({**sim.summary.to_dict(), "put": put, "run": run}) + "\n")
    sys.stdout.flush()


# -- people ---------------------------------------------------------------------------------------


def _timeline(sim: Simulation, limit: int, title: str | None) -> None:
    from memcli.simulate import FlushEvent

    threshold = sim.budget.threshold
    rows: list[tuple[str, str, str, str, str]] = []
    quiet: list[Any] = []

    def fold() -> None:
        if not quiet:
            return
        a, b = quiet[0], quiet[-1]
        calls = f"{a.call + 1}" if a is b else f"{a.call + 1}–{b.call + 1}"
        what = "no flush" if a is b else f"{len(quiet)} puts, no flush"
        rows.append(
            (
                calls,
                _span(a.first, b.last),
                f"+{sum(p.tokens for p in quiet):,}",
                f"{b.kept_tokens:,}",
                what,
            )
        )
        quiet.clear()

    for event in sim.events:
        if isinstance(event, FlushEvent):
            rows.append(
                (
                    "",
                    _span(event.first, event.last),
                    f"−{event.tokens:,}",
                    "",
                    f"flush {output.plural(event.messages, 'message')}: {event.reason}",
                )
            )
            continue
        if not event.flushes and not event.over_threshold:
            quiet.append(event)
            continue
        fold()
        active = f"{event.active_tokens:,} → {event.kept_tokens:,}"
        if event.over_threshold:
            what = f"still over the threshold {threshold:,.0f}: the newest turn is larger than the budget"
        else:
            what = f"over the threshold {threshold:,.0f}: {output.plural(event.flushes, 'flush')}"
        rows.append(
            (
                str(event.call + 1),
                _span(event.first, event.last),
                f"+{event.tokens:,}",
                active,
                what,
            )
        )
    fold()
    shown: list[Sequence[str]] = list(rows)
    groups: list[list[Sequence[str]]] = []
    for row in rows:
        if row[0] == "" and groups:  # a flush row stays with the put that caused it
            groups[-1].append(row)
        else:
            groups.append([row])
    head, tail = _ends(groups, (limit + 1) // 2, limit // 2) if limit else (rows, [])
    left_out = len(rows) - len(head) - len(tail)
    if left_out:
        shown = [
            *head,
            ("…", "", "", "", f"{left_out:,} rows left out (--rows 0 shows them all)"),
            *tail,
        ]
    output.table(
        title or "Timeline", ["put", "messages", "tokens", "active", "what happened"], shown
    )


def _ends(
    groups: Sequence[list[Sequence[str]]], head_rows: int, tail_rows: int
) -> tuple[list[Sequence[str]], list[Sequence[str]]]:
    """The rows of the first and of the last groups that fit in `head_rows` and `tail_rows`
    (the first group always): a put and its flushes are shown together or left out together."""
    head: list[Sequence[str]] = []
    i = 0
    while i < len(groups) and (not head or len(head) + len(groups[i]) <= head_rows):
        head += groups[i]
        i += 1
    tail: list[Sequence[str]] = []
    j = len(groups)
    while j > i and len(tail) + len(groups[j - 1]) <= tail_rows:
        j -= 1
        tail = [*groups[j], *tail]
    return head, tail


def _span(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}–{last}"


def _summary_one(sim: Simulation, put: str) -> None:
    m = sim.summary
    b = sim.budget
    over = "no"
    if m.stayed_over:
        over = (
            f"yes, after {output.plural(m.over_threshold_puts, 'put')}"
            f" (first at message {m.first_over_threshold}): a turn larger than the budget stays whole"
        )
    rows = [
        ("budget", f"{_label(b)}; threshold {b.threshold:,.0f}; --put {put}"),
        (
            "transcript",
            f"{output.plural(m.messages, 'message')}, {output.plural(m.tokens, 'token')}",
        ),
        ("puts", f"{m.puts:,}"),
        ("flushes", f"{m.flushes:,}"),
        (
            "archived",
            f"{output.plural(m.archived_messages, 'message')}, {output.plural(m.archived_tokens, 'token')}",
        ),
        (
            "average batch",
            f"{m.average_batch_messages:g} messages, {m.average_batch_tokens:,.1f} tokens",
        ),
        (
            "largest batch",
            f"{output.plural(m.largest_batch_messages, 'message')}, {output.plural(m.largest_batch_tokens, 'token')}",
        ),
        (
            "largest active window",
            f"{output.plural(m.largest_active_tokens, 'token')}, {output.plural(m.largest_active_messages, 'message')} (right after a put)",
        ),
        ("largest kept after flushing", f"{output.plural(m.largest_kept_tokens, 'token')}"),
        (
            "active at the end",
            f"{output.plural(m.active_messages, 'message')}, {output.plural(m.active_tokens, 'token')}",
        ),
        ("stayed over the threshold", over),
    ]
    output.table("Summary", ["", ""], rows)


def _summary_many(sims: Sequence[Simulation], put: str) -> None:
    columns = [
        "limit",
        "ratio",
        "flush",
        "threshold",
        "flushes",
        "archived",
        "avg batch",
        "max batch",
        "peak",
        "at end",
        "stayed over",
    ]
    rows = []
    for sim in sims:
        m = sim.summary
        rows.append(
            (
                f"{m.token_limit:,}",
                f"{m.ratio:g}",
                f"{m.flush_size:,}",
                f"{m.threshold:,.0f}",
                f"{m.flushes:,}",
                f"{m.archived_messages:,}",
                f"{m.average_batch_tokens:,.0f}",
                f"{m.largest_batch_tokens:,}",
                f"{m.largest_active_tokens:,}",
                f"{m.active_tokens:,}",
                f"{m.over_threshold_puts:,} puts" if m.stayed_over else "no",
            )
        )
    first = sims[0].summary
    title = (
        f"{len(sims)} parameter sets: {output.plural(first.messages, 'message')},"
        f" {output.plural(first.tokens, 'token')},"
        f" --put {put}. Archived in messages; batches, peak (active tokens right after a put)"
        " and at end in tokens"
    )
    output.table(title, columns, rows)


def _chart(sims: Sequence[Simulation]) -> None:
    from rich.text import Text

    from memcli.charts import terminal_chart

    console = output.out()
    width = min(console.width, 140)
    color = not console.no_color and console.color_system is not None
    text = terminal_chart(sims, width=width, height=22, color=color)
    console.print(Text.from_ansi(text))

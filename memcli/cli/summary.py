"""`memcli summary SESSION`: the session's running summary (the summary block's), or its history."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from memcli.cli import common, output

if TYPE_CHECKING:
    from memcli.blocks.summary import SummaryReport


def summary_command(
    ctx: typer.Context,
    session: common.SessionId,
    history: Annotated[
        bool, typer.Option("--history", help="Every version, oldest first, not only the current.")
    ] = False,
    block: Annotated[
        str | None,
        typer.Option("--block", metavar="NAME", help="Only this summary block's summary."),
    ] = None,
    user: common.User = None,
    model: common.Model = None,
    api_base: common.ApiBase = None,
    json_: common.Json = False,
) -> None:
    """Show the session's summary, as the summary block ([[blocks]] kind = "summary") keeps it:
    the current version with the batch it last took in, or with --history every version (time,
    batch covered, tokens). Batches still waiting to be summarised are counted on stderr.

    Example: memcli summary demo --history
    """
    from memcli.blocks.summary import summary_reports

    s = common.settings(ctx, user=user, model=model, api_base=api_base)
    store = common.open_store(s, must_exist=True)
    info = common.require_session(store, session, common.asked_user(s))
    session = info.id
    blocks = common.make_blocks(s, store, session=session, warn=False)
    reports = summary_reports(store, session, blocks, block=block, history=history)
    if output.wants_json(json_):
        output.emit_all(r for report in reports for r in report.records(history))
    else:
        for report in reports:
            _show(report, history)
    if not reports:  # no summary block: none will ever come
        output.info(
            f"No summary of session {info.name}: it has no summary block. Add one to the config"
            ' file ([[blocks]] kind = "summary"; `memcli blocks list` shows the blocks).'
        )
    elif not any(r.current for r in reports):
        output.info(f"No summary of session {info.name} yet.")
    for report in reports:
        if report.pending:
            error = f" ({report.error})" if report.error else ""
            output.info(
                f"{report.block}: {output.plural(len(report.pending), 'batch')} waiting to be"
                f" summarised{error}. They are retried after later flushes, or now with"
                f" `memcli blocks backfill {common.session_args(store, info)}`."
            )


def _show(report: SummaryReport, history: bool) -> None:
    from rich.markup import escape

    if report.current is None:
        return
    if history:
        output.table(
            f"{report.block}: {output.plural(len(report.history), 'version')}",
            ["version", "time", "flush", "message ids", "tokens", "summary"],
            [
                (
                    s.version,
                    s.created_at.astimezone(),
                    s.flush_id,
                    _span(s.first_message_id, s.last_message_id),
                    s.tokens,
                    s.text,
                )
                for s in report.history
            ],
        )
        return
    s = report.current
    console = output.out()
    console.print(
        f"[bold]{escape(report.block)}[/] v{s.version} · {s.created_at.astimezone():%Y-%m-%d %H:%M}"
        f" · flush {s.flush_id}, messages {_span(s.first_message_id, s.last_message_id)}"
        f" · {output.plural(s.tokens, 'token')}",
        markup=True,
        highlight=False,
    )
    console.print(s.text, markup=False, highlight=False, soft_wrap=True)


def _span(first: int | None, last: int | None) -> str:
    if first is None or last is None:
        return ""
    return str(first) if first == last else f"{first}–{last}"

"""`memcli export SESSION`: the session as JSON Lines that `memcli import` reads back, as an
OpenAI fine-tuning line, or as a Markdown transcript."""

from __future__ import annotations

from typing import Annotated

import typer

from memcli.cli import common, output


def export_command(
    ctx: typer.Context,
    session: common.SessionId,
    all_: Annotated[
        bool, typer.Option("--all", help="Include archived messages, with their status.")
    ] = False,
    format_: Annotated[
        str,
        typer.Option(
            "--format",
            help="jsonl (memcli's own, read back whole), openai (one fine-tuning line) or"
            " markdown (a transcript to read).",
            metavar="[jsonl|openai|markdown]",
            autocompletion=common.choices("memcli.transcripts", "EXPORT_FORMATS"),
        ),
    ] = "jsonl",
    user: common.User = None,
    json_: common.Json = False,
) -> None:
    """Write a session's messages on stdout (active ones, or all with --all).

    jsonl (the default): a first record for the session, {"type": "session", "id", "user",
    "token_limit", "chat_history_token_ratio", "token_flush_size"}, so that `memcli import`
    recreates its budget, then one message per line with its name, timestamp and metadata.

    openai: one line {"messages": [...]} in OpenAI's chat (fine-tuning) format, each message's
    role, content, name, tool_calls and tool_call_id (and other keys it came with) as OpenAI
    has them, a developer message as developer, with the record-level keys an import kept
    (tools, parallel_tool_calls, ...); `memcli import` reads it back to the same conversation.
    Timestamps and metadata are not part of that format. Tool turns are valid for OpenAI: a
    tool call without its result, or a tool result without its call, is written as text.

    markdown: the conversation's title (else the session's id), then a heading per message
    with its role, id and time (UTC), its text as it is.

    With --user, only a session of that user is exported (another user's is not found: exit 1).
    --json is accepted and changes nothing.

    Examples: memcli export demo --all > demo.jsonl && memcli import demo.jsonl --session copy;
    memcli export demo --format openai >> train.jsonl; memcli export demo --format markdown > demo.md
    """
    from memcli.errors import UsageError
    from memcli.provider_messages import openai_line
    from memcli.transcripts import (
        EXPORT_FORMATS,
        SessionRecord,
        export_lines,
        markdown_transcript,
        session_record_keys,
    )

    del json_  # always the format asked for
    if format_ not in EXPORT_FORMATS:
        raise UsageError(
            f"unknown export format {format_!r}", f"Use one of: {', '.join(EXPORT_FORMATS)}"
        )
    s = common.settings(ctx)
    store = common.open_store(s, must_exist=True)
    info = common.require_session(store, session, user)
    session = info.id
    # Read whole before the first line is written: a damaged database fails here, writing nothing.
    messages = store.read_messages(session, status=None if all_ else "active")
    if format_ == "openai":
        output.emit_all([openai_line(messages, session_record_keys(info))])
    elif format_ == "markdown":
        for piece in markdown_transcript(messages, info.name, info.user_id, info.title):
            output.write(piece)
    else:
        output.emit_all([SessionRecord.of(info).to_dict()])
        output.emit_all(export_lines(messages, with_status=all_))

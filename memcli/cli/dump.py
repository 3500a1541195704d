"""`memcli dump blocks|context`: what long-term memory holds and what the LLM would be sent."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from memcli.cli import common, output

app = typer.Typer(
    help="Show long-term memory blocks, or the exact context get() would return.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

Input = Annotated[
    str | None,
    typer.Option("--input", help="A user message to assemble the context for (not stored)."),
]
WhatIfLimit = Annotated[
    int | None,
    typer.Option(
        "--token-limit",
        help="What if the token limit were this: blocks truncated to it (nothing is stored).",
    ),
]


@app.command("blocks")
def blocks_command(
    ctx: typer.Context,
    session: Annotated[
        str | None,
        typer.Argument(
            help="The session (default: none, an empty chat history).",
            metavar="[SESSION]",
            autocompletion=common.complete_session,
            callback=lambda value: common.session_name(value),
        ),
    ] = None,
    block: Annotated[str | None, typer.Option("--block", help="Only this block.")] = None,
    input_: Input = None,
    user: common.User = None,
    token_limit: WhatIfLimit = None,
    json_: common.Json = False,
) -> None:
    """Each block's content with its priority and tokens, and what truncation would cut.

    Example: memcli dump blocks demo --input "what do you know about me?"
    """
    from memcli.errors import UsageError
    from memcli.sessions import blocks_view

    s = common.settings(ctx, user=user)
    store = common.open_store(s, must_exist=True)
    session = common.session_named(store, session, common.asked_user(s))
    blocks = common.make_blocks(s, store, session=session)
    names = [b.name for b in blocks]
    if block is not None and block not in names:
        raise UsageError(
            f"no block named {block!r}", f"Configured blocks: {', '.join(names) or 'none'}"
        )
    context = blocks_view(
        store,
        session,
        user=s.user,
        blocks=blocks,
        tokenizer=common.tokenizer(s),
        token_limit=token_limit if token_limit is not None or session else s.token_limit,
        insert_method=s.insert_method,
        input=input_,
    )
    shown = {b.name: b for b in context.blocks}
    records: list[dict[str, Any]] = []
    for b in blocks:
        if block is not None and b.name != block:
            continue
        content = shown.get(b.name)
        records.append(
            {
                "type": "block",
                "name": b.name,
                "kind": type(b).__name__,
                "priority": b.priority,
                "scope": b.scope,
                "tokens": content.original_tokens if content else 0,
                "content": content_text(content),
                "truncated": content.truncated if content else None,
                "tokens_after_truncation": content.tokens if content else 0,
            }
        )
    if output.wants_json(json_):
        output.emit_all(records)
    else:
        _print_blocks(records)


def _print_blocks(records: list[dict[str, Any]]) -> None:
    console = output.out()
    for r in records:
        cut = (
            f"  truncation: {r['truncated']} to {r['tokens_after_truncation']}"
            if r["truncated"]
            else ""
        )
        console.print(
            f"[bold]{r['name']}[/] ({r['kind']}, {r['scope']} scope)  priority {r['priority']}"
            f"  {output.plural(r['tokens'], 'token')}{cut}"
        )
        console.print(r["content"] or "(empty)", markup=False, highlight=False)
        console.print()


def content_text(content: Any) -> str:
    """A block's full content before truncation (what the block holds)."""
    if content is None:
        return ""
    return str(content.original_content or content.content)


@app.command("context")
def context_command(
    ctx: typer.Context,
    session: Annotated[
        str,
        typer.Argument(
            help="The session.",
            metavar="SESSION",
            autocompletion=common.complete_session,
            callback=lambda value: common.session_name(value),
        ),
    ],
    input_: Input = None,
    user: common.User = None,
    token_limit: WhatIfLimit = None,
    json_: common.Json = False,
) -> None:
    """Exactly the messages get() would return: the active window with long-term memory inserted;
    with --input, then that message, as the model would be sent it (a record of type "input":
    get() shows it to the blocks but does not return it; nothing is stored).

    Example: memcli dump context demo --input "what's my dog called?" --json
    """
    from memcli.sessions import blocks_view

    s = common.settings(ctx, user=user)
    store = common.open_store(s, must_exist=True)
    session = common.session_named(store, session, common.asked_user(s)) or session
    blocks = common.make_blocks(s, store, session=session)
    messages = blocks_view(
        store,
        session,
        user=s.user,
        blocks=blocks,
        tokenizer=common.tokenizer(s),
        token_limit=token_limit,
        insert_method=s.insert_method,
        input=input_,
    ).messages
    records = [{"type": "message", **m.to_dict()} for m in messages]
    if input_ is not None:
        records.append({"type": "input", "role": "user", "content": input_})
    if output.wants_json(json_):
        output.emit_all(records)
        return
    console = output.out()
    for r in records:
        said = " (the input, not stored)" if r["type"] == "input" else ""
        console.print(f"[bold]{r['role']}[/]{said}")
        console.print(r["content"], markup=False, highlight=False)
        console.print()

"""`memcli chat`: the full-screen REPL on a terminal, or plain mode for pipes and scripts."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from memcli.cli import common, output

if TYPE_CHECKING:
    from memcli.chat.commands import Commands
    from memcli.chat.session import Chat, Turn
    from memcli.config import Settings
    from memcli.flush import Budget


def chat_command(
    ctx: typer.Context,
    session: Annotated[
        str | None,
        typer.Option("--session", help="Resume this session (or start one with this id)."),
    ] = None,
    user: common.User = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model", help="Any litellm model string (default: $MEMCLI_MODEL, [llm] model)."
        ),
    ] = None,
    api_base: Annotated[
        str | None,
        typer.Option(
            "--api-base", help="The endpoint, for OpenAI-compatible servers ($MEMCLI_API_BASE)."
        ),
    ] = None,
    token_limit: common.TokenLimit = None,
    ratio: common.Ratio = None,
    flush_size: common.FlushSize = None,
    rebudget: Annotated[
        bool,
        typer.Option(
            "--rebudget",
            help="Store the budget options in a session that has another budget (else an error).",
        ),
    ] = False,
    plain: Annotated[
        bool,
        typer.Option(
            "--plain", help="One message per stdin line, replies on stdout (the default in a pipe)."
        ),
    ] = False,
    json_: Annotated[
        bool, typer.Option("--json", help="Plain mode with each reply as a JSON Lines record.")
    ] = False,
) -> None:
    """Chat with an LLM through memory: live short-term and long-term panels, slash commands.

    With no model configured it still runs, offline: replies come from memory and say how to set a
    model. In a pipe, or with --plain or --json, it reads one message per line from stdin and writes
    only the replies to stdout.

    Example: printf 'hi\\nwhat did I say?\\n' | memcli chat --plain --session demo
    """
    s = common.settings(ctx, user=user, model=model, api_base=api_base)
    chat, is_new = build_chat(s, session, token_limit, ratio, flush_size, rebudget)
    from memcli.chat.commands import Commands

    commands = Commands(chat)
    if plain or json_ or not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise typer.Exit(run_plain(chat, commands, is_new, json_))
    from memcli.cli.chat_ui import ChatApp

    with stderr_to(s.home / "chat.log"):
        ChatApp(
            chat, commands, is_new, history_path=s.home / "chat_history", db_label=str(s.db_path)
        ).run()


@contextmanager
def stderr_to(path: Path) -> Iterator[None]:
    """Send file descriptor 2 to a log file while the full-screen app runs: a library warning
    (litellm, the embedding model) written to the terminal would tear the screen."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    with path.open("a", encoding="utf-8") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
    if path.stat().st_size == 0:
        path.unlink()  # nothing was said


def build_chat(
    s: Settings,
    session: str | None,
    token_limit: int | None,
    ratio: float | None,
    flush_size: int | None,
    rebudget: bool = False,
) -> tuple[Chat, bool]:
    """The Chat for these settings, with its session open; True when the session is new.

    Budget options that differ from a stored session's budget are an error (exit 2) unless
    `rebudget`, which stores them in the session first and says what that flushed."""
    from memcli.chat.session import Chat
    from memcli.ranking import SearchOptions
    from memcli.sessions import budget_rule, owned

    store = common.open_store(s)
    blocks = common.make_blocks(s, store)
    user_id = s.user
    if session:
        # A session of another user: refused for an explicit --user, else chatted in as its user's.
        user = s.user if "user" in s.explicit else None
        info = owned(store, session, user, "Use --user {owner}, or another --session")
        if info is not None:
            user_id = info.user_id
            rule = budget_rule(
                common.default_budget(s), token_limit, ratio, flush_size, rebudget=rebudget
            )
            wanted = rule(info)  # UsageError when it differs and --rebudget is not given
            if wanted is not None:
                _rebudget(s, store, session, blocks, wanted)

    chat = Chat(
        store,
        user_id=user_id,
        blocks=blocks,
        tokenizer=common.tokenizer(s),
        budget_for=budget_rule(common.default_budget(s), token_limit, ratio, flush_size),
        insert_method=s.insert_method,
        llm=llm_config(s),
        search_options=SearchOptions.from_settings(s),
    )
    is_new = chat.open(session)
    return chat, is_new


def _rebudget(s: Settings, store: Any, session: str, blocks: list[Any], budget: Budget) -> None:
    """Store another budget in a stored session (--rebudget) and say what it flushed."""
    from memcli.memory import budget_text
    from memcli.sessions import open_stored

    memory = open_stored(store, session, blocks, common.tokenizer(s), s.insert_method)
    old = memory.budget
    flushes = memory.rebudget(budget)
    moved = sum(len(f.message_ids) for f in flushes)
    output.info(
        f"Session {session}: budget {budget_text(budget)} stored (was {budget_text(old)});"
        f" the change flushed {moved:,} {'message' if moved == 1 else 'messages'}."
    )


def llm_config(s: Settings) -> Any:
    """The model to chat with: settings, else a default for a provider key that is set; else None."""
    from memcli.chat.offline import default_model
    from memcli.llm import PROVIDER_KEY_VARIABLES, LLMConfig

    name = s.model or default_model(k for k in PROVIDER_KEY_VARIABLES if os.environ.get(k))
    if name is None:
        return None
    return LLMConfig(model=name, api_base=s.api_base, timeout=s.llm_timeout)


# -- plain mode -----------------------------------------------------------------------------------


def run_plain(chat: Chat, commands: Commands, is_new: bool, json_: bool) -> int:
    """One user message per stdin line; replies on stdout; return the exit code."""
    from memcli.errors import MemcliError

    state = "new session" if is_new else "resumed session"
    output.info(
        f"memcli chat: {state} {chat.session_id} (user {chat.user_id}); resume with --session {chat.session_id}"
    )
    if chat.offline:
        from memcli.chat.offline import MODEL_HINT

        output.info(f"No model is configured: replies come from memory alone. {MODEL_HINT}.")
    code = 0
    for raw in sys.stdin:
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        try:
            if line.startswith("/"):
                result = commands.run(line)
                if result.text:  # unwrapped: /context shows exactly what is sent
                    sys.stderr.write(result.text + "\n")
                    sys.stderr.flush()
                if result.exit:
                    break
                if result.turn is None:
                    continue
                turn = result.turn
            else:
                turn = chat.send(line)
            if not play(chat, turn, json_):
                code = 1
        except MemcliError as error:
            output.print_error(error)
            code = max(code, 1)
    return code


def play(chat: Chat, turn: Turn, json_: bool) -> bool:
    """Run a turn, streaming the reply to stdout; False when the LLM call failed."""
    from memcli.chat.session import ReplyDone, ReplyFailed, ReplyPiece, UserStored

    written = False
    try:
        for event in turn.events():
            if isinstance(event, UserStored):
                _note_flushes(event.flushes)
            elif isinstance(event, ReplyPiece) and not json_:
                sys.stdout.write(event.text)
                sys.stdout.flush()
                written = True
            elif isinstance(event, ReplyDone):
                _done(chat, event, json_)
                _note_flushes(event.flushes)
            elif isinstance(event, ReplyFailed):
                if written:
                    sys.stdout.write("\n")
                output.print_error(event.error)
                output.info("Your message is kept in memory; send /retry to try again.")
                return False
    except KeyboardInterrupt:
        done = turn.interrupt()
        if written:
            sys.stdout.write("\n")
            sys.stdout.flush()
        if done is not None and done.message is not None:
            output.info("Cancelled: the partial reply is kept, marked as cancelled.")
        raise
    return True


def _done(chat: Chat, event: Any, json_: bool) -> None:
    if json_:
        output.emit(
            {
                "type": "reply",
                "session": chat.session_id,
                "content": event.text,
                "offline": event.offline,
                "cancelled": event.cancelled,
                "stored": event.message is not None,
                "flushes": len(event.flushes),
            }
        )
    else:
        sys.stdout.write("\n")  # one reply per line, an empty reply too
    sys.stdout.flush()


def _note_flushes(flushes: Any) -> None:
    for f in flushes:
        output.info(
            f"Flushed {len(f.message_ids)} messages ({f.tokens:,} tokens) to long-term memory."
        )

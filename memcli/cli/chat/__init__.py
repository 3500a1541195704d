"""`memcli chat`: the full-screen REPL on a terminal, or plain mode for pipes and scripts."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from memcli.cli import common, output
from memcli.words import shell_arg

if TYPE_CHECKING:
    from memcli.chat.commands import Commands
    from memcli.chat.session import Chat, Turn
    from memcli.config import Settings
    from memcli.errors import UsageError
    from memcli.flush import Budget


def chat_command(
    ctx: typer.Context,
    session: Annotated[
        str | None,
        typer.Option(
            "--session",
            metavar="SESSION",
            help="Resume this session (or start one with this id).",
            autocompletion=common.complete_session,
            callback=lambda value: common.session_name(value),
        ),
    ] = None,
    continue_: Annotated[
        bool,
        typer.Option(
            "--continue",
            "-c",
            help="Resume your most recent session (the one with the latest message).",
        ),
    ] = False,
    user: common.User = None,
    model: common.Model = None,
    api_base: common.ApiBase = None,
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
            "--plain",
            help="One message per stdin line; each reply on stdout, then an empty line (the "
            "default in a pipe).",
        ),
    ] = False,
    json_: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Plain mode with each reply, each memory tool call and each failed turn as a"
            " JSON Lines record.",
        ),
    ] = False,
    memory_tools: Annotated[
        bool,
        typer.Option(
            "--memory-tools",
            help="Offer the model tools to search memory and to list, add, update and delete"
            " facts; each call is shown and kept in the session ([llm] memory_tools).",
        ),
    ] = False,
) -> None:
    """Chat with an LLM through memory: live short-term and long-term panels, slash commands.

    With no model configured it still runs, offline: replies come from memory and say how to set a
    model. In a pipe, or with --plain or --json, it reads one message per line from stdin and writes
    only the replies to stdout, each followed by an empty line (--json: one record per reply, and
    a {"type": "error"} record per failed turn). Every message is stored with its time.

    Example: printf 'hi\\nwhat did I say?\\n' | memcli chat --plain --session demo
    """
    ending = ProcessEnd()  # before litellm registers its exit handlers: they run first
    s = common.settings(
        ctx, user=user, model=model, api_base=api_base, memory_tools=memory_tools or None
    )
    if continue_:
        if session is not None:
            from memcli.errors import UsageError

            raise UsageError("--continue and --session go not together", "Give one of them")
        session = latest_session(s)
    chat, is_new = build_chat(
        s, session, token_limit, ratio, flush_size, rebudget, own=bool(continue_)
    )
    from memcli.chat.commands import Commands

    commands = Commands(chat)
    guess = close_sessions(chat, session) if is_new else None
    if plain or json_ or not (sys.stdin.isatty() and sys.stdout.isatty()):
        if guess is not None:
            output.info(guess)
        code = run_plain(chat, commands, is_new, json_)
        chat.store.close()
        ending.code = code
        raise typer.Exit(code)
    from memcli.cli.chat.ui import ChatApp
    from memcli.input_history import history_path

    with stderr_to(s.home / "chat.log"):
        history = history_path(s.home, chat.user_id)  # (the session's user)
        app = ChatApp(chat, commands, is_new, history_path=history, db_label=s.db_label)
        if guess is not None:
            app.note(guess)
        code = app.run()
    chat.store.close()
    from memcli.blocks.background import left_note

    note = left_note(app.left, chat.session_id, chat.user_id)
    if note is not None:
        output.info(note)
    ending.code = code
    if code:  # a turn or a command failed (said in the conversation): exit 1, as plain mode
        raise typer.Exit(code)


def resume_args(chat: Chat) -> str:
    """The options that resume the chat's session: its name, and its user when not the default
    one (a session's name is its user's)."""
    args = f"--session {shell_arg(chat.session_id)}"
    return args if chat.user_id == "default" else f"{args} --user {shell_arg(chat.user_id)}"


def latest_session(s: Settings) -> str | None:
    """The user's most recent session (its latest message the newest), for --continue; None
    (a new session, said) when they have none."""
    store = common.open_store(s, must_exist=True) if common.database_exists(s) else None
    infos = store.list_sessions(s.user) if store is not None else []
    if store is not None:
        store.close()
    if not infos:
        output.info(f"No session of user {s.user} to continue: this chat starts one.")
        return None
    return max(infos, key=lambda i: (i.last_at or i.updated_at, i.updated_at)).name


def close_sessions(chat: Chat, session: str | None) -> str | None:
    """For a --session that starts a new session: the user's sessions with a close id (a typo
    would otherwise start an empty session unnoticed), as a note; None when none is close."""
    from memcli.store.base import suggestion

    guess = suggestion(chat.store, session, chat.user_id, new=True) if session else None
    if guess is None:
        return None
    return (
        f"No session {shell_arg(str(session))} of user {shell_arg(chat.user_id)} yet: this chat"
        f" starts it. {guess}."
    )


class ProcessEnd:
    """How a chat process ends: as Python ends it (its threads joined, every exit handler run:
    litellm's, logging's, those registered after this object), then, once `code` is set, at
    once with that status, skipping the interpreter's teardown of its objects.

    That teardown frees every object of every module one by one, with full garbage collections
    between: with litellm imported (~400,000 objects) it took 2 to 3 s after the last atexit
    handler on a loaded machine, and 0.3 s with the collections skipped; it writes nothing. What
    it would have closed is closed before `code` is set (the store: its last connection
    checkpoints the WAL) or flushed here (stdout and stderr). A thread still running (long-term
    work, the warm-up) is a daemon: the interpreter would not have waited for it either; its
    batch stays pending in the store. When `code` is not set (an error, Ctrl-C), the process
    ends as usual."""

    def __init__(self) -> None:
        import atexit

        self.code: int | None = None
        atexit.register(self._end)  # (handlers run last-registered first: this one last)

    def _end(self) -> None:
        if self.code is None:
            return
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a reader that left, a stream closed
                pass
        os._exit(self.code)


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
    *,
    own: bool = False,
) -> tuple[Chat, bool]:
    """The Chat for these settings, with its session open; True when the session is new.
    `own`: the session is the settings' user's (--continue), whoever else has one of its name.

    Budget options that differ from a stored session's budget are an error (exit 2) unless
    `rebudget`, which stores them in the session first and says what that flushed."""
    from memcli.chat.session import Chat
    from memcli.search.types import SearchOptions
    from memcli.sessions import budget_rule, default_budget, owned
    from memcli.store.base import by_prefix

    asked = common.budget_asked(token_limit, ratio, flush_size)
    store = common.open_store(s)
    user_id = s.user
    info = None
    if session:
        # The --user's session of that name (another user's of the same name is not theirs);
        # without --user, any user's, chatted in as its user's; else a unique start of one of
        # the user's names; else a new session of the user's.
        info = owned(store, session, s.user if own else common.asked_user(s))
        if info is None:
            info = by_prefix(store, session, s.user)
            if info is not None:
                output.info(
                    f"--session {shell_arg(session)} is the start of session"
                    f" {shell_arg(info.name)}: resuming it (give another name to start a new"
                    " session)."
                )
        if info is not None:
            session, user_id = info.name, info.user_id
    blocks = common.make_blocks(s, store, session=info.id if info else None, user=user_id)
    if info is not None:
        rule = budget_rule(default_budget(s), asked, rebudget=rebudget)
        wanted = rule(info)  # UsageError when it differs and --rebudget is not given
        if wanted is not None:
            _rebudget(s, store, info.id, blocks, wanted)

    chat = Chat(
        store,
        user_id=user_id,
        blocks=blocks,
        tokenizer=common.tokenizer(s),
        budget_for=budget_rule(default_budget(s), asked),
        insert_method=s.insert_method,
        llm=llm_config(s),
        search_options=SearchOptions.from_settings(s),
        tools=memory_tools(s, store, user_id, blocks) if s.memory_tools else None,
        reopen=lambda: common.open_store(s),  # the long-term thread's own connection
    )
    is_new = chat.open(session)
    return chat, is_new


def memory_tools(s: Settings, store: Any, user_id: str, blocks: list[Any]) -> Any:
    """The chat's memory tools (memcli.tools, as `memcli mcp` serves them): the user's
    facts in the chat's fact block, search through the chat's vector block (its model loaded
    once) or, without one, as `memcli search` searches. Changes are recorded as chat-tool."""
    from memcli.blocks.vector import VectorBlock
    from memcli.tool_calls import chat_tools
    from memcli.tools import AgentTools

    vector = next((b for b in blocks if isinstance(b, VectorBlock)), None)
    tools = AgentTools(
        store,
        s,
        user_id,
        blocks=lambda _: blocks,
        retriever=(
            (lambda: vector.retriever(store))
            if vector is not None
            else (lambda: common.retriever(s, store))
        ),
        origin="chat-tool",
    )
    return chat_tools(tools)


def _rebudget(s: Settings, store: Any, session: str, blocks: list[Any], budget: Budget) -> None:
    """Store another budget in a stored session (--rebudget) and say what it flushed."""
    from memcli.memory import budget_text
    from memcli.sessions import open_stored

    memory = open_stored(store, session, blocks, common.tokenizer(s), s.insert_method)
    old = memory.budget
    flushes = memory.rebudget(budget)
    moved = sum(len(f.message_ids) for f in flushes)
    output.info(
        f"Session {memory.session_id}: budget {budget_text(budget)} stored (was {budget_text(old)});"
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


def _with_commands(doc: str) -> str:
    """The help text of `chat` with the slash commands and keys (`\\b` keeps click from
    rewrapping them)."""
    from inspect import cleandoc

    from memcli.chat.commands import help_lines

    lines = help_lines()
    blank = lines.index("")
    commands, keys = lines[:blank], lines[blank + 1 :]
    listed = "\n".join(["\b", "Slash commands (typed as a message):", *commands, "", "\b", *keys])
    return f"{cleandoc(doc)}\n\n{listed}"


chat_command.__doc__ = _with_commands(chat_command.__doc__ or "")


# -- plain mode -----------------------------------------------------------------------------------


def run_plain(chat: Chat, commands: Commands, is_new: bool, json_: bool) -> int:
    """One user message per stdin line; replies on stdout; return the exit code.

    Each reply is written as it streams, then ends with a newline and one empty line (a model's
    reply may hold empty lines of its own: `--json` writes one record per reply). With `--json`,
    a failed turn is a `{"type": "error"}` record on stdout as well as a message on stderr.
    A batch of long-term work (run beside the turns) that fails is a line on stderr, and exit 1.
    """
    for stream in (sys.stdout, sys.stderr):  # a character the terminal cannot show is no crash
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="replace")
    chat.prepare_in_background()  # litellm, the models, the indexes: while the user types
    state = "new session" if is_new else "resumed session"
    output.info(
        f"memcli chat: {state} {chat.session_id} (user {chat.user_id}); resume with"
        f" {resume_args(chat)}"
    )
    if chat.tools is not None and not chat.offline:
        output.info(
            "Memory tools are on: the model may search memory and list, add, update and delete"
            " facts; each call is shown here."
        )
    if chat.offline:
        from memcli.chat.offline import MODEL_HINT

        output.info(f"No model is configured: replies come from memory alone. {MODEL_HINT}.")
    _say_failures(chat)
    try:
        code = _read_turns(chat, commands, json_)
    finally:
        _leave(chat)
    failed = chat.longterm is not None and chat.longterm.status().failed
    return max(code, 1) if failed else code


def _read_turns(chat: Chat, commands: Commands, json_: bool) -> int:
    """Play stdin's lines as turns and commands; return the exit code."""
    from memcli.errors import MemcliError

    code = 0
    for number, (line, is_damaged, over) in enumerate(stdin_lines(lambda: line_limit(chat)), 1):
        if over:
            refused = line_too_long(number, over, line_limit(chat))
            output.print_error(refused)
            if json_:
                _error_record(chat, "message", refused, stored=False)
            code = max(code, 1)
            continue
        if is_damaged:
            output.info(
                f"Line {number} is not valid UTF-8: its undecodable bytes are kept as \ufffd."
            )
        if not line.strip():
            continue
        turn: Turn | None = None
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
            common.trim_heap()  # what the turn let go goes back to the system
        except MemcliError as error:
            output.print_error(error)
            if json_:
                failed = "message" if turn is not None else "command"
                stored = turn is not None and turn.user_stored
                _error_record(chat, failed, error, stored=stored)
            code = max(code, 1)
    return code


def _say_failures(chat: Chat) -> None:
    """One line on stderr for each job of long-term work that fails in the background."""
    if chat.longterm is None:
        return

    def on_fed(fed: Any) -> None:
        if fed.failed:
            n = fed.failed
            output.info(
                f"Long-term memory: {output.plural(n, 'batch')} failed and"
                f" {'stays' if n == 1 else 'stay'} pending ({fed.error}); `memcli blocks"
                " backfill` retries."
            )

    chat.longterm.on_fed = on_fed


def _leave(chat: Chat) -> None:
    """Quit without waiting for long-term work: say what is left (it stays in the store)."""
    from memcli.blocks.background import left_note

    note = left_note(chat.close(), chat.session_id, chat.user_id)
    if note is not None:
        output.info(note)


#: The longest line plain mode reads, in bytes, whatever the budget (a budget's token_limit
#: times LINE_BYTES_PER_TOKEN, when that is more).
MIN_LINE_BYTES = 256 * 1024
#: Bytes a token may take on average in a line that still fits the budget (English prose: ~4).
LINE_BYTES_PER_TOKEN = 8
_CHUNK = 64 * 1024


def line_limit(chat: Chat) -> int:
    """The longest line plain mode reads whole, in bytes: room for a message as large as the
    session's budget allows (its token_limit), at most 8 bytes a token, and at least 256 KiB.
    A longer line could only be refused (`Chat.check_fits`): it is skipped unread."""
    return max(MIN_LINE_BYTES, chat.mem.budget.token_limit * LINE_BYTES_PER_TOKEN)


def line_too_long(number: int, size: int, limit: int) -> UsageError:
    """The error for a line of stdin over `line_limit`."""
    from memcli.errors import UsageError

    return UsageError(
        f"line {number} is {size:,} bytes, over the {limit:,} bytes a message may have in plain"
        " mode (this session's budget); it was neither read whole, sent nor stored",
        "Send it in smaller parts, or chat in a session with a larger budget (--token-limit)",
    )


def stdin_lines(limit: Callable[[], int]) -> Iterator[tuple[str, bool, int]]:
    """stdin's lines without their line ends, read as UTF-8 whatever the locale, each with
    whether it was damaged: bytes that are not UTF-8 become U+FFFD and never stop the chat.

    A line over `limit()` bytes is never held whole: it is read past in chunks and given as
    ("", False, its size in bytes); every other line as (text, damaged, 0)."""
    from memcli.chat.session import readable

    binary = getattr(sys.stdin, "buffer", None)
    if binary is None:  # a text stream without bytes underneath (an embedding program's)
        for text in sys.stdin:
            clean = readable(text.rstrip("\r\n"))
            yield clean, clean != text.rstrip("\r\n"), 0
        return
    while True:
        most = limit()
        raw = binary.readline(most + 2)  # (+2: the line end)
        if not raw:
            return
        if len(raw.rstrip(b"\r\n")) > most:
            size = len(raw.rstrip(b"\r\n"))
            while not raw.endswith(b"\n"):  # the rest of the line, read and dropped
                raw = binary.readline(_CHUNK)
                if not raw:
                    break
                size += len(raw.rstrip(b"\r\n"))
            yield "", False, size
            continue
        raw = raw.rstrip(b"\r\n")
        try:
            yield raw.decode("utf-8"), False, 0
        except UnicodeDecodeError:
            yield raw.decode("utf-8", errors="replace"), True, 0


def play(chat: Chat, turn: Turn, json_: bool) -> bool:
    """Run a turn, streaming the reply to stdout; False when the LLM call failed."""
    from memcli.chat.session import (
        ReplyDone,
        ReplyFailed,
        ReplyPiece,
        ToolCalled,
        ToolsUnavailable,
        UserStored,
    )

    written = ""
    try:
        for event in turn.events():
            if isinstance(event, UserStored):
                _note_flushes(event.flushes)
            elif isinstance(event, ReplyPiece) and not json_:
                sys.stdout.write(event.text)
                sys.stdout.flush()
                written += event.text
            elif isinstance(event, ToolCalled):
                if written and not written.endswith("\n"):  # text the model wrote before it
                    sys.stdout.write("\n")
                    written += "\n"
                _tool_called(chat, event.result, json_)
            elif isinstance(event, ToolsUnavailable):
                output.info(event.text)
            elif isinstance(event, ReplyDone):
                _done(chat, event, json_, written)
                _note_flushes(event.flushes)
            elif isinstance(event, ReplyFailed):
                if written:
                    _end_reply(written)
                output.print_error(event.error)
                output.info("Your message is kept in memory; send /retry to try again.")
                if json_:
                    _error_record(chat, "reply", event.error, stored=True, partial=event.partial)
                return False
    except KeyboardInterrupt:
        done = turn.interrupt()
        if done is None and turn.user_stored:
            done = ReplyDone("", cancelled=True)  # cancelled before the reply began
        if json_ and done is not None:
            _done(chat, done, json_, written)
        elif written:
            _end_reply(written)
        if done is not None and done.message is not None:
            output.info("Cancelled: the partial reply is kept, marked as cancelled.")
        raise
    return True


def _done(chat: Chat, event: Any, json_: bool, written: str) -> None:
    """A reply is over: its record (`--json`), or its end on stdout. `pending` counts the
    flushed batches the blocks must still process (an extraction failed; see `memcli check`)."""
    if event.note:
        output.info(event.note + ".")
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
                "note": event.note or None,
                "pending": _pending(chat),
            }
        )
        sys.stdout.flush()
    else:
        _end_reply(written)


def _pending(chat: Chat) -> int | None:
    """The flushed batches the blocks must still process; None when the store cannot say (a
    record about a failure must not fail itself)."""
    from memcli.chat.view import pending_work
    from memcli.errors import MemcliError

    try:
        return pending_work(chat).batches
    except MemcliError:
        return None


def _tool_called(chat: Chat, result: Any, json_: bool) -> None:
    """A memory tool call: a dim line on stderr (`→ add_fact(text="...") ✓ fact 12`), and with
    `--json` a `{"type": "tool_call"}` record with the arguments and the result."""
    from memcli.chat.view import tool_line

    output.err().print(
        tool_line(result), style="dim", markup=False, highlight=False, soft_wrap=True
    )
    if json_:
        output.emit(
            {
                "type": "tool_call",
                "session": chat.session_id,
                "id": result.call_id,
                "name": result.name,
                "arguments": result.arguments,
                "ok": result.ok,
                "result": result.value if result.ok else None,
                "error": None if result.ok else result.value,
            }
        )
        sys.stdout.flush()


def _end_reply(written: str) -> None:
    """End a reply in plain mode: its last line, then one empty line (an empty reply too)."""
    sys.stdout.write("\n\n" if not written.endswith("\n") else "\n")
    sys.stdout.flush()


def _error_record(chat: Chat, failed: str, error: Any, *, stored: bool, partial: str = "") -> None:
    """A failed turn as a JSON Lines record: what failed (`reply`: the LLM call; `message`:
    storing the message; `command`: a slash command), the error, and whether the user message
    is in memory (then `/retry` sends it again)."""
    output.emit(
        {
            "type": "error",
            "session": chat.session_id,
            "failed": failed,
            "error": error.message,
            "hint": error.hint,
            "exit_code": error.exit_code,
            "user_message_stored": stored,
            "partial": partial,
            "pending": _pending(chat),
        }
    )
    sys.stdout.flush()


def _note_flushes(flushes: Any) -> None:
    for f in flushes:
        output.info(
            f"Flushed {output.plural(len(f.message_ids), 'message')}"
            f" ({output.plural(f.tokens, 'token')}) to long-term memory."
        )

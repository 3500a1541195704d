"""The chat's slash commands, UI-free: each returns text to show, and maybe a turn to run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from memcli.errors import UsageError
from memcli.words import plural

if TYPE_CHECKING:
    from memcli.chat.session import Chat, Turn
    from memcli.writer import Flush

#: Every command with what it does (the completion menu shows these).
COMMANDS: dict[str, str] = {
    "/help": "show the commands and keys",
    "/session": "show the session, or switch to (or start) session ID",
    "/new": "start a new session",
    "/title": "show the session's title, or give it TITLE",
    "/sessions": "list your sessions",
    "/context": "show exactly what the LLM is sent",
    "/blocks": "show each long-term block's content",
    "/facts": "show the facts long-term memory holds",
    "/search": "hybrid search (BM25 + vectors) of your messages, as `memcli search`; "
    "BM25 alone with no vector block",
    "/flush": "flush one batch out of short-term memory now",
    "/model": "show the model, or use NAME from now on",
    "/retry": "send the unanswered message again",
    "/reset": "delete this session's messages (asks to confirm)",
    "/exit": "quit (Ctrl-D too)",
}

#: The argument of each command that takes one (as usage metavars: optional in brackets).
ARGUMENTS: dict[str, str] = {
    "/session": "[ID]",
    "/title": "[TITLE]",
    "/search": "QUERY",
    "/model": "[NAME]",
}


def usage(name: str) -> str:
    """A command as it is typed: `/session [ID]`."""
    argument = ARGUMENTS.get(name)
    return f"{name} {argument}" if argument else name


#: The keys of the full-screen chat, with what each does.
KEY_LIST: dict[str, str] = {
    "Enter": "send (with the /command menu open: take the highlighted command)",
    "Alt+Enter, Esc Enter": "start a new line in the message",
    "Ctrl-C": "cancel the reply (then the latest queued message), or clear the line",
    "Ctrl-D": "quit, on an empty line (/exit too)",
    "PageUp, PageDown": "scroll the conversation a page back or forward",
    "Home, End": "the conversation's first line, its end (on an empty line; Ctrl too)",
    "F2": "hide or show the panels (hidden while the terminal is under 80 columns)",
    "Up, Down": "your earlier messages",
}


def help_lines() -> list[str]:
    """The slash commands, then the keys of the full-screen chat, one a line, aligned (what
    `/help` and `memcli chat --help` show)."""
    width = max(len(name) for name in [*map(usage, COMMANDS), *KEY_LIST])
    lines = [f"{usage(name).ljust(width)}  {text}" for name, text in COMMANDS.items()]
    lines += ["", "Keys (full-screen chat):"]
    lines += [f"{key.ljust(width)}  {does}" for key, does in KEY_LIST.items()]
    return lines


@dataclass
class Result:
    """What a command did: text to show, a turn to run, whether the session changed or chat ends."""

    text: str = ""
    turn: Turn | None = None
    flushes: tuple[Flush, ...] = ()  # what a /flush moved out of short-term memory
    exit: bool = False
    switched: bool = False
    changed: bool = False  # the memory changed (refresh the panels)


class Commands:
    """Runs slash commands against a Chat (on the chat's thread)."""

    def __init__(self, chat: Chat) -> None:
        self.chat = chat
        self._reset_armed: str | None = None
        self._table: dict[str, Callable[[str], Result]] = {
            "/help": self.help,
            "/session": self.session,
            "/new": self.new,
            "/title": self.title,
            "/sessions": self.sessions,
            "/context": self.context,
            "/blocks": self.blocks,
            "/facts": self.facts,
            "/search": self.search,
            "/flush": self.flush,
            "/model": self.model,
            "/retry": self.retry,
            "/reset": self.reset,
            "/exit": self.exit,
            "/quit": self.exit,
        }

    def run(self, line: str) -> Result:
        name, _, arg = line.strip().partition(" ")
        handler = self._table.get(name.lower())
        if handler is None:
            raise UsageError(f"unknown command {name!r}", "Type /help to see the commands")
        if handler != self.exit:  # (Chat.prepare_in_background: the blocks are its own till then)
            self.chat.wait_prepared()
        if handler != self.reset:
            self._reset_armed = None
        return handler(arg.strip())

    def help(self, arg: str) -> Result:
        return Result("\n".join(help_lines()))

    def session(self, arg: str) -> Result:
        chat = self.chat
        if not arg:
            info = chat.mem.session()
            return Result(
                f"Session {info.name} (user {info.user_id}):"
                f" {plural(info.active_messages, 'active message')},"
                f" {plural(info.active_tokens, 'token')} of {info.threshold:,.0f} threshold,"
                f" {info.archived_messages:,} archived in {plural(info.flushes, 'flush')}"
            )
        from memcli.messages import validate_session_id
        from memcli.store.base import by_prefix

        arg = validate_session_id(arg, "the session")
        named = by_prefix(chat.store, arg, chat.user_id)  # a unique start of one of the user's
        arg = named.name if named is not None else arg  # (else a new session of the user's)
        is_new = chat.open(arg)
        return Result(
            f"{'Started new' if is_new else 'Resumed'} session {chat.session_id}",
            switched=True,
            changed=True,
        )

    def new(self, arg: str) -> Result:
        self.chat.open(None)
        return Result(f"Started new session {self.chat.session_id}", switched=True, changed=True)

    def title(self, arg: str) -> Result:
        if not arg:
            title = self.chat.title
            if title is None:
                return Result("The session has no title yet: its first message gives it one.")
            return Result(f"Title: {title}")
        return Result(f"Title set: {self.chat.set_title(arg)}", changed=True)

    def sessions(self, arg: str) -> Result:
        infos = self.chat.store.list_sessions(self.chat.user_id)
        if not infos:
            return Result("No sessions yet.")
        infos.sort(key=lambda i: (i.last_at or i.updated_at, i.updated_at), reverse=True)
        lines = [
            f"{'*' if i.id == self.chat.mem.session_key else ' '} {i.name}"
            + (f" ({i.title})" if i.title else "")
            + f"  {i.active_messages} active, {i.archived_messages} archived,"
            f" {i.active_tokens:,} / {i.threshold:,.0f} tokens,"
            f" last message {(i.last_at or i.updated_at).astimezone():%Y-%m-%d %H:%M}"
            for i in infos
        ]
        return Result("\n".join(lines))

    def context(self, arg: str) -> Result:
        ready = self.chat.context()
        messages = ready.context.messages
        tokens = self.chat.mem.tokenizer
        go = "goes" if len(messages) == 1 else "go"
        parts = [f"{plural(len(messages), 'message')} {go} to the LLM:"]
        for m in messages:
            parts.append(f"── {m.role} ({plural(tokens.count(m.content), 'token')}) ──")
            parts.append(m.content)
        return Result("\n".join(parts), changed=True)

    def blocks(self, arg: str) -> Result:
        chat = self.chat
        if not chat.blocks:
            return Result("No long-term blocks are configured (see [[blocks]] in the config).")
        ready = chat.context()
        got = {b.name: b for b in ready.context.blocks}
        parts = []
        for block in chat.blocks:
            content = got.get(block.name)
            head = f"── {block.name} ({type(block).__name__}, priority {block.priority})"
            if content is None:
                parts.append(f"{head}: empty ──")
                continue
            cut = f", {content.truncated} by truncation" if content.truncated else ""
            parts.append(
                f"{head}: {content.tokens:,} of {plural(content.original_tokens, 'token')}{cut} ──"
            )
            parts.append(content.content)
        return Result("\n".join(parts), changed=True)

    def facts(self, arg: str) -> Result:
        """Every fact the session's fact blocks hold (with ids, for `memcli facts edit|rm`)."""
        from memcli.chat.view import facts_in
        from memcli.facts import Facts

        chat = self.chat
        facts = Facts(chat.store, chat.user_id, lambda _: chat.blocks, owner=chat.user_id)
        lines = []
        for name, found in facts.of_blocks(chat.mem.session_key):
            for fact in found:
                topics = f" ({', '.join(fact.topics)})" if fact.topics else ""
                lines.append(f"[{name}] #{fact.id} {fact.text}{topics}")
        if not lines:
            # Custom blocks may render <fact> lines too.
            ready = chat.context()
            lines = [f"[{b.name}] {f}" for b in ready.context.blocks for f in facts_in(b.content)]
        if not lines:
            return Result("No facts yet: facts come from a fact block as messages are flushed.")
        return Result("\n".join(lines), changed=True)

    def search(self, arg: str) -> Result:
        """The user's memory, searched as `memcli search` searches it (`Chat.search`)."""
        if not arg:
            raise UsageError("/search needs a query", "Example: /search green tea")
        result = self.chat.search(arg, k=5)
        if not result.hits:
            return Result(f"Nothing in memory matches {arg!r}.")
        noun = "hit" if len(result.hits) == 1 else "hits"
        lines = [f"{len(result.hits)} {noun} for {arg!r}:"]
        for hit in result.hits:
            flat = " ".join(hit.text.split())
            text = flat if len(flat) <= 160 else flat[:159] + "…"
            lines.append(f"{hit.score:.3f} {hit.session_id} #{hit.message_ids[0]}: {text}")
        return Result("\n".join(lines))

    def flush(self, arg: str) -> Result:
        flushes = self.chat.mem.flush_now()
        if not flushes:
            return Result("Nothing to flush: the newest complete turn always stays.")
        f = flushes[0]
        return Result(
            f"Flushed {plural(len(f.message_ids), 'message')} ({plural(f.tokens, 'token')}):"
            f" {f.reason}",
            changed=True,
            flushes=tuple(flushes),
        )

    def model(self, arg: str) -> Result:
        chat = self.chat
        if not arg:
            if chat.llm is None:
                from memcli.chat.offline import MODEL_HINT

                return Result(f"No model is configured (offline). {MODEL_HINT}.")
            from memcli.credentials import redact_url

            where = f" at {redact_url(chat.llm.api_base)}" if chat.llm.api_base else ""
            return Result(f"Model: {chat.llm.model}{where}")
        chat.set_model(arg)
        return Result(f"Model set to {arg} for this chat.")

    def retry(self, arg: str) -> Result:
        return Result(turn=self.chat.retry())

    def reset(self, arg: str) -> Result:
        chat = self.chat
        if self._reset_armed != chat.session_id:
            info = chat.mem.session()
            self._reset_armed = chat.session_id
            total = info.active_messages + info.archived_messages
            return Result(
                f"/reset deletes the {total} messages of session {info.name} (long-term blocks keep "
                "theirs). Type /reset again to confirm."
            )
        self._reset_armed = None
        count = chat.mem.reset()
        chat.last_context = None
        return Result(f"Deleted {count} messages of session {chat.session_id}.", changed=True)

    def exit(self, arg: str) -> Result:
        return Result(exit=True)


def complete(prefix: str) -> list[tuple[str, str]]:
    """The commands starting with `prefix`, with what each does."""
    return [(name, text) for name, text in COMMANDS.items() if name.startswith(prefix.lower())]

"""The full-screen chat: prompt-toolkit layout and keys, a worker thread for everything that touches
the store, and the conversation as formatted text. The panels are drawn by panels.py (rich).

The UI thread never touches the store: jobs (turns, commands, the warm-up that loads litellm and
the blocks' models) run in order on one worker thread, and post their results back to the event
loop. Nothing polls: the screen is redrawn when an event arrives or a key is pressed.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memcli.chat import view
from memcli.chat.session import (
    ReplyDone,
    ReplyFailed,
    ReplyPiece,
    ToolCalled,
    ToolsUnavailable,
    UserStored,
    readable,
)
from memcli.cli.chat.panels import (
    Entry,
    history_entries,
    render_long,
    render_short,
)
from memcli.cli.chat.panels import conversation as render_conversation
from memcli.cli.common import trim_heap
from memcli.cli.output import plural
from memcli.errors import MemcliError

if TYPE_CHECKING:
    from prompt_toolkit.formatted_text import StyleAndTextTuples

    from memcli.chat.commands import Commands, Result
    from memcli.chat.session import Chat, ContextReady, Turn


#: Said when Ctrl-C finds nothing to cancel and nothing to clear.
QUIT_HINT = "Nothing to cancel: Ctrl-D or /exit quits."

#: The memory tools whose successful call changes the facts the long-term panel shows.
CHANGING_TOOLS = frozenset(("add_fact", "update_fact", "delete_fact"))


def _short(text: str, width: int = 40) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


class Worker:
    """One daemon thread that runs jobs in order (every job that touches the store)."""

    def __init__(self, on_error: Callable[[BaseException], None]) -> None:
        self.jobs: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self.on_error = on_error
        self.idle = threading.Event()
        self.idle.set()
        self.running = False
        self.thread = threading.Thread(target=self._run, name="memcli-chat", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        self.idle.clear()
        self.jobs.put(job)

    def drop_queued(self) -> None:
        """Forget the jobs not started yet."""
        while True:
            try:
                self.jobs.get_nowait()
            except queue.Empty:
                break
        if self.jobs.empty() and not self.running:
            self.idle.set()

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            self.running = True
            try:
                job()
            except BaseException as error:  # shown in the conversation; the chat goes on
                self.on_error(error)
            finally:
                self.running = False
                trim_heap()  # what the turn (or command) let go goes back to the system
            if self.jobs.empty():
                self.idle.set()


#: What the status line calls the parts the chat prepares (`_warm_up`): the model's client is
#: litellm only for providers that need it (an OpenAI-compatible server's is a light one).
LOADING_NAMES = {"blocks": "the memory blocks", "litellm": "the model's client"}


class ChatApp:
    """The prompt-toolkit application around a Chat."""

    def __init__(
        self,
        chat: Chat,
        commands: Commands,
        is_new: bool,
        history_path: Path | None = None,
        input: Any = None,
        output: Any = None,
        db_label: str | None = None,
    ) -> None:
        self.chat = chat
        self.commands = commands
        self.db_label = db_label or str(getattr(chat.store, "where", ""))
        self.entries: list[Entry] = []
        self.live_flushes: list[view.FlushMark] = []
        self.panels = view.panels(chat)  # read before the worker starts: the first screen has it
        self.session_ids = [i.name for i in chat.store.list_sessions(chat.user_id)]
        self.turn: Turn | None = None  # the turn being played (set by the worker)
        self.pending = 0  # messages and commands submitted and not finished
        self.queued: list[Turn] = []  # turns submitted and not started
        self.loading: set[str] = set()
        self.warmed = threading.Event()  # set once litellm and the blocks are loaded
        self.scroll_back = 0  # lines scrolled back from the end of the conversation
        self.max_scroll = 0  # the most it can be (the lines above the screen), at the last redraw
        self.show_panels = True  # F2 toggles; crossing NARROW columns shows or hides them
        self.narrow = False  # the terminal's width below NARROW at the last redraw
        self.exit_code = 0  # 1 once a turn or a command failed (as in plain mode)
        self.queue_note: Entry | None = None  # "N queued messages wait": gone once they start
        self.conversation_size: Callable[[], tuple[int, int]] = lambda: (80, 24)  # by the layout
        self.timings: dict[str, float] = {}
        self.left = 0  # batches of long-term work left unfed on quitting
        self._drawn: dict[str, tuple[Any, Any]] = {}
        self._wrapped: dict[int, tuple[Any, StyleAndTextTuples]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.worker = Worker(lambda e: self.post(lambda: self._failed_job(e)))
        self._welcome(is_new)
        from memcli.cli.chat.layout import build_application

        self.app = build_application(self, history_path, input, output)
        if self.panels_shown() is False:
            self.note("The panels are hidden on this narrow terminal: F2 shows them.")

    # -- running ----------------------------------------------------------------------------------

    def run(self) -> int:
        """Run until the user quits; the exit code: 1 when a turn or a command failed."""
        self.app.run(pre_run=self._started, handle_sigint=False)
        self._stop()
        return self.exit_code

    def panels_shown(self) -> bool:
        """Whether the panels are drawn: hidden when the terminal gets narrower than NARROW
        columns, shown again when it gets wide (F2 decides in between)."""
        from memcli.cli.chat.layout import NARROW

        narrow = self.app.output.get_size().columns < NARROW
        if narrow != self.narrow:
            self.narrow = narrow
            self.show_panels = not narrow
        return self.show_panels

    def _started(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.worker.start()
        if self.chat.longterm is not None:
            self.chat.longterm.on_fed = self._fed
        self.app.after_render += self._first_render

    def _first_render(self, _: Any) -> None:
        """Start loading litellm and the blocks' models once the first screen is up, not before:
        imports hold the interpreter's lock and would delay it."""
        self.app.after_render -= self._first_render
        self._warm_up()
        self.app.invalidate()  # the status line says what is loading

    def _stop(self) -> None:
        """Leaving: drop queued jobs; a reply being generated is cancelled and stored, marked.
        Long-term work is not waited for: `left` batches stay unfed, in the store."""
        self.worker.drop_queued()
        turn = self.turn
        if turn is not None:
            turn.cancel()
        if turn is not None or self.pending:
            self.worker.idle.wait(timeout=5)
        self.left = self.chat.close()

    def _fed(self, fed: Any) -> None:
        """(On the long-term thread.) A job of long-term work ended: the panels are read again
        (the blocks asked anew: a fact extracted shows at once; a failure shows as pending)."""
        self.worker.submit(lambda: self._refresh_panels(reassemble=True))

    def post(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the UI thread (from any thread), then redraw."""

        def apply() -> None:
            fn()
            self.app.invalidate()

        if self._loop is None or self._loop.is_closed():
            fn()
            return
        self._loop.call_soon_threadsafe(apply)

    def _warm_up(self) -> None:
        """Prepare the chat on a thread of its own (Chat.prepare_in_background: the blocks'
        models and litellm); the status line says what is loading. The worker waits for it,
        so the jobs queued meanwhile (the first turn) find it done."""
        if not self.chat.offline:
            self.loading.add("litellm")
        if self.chat.blocks:
            self.loading.add("blocks")
            self._say_when_preparing()

        def step(part: str) -> None:  # (on the preparing thread: the store is its own till done)
            try:
                if part == "blocks" and self.chat.blocks:
                    self._refresh_panels()
            except Exception as error:  # shown in the conversation, as a worker's job's
                failed = error
                self.post(lambda: self._failed_job(failed))
            self.post(lambda: self._loaded(part))

        def ready() -> None:
            try:
                self.chat.wait_prepared()
            finally:
                self.post(lambda: self._loaded("blocks", "litellm"))

        self.chat.prepare_in_background(step)
        self.worker.submit(ready)

    def _say_when_preparing(self) -> None:
        """The embedding model's first export (seconds) is told in the conversation: stderr,
        where other commands say it, goes to the log while the app runs."""
        from memcli.cli.common import PREPARING

        for block in self.chat.blocks:
            embedder: Any = getattr(block, "embedder", None)
            if hasattr(embedder, "on_prepare"):
                embedder.on_prepare = lambda: self.post(lambda: self.note(PREPARING))

    def _loaded(self, *parts: str) -> None:
        self.loading.difference_update(parts)
        self._check_warm()

    def _check_warm(self) -> None:
        if not self.loading:
            self.warmed.set()

    # -- input ------------------------------------------------------------------------------------

    def submit(self, text: str) -> bool:
        """Enter: send a message or run a command (queued behind the one running, if any)."""
        text = readable(text).strip()  # undecodable input is shown and stored as U+FFFD
        if not text:
            return False
        self.scroll_back = 0
        if text.split()[0].lower() in ("/exit", "/quit"):
            self.app.exit()
            return True
        self.pending += 1
        if text.startswith("/"):
            self.entries.append(Entry("command", text))
            self.worker.submit(lambda: self._command(text))
            return True
        self.timings["enter"] = time.perf_counter()
        self.timings.pop("first_piece", None)
        turn = self.chat.send(text)
        self.queued.append(turn)
        self.entries.append(Entry("user", text))
        reply = Entry("assistant", "", "waiting")
        self.entries.append(reply)
        self.worker.submit(lambda: self._play(turn, reply))
        return True

    def cancel_or_clear(self, buffer: Any) -> None:
        """Ctrl-C: cancel the reply being generated (its connection is closed at once), else
        the latest message waiting for its turn, else clear the line."""
        if self.turn is not None:
            turn = self.turn
            waiting = len(self.queued)  # before the cancel: the next turn may start at once
            turn.cancel()
            if waiting:
                self.note(f"Cancelled the reply to “{_short(turn.text or '/retry')}”.")
                self._clear_queue_note()
                self.queue_note = Entry(
                    "note",
                    f"{waiting} queued {'message waits' if waiting == 1 else 'messages wait'}"
                    " (Ctrl-C again cancels the latest).",
                )
                self.entries.append(self.queue_note)
        elif self.queued:
            latest = self.queued[-1]
            latest.cancel()  # the latest message still waiting for its turn
            self.note(
                f"Cancelled “{_short(latest.text or '')}” before it was sent (kept; /retry sends it)."
            )
        elif buffer.text:
            buffer.reset()
        elif not (self.entries and self.entries[-1].text == QUIT_HINT):  # said once in a row
            self.note(QUIT_HINT)

    def _clear_queue_note(self) -> None:
        """The queued messages the note counted have started: it is no longer true."""
        if self.queue_note is not None and self.queue_note in self.entries:
            self.entries.remove(self.queue_note)
        self.queue_note = None

    def scroll(self, lines: int) -> None:
        """Scroll the conversation back (up) by `lines`, or forward when negative; it stops at
        the first line and at the end."""
        self.scroll_back = min(self.max_scroll, max(0, self.scroll_back + lines))

    def scroll_to_top(self) -> None:
        self.scroll_back = self.max_scroll

    def note(self, text: str, kind: str = "note") -> None:
        self.entries.append(Entry(kind, text))

    # -- jobs (worker thread) ---------------------------------------------------------------------

    def _command(self, line: str) -> None:
        try:
            result = self.commands.run(line)
            if result.switched:
                ids = [i.name for i in self.chat.store.list_sessions(self.chat.user_id)]
                self.live_flushes = []
                earlier = history_entries(self.chat.mem.get_all(status="active"))
                self.post(lambda: setattr(self, "session_ids", ids))
                self.post(lambda: self.entries.extend(earlier))
            if result.flushes:  # a manual /flush: a mark in the Short-term panel as well
                self.live_flushes.extend(view.flush_marks(list(result.flushes), live=True))
            if result.changed or result.switched:
                self._refresh_panels(reassemble=True)
        except MemcliError as error:
            self.post(lambda e=error: self._error(e))  # type: ignore[misc]
            self.post(self._finished)
            return
        except BaseException:
            self.post(self._finished)
            raise
        self.post(lambda: self._command_done(result))
        if result.turn is None:
            self.post(self._finished)
            return
        reply = Entry("assistant", "", "waiting")
        self.post(lambda: self.entries.append(reply))
        self._play(result.turn, reply)

    def _play(self, turn: Turn, reply: Entry) -> None:
        self.turn = turn
        if turn in self.queued:
            self.queued.remove(turn)
        if not self.queued:
            self.post(self._clear_queue_note)
        # The entry the reply streams into; after a memory tool call, a new one below its line
        # (replaced on the UI thread, where the posts that use it run in order).
        current = [reply]
        try:
            for event in turn.events():
                if isinstance(event, ReplyPiece):
                    self.post(lambda t=event.text: self._piece(current[0], t))  # type: ignore[misc]
                elif isinstance(event, ToolCalled):
                    line = view.tool_line(event.result)
                    self.post(lambda t=line: self._tool_called(current, t))  # type: ignore[misc]
                    if event.result.ok and event.result.name in CHANGING_TOOLS:
                        self._refresh_panels(reassemble=True)  # the fact shows at once
                elif isinstance(event, ToolsUnavailable):
                    self.post(lambda t=event.text: self.note(t))  # type: ignore[misc]
                elif isinstance(event, UserStored):
                    self._flushed(event.flushes)
                    short = view.short_term(self.chat, self.live_flushes)
                    self.post(lambda s=short: self._set_short(s))  # type: ignore[misc]
                elif isinstance(event, ReplyDone):
                    self.post(lambda e=event: self._reply_done(current[0], e))  # type: ignore[misc]
                    self._flushed(event.flushes)
                    # Storing the reply may have flushed: the blocks were fed (facts extracted,
                    # or the extraction failed), so the long-term panel is assembled again.
                    self._refresh_panels(reassemble=bool(event.flushes))
                elif isinstance(event, ReplyFailed):
                    self.post(lambda e=event: self._reply_failed(current[0], e))  # type: ignore[misc]
                    self._refresh_panels()
                else:
                    self._context_ready(event)
        except MemcliError as error:
            if turn.user_stored:
                raise  # (the worker shows it)
            # Refused before it was stored (over the session's budget): no reply to wait for.
            self.post(lambda e=error: self._refused(reply, e))  # type: ignore[misc]
        finally:
            self.turn = None
            self.post(self._finished)

    def _context_ready(self, event: ContextReady) -> None:
        longs = view.long_term(self.chat)
        work = view.pending_work(self.chat)
        if longs != self.panels.long or work != self.panels.pending:
            # (unchanged, as with static blocks: no redraw in the reply's way)
            self.post(lambda: setattr(self, "panels", view.Panels(self.panels.short, longs, work)))

    def _flushed(self, flushes: Iterable[Any]) -> None:
        marks = view.flush_marks(list(flushes), live=True)
        if not marks:
            return
        self.live_flushes.extend(marks)
        for m in marks:
            text = (
                f"⇣ flushed {plural(m.messages, 'message')} ({plural(m.tokens, 'token')})"
                " to long-term memory"
            )
            self.post(lambda t=text: self.note(t, "flush"))  # type: ignore[misc]

    def _refresh_panels(self, reassemble: bool = False) -> None:
        """Read the panels again (on the worker); with `reassemble`, after memory changed
        (a flush fed the blocks, a fact changed, /reset, another session), the blocks are asked
        again, so the long-term panel shows what they hold now, not at the last turn."""
        if reassemble and self.chat.blocks:
            self.chat.context()
        fresh = view.panels(self.chat, self.live_flushes)
        self.post(lambda: setattr(self, "panels", fresh))

    # -- applying results (UI thread) -------------------------------------------------------------

    def _set_short(self, short: view.ShortTerm) -> None:
        self.panels = view.Panels(short, self.panels.long, self.panels.pending)

    def _piece(self, reply: Entry, text: str) -> None:
        if "first_piece" not in self.timings:
            self.timings["first_piece"] = time.perf_counter()
        reply.text += text
        reply.mark = "streaming"

    def _tool_called(self, current: list[Entry], line: str) -> None:
        """A memory tool call's dim line, below what the model wrote before it (or in place of
        the waiting reply); the rest of the reply streams into a new entry below it."""
        reply, tool = current[0], Entry("tool", line)
        if reply.text:
            reply.mark = ""
            self.entries.append(tool)
        else:
            self.entries[self.entries.index(reply)] = tool
        current[0] = Entry("assistant", "", "waiting")
        self.entries.append(current[0])

    def _reply_done(self, reply: Entry, event: ReplyDone) -> None:
        if event.note:
            self.note(event.note + ".")
        reply.text = event.text
        if event.cancelled:
            reply.mark = "cancelled" if event.text else "cancelled-empty"
        else:
            reply.mark = "offline" if event.offline else ""

    def _refused(self, reply: Entry, error: MemcliError) -> None:
        """A message refused before it was stored: its reply entry goes, the error says why."""
        if reply in self.entries:
            self.entries.remove(reply)
        self._error(error)

    def _reply_failed(self, reply: Entry, event: ReplyFailed) -> None:
        reply.text = event.partial
        reply.mark = "failed"
        self._error(event.error)
        self.note("Your message is kept in memory; type /retry to send it again.")

    def _command_done(self, result: Result) -> None:
        if result.text:
            self.note(result.text)
        if result.exit:
            self.app.exit()

    def _error(self, error: MemcliError) -> None:
        self.exit_code = 1  # a failed turn or command: the chat exits 1, as in plain mode
        text = str(error)  # (MemcliError joins message and hint, minding the message's own stop)
        self.note(text if text.endswith((".", "!", "?")) else text + ".", "error")

    def _failed_job(self, error: BaseException) -> None:
        if isinstance(error, MemcliError):
            self._error(error)
        else:
            self.exit_code = 1
            self.note(f"Internal error: {type(error).__name__}: {error}", "error")
        self.turn = None

    def _finished(self) -> None:
        self.pending = max(0, self.pending - 1)

    def _welcome(self, is_new: bool) -> None:
        sid = self.chat.session_id
        if not is_new:
            self.entries.extend(history_entries(self.panels.short.messages))
        state = "New session" if is_new else "Resumed session"
        self.note(
            f"{state} {sid} · resume it later with `memcli chat --session {sid}` · /help lists commands"
        )
        if self.chat.tools is not None and not self.chat.offline:
            self.note(
                "Memory tools are on: the model may search memory and list, add, update and"
                " delete facts; each call is shown here."
            )
        if self.chat.offline:
            from memcli.chat.offline import MODEL_HINT

            self.note(
                f"No model is configured: chat runs offline and replies from memory. {MODEL_HINT}."
            )

    # -- drawing ----------------------------------------------------------------------------------

    def status(self) -> str:
        model = self.chat.model or "offline (no model)"
        state = "ready"
        if self.loading:
            parts = sorted(LOADING_NAMES.get(part, part) for part in self.loading)
            state = "loading " + " and ".join(parts) + "…"
        if self.turn is not None:
            state = "replying… Ctrl-C cancels"
        elif self.pending:
            state = "working…"
        work = self.panels.pending.text
        trouble = f" · ⚠ {work}" if work else ""
        longterm = self.chat.longterm.status().text if self.chat.longterm is not None else ""
        if longterm:  # e.g. "long-term: 1 batch in progress"
            trouble = f" · {longterm}{trouble}"
        if self.scroll_back:
            state += f" · scrolled back {self.scroll_back} lines (End returns)"
        return (
            f" {state}{trouble} · session {self.chat.session_id} · user {self.chat.user_id}"
            f" · model {model} · db {self.db_label}"
        )

    def drawn(self, name: str, width: int, height: int) -> Any:
        """A panel as prompt-toolkit text, redrawn with rich only when its data or size changed."""
        from prompt_toolkit.formatted_text import ANSI

        data = self.panels.short if name == "short" else self.panels.long
        loading = "blocks" in self.loading
        key = (data, width, height, loading)
        cached = self._drawn.get(name)
        if cached is not None and (cached[0] is key or cached[0] == key):
            return cached[1]
        if name == "short":
            text = render_short(self.panels.short, width, height)
        else:
            text = render_long(self.panels.long, width, loading)
        value = ANSI(text)
        self._drawn[name] = (key, value)
        return value

    def conversation(self) -> StyleAndTextTuples:
        """The lines of the conversation that fit the screen: the last ones, or the ones
        `scroll_back` lines above them (clamped: the view stops at the first line)."""
        from prompt_toolkit.formatted_text.utils import split_lines

        width, height = self.conversation_size()
        lines = list(split_lines(render_conversation(self.entries, width, self._wrapped)))
        if lines and not lines[-1]:
            lines.pop()  # the empty end of the last entry's "\n\n"
        self.max_scroll = max(0, len(lines) - height)
        self.scroll_back = min(self.scroll_back, self.max_scroll)
        end = len(lines) - self.scroll_back
        shown: StyleAndTextTuples = []
        for i, line in enumerate(lines[max(0, end - height) : end]):
            if i:
                shown.append(("", "\n"))
            shown.extend(line)
        return shown

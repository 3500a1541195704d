"""The chat's prompt-toolkit layout, keys and completion (imported only when the REPL starts)."""
# ruff: noqa: TID253  (imported only when the REPL starts, from ui.py)

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prompt_toolkit.application import Application
from prompt_toolkit.buffer import Buffer
from prompt_toolkit.completion import CompleteEvent, Completer, Completion
from prompt_toolkit.document import Document
from prompt_toolkit.filters import Condition, has_focus
from prompt_toolkit.history import FileHistory, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings
from prompt_toolkit.layout import (
    ConditionalContainer,
    Float,
    FloatContainer,
    HSplit,
    Layout,
    VSplit,
    Window,
)
from prompt_toolkit.layout.controls import BufferControl, FormattedTextControl
from prompt_toolkit.layout.dimension import Dimension
from prompt_toolkit.layout.menus import CompletionsMenu
from prompt_toolkit.styles import Style

from memcli.chat.commands import complete, usage
from memcli.cli.output import plural

if TYPE_CHECKING:
    from memcli.cli.chat.ui import ChatApp

STYLE = Style.from_dict(
    {
        "user.label": "bold ansicyan",
        "user": "ansicyan",
        "assistant.label": "bold ansigreen",
        "mark": "italic ansiyellow",
        "note": "ansibrightblack",
        "command": "bold",
        "flush": "bold ansimagenta",
        "tool": "ansibrightblack",
        "error": "bold ansired",
        "status": "reverse",
        "prompt": "bold",
        "frame.label": "bold",
    }
)


class SlashCompleter(Completer):
    """Completes slash commands, then session ids after /session and models after /model."""

    def __init__(self, ui: ChatApp) -> None:
        self.ui = ui

    def get_completions(self, document: Document, event: CompleteEvent) -> Iterator[Completion]:
        text = document.text_before_cursor
        if not text.startswith("/") or "\n" in text:
            return
        if " " not in text:
            for name, meta in complete(text):
                yield Completion(
                    name, start_position=-len(text), display=usage(name), display_meta=meta
                )
            return
        command, _, arg = text.partition(" ")
        options: list[str] = []
        if command == "/session":
            options = self.ui.session_ids
        elif command == "/model":
            from memcli.chat.offline import DEFAULT_MODELS

            options = [m for m in (self.ui.chat.model,) if m] + list(DEFAULT_MODELS.values())
        for option in dict.fromkeys(options):
            if option.startswith(arg):
                yield Completion(option, start_position=-len(arg))


#: Below this many columns the panels are hidden (F2 shows them).
NARROW = 80
#: The most rows the message being typed takes; a longer one gets a preview line above it.
EDITOR_ROWS = 8


def wrapped_rows(text: str, width: int, most: int | None = None) -> int:
    """The rows `text` takes wrapped at `width` columns; with `most`, counted only until they
    are more than that (the editor asks at each redraw: a long paste is not read whole)."""
    width = max(1, width)
    rows = start = 0
    while True:
        end = text.find("\n", start)
        rows += max(1, -(-((len(text) if end < 0 else end) - start) // width))
        if end < 0 or (most is not None and rows > most):
            return rows
        start = end + 1


def draft_preview(text: str, width: int, rows: int, room: int) -> str:
    """A line about a message too long for the editor (`rows` rows of `width` columns): its
    length, its first and last characters, so that a long paste can be reviewed before Enter
    sends it (the editor shows only its end). Empty when the message fits. At most `room`
    characters."""
    if wrapped_rows(text, width, rows) <= rows:
        return ""
    size = f"{plural(len(text), 'character')}, {plural(text.count(chr(10)) + 1, 'line')}"
    tail = " · Enter sends it all, Ctrl-C clears"
    if (room - len(size) - len(tail) - 12) // 2 < 16:
        tail = ""  # a narrow screen: the message's ends come first
    ends = max(8, (room - len(size) - len(tail) - 12) // 2)
    # (the ends of the first and last lines, read no further than they can be shown)
    head = " ".join(text.partition("\n")[0][: 4 * room].split())
    last = " ".join(text.rpartition("\n")[2][-4 * room :].split())
    first = head if len(head) <= ends else head[: ends - 1] + "…"
    end = last if len(last) <= ends else "…" + last[-(ends - 1) :]
    out = f"{size}: “{first}” … “{end}”{tail}"
    return out if len(out) <= room else out[: max(1, room - 1)] + "…"


def panel_width(columns: int) -> int:
    """The panels' width with their separator: two fifths of the screen, 34 to 64 columns, and
    never more than half of a narrow screen."""
    return max(min(34, columns // 2), min(64, columns * 2 // 5))


def build_application(
    ui: ChatApp, history_path: Path | None, input: Any, output: Any
) -> Application[Any]:
    """The full-screen chat: the conversation with the message being typed below it, the panels
    of short-term and long-term memory beside it (F2), a status line at the bottom."""
    buffer = input_buffer(ui, history_path)
    sizes = Sizes(ui, buffer)
    ui.conversation_size = sizes.conversation
    app: Application[Any] = Application(
        layout=Layout(screen_container(ui, buffer, sizes), focused_element=buffer),
        key_bindings=key_bindings(ui, buffer, sizes),
        style=STYLE,
        full_screen=True,
        mouse_support=False,
        input=input,
        output=output,
        min_redraw_interval=0.01,
    )
    sizes.output = app.output
    return app


def input_buffer(ui: ChatApp, history_path: Path | None) -> Buffer:
    """The editor's buffer: several lines, the history file (in memory without one), slash
    commands completed as they are typed."""
    if history_path is not None:
        history_path.parent.mkdir(parents=True, exist_ok=True)
    history = FileHistory(str(history_path)) if history_path else InMemoryHistory()
    return Buffer(
        multiline=True,
        history=history,
        completer=SlashCompleter(ui),
        complete_while_typing=True,
        name="input",
    )


def key_bindings(ui: ChatApp, buffer: Buffer, sizes: Sizes) -> KeyBindings:
    """The chat's keys: those of the editor, then those that move through the conversation."""
    keys = KeyBindings()
    add_editor_keys(keys, ui, buffer)
    add_scroll_keys(keys, ui, buffer, sizes)
    return keys


def add_editor_keys(keys: KeyBindings, ui: ChatApp, buffer: Buffer) -> None:
    """Enter sends (or takes the completion shown), Esc Enter starts a new line, Ctrl-C cancels
    the turn or clears the editor, Ctrl-D deletes or quits."""
    typing = has_focus(buffer)

    @keys.add("enter", filter=typing)
    def _send(event: Any) -> None:
        state = buffer.complete_state
        if state is not None and state.current_completion is not None:
            buffer.apply_completion(state.current_completion)
            return
        if ui.submit(buffer.text):
            buffer.reset(append_to_history=True)

    @keys.add("escape", "enter", filter=typing)
    def _newline(event: Any) -> None:
        buffer.insert_text("\n")

    @keys.add("c-c")
    def _cancel(event: Any) -> None:
        ui.cancel_or_clear(buffer)

    @keys.add("c-d")
    def _quit(event: Any) -> None:
        if buffer.text:
            buffer.delete()
        else:
            event.app.exit()


def add_scroll_keys(keys: KeyBindings, ui: ChatApp, buffer: Buffer, sizes: Sizes) -> None:
    """PageUp/PageDown scroll the conversation a page, Home/End (the editor empty, or with
    Ctrl) go to its top and back to its end; F2 shows or hides the panels."""

    def page() -> int:
        return max(1, sizes.conversation()[1] - 2)

    @keys.add("pageup")
    def _up(event: Any) -> None:
        ui.scroll(page())

    @keys.add("pagedown")
    def _down(event: Any) -> None:
        ui.scroll(-page())

    empty = Condition(lambda: not buffer.text)

    @keys.add("home", filter=empty)
    @keys.add("c-home")
    def _top(event: Any) -> None:
        ui.scroll_to_top()

    @keys.add("end", filter=empty)
    @keys.add("c-end")
    def _bottom(event: Any) -> None:
        ui.scroll_back = 0

    @keys.add("f2")
    def _panels(event: Any) -> None:
        ui.show_panels = not ui.show_panels


def exact(cells: int) -> Dimension:
    """A size of exactly this many cells (at least one)."""
    return Dimension.exact(max(1, cells))


class Sizes:
    """The size of each part of the screen, read from the terminal at each redraw, so that a
    resize lays the screen out again. Every size is given exactly: prompt-toolkit shares out free
    space one cell at a time, which costs more than the rest of a redraw together."""

    def __init__(self, ui: ChatApp, buffer: Buffer) -> None:
        self.ui = ui
        self.buffer = buffer
        #: The application's output (set once it is made): the terminal's size.
        self.output: Any = None
        #: The last preview made (it is asked several times a redraw).
        self._previewed: dict[tuple[str, int, int], str] = {}

    def screen(self) -> tuple[int, int, int]:
        """Columns, rows above the status line, the panels' width with their separator (0 when
        hidden)."""
        size = self.output.get_size()
        columns = max(1, size.columns)
        panel = panel_width(columns) if self.ui.panels_shown() else 0
        return columns, max(3, size.rows - 1), panel

    def conversation(self) -> tuple[int, int]:
        """The conversation's columns and rows: what the editor, its preview line and the rule
        above them leave."""
        columns, rows, panel = self.screen()
        return max(1, columns - panel), max(
            1, rows - 1 - self.editor_height() - self.preview_height()
        )

    def editor_width(self) -> int:
        columns, _, panel = self.screen()
        return max(1, columns - panel - 2)

    def editor_height(self) -> int:
        """Its wrapped rows, up to EDITOR_ROWS (a long line shows more than its end)."""
        return min(EDITOR_ROWS, wrapped_rows(self.buffer.text, self.editor_width(), EDITOR_ROWS))

    def preview(self) -> str:
        """The line about a message too long for the editor (`draft_preview`), made once per
        text and width."""
        columns, _, panel = self.screen()
        key = (self.buffer.text, self.editor_width(), columns - panel)
        if key not in self._previewed:
            self._previewed.clear()
            self._previewed[key] = draft_preview(key[0], key[1], EDITOR_ROWS, key[2])
        return self._previewed[key]

    def preview_height(self) -> int:
        return 1 if self.preview() else 0

    def panel_height(self, name: str) -> int:
        """The rows of the short-term panel (half the screen) or of the long-term one (the rest),
        their title rules included."""
        rows = self.screen()[1]
        short = max(3, rows // 2)
        return short if name == "short" else max(3, rows - short)


def screen_container(ui: ChatApp, buffer: Buffer, sizes: Sizes) -> FloatContainer:
    """The conversation column beside the panels (when shown), the status line below them, and
    the completion menu at the cursor."""
    right = HSplit([panel(ui, sizes, "short", "Short-term"), panel(ui, sizes, "long", "Long-term")])
    separator = Window(
        width=1, height=lambda: exact(sizes.screen()[1]), char="│", style="class:note"
    )
    shown = Condition(ui.panels_shown)
    status = Window(
        FormattedTextControl(lambda: [("class:status", ui.status())]),
        height=1,
        width=lambda: exact(sizes.screen()[0]),
        style="class:status",
    )
    return FloatContainer(
        HSplit(
            [
                VSplit(
                    [
                        conversation_column(ui, buffer, sizes),
                        ConditionalContainer(separator, filter=shown),
                        ConditionalContainer(right, filter=shown),
                    ]
                ),
                status,
            ]
        ),
        floats=[
            Float(
                xcursor=True,
                ycursor=True,
                content=ConditionalContainer(
                    CompletionsMenu(max_height=12, scroll_offset=1), filter=has_focus(buffer)
                ),
            )
        ],
    )


def conversation_column(ui: ChatApp, buffer: Buffer, sizes: Sizes) -> HSplit:
    """The conversation, a rule, the preview line of a message too long for the editor (when
    there is one), and the editor with its prompt."""
    conversation = Window(
        FormattedTextControl(ui.conversation, focusable=False),
        wrap_lines=True,
        always_hide_cursor=True,
        width=lambda: exact(sizes.conversation()[0]),
        height=lambda: exact(sizes.conversation()[1]),
    )
    prompt = Window(FormattedTextControl([("class:prompt", "› ")]), width=2, height=1)
    editor = VSplit(
        [
            prompt,
            Window(
                BufferControl(buffer),
                height=lambda: exact(sizes.editor_height()),
                width=lambda: exact(sizes.screen()[0] - sizes.screen()[2] - 2),
                wrap_lines=True,
            ),
        ]
    )
    rule = Window(
        height=1,
        width=lambda: exact(sizes.screen()[0] - sizes.screen()[2]),
        char="─",
        style="class:note",
    )
    pasted = ConditionalContainer(
        Window(
            FormattedTextControl(lambda: [("class:note", sizes.preview())]),
            height=1,
            width=lambda: exact(sizes.screen()[0] - sizes.screen()[2]),
        ),
        filter=Condition(lambda: bool(sizes.preview())),
    )
    return HSplit([conversation, rule, pasted, editor])


def panel(ui: ChatApp, sizes: Sizes, name: str, title: str) -> HSplit:
    """A titled panel: a title rule, then the panel's text (cheaper to draw than a Frame)."""
    window: Window

    def text() -> Any:
        info = window.render_info
        width = info.window_width if info else sizes.screen()[2] - 1
        height = info.window_height if info else sizes.panel_height(name) - 1
        return ui.drawn(name, width, height)

    def rule() -> Any:
        head = f"─ {title} "
        return [
            ("class:frame.label", head),
            ("class:note", "─" * (sizes.screen()[2] - 1 - len(head))),
        ]

    window = Window(
        FormattedTextControl(text, focusable=False),
        wrap_lines=False,
        width=lambda: exact(sizes.screen()[2] - 1),
        height=lambda: exact(sizes.panel_height(name) - 1),
    )
    heading = Window(
        FormattedTextControl(rule), height=1, width=lambda: exact(sizes.screen()[2] - 1)
    )
    return HSplit([heading, window])

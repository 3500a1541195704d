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
    if history_path is not None:
        history_path.parent.mkdir(parents=True, exist_ok=True)
    history = FileHistory(str(history_path)) if history_path else InMemoryHistory()
    buffer = Buffer(
        multiline=True,
        history=history,
        completer=SlashCompleter(ui),
        complete_while_typing=True,
        name="input",
    )
    keys = KeyBindings()
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

    def page() -> int:
        return max(1, conversation_size()[1] - 2)

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

    # Every size is given exactly: prompt-toolkit shares out free space one cell at a time, which
    # costs more than the rest of a redraw together.
    def size() -> tuple[int, int, int]:
        """Columns, rows above the status line, the panels' width with their separator (0 when
        hidden). Read from the terminal at each redraw, so a resize lays the screen out again."""
        screen = app.output.get_size()
        columns = max(1, screen.columns)
        panel = panel_width(columns) if ui.panels_shown() else 0
        return columns, max(3, screen.rows - 1), panel

    def conversation_size() -> tuple[int, int]:
        columns, rows, panel = size()
        return max(1, columns - panel), max(1, rows - 1 - editor_height() - preview_height())

    def editor_width() -> int:
        columns, _, panel = size()
        return max(1, columns - panel - 2)

    previewed: dict[tuple[str, int, int], str] = {}  # the last one (asked several times a redraw)

    def preview() -> str:
        columns, _, panel = size()
        key = (buffer.text, editor_width(), columns - panel)
        if key not in previewed:
            previewed.clear()
            previewed[key] = draft_preview(key[0], key[1], EDITOR_ROWS, key[2])
        return previewed[key]

    def preview_height() -> int:
        return 1 if preview() else 0

    ui.conversation_size = conversation_size

    def exact(cells: int) -> Dimension:
        return Dimension.exact(max(1, cells))

    def editor_height() -> int:
        """Its wrapped rows, up to EDITOR_ROWS (a long line shows more than its end)."""
        return min(EDITOR_ROWS, wrapped_rows(buffer.text, editor_width(), EDITOR_ROWS))

    def panel_height(name: str) -> int:
        rows = size()[1]
        short = max(3, rows // 2)
        return short if name == "short" else max(3, rows - short)

    def panel(name: str, title: str) -> HSplit:
        """A titled panel: a title rule, then the panel's text (cheaper to draw than a Frame)."""
        window: Window

        def text() -> Any:
            info = window.render_info
            width = info.window_width if info else size()[2] - 1
            height = info.window_height if info else panel_height(name) - 1
            return ui.drawn(name, width, height)

        def rule() -> Any:
            head = f"─ {title} "
            return [("class:frame.label", head), ("class:note", "─" * (size()[2] - 1 - len(head)))]

        window = Window(
            FormattedTextControl(text, focusable=False),
            wrap_lines=False,
            width=lambda: exact(size()[2] - 1),
            height=lambda: exact(panel_height(name) - 1),
        )
        heading = Window(FormattedTextControl(rule), height=1, width=lambda: exact(size()[2] - 1))
        return HSplit([heading, window])

    conversation = Window(
        FormattedTextControl(ui.conversation, focusable=False),
        wrap_lines=True,
        always_hide_cursor=True,
        width=lambda: exact(conversation_size()[0]),
        height=lambda: exact(conversation_size()[1]),
    )
    prompt = Window(FormattedTextControl([("class:prompt", "› ")]), width=2, height=1)
    editor = VSplit(
        [
            prompt,
            Window(
                BufferControl(buffer),
                height=lambda: exact(editor_height()),
                width=lambda: exact(size()[0] - size()[2] - 2),
                wrap_lines=True,
            ),
        ]
    )
    rule = Window(
        height=1, width=lambda: exact(size()[0] - size()[2]), char="─", style="class:note"
    )
    pasted = ConditionalContainer(
        Window(
            FormattedTextControl(lambda: [("class:note", preview())]),
            height=1,
            width=lambda: exact(size()[0] - size()[2]),
        ),
        filter=Condition(lambda: bool(preview())),
    )
    left = HSplit([conversation, rule, pasted, editor])
    right = HSplit([panel("short", "Short-term"), panel("long", "Long-term")])
    separator = Window(width=1, height=lambda: exact(size()[1]), char="│", style="class:note")
    shown = Condition(ui.panels_shown)
    status = Window(
        FormattedTextControl(lambda: [("class:status", ui.status())]),
        height=1,
        width=lambda: exact(size()[0]),
        style="class:status",
    )
    body = FloatContainer(
        HSplit(
            [
                VSplit(
                    [
                        left,
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
                    CompletionsMenu(max_height=12, scroll_offset=1), filter=typing
                ),
            )
        ],
    )
    app: Application[Any] = Application(
        layout=Layout(body, focused_element=buffer),
        key_bindings=keys,
        style=STYLE,
        full_screen=True,
        mouse_support=False,
        input=input,
        output=output,
        min_redraw_interval=0.01,
    )
    return app

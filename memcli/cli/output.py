"""The output layer: consoles, JSON Lines, tables, errors. All styled output goes through here."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from memcli.words import plural

__all__ = ["plural"]  # besides what is defined here: how a count is said, as the engine says it

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence

    from rich.console import Console

    from memcli.errors import MemcliError


def _color_off() -> bool:
    return bool(os.environ.get("NO_COLOR")) or os.environ.get("TERM") == "dumb"


@lru_cache(maxsize=1)
def out() -> Console:
    """The console for data on stdout."""
    from rich.console import Console

    return Console(no_color=_color_off(), highlight=False, soft_wrap=False)


@lru_cache(maxsize=1)
def err() -> Console:
    """The console for messages, hints and progress on stderr."""
    from rich.console import Console

    return Console(stderr=True, no_color=_color_off(), highlight=False)


@contextmanager
def paged() -> Iterator[None]:
    """What the block prints on `out()`, through a pager when stdout is a terminal, as git does:
    $PAGER (run by the shell; empty or `cat`: none), else `less` with LESS=FRX unless LESS is
    set (output that fits the screen is just shown; colours pass). In a pipe, nothing changes."""
    import shlex
    import shutil
    import subprocess

    command = os.environ.get("PAGER", "less")
    if not stdout_is_tty() or command.strip() in ("", "cat"):
        yield
        return
    console = out()
    with console.capture() as captured:
        yield
    text = captured.get()
    if shutil.which(shlex.split(command)[0]) is None:  # no pager here: write it out
        sys.stdout.write(text)
        return
    env = {**os.environ, "LESS": os.environ.get("LESS", "FRX")}
    try:
        subprocess.run(command, shell=True, input=text.encode(), env=env, check=False)
    except OSError:
        sys.stdout.write(text)


def fit_streams() -> None:
    """stdout and stderr write a character their encoding cannot hold (a terminal set to latin-1
    or ASCII, PYTHONIOENCODING) as an escape (`\\U0001f389`), not as a UnicodeEncodeError; JSON
    Lines stay JSON (`emit`). A stream whose errors were chosen (`PYTHONIOENCODING=...:replace`)
    is left as it is."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", None) == "strict":
            if not _holds_all(getattr(stream, "encoding", None)):
                reconfigure(errors="backslashreplace")


@lru_cache(maxsize=8)
def _holds_all(encoding: str | None) -> bool:
    """Whether text in `encoding` can hold every character (UTF-8, UTF-16, ...)."""
    try:
        "\U0001f389\u65e5\u0416".encode(encoding or "utf-8")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def _json_escapes(error: UnicodeError) -> tuple[str, int]:
    """A codec error handler: what the encoding cannot hold, as JSON's `\\uXXXX` escapes."""
    assert isinstance(error, UnicodeEncodeError)
    import json

    text = error.object[error.start : error.end]
    return json.dumps(text)[1:-1], error.end


def stdout_is_tty() -> bool:
    return sys.stdout.isatty()


def stderr_is_tty() -> bool:
    return sys.stderr.isatty()


def wants_json(flag: bool) -> bool:
    """JSON Lines when asked for, or when stdout is not a terminal."""
    return flag or not stdout_is_tty()


def json_line(record: dict[str, Any]) -> str:
    from memcli.messages import to_json_line

    return to_json_line(record)


def emit(record: dict[str, Any]) -> None:
    """Write one JSON Lines record to stdout (on a stdout whose encoding cannot hold all of it,
    with the rest as JSON escapes: the same record, read back)."""
    line = json_line(record)
    encoding = getattr(sys.stdout, "encoding", None)
    if not _holds_all(encoding):
        import codecs

        codecs.register_error("memcli-json", _json_escapes)
        line = line.encode(encoding or "ascii", "memcli-json").decode(encoding or "ascii")
    sys.stdout.write(line + "\n")


def emit_all(records: Iterable[dict[str, Any]]) -> None:
    for record in records:
        emit(record)
    sys.stdout.flush()


def write(text: str) -> None:
    """Write text to stdout as it is (no markup, no styling): a format that is not JSON Lines."""
    sys.stdout.write(text)


def info(message: str) -> None:
    """A message for the person (stderr)."""
    err().print(message, markup=False, highlight=False, soft_wrap=True)


def note(message: str) -> None:
    """A styled message for the person (stderr); markup allowed."""
    err().print(message)


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """A rich table on stdout. Ids, session names and numbers (`WHOLE_COLUMNS`) are never cut:
    the free text wraps instead; a terminal too narrow for that gets each row as a paragraph.
    Columns that are all unnamed (`["", ""]`: a list of names and values) get no header row."""
    from rich.table import Table

    cells = [[cell if isinstance(cell, str) else _cell(cell) for cell in row] for row in rows]
    whole = [column.lower() in WHOLE_COLUMNS for column in columns]
    widths = [
        max([_width(column, is_whole), *(_width(row[i], is_whole) for row in cells)])
        for i, (column, is_whole) in enumerate(zip(columns, whole, strict=True))
    ]
    console = out()
    if sum(widths) + 3 * (len(columns) - 1) > console.width:
        _paragraphs(title, columns, whole, cells)
        return
    grid = Table(
        title=title,
        title_justify="left",
        show_edge=False,
        pad_edge=False,
        show_header=any(columns),
    )
    roomy = any(column.lower() in ROOMY_COLUMNS for column in columns)
    natural = [
        max(_width(c, True) for c in [column, *(row[i] for row in cells)])
        for i, column in enumerate(columns)
    ]
    fits = sum(natural) + 3 * (len(columns) - 1) <= console.width
    for i, (column, is_whole, width) in enumerate(zip(columns, whole, widths, strict=True)):
        justify = "right" if column.lower() in NUMERIC_COLUMNS else "left"
        if is_whole:
            grid.add_column(column, justify=justify, no_wrap=True, min_width=width)  # type: ignore[arg-type]
        else:
            spare = console.width - sum(widths) - 3 * (len(columns) - 1)
            room = _room(column, [row[i] for row in cells], spare)
            # When a roomy column (a fact, a title) must wrap, the other free columns wrap at
            # their longest word: rich would otherwise keep them whole and squeeze the last
            # one below a word ("20" for a date).
            tight = room is None and roomy and not fits
            grid.add_column(
                column,
                justify=justify,  # type: ignore[arg-type]
                overflow="fold",
                min_width=room if room is not None else width,
                max_width=width if tight else None,
            )
    for row in cells:
        grid.add_row(*row)
    console.print(grid)


#: Free-text columns that get room before the others wrap (up to this many cells, while the
#: terminal has it): a title cut to a few characters says nothing.
ROOMY_COLUMNS = {"title": 40, "text": 40, "fact": 50}


def _room(column: str, cells: Sequence[Any], spare: int) -> int | None:
    """The least width of a free-text column: its longest cell up to `ROOMY_COLUMNS`' figure
    and what the terminal has to spare, for the columns named there; None (as rich sizes it)
    for the others."""
    from rich.cells import cell_len

    most = ROOMY_COLUMNS.get(column.lower())
    if most is None:
        return None
    longest = max((cell_len(str(getattr(c, "plain", c))) for c in cells), default=0)
    least = max(_width(column, False), *(_width(c, False) for c in cells))
    return max(least, min(longest, most, least + max(0, spare)))


def _width(cell: Any, whole: bool) -> int:
    """The fewest columns a cell takes: all of it when whole, else its longest word."""
    from rich.cells import cell_len

    text = cell if isinstance(cell, str) else str(getattr(cell, "plain", cell))
    if whole:
        return max((cell_len(line) for line in text.splitlines()), default=0)
    return max((cell_len(word) for word in text.split()), default=0)


def _paragraphs(
    title: str | None, columns: Sequence[str], whole: Sequence[bool], rows: list[list[Any]]
) -> None:
    """A table for a narrow terminal: each row as a line of `column value` pairs (short values),
    then its long free text, indented and wrapped."""
    from rich.markup import escape
    from rich.padding import Padding
    from rich.text import Text

    console = out()
    if title:
        console.print(f"[bold]{escape(title)}[/]")
    for row in rows:
        pairs, texts = [], []
        for column, is_whole, cell in zip(columns, whole, row, strict=True):
            text = str(getattr(cell, "plain", cell))
            if not text:
                continue
            if is_whole or len(text) <= 24:
                pairs.append(
                    f"[bold]{escape(column)}[/] {escape(text)}" if column else escape(text)
                )
            else:
                texts.append(text)
        console.print(" · ".join(pairs), overflow="fold")
        for text in texts:
            console.print(Padding(Text(text, overflow="fold"), (0, 0, 0, 2)))


NUMERIC_COLUMNS = {
    "#",
    "id",
    "tokens",
    "active",
    "archived",
    "flushes",
    "messages",
    "rank",
    "score",
}

#: Columns whose values are never cut or wrapped: numbers, ids and names of things.
WHOLE_COLUMNS = NUMERIC_COLUMNS | {
    *("session", "user", "block", "flush", "fact id", "bm25", "vector"),
    *("last message", "stored"),
}


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M")
    if isinstance(value, float):
        return f"{value:.3f}"
    return value if hasattr(value, "__rich_console__") else str(value)


def preview(text: str, width: int = 60) -> str:
    """One line of a message, cut to `width` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: max(1, width - 1)] + "…"


def gauge_bar(active: int, threshold: float, limit: int, width: int) -> str:
    """The budget gauge: filled to the active tokens, with ┃ at the flush threshold (rich markup)."""
    width = max(10, width)
    filled = min(width, round(width * active / limit)) if limit else 0
    mark = min(width - 1, round(width * threshold / limit)) if limit else 0
    color = "red" if active > threshold else ("yellow" if active > 0.8 * threshold else "green")
    cells = []
    for i in range(width):
        char = "█" if i < filled else "·"
        if i == mark:
            char = "┃" if i >= filled else "╋"
        cells.append(char)
    return f"[{color}]{''.join(cells)}[/]"


def gauge(active: int, threshold: float, limit: int, width: int = 30) -> str:
    """The gauge bar with its figures: active tokens / threshold / token limit (rich markup)."""
    bar = gauge_bar(active, threshold, limit, width)
    return f"{bar} {active:,} / {threshold:,.0f} threshold / {limit:,} limit"


def print_error(error: MemcliError) -> None:
    """`Error: <what happened>. <how to fix it>` on stderr."""
    text = str(error)  # (MemcliError joins the two, minding a message's own stop)
    if not text.endswith((".", "!", "?")):
        text += "."
    err().print(f"[bold red]Error:[/] {_escape(text)}", soft_wrap=True)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


class progress:  # noqa: N801 (used as a context manager, like open)
    """A progress bar on stderr, only on a terminal: `with progress("Embedding") as bar:` then
    `bar.total(n)` and `bar.advance(k)`."""

    def __init__(self, label: str, min_total: int = 1) -> None:
        self.label = label
        self.min_total = min_total
        self.bar: Any = None
        self.task: Any = None

    def __enter__(self) -> progress:
        return self

    def total(self, n: int) -> None:
        if n < self.min_total or not stderr_is_tty() or self.bar is not None:
            return
        from rich.progress import Progress

        self.bar = Progress(console=err(), transient=True)
        self.bar.start()
        self.task = self.bar.add_task(self.label, total=n)

    def advance(self, n: int) -> None:
        if self.bar is not None:
            self.bar.advance(self.task, n)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

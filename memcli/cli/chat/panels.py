"""Drawing the chat: the conversation as prompt-toolkit fragments, and the "Short-term" and
"Long-term" panels with rich, as ANSI text."""

from __future__ import annotations

import io
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memcli.cli.output import gauge_bar, plural, preview

if TYPE_CHECKING:
    from collections.abc import Sequence

    from prompt_toolkit.formatted_text import StyleAndTextTuples
    from rich.console import Console

    from memcli.chat.view import BlockView, LongTerm, ShortTerm
    from memcli.messages import Message


@dataclass
class Entry:
    """One item of the conversation: a user message, a reply, a note, an error or a flush."""

    kind: str
    text: str
    mark: str = ""


def history_entries(messages: list[Message], keep: int = 20) -> list[Entry]:
    """A resumed session's latest active messages, as conversation entries."""
    shown = messages[-keep:]
    entries = []
    if len(messages) > len(shown):
        entries.append(Entry("note", f"… {len(messages) - len(shown)} earlier active messages"))
    for m in shown:
        if m.role in ("user", "assistant"):
            cut = m.role == "assistant" and bool(m.metadata and m.metadata.get("cancelled"))
            entries.append(Entry(m.role, m.content, "cancelled" if cut else ""))
        else:
            entries.append(Entry("note", f"[{m.role}] {m.content}"))
    return entries


def _console(width: int) -> Console:
    from rich.console import Console

    color = not (os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb")
    return Console(
        file=io.StringIO(),
        width=max(20, width),
        force_terminal=True,
        color_system="standard" if color else None,
        no_color=not color,
        highlight=False,
        emoji=False,
    )


def render_short(view: ShortTerm, width: int, height: int) -> str:
    """The Short-term panel: gauge, counts, flush marks, then the newest active messages."""
    from rich.markup import escape

    console = _console(width)
    lines = [
        gauge_bar(view.active_tokens, view.threshold, view.token_limit, width),
        f"[bold]{view.active_tokens:,}[/] / {view.threshold:,.0f} threshold · limit {view.token_limit:,}",
        f"{len(view.messages)} active · {view.archived} archived · {plural(view.flush_count, 'flush')}"
        f" (size {view.flush_size:,})",
    ]
    for mark in view.flushes:
        style = "bold magenta" if mark.live else "magenta"
        lines.append(
            f"[{style}]⇣ flushed {plural(mark.messages, 'msg')}, {plural(mark.tokens, 'token')}[/]"
            f" [dim]{escape(preview(mark.reason, max(10, width - 34)))}[/]"
        )
    room = max(1, height - len(lines) - 1)
    shown = view.messages[-room:]
    if len(view.messages) > len(shown):
        lines.append(f"[dim]… {len(view.messages) - len(shown)} older active messages[/]")
    for m in shown:
        head = f"{m.role[:9]:<9} {m.tokens or 0:>5} "
        color = {"user": "cyan", "assistant": "green"}.get(m.role, "yellow")
        cancelled = " ⏹" if m.metadata and m.metadata.get("cancelled") else ""
        text = preview(m.content, width - len(head) - len(cancelled))
        lines.append(f"[{color}]{head}[/]{escape(text)}{cancelled}")
    if not view.messages:
        lines.append("[dim]No active messages yet.[/]")
    for line in lines:
        console.print(line, overflow="ellipsis", no_wrap=True)
    return console.file.getvalue()  # type: ignore[attr-defined, no-any-return]


def _hit_line(hit: Any, width: int) -> str:
    score = getattr(hit, "score", None)
    text = getattr(hit, "text", str(hit))
    where = getattr(hit, "session_id", "") or ""
    ids = getattr(hit, "message_ids", None) or []
    span = f" #{ids[0]}-{ids[-1]}" if ids else ""
    head = f"{score:.2f} " if isinstance(score, int | float) else ""
    text = re.sub(r"<message role=['\"]?(\w+)['\"]?>", r"\1: ", text).replace("</message>", " ")
    return f"{head}{where}{span}: " + preview(text, width)


def _block_lines(block: BlockView, width: int) -> list[str]:
    from rich.markup import escape

    lines = []
    size = f"{block.tokens:,} tok" if block.computed else "not asked yet"
    if block.truncated:
        size += f" [red]({block.truncated} by truncation, was {block.original_tokens:,})[/]"
    lines.append(f"[bold]{escape(block.name)}[/] [dim]{block.kind} · p{block.priority}[/] · {size}")
    if block.facts:
        lines.extend(f"  • {escape(preview(f, width - 4))}" for f in block.facts[-8:])
    if block.hits:
        lines.append("  [dim]retrieved for the last turn:[/]")
        lines.extend(f"  {escape(_hit_line(h, width - 24))}" for h in block.hits[:4])
    if block.kind == "SummaryBlock" and block.content:  # the running summary, wrapped
        lines.extend(f"  [dim]{escape(text)}[/]" for text in _wrapped(block.content, width - 2))
    elif not block.facts and not block.hits and block.content:
        for text in block.content.splitlines()[:3]:
            if text.strip():
                lines.append(f"  [dim]{escape(preview(text, width - 4))}[/]")
    if block.computed and not block.content and block.truncated != "dropped":
        lines.append("  [dim](empty for this turn)[/]")
    return lines


def _wrapped(text: str, width: int, keep: int = 6) -> list[str]:
    """`text` word-wrapped to `width` (as `wrap`), at most `keep` lines, the last ending in …
    when cut."""
    lines = [line for line in wrap(text, width).split("\n") if line.strip()]
    if len(lines) > keep:
        lines = lines[:keep]
        lines[-1] = preview(lines[-1] + " …", max(10, width))
    return lines


def render_long(view: LongTerm, width: int, loading: bool) -> str:
    """The Long-term panel: each block with its priority, tokens, facts, retrieved batches, cuts."""
    from rich.markup import escape

    console = _console(width)
    lines: list[str] = []
    if not view.blocks:
        lines += [
            "[dim]No long-term blocks configured.[/]",
            f"[dim]{escape('Add [[blocks]] tables to the config file (see config.example.toml).')}[/]",
        ]
    elif loading and not view.ready:
        lines.append("[yellow]Loading the blocks (models load in the background)…[/]")
    for block in view.blocks:
        lines.extend(_block_lines(block, width))
    cut = [b for b in view.blocks if b.truncated]
    if cut:
        names = ", ".join(f"{b.name} ({b.truncated})" for b in cut)
        lines.append(f"[red]truncation cut: {names}[/]")
    for line in lines:
        console.print(line, overflow="ellipsis", no_wrap=True)
    return console.file.getvalue()  # type: ignore[attr-defined, no-any-return]


MARKS = {
    "waiting": ("class:mark", " …"),
    "streaming": ("class:mark", "▌"),
    "cancelled": ("class:mark", "  ⏹ cancelled: partial reply kept"),
    "cancelled-empty": ("class:mark", "⏹ cancelled before any reply"),
    "failed": ("class:error", "  ✗ failed"),
}
LABELS = {
    "user": ("class:user.label", "you › "),
    "assistant": ("class:assistant.label", "assistant › "),
}


#: A line of an aligned list (`/help`): a name, two spaces or more, then its description.
_ALIGNED = re.compile(r"(\S.*?\s{2,})\S")


def wrap(text: str, width: int, first: int = 0, hanging: bool = False) -> str:
    """Word-wrap `text` to `width` columns, the first line starting `first` columns in. With
    `hanging`, a line of an aligned list (a name, two spaces or more, its description: `/help`)
    continues under its description, not at column 0."""
    import textwrap

    width = max(10, width - 1)
    out = []
    for i, paragraph in enumerate(text.split("\n")):
        indent = " " * first if i == 0 else ""
        aligned = _ALIGNED.match(paragraph) if hanging else None
        under = len(aligned.group(1)) if aligned and len(aligned.group(1)) <= width // 2 else 0
        lines = textwrap.wrap(
            paragraph,
            width,
            initial_indent=indent,
            subsequent_indent=" " * under,
            break_on_hyphens=False,
            drop_whitespace=True,
        ) or [indent]
        if i == 0:
            lines[0] = lines[0][first:]
        out.extend(lines)
    return "\n".join(out)


def conversation(
    entries: Sequence[Entry], width: int, cache: dict[int, tuple[Any, StyleAndTextTuples]]
) -> StyleAndTextTuples:
    """The conversation as prompt-toolkit fragments, word-wrapped; each entry is wrapped again
    only when its text, mark or the width changed."""
    out: StyleAndTextTuples = []
    for entry in entries:
        key = (entry.text, entry.mark, width)
        cached = cache.get(id(entry))
        if cached is None or cached[0] != key:
            label = LABELS.get(entry.kind)
            style = {"user": "class:user", "assistant": ""}.get(entry.kind, f"class:{entry.kind}")
            fragments: StyleAndTextTuples = [label] if label else []
            first = len(label[1]) if label else 0
            text = wrap(entry.text, width, first, hanging=entry.kind not in ("user", "assistant"))
            fragments.append((style, text))
            if entry.kind == "assistant" and entry.mark in MARKS:
                fragments.extend(_mark(MARKS[entry.mark], text, width, first))
            fragments.append(("", "\n\n"))
            cached = (key, fragments)
            cache[id(entry)] = cached
        out.extend(cached[1])
    return out


def _mark(mark: tuple[str, str], text: str, width: int, first: int) -> StyleAndTextTuples:
    """A reply's mark (`MARKS`) after its wrapped `text`: on its last line when it fits there,
    else on lines of its own, wrapped at words as the text is (the window would cut it
    anywhere, mid-word)."""
    style, said = mark
    last = text.rpartition("\n")[2]
    used = len(last) + (first if "\n" not in text else 0)
    if used + len(said) <= max(10, width - 1):
        return [mark]
    return [("", "\n"), (style, wrap(said.strip(), width))]

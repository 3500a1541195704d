"""Charts of a flush simulation: active tokens over the transcript, with the threshold and limit.

`terminal_chart` draws with plotext and returns the text; `write_chart` draws the same chart with
matplotlib (no display) into a PNG, SVG or PDF file. Both libraries are imported only when a chart is drawn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from memcli.errors import MemcliError, UsageError

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from memcli.simulate import Simulation

#: Most sets drawn in the terminal chart (one marker each); the others are left out of it, and its
#: title says so (the summary table has them all; the image file of `write_chart` draws every set).
MAX_SETS = 6


@dataclass(frozen=True)
class Series:
    """What a chart draws for one simulation, thinned to at most a few thousand points.

    `x` counts the messages put so far; `y` is the active tokens: right after each put, then what
    the put's flushes left (the saw teeth). `flush_x`/`flush_y` mark the puts that flushed.
    """

    label: str
    x: list[int]
    y: list[int]
    flush_x: list[int]
    flush_y: list[int]
    threshold: float
    token_limit: int


def series(sim: Simulation, max_points: int = 2000, label: str | None = None) -> Series:
    """The chart's points for a simulation: every put, or the envelope of groups of puts."""
    puts = sim.puts
    group = max(1, -(-len(puts) // max(1, max_points // 2)))
    x: list[int] = []
    y: list[int] = []
    flush_x: list[int] = []
    flush_y: list[int] = []
    for i in range(0, len(puts), group):
        chunk = puts[i : i + group]
        peak = max(chunk, key=lambda p: p.active_tokens)
        last = chunk[-1]
        x.append(peak.last + 1)
        y.append(peak.active_tokens)
        if last is not peak or peak.flushes:
            x.append(last.last + 1)
            y.append(last.kept_tokens)
        flushed = [p for p in chunk if p.flushes]
        if flushed:
            top = max(flushed, key=lambda p: p.active_tokens)
            flush_x.append(top.last + 1)
            flush_y.append(top.active_tokens)
    b = sim.budget
    name = label or (
        f"limit {b.token_limit:,} · ratio {b.chat_history_token_ratio:g} · flush {b.flush_size:,}"
    )
    return Series(name, x, y, flush_x, flush_y, b.threshold, b.token_limit)


#: Each set's marker in the terminal chart, so that sets differ without colour.
MARKERS = ("braille", "•", "+", "o", "*", "#")
#: What each marker looks like in the legend.
SAMPLES = {"braille": "⠤⠔⠊"}
#: File formats `write_chart` writes, chosen by the file's extension.
FORMATS = ("png", "svg", "pdf")


def terminal_chart(
    sims: Sequence[Simulation], width: int = 100, height: int = 20, color: bool = True
) -> str:
    """The chart as text for a terminal (ANSI colours unless `color` is False). Each set has its
    own marker; the legend is written under the plot, where it covers nothing."""
    import plotext

    figure = plotext.figure
    figure.clear()
    figure.plot_size(max(40, width), max(10, height))
    figure.theme("simple" if color else "colorless")
    shown = [series(s, max_points=max(40, width) * 2) for s in sims[:MAX_SETS]]
    one = len(shown) == 1
    legend: list[str] = []
    for i, s in enumerate(shown):
        marker = MARKERS[i % len(MARKERS)]
        figure.draw(figure.signal(s.x, s.y, marker=marker).lines())
        sample = SAMPLES.get(marker, marker * 3)
        legend.append(f"{sample} {'active tokens' if one else s.label}")
    for s in shown:
        figure.line(s.threshold)
    if one:
        s = shown[0]
        legend.append(f"─── threshold {s.threshold:,.0f}")
        figure.line(s.token_limit, style="dotted")
        legend.append(f"┈┈┈ token_limit {s.token_limit:,}")
        if s.flush_x:
            figure.draw(figure.signal(s.flush_x, s.flush_y, marker="x"))
            legend.append("x a put that flushed")
    else:
        thresholds = ", ".join(f"{s.threshold:,.0f}" for s in shown)
        legend.append(f"─── thresholds {thresholds}")
    top = max([s.token_limit for s in shown] + [max(s.y, default=0) for s in shown])
    right = max([max(s.x, default=1) for s in shown])
    figure.ruler("y").lim(0, top * 1.1).ticks(*_whole_ticks(0, int(top * 1.1), height // 4))
    figure.ruler("x").lim(1, max(2, right)).ticks(*_whole_ticks(1, max(2, right), width // 12))
    figure.legend(active=False)
    figure.title(_title(sims))
    figure.label("messages put", "x")
    plot = str(figure.build().string(colorless=not color))
    lines = [""]
    for entry in legend:  # as many entries on a line as fit the width
        if lines[-1] and len(lines[-1]) + 3 + len(entry) > width:
            lines.append("")
        lines[-1] += ("   " if lines[-1] else "") + entry
    return "\n".join([plot, *lines])


def _whole_ticks(low: int, high: int, most: int) -> tuple[list[int], list[str]]:
    """At most `most` ticks between low and high, whole numbers 1, 2 or 5 × 10^k apart."""
    span, most = max(1, high - low), max(2, most)
    scale = 1
    while True:
        step = next((f * scale for f in (1, 2, 5) if span / (f * scale) <= most), 0)
        if step:
            break
        scale *= 10
    first = -(-low // step) * step
    positions = list(range(first, high + 1, step))
    return positions, [f"{p:,}" for p in positions]


def chart_format(path: str | Path) -> str:
    """The image format a chart file's extension names: png, svg or pdf (UsageError otherwise)."""
    from pathlib import Path

    name = str(path)
    if name in ("", "-"):
        raise UsageError("--png needs a file name", "Pass e.g. --png budget.png")
    suffix = Path(name).suffix.lower().lstrip(".")
    if suffix not in FORMATS:
        raise UsageError(
            f"--png {name}: cannot tell the image format from "
            + (f"the extension .{suffix}" if suffix else "a name without an extension"),
            "Name the file .png, .svg or .pdf",
        )
    return suffix


def write_chart(
    sims: Sequence[Simulation], path: str | Path, width: float = 10, height: float = 5
) -> None:
    """The same chart as an image file (matplotlib, no display): PNG, SVG or PDF, as the file's
    extension says."""
    kind = chart_format(path)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    shown = [series(s, max_points=20000) for s in sims]  # every set: colours do not run out
    one = len(shown) == 1
    styles = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)))
    palette = "tab10" if len(shown) <= 10 else "tab20"
    from matplotlib import colormaps

    colors = colormaps[palette].colors  # type: ignore[attr-defined]
    for i, s in enumerate(shown):
        color = colors[i % len(colors)]
        label = "active tokens" if one else s.label
        ax.step(
            s.x,
            s.y,
            where="post",
            color=color,
            linewidth=0.8,
            linestyle=styles[i % len(styles)],
            label=label,
        )
        ax.axhline(
            s.threshold,
            color="C3" if one else color,
            linestyle="--",
            linewidth=1,
            label=f"threshold {s.threshold:,.0f}",
        )
        if one:
            ax.axhline(
                s.token_limit,
                color="black",
                linestyle=":",
                linewidth=1,
                label=f"token_limit {s.token_limit:,}",
            )
            if s.flush_x:
                ax.scatter(
                    s.flush_x, s.flush_y, marker="v", s=12, color="C1", label="flush", zorder=3
                )
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(_title(sims, len(sims)))
    ax.set_xlabel("messages put")
    ax.set_ylabel("active tokens")
    ax.set_ylim(bottom=0)
    # Outside the plot, to the right: it covers no line.
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small", borderaxespad=0)
    fig.tight_layout()
    try:
        fig.savefig(str(path), format=kind)
    except OSError as exc:
        raise MemcliError(f"cannot write {path}: {exc}", "Check the path and permissions") from None


def _title(sims: Sequence[Simulation], drawn: int = MAX_SETS) -> str:
    """The chart's title; it says when only the first `drawn` sets are drawn (the terminal
    chart has a marker for each of MAX_SETS; the image file draws them all)."""
    text = "Active tokens (short-term memory) as the transcript is put"
    if len(sims) > drawn:
        text += f": first {drawn} of {len(sims)} parameter sets"
    return text

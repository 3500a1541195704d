"""`memcli simulate flush`: JSON Lines, the engine agrees, bad input, nothing stored, charts."""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import memcli
from typer.testing import CliRunner

from memcli.store.sqlite import SQLiteStore

WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet".split()


def text(n: int, seed: int) -> str:
    return " ".join(WORDS[(seed * 7 + i * 3) % len(WORDS)] for i in range(n))


def write_transcript(path: Path) -> Path:
    """Conversation lines, single messages, several replies per turn and a tool message."""
    lines = []
    for turn in range(30):
        user = {"role": "user", "content": text(5 + turn % 9, turn)}
        replies = [
            {"role": "assistant", "content": text(8 + (turn * 5) % 23, turn + 1)}
            for _ in range(1 + turn % 3)
        ]
        if turn % 4 == 0:
            replies.insert(0, {"role": "tool", "content": text(12, turn + 2)})
        if turn % 2:
            lines.append({"messages": [user, *replies]})
        else:
            lines.extend([user, *replies])
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.fixture(autouse=True)
def wide_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rich wraps stderr at the terminal width; keep long paths in messages on one line."""
    monkeypatch.setenv("COLUMNS", "400")


@pytest.fixture
def transcript(tmp_path: Path) -> Path:
    return write_transcript(tmp_path / "chat.jsonl")


def db_state(path: Path) -> tuple[str, list[str]]:
    """The database file's hash and every row, as SQL."""
    conn = sqlite3.connect(path)
    try:
        dump = list(conn.iterdump())
    finally:
        conn.close()
    return hashlib.sha256(path.read_bytes()).hexdigest(), dump


def said(text: str) -> str:
    """stderr with rich's line wrapping undone."""
    return " ".join(text.split())


BUDGET = ["--token-limit", "200", "--ratio", "0.6", "--flush-size", "30"]


@pytest.mark.parametrize("put", ["call", "message", "batch"])
def test_import_archives_what_simulate_printed(tmp_path: Path, transcript: Path, put: str) -> None:
    db = tmp_path / "m.db"
    sim = memcli("simulate", "flush", str(transcript), *BUDGET, "--put", put, "--json")
    assert sim.code == 0, sim.stderr
    records = sim.records()
    flushes = [r for r in records if r["type"] == "flush"]
    (summary,) = [r for r in records if r["type"] == "summary"]
    assert flushes, "the budget is small enough to flush"

    run = memcli(
        "--db", str(db), "import", str(transcript), "--session", "s", *BUDGET, "--put", put
    )
    assert run.code == 0, run.stderr
    store = SQLiteStore(db)
    messages = store.get_messages("s")
    position = {m.id: i for i, m in enumerate(messages)}
    stored = store.list_flushes("s")
    got = [
        {
            "first": position[f.first_message_id],
            "last": position[f.last_message_id],
            "messages": f.messages,
            "tokens": f.tokens,
            "reason": f.reason,
        }
        for f in stored
    ]
    want = [{k: f[k] for k in ("first", "last", "messages", "tokens", "reason")} for f in flushes]
    assert got == want
    archived = [position[m.id] for m in messages if m.status == "archived"]
    assert archived == [i for f in flushes for i in range(f["first"], f["last"] + 1)]
    assert summary["archived_messages"] == len(archived)
    assert summary["active_messages"] == sum(m.status == "active" for m in messages)
    assert summary["active_tokens"] == sum(m.tokens or 0 for m in messages if m.status == "active")
    assert (summary["token_limit"], summary["ratio"], summary["flush_size"]) == (200, 0.6, 30)
    assert summary["put"] == put
    store.close()


def test_stored_session_is_replayed_read_only(tmp_path: Path, transcript: Path) -> None:
    db = tmp_path / "m.db"
    run = memcli("--db", str(db), "import", str(transcript), "--session", "s", *BUDGET)
    assert run.code == 0, run.stderr
    before = db_state(db)
    stored = memcli(
        "--db",
        str(db),
        "simulate",
        "flush",
        "--session",
        "s",
        "--json",
        "--token-limit",
        "100,300",
        "--ratio",
        "0.5",
        "--flush-size",
        "20",
    )
    assert stored.code == 0, stored.stderr
    assert db_state(db) == before
    # A stored session keeps no call boundaries: it replays as one put per message.
    from_file = memcli(
        "simulate",
        "flush",
        str(transcript),
        "--put",
        "message",
        "--json",
        "--token-limit",
        "100,300",
        "--ratio",
        "0.5",
        "--flush-size",
        "20",
    )
    assert stored.records() == [
        {**r, "put": "call"} if r["type"] == "summary" else r for r in from_file.records()
    ]
    # With no flags, the session's own budget is used.
    own = memcli("--db", str(db), "simulate", "flush", "--session", "s", "--json").records()[-1]
    assert (own["token_limit"], own["ratio"], own["flush_size"]) == (200, 0.6, 30)
    assert db_state(db) == before


def test_json_lines_shape_and_several_sets(transcript: Path) -> None:
    run = memcli(
        "simulate",
        "flush",
        str(transcript),
        "--token-limit",
        "100,200",
        "--ratio",
        "0.5,0.7",
        "--flush-size",
        "20",
    )  # not a terminal: JSON Lines without --json
    assert run.code == 0, run.stderr
    records = run.records()
    summaries = [r for r in records if r["type"] == "summary"]
    assert [(s["token_limit"], s["ratio"], s["flush_size"], s["run"]) for s in summaries] == [
        (100, 0.5, 20, 0),
        (100, 0.7, 20, 1),
        (200, 0.5, 20, 2),
        (200, 0.7, 20, 3),
    ]
    first_run = [r for r in records if r["run"] == 0]
    puts = [r for r in first_run if r["type"] == "put"]
    messages = sum(p["messages"] for p in puts)
    assert summaries[0]["messages"] == messages == puts[-1]["last"] + 1
    assert [p["first"] for p in puts] == [0] + [p["last"] + 1 for p in puts[:-1]]
    for r in first_run:
        if r["type"] == "flush":
            assert set(r) >= {"first", "last", "messages", "tokens", "reason"}
            assert r["last"] - r["first"] + 1 == r["messages"]
    assert summaries[0]["flushes"] == sum(r["type"] == "flush" for r in first_run)


def test_stdin_and_json_array(tmp_path: Path, transcript: Path) -> None:
    lines = [json.loads(line) for line in transcript.read_text().splitlines()]
    flat = [m for line in lines for m in line.get("messages", [line])]
    array = tmp_path / "chat.json"
    array.write_text(json.dumps(flat))
    a = memcli("simulate", "flush", "-", *BUDGET, "--put", "message", input=transcript.read_bytes())
    b = memcli("simulate", "flush", str(array), *BUDGET, "--put", "message")
    assert a.code == b.code == 0, a.stderr + b.stderr
    assert a.records() == b.records()


def test_head_exits_quietly(transcript: Path) -> None:
    cmd = (
        f"{sys.executable} -m memcli simulate flush {transcript} --token-limit 50 --json | head -1"
    )
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=60)
    assert json.loads(proc.stdout)["type"] == "put"
    assert "Traceback" not in proc.stderr


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--token-limit", "2000,abc"], "--token-limit: 'abc' is not a whole number"),
        (["--token-limit", "2000,"], "--token-limit: '' is not a whole number"),
        (["--ratio", "0.7,x"], "--ratio: 'x' is not a number"),
        (["--ratio", "0.5,1.5"], "chat_history_token_ratio must be in (0, 1]"),
        (["--token-limit", "-5"], "token_limit must be positive"),
        (
            ["--token-limit", "100,1000", "--flush-size", "500"],
            "token_flush_size 500 is larger than token_limit 100",
        ),
        (["--flush-size", "0"], "token_flush_size must be a positive whole number"),
        (["--put", "sometimes"], "unknown --put 'sometimes'"),
    ],
)
def test_bad_parameters_exit_2(transcript: Path, args: list[str], needle: str) -> None:
    run = memcli("simulate", "flush", str(transcript), *args)
    assert run.code == 2
    assert needle in said(run.stderr)
    assert said(run.stderr).startswith("Error:")
    assert run.stdout == ""


def test_malformed_line_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"role": "user", "content": "hi"}\n{"role": "assistant", "content": "yo"}\n{oops\n'
    )
    run = memcli("simulate", "flush", str(bad))
    assert run.code == 2
    assert f"{bad}:3: invalid JSON" in said(run.stderr)
    bad.write_text('{"role": "user", "content": "hi"}\n{"role": "robot", "content": "yo"}\n')
    run = memcli("simulate", "flush", str(bad))
    assert run.code == 2 and f"{bad}:2: unknown role 'robot'" in said(run.stderr)


def test_missing_file_source_and_session(tmp_path: Path, transcript: Path) -> None:
    run = memcli("simulate", "flush", str(tmp_path / "nope.jsonl"))
    assert run.code == 2 and "no such file" in said(run.stderr)
    run = memcli("simulate", "flush")
    assert run.code == 2 and "give a transcript file or --session ID" in said(run.stderr)
    run = memcli("simulate", "flush", str(transcript), "--session", "s")
    assert run.code == 2 and "one of them" in said(run.stderr)


def test_unknown_session_exits_1(tmp_path: Path, transcript: Path) -> None:
    db = tmp_path / "m.db"
    run = memcli("--db", str(db), "simulate", "flush", "--session", "ghost")
    assert run.code == 1 and "no database" in said(run.stderr)
    assert not db.exists()  # simulate does not create a database
    assert memcli("--db", str(db), "import", str(transcript), "--session", "s").code == 0
    before = db_state(db)
    run = memcli("--db", str(db), "simulate", "flush", "--session", "ghost")
    assert run.code == 1 and "no session 'ghost'" in said(run.stderr)
    assert db_state(db) == before


def test_simulating_a_file_touches_no_database(tmp_path: Path, transcript: Path) -> None:
    db = tmp_path / "m.db"
    run = memcli("--db", str(db), "simulate", "flush", str(transcript), "--json")
    assert run.code == 0 and not db.exists()


# -- charts and the human output ----------------------------------------------------------------


def test_png_is_a_real_png(tmp_path: Path, transcript: Path) -> None:
    png = tmp_path / "budget.png"
    run = memcli("simulate", "flush", str(transcript), *BUDGET, "--png", str(png), "--json")
    assert run.code == 0, run.stderr
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1200, 600)
    assert f"Wrote the chart to {png}" in said(run.stderr)
    run = memcli(
        "simulate", "flush", str(transcript), "--png", str(tmp_path / "no" / "such" / "dir.png")
    )
    assert run.code == 1 and "cannot write" in said(run.stderr)


def test_terminal_output_timeline_summary_chart(
    transcript: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memcli.cli import output
    from memcli.cli.app import app

    monkeypatch.setattr(output, "stdout_is_tty", lambda: True)
    monkeypatch.setenv("COLUMNS", "140")
    output.out.cache_clear()
    result = CliRunner().invoke(
        app, ["simulate", "flush", str(transcript), *BUDGET, "--rows", "10"]
    )
    output.out.cache_clear()
    assert result.exit_code == 0, result.output
    shown = result.stdout
    assert "Timeline" in shown and "rows left out (--rows 0 shows them all)" in shown
    assert "reached the flush size" in shown and "puts, no flush" in shown
    assert "over the threshold 120" in shown
    assert "Summary" in shown and "stayed over the threshold" in shown
    assert "threshold 120" in shown and "token_limit 200" in shown and "messages put" in shown
    assert "\x1b[" not in shown  # NO_COLOR
    assert not shown.lstrip().startswith("{")


def test_terminal_output_compares_sets(transcript: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from memcli.cli import output
    from memcli.cli.app import app

    monkeypatch.setattr(output, "stdout_is_tty", lambda: True)
    monkeypatch.setenv("COLUMNS", "160")
    output.out.cache_clear()
    result = CliRunner().invoke(
        app, ["simulate", "flush", str(transcript), "--token-limit", "100,200,400", "--no-chart"]
    )
    output.out.cache_clear()
    assert result.exit_code == 0, result.output
    assert "3 parameter sets" in result.stdout
    assert "Timeline" not in result.stdout  # several sets: the table only, unless --timeline
    for limit in ("100", "200", "400"):
        assert f"\n{limit} " in result.stdout


def test_heavy_plotting_stays_out_of_the_cli_start() -> None:
    code = (
        "import sys, memcli.cli.app; "
        "print(any(m.split('.')[0] in ('plotext', 'matplotlib') for m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "False", proc.stderr


def test_bad_budget_is_reported_before_the_transcript_is_read(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{oops\n")
    run = memcli("simulate", "flush", str(bad), "--ratio", "2")
    assert run.code == 2 and "chat_history_token_ratio must be in (0, 1], not 2.0" in said(
        run.stderr
    )


def test_a_long_transcripts_json_lines_are_the_librarys_events(tmp_path: Path) -> None:
    """Over 40,000 events: the command's output is the library's replay, byte for byte."""
    from memcli.flush import Budget
    from memcli.simulate import Replay, events_json, run
    from memcli.tokens import TiktokenTokenizer

    path = tmp_path / "long.jsonl"
    with path.open("w") as out:
        for i in range(25_000):
            turn = [
                {"role": "user", "content": text(4 + i % 7, i) + f" {i}?"},
                {"role": "assistant", "content": text(9 + i % 13, i + 1) + f".\n\n{i % 97}"},
            ]
            if i % 3:  # a conversation line: one put call
                out.write(json.dumps({"messages": turn}) + "\n")
            else:
                out.writelines(json.dumps(m) + "\n" for m in turn)
    result = memcli(
        "simulate", "flush", str(path), "--put", "message", "--json",
        "--token-limit", "2000", "--ratio", "0.7", "--flush-size", "200",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    replay, _ = Replay.from_source(path, "message", TiktokenTokenizer())
    sim = run(replay, Budget(2000, 0.7, 200))
    assert len(sim.events) > 40_000
    events, summary = result.stdout.rsplit("\n", 2)[0] + "\n", result.stdout.splitlines()[-1]
    assert events == events_json(sim.events, 0)
    assert json.loads(summary)["flushes"] == sim.summary.flushes > 0


# -- chart files, the terminal chart, --rows ---------------------------------------------------


def test_chart_file_format_follows_its_extension(tmp_path: Path, transcript: Path) -> None:
    heads = {"svg": b"<?xml", "pdf": b"%PDF", "png": b"\x89PNG"}
    for kind, head in heads.items():
        path = tmp_path / f"budget.{kind.upper() if kind == 'pdf' else kind}"
        run = memcli("simulate", "flush", str(transcript), *BUDGET, "--png", str(path))
        assert run.code == 0, run.stderr
        assert path.read_bytes().startswith(head), kind
    assert b"<svg" in (tmp_path / "budget.svg").read_bytes()
    missing = tmp_path / "missing.jsonl"  # the name is refused before the source is read
    for name in ("budget.jpg", "budget"):
        run = memcli("simulate", "flush", str(missing), "--png", str(tmp_path / name))
        assert run.code == 2 and "Name the file .png, .svg or .pdf" in said(run.stderr)
        assert not (tmp_path / name).exists()


def terminal(args: list[str], monkeypatch: pytest.MonkeyPatch) -> str:
    from memcli.cli import output
    from memcli.cli.app import app

    monkeypatch.setattr(output, "stdout_is_tty", lambda: True)
    monkeypatch.setenv("COLUMNS", "300")
    output.out.cache_clear()
    result = CliRunner().invoke(app, ["simulate", "flush", *args])
    output.out.cache_clear()
    assert result.exit_code == 0, result.output
    return result.stdout


def test_rows_never_separate_a_flush_from_its_put(
    transcript: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for rows in range(1, 16):
        shown = terminal([str(transcript), *BUDGET, "--rows", str(rows), "--no-chart"], monkeypatch)
        table = shown.split("Summary")[0]
        cells = [[c.strip() for c in line.split("│")] for line in table.splitlines() if "│" in line]
        assert any(c[0] == "…" for c in cells), rows
        for before, row in zip(cells, cells[1:], strict=False):
            if row[4].startswith("flush "):  # a flush row follows its put (or a sibling flush)
                assert before[0] != "…", rows
                assert "over the threshold" in before[4] or before[4].startswith("flush "), rows


def test_terminal_chart_whole_ticks_legend_below_and_a_marker_per_set(
    transcript: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown = terminal([str(transcript), "--token-limit", "200,400", "--no-timeline"], monkeypatch)
    chart = shown[shown.index("Active tokens") :]
    lines = chart.splitlines()
    bottom = next(i for i, line in enumerate(lines) if line.lstrip().startswith("└"))
    x_ticks = lines[bottom + 1].split()
    y_ticks = [m[1] for line in lines[1:bottom] if (m := re.match(r"\s*([\d,.]+)[┤┼]", line))]
    assert x_ticks and all(t.replace(",", "").isdigit() for t in x_ticks)
    assert y_ticks and all(t.replace(",", "").isdigit() for t in y_ticks), y_ticks
    # The legend is under the plot (after the axis label), one marker per set.
    below = "\n".join(lines[bottom + 1 :])
    assert "messages put" in below
    legend = below[below.index("messages put") :]
    first, second = legend.index("limit 200"), legend.index("limit 400")
    assert legend[first - 4 : first - 1] == "⠤⠔⠊" and legend[second - 4 : second - 1] == "•••"
    plot = "\n".join(lines[1:bottom])
    assert "•" in plot and "limit 200" not in plot


def test_the_image_draws_every_parameter_set(tmp_path: Path, transcript: Path) -> None:
    """8 parameter sets (more than the terminal chart's 6 markers): the image's legend names
    every one, and its title claims no cut."""
    svg = tmp_path / "many.svg"
    run = memcli(
        "simulate", "flush", str(transcript), "--token-limit", "300,400,500,600",
        "--ratio", "0.5,0.7", "--png", str(svg), "--json",
    )  # fmt: skip
    assert run.code == 0, run.stderr
    text = svg.read_text()
    for limit in (300, 400, 500, 600):
        for ratio in (0.5, 0.7):
            assert f"limit {limit} · ratio {ratio:g}" in text  # each set's legend entry
    assert "first 6 of 8" not in text


@pytest.mark.parametrize("export", ["chatgpt", "claude"])
def test_an_export_is_said_to_be_one_with_what_to_do(tmp_path: Path, export: str) -> None:
    """simulate replays a transcript or a stored session; given an export (which `import`
    reads), it says so and how to replay it, not "item 0: missing role"."""
    exports = Path(__file__).parent / "data" / "exports"
    source = next(p for p in sorted(exports.iterdir()) if p.name.startswith(export))
    run = memcli("simulate", "flush", str(source))
    assert run.code == 2, run.stderr
    said = " ".join(run.stderr.split())
    name = {"chatgpt": "a ChatGPT", "claude": "a Claude.ai"}[export]
    assert f"is {name} export" in said and "memcli simulate flush --session ID" in said, said
    assert "missing role" not in said

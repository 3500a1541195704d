"""`memcli summary SESSION`: the summary block's summary after `memcli import`, over HTTP."""

from __future__ import annotations

from pathlib import Path

from helpers import llm_config, memcli
from helpers import turns_transcript as transcript


def write_config(tmp_path: Path, llm, extra: str = "") -> str:
    return llm_config(tmp_path, llm, f'[[blocks]]\nkind = "summary"\nmax_tokens = 50\n{extra}')


def imported(tmp_path: Path, llm, *replies: dict, turns: int = 3) -> str:
    config = write_config(tmp_path, llm)
    llm.script(*replies)
    run = memcli("--config", config, "import", transcript(tmp_path, turns), "--session", "s1")
    # exit 1 when a batch stays pending (the messages are stored)
    assert run.code == (1 if " pending in a block" in run.stderr else 0), run.stderr
    return config


def test_summary_plain_history_and_json(llm, tmp_path: Path) -> None:
    config = imported(
        tmp_path,
        llm,
        {"content": "<summary>Ana introduced herself.</summary>"},
        {"content": "<summary>Ana introduced herself and said more.</summary>"},
    )
    assert len(llm.requests) == 2
    assert "Ana introduced herself." in llm.requests[1]["messages"][0]["content"]

    run = memcli("--config", config, "summary", "s1", "--json")
    assert run.code == 0, run.stderr
    (record,) = run.records()
    assert record["type"] == "summary" and record["session"] == "s1"
    assert record["block"] == "session_summary" and record["version"] == 2
    assert record["text"] == "Ana introduced herself and said more."
    assert record["tokens"] == 7 and record["current"] is True
    assert record["pending_batches"] == 0 and record["error"] is None
    assert record["first_message_id"] <= record["last_message_id"]
    assert record["created_at"].endswith("Z") or "+00:00" in record["created_at"]

    run = memcli("--config", config, "summary", "s1", "--history", "--json")
    assert run.code == 0, run.stderr
    history = run.records()
    assert [(r["version"], r["current"]) for r in history] == [(1, False), (2, True)]
    assert history[0]["text"] == "Ana introduced herself."
    assert history[0]["flush_id"] < history[1]["flush_id"]
    assert history[0]["last_message_id"] < history[1]["first_message_id"]

    run = memcli("--config", config, "summary", "s1", "--block", "other", "--json")
    assert run.code == 0 and run.stdout == "" and "No summary of session s1 yet." in run.stderr

    # Without --json on a pipe: JSON Lines too. On a terminal: the text (a plain format forced).
    assert memcli("--config", config, "summary", "s1").records() == [record]


def test_summary_on_a_terminal(llm, tmp_path: Path, monkeypatch) -> None:
    from typer.testing import CliRunner

    from memcli.cli import output
    from memcli.cli.app import build_app

    config = imported(tmp_path, llm, {"content": "<summary>Ana likes tea.</summary>"}, turns=2)
    monkeypatch.setattr(output, "stdout_is_tty", lambda: True)
    output.out.cache_clear()
    runner = CliRunner()
    app = build_app("summary")
    result = runner.invoke(app, ["--config", config, "summary", "s1"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("session_summary v1 · ")
    assert lines[0].endswith(" · flush 1, messages 1–2 · 4 tokens")
    assert lines[1] == "Ana likes tea."
    result = runner.invoke(app, ["--config", config, "summary", "s1", "--history"])
    assert result.exit_code == 0, result.output
    assert "session_summary: 1 version" in result.stdout
    assert "Ana likes tea." in result.stdout and "version" in result.stdout


def test_a_failed_reply_is_pending_and_said(llm, tmp_path: Path) -> None:
    config = imported(
        tmp_path,
        llm,
        {"content": "<summary>Ana introduced herself.</summary>"},
        {"status": 500},
    )
    run = memcli("--config", config, "summary", "s1", "--json")
    assert run.code == 0, run.stderr
    (record,) = run.records()
    assert record["version"] == 1 and record["text"] == "Ana introduced herself."
    assert record["pending_batches"] == 1 and "server" in record["error"]
    assert "1 batch waiting to be summarised" in run.stderr
    assert "memcli blocks backfill s1" in run.stderr
    # Backfill takes it in; the summary moves on.
    llm.script({"content": "<summary>Ana introduced herself twice.</summary>"})
    assert memcli("--config", config, "blocks", "backfill", "s1").code == 0
    (record,) = memcli("--config", config, "summary", "s1", "--json").records()
    assert (record["version"], record["pending_batches"]) == (2, 0)


def test_no_summary_yet_and_not_found(llm, tmp_path: Path) -> None:
    config = imported(tmp_path, llm, turns=1)  # one turn: nothing flushed
    run = memcli("--config", config, "summary", "s1", "--json")
    assert run.code == 0 and run.stdout == ""
    assert "No summary of session s1 yet." in run.stderr
    run = memcli("--config", config, "summary", "nope")
    assert run.code == 1 and run.stdout == ""
    assert run.stderr.startswith("Error: no session 'nope'")


def test_a_session_without_a_summary_block_is_told_so(tmp_path: Path) -> None:
    # The default blocks (vector, facts) keep no summary: "yet" would promise one.
    (tmp_path / "chat.jsonl").write_text('{"role": "user", "content": "Hi"}\n')
    assert memcli("import", str(tmp_path / "chat.jsonl"), "--session", "s1").code == 0
    run = memcli("summary", "s1")
    assert run.code == 0 and run.stdout == "", run.stderr
    assert "No summary of session s1: it has no summary block." in run.stderr
    assert 'kind = "summary"' in run.stderr and "yet" not in run.stderr


def test_a_bad_summary_option_in_the_config_exits_2(llm, tmp_path: Path) -> None:
    imported(tmp_path, llm, turns=1)
    path = tmp_path / "bad.toml"
    path.write_text('[[blocks]]\nkind = "summary"\nmax_tokens = 0\n')
    run = memcli("--config", str(path), "summary", "s1")
    assert run.code == 2, run.stderr
    assert "[[blocks]] #1: block 'session_summary': max_tokens must be a whole number >= 10" in (
        run.stderr
    )
    assert f"Error: {path}: [[blocks]] #1" in " ".join(run.stderr.split())  # the file, named


def test_the_chat_long_term_panel_shows_the_summary_wrapped() -> None:
    from memcli.chat.view import BlockView, LongTerm
    from memcli.cli.chat.panels import render_long

    text = " ".join(f"Ana said thing {i}." for i in range(40))
    block = BlockView("session_summary", 1, "SummaryBlock", tokens=200, content=text, computed=True)
    lines = render_long(LongTerm([block], ready=True), 40, loading=False).splitlines()
    assert lines[0].startswith("session_summary SummaryBlock · p1 · 200")
    shown = [line.strip() for line in lines[1:]]
    assert len(shown) == 6 and shown[0].startswith("Ana said thing 0. Ana said")
    assert shown[-1].endswith("…") and all(len(line) <= 40 for line in lines)
    words = " ".join(shown).replace(" …", "").split()
    assert text.startswith(" ".join(words[:-1]))


def test_the_chat_panel_shows_the_summary_after_the_turn_that_flushed(llm, tmp_path: Path) -> None:
    from memcli import SQLiteStore, SummaryBlock
    from memcli.chat import Chat
    from memcli.chat.view import panels
    from memcli.cli.chat.panels import render_long
    from memcli.flush import Budget
    from memcli.llm import LLMConfig

    def reply(body: dict) -> dict:
        if "running summary" in body["messages"][0]["content"]:
            n = sum("running summary" in r["messages"][0]["content"] for r in llm.requests)
            return {"content": f"<summary>Summary number {n}.</summary>"}
        return {"content": "Sure, noted that for you."}

    llm.script(*[reply] * 20)
    block = SummaryBlock(model="openai/test", api_base=llm.api_base, timeout=5)
    chat = Chat(
        SQLiteStore(tmp_path / "chat.db"),
        blocks=[block],
        llm=LLMConfig("openai/test", api_base=llm.api_base, timeout=5),
        budget_for=lambda info: Budget(20, 0.5, 5),
    )
    chat.open("s1")
    shown = []
    for text in ("I am Ana and I live in Porto", "I like tea", "I work as a nurse"):
        list(chat.send(text).events())
        assert chat.longterm is not None and chat.longterm.wait(timeout=120)  # (in background)
        chat.context()  # the panels are drawn again once the work is done (as the UI does)
        (view,) = panels(chat).long.blocks
        shown.append(view.content)
    assert shown[0] == ""  # nothing flushed before the first reply
    assert shown[1:] == ["Summary number 1.", "Summary number 2."]
    assert "Summary number 2." in render_long(panels(chat).long, 60, loading=False)

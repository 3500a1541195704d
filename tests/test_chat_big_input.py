"""Big input in `memcli chat` (issue 44, item 8): a message over the session's budget is refused
with its size and the budget, neither stored nor sent (plain mode, --json, the full-screen app
and the library's Chat); a line longer than plain mode reads whole is skipped unread, and the
chat goes on."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from helpers import memcli, no_blocks  # noqa: F401 (a fixture)

from memcli import SQLiteStore
from memcli.errors import UsageError

pytestmark = pytest.mark.usefixtures("no_blocks")


def model_args(llm: Any) -> list[str]:
    return ["--model", "openai/test", "--api-base", llm.api_base]


def words(n: int) -> str:
    return " ".join(f"word{i}" for i in range(n))


def sent_texts(llm: Any) -> list[str]:
    return [str(m.get("content")) for r in llm.requests for m in r["messages"]]


def stored(session: str) -> list[str]:
    run = memcli("inspect", session, "--all", "--json")
    assert run.code == 0, run.stderr
    return [r["content"] for r in run.records() if r["type"] == "message"]


def test_plain_mode_refuses_a_message_over_the_budget_and_goes_on(llm):
    big = words(600)  # ~1,200 tokens; the budget allows 1,000
    run = memcli(
        "chat",
        "--session",
        "budget",
        "--token-limit",
        "1000",
        *model_args(llm),
        input=f"hi\n{big}\nstill there?\n",
    )
    assert run.code == 1, run.stderr
    assert "over this session's budget" in run.stderr
    assert "over this session's budget of 1,000 tokens (its token_limit)" in run.stderr
    assert f"({len(big):,} bytes)" in run.stderr
    assert len(llm.requests) == 2  # "hi" and "still there?"; the big one never left
    assert not any("word599" in text for text in sent_texts(llm))
    assert "word1 " not in " ".join(stored("budget"))
    assert "still there?" in stored("budget")


def test_json_mode_writes_an_error_record_for_a_refused_message(llm):
    run = memcli(
        "chat",
        "--json",
        "--session",
        "budget-json",
        "--token-limit",
        "1000",
        *model_args(llm),
        input=f"{words(600)}\n",
    )
    assert run.code == 1
    (record,) = [json.loads(line) for line in run.stdout.splitlines() if line.strip()]
    assert record["type"] == "error" and record["failed"] == "message"
    assert record["user_message_stored"] is False
    assert "over this session's budget" in record["error"]
    assert llm.requests == []


def test_plain_mode_skips_a_line_longer_than_it_reads_whole(llm):
    # The default budget (token_limit 30,000) reads lines of up to 30,000 × 8 bytes, at least
    # 256 KiB.
    huge = "x" * 300_000
    run = memcli("chat", "--session", "huge", *model_args(llm), input=f"{huge}\nafter it\n")
    assert run.code == 1, run.stderr
    assert "line 1 is 300,000 bytes, over the 262,144 bytes a message may have" in run.stderr
    assert len(llm.requests) == 1
    assert sent_texts(llm)[-1] == "after it"
    assert stored("huge") == ["after it", "OK"]


def test_a_line_just_under_the_limit_is_read_and_judged_by_its_tokens(llm):
    line = "y" * 262_144  # the limit itself: read whole, then refused by its tokens
    run = memcli("chat", "--session", "edge", *model_args(llm), input=f"{line}\n")
    assert run.code == 1
    assert "over this session's budget" in run.stderr
    assert "bytes a message may have" not in run.stderr
    assert llm.requests == []


def test_the_library_chat_refuses_before_storing(tmp_path, llm):
    from memcli.chat import Chat
    from memcli.flush import Budget
    from memcli.llm import LLMConfig

    chat = Chat(
        SQLiteStore(tmp_path / "c.db"),
        budget_for=lambda info: Budget(200, 0.5, 20),
        llm=LLMConfig("openai/test", api_base=llm.api_base, timeout=10),
        background=False,
    )
    chat.open("lib")
    turn = chat.send(words(150))
    with pytest.raises(UsageError, match="budget of 200 tokens"):
        list(turn.events())
    assert not turn.user_stored
    assert chat.mem.get_all() == []
    assert llm.requests == []
    assert [type(e).__name__ for e in chat.send("a short one").events()][-1] == "ReplyDone"


def wait_for(condition: Any, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError("timed out waiting for the chat")
        time.sleep(0.02)


def test_full_screen_app_says_why_a_message_is_refused_and_sends_nothing(tmp_path, llm):
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from memcli.chat import Chat, Commands
    from memcli.cli.chat.ui import ChatApp
    from memcli.flush import Budget
    from memcli.llm import LLMConfig

    chat = Chat(
        SQLiteStore(tmp_path / "ui.db"),
        budget_for=lambda info: Budget(200, 0.5, 20),
        llm=LLMConfig("openai/test", api_base=llm.api_base, timeout=10),
    )
    chat.open("ui")
    paste = "\n".join(words(15) for _ in range(10))
    with create_pipe_input() as pipe:
        ui = ChatApp(chat, Commands(chat), True, tmp_path / "history", pipe, DummyOutput())
        runner = threading.Thread(target=ui.run)
        runner.start()
        try:
            pipe.send_text("\x1b[200~" + paste + "\x1b[201~\r")
            wait_for(lambda: any(e.kind == "error" for e in ui.entries) and not ui.pending)
            pipe.send_text("short\r")
            wait_for(lambda: any(e.text == "OK" for e in ui.entries) and not ui.pending)
        finally:
            pipe.send_text("\x04")
            runner.join(60)
    assert not runner.is_alive()
    (error,) = [e for e in ui.entries if e.kind == "error"]
    assert "over this session's budget" in error.text and "budget of 200 tokens" in error.text
    assert not any(e.mark == "waiting" for e in ui.entries)  # no reply left waiting
    assert [m.content for m in chat.mem.get_all()] == ["short", "OK"]
    assert len(llm.requests) == 1


def test_full_screen_app_sends_a_25_kb_paste_of_paragraphs_whole_and_once(tmp_path, llm):
    """A 25 KB bracketed paste of 301 lines in paragraphs (blank lines in it, each a newline,
    not an Enter), then Enter: one request holds it exactly as pasted, stored once."""
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from memcli.chat import Chat, Commands
    from memcli.cli.chat.ui import ChatApp
    from memcli.flush import Budget
    from memcli.llm import LLMConfig

    chat = Chat(
        SQLiteStore(tmp_path / "ui.db"),
        budget_for=lambda info: Budget(30000, 0.7, 100),
        llm=LLMConfig("openai/test", api_base=llm.api_base, timeout=10),
    )
    chat.open("paste")
    lines = [words(16) if i % 6 != 5 else "" for i in range(301)]
    paste = "\n".join(lines)
    assert len(paste) > 25_000 and paste.count("\n\n") == 50
    with create_pipe_input() as pipe:
        ui = ChatApp(chat, Commands(chat), True, tmp_path / "history", pipe, DummyOutput())
        runner = threading.Thread(target=ui.run)
        runner.start()
        try:
            pipe.send_text("\x1b[200~" + paste.replace("\n", "\r") + "\x1b[201~")
            wait_for(lambda: ui.app.current_buffer.text == paste)
            assert not llm.requests and not ui.pending  # nothing sent before Enter
            pipe.send_text("\r")
            wait_for(lambda: any(e.text == "OK" for e in ui.entries) and not ui.pending)
        finally:
            pipe.send_text("\x04")
            runner.join(60)
    assert not runner.is_alive()
    assert sent_texts(llm).count(paste) == 1 and len(llm.requests) == 1
    assert sum(paste[:100] in text for text in sent_texts(llm)) == 1  # not in parts either
    assert [m.content for m in chat.mem.get_all()] == [paste, "OK"]

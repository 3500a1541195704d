"""`memcli chat`: plain mode through the CLI against the loopback LLM server, the full-screen app
through prompt-toolkit's pipe input, and the real thing in a terminal (tmux)."""

from __future__ import annotations

import json
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers import memcli, no_blocks  # noqa: F401 (a fixture)

from memcli import MemoryBlock, Message, SQLiteStore
from memcli.blocks.base import BlockContext

# No test here needs the default vector block: no command loads an embedding model.
pytestmark = pytest.mark.usefixtures("no_blocks")


def model_args(llm: Any) -> list[str]:
    return ["--model", "openai/test", "--api-base", llm.api_base]


def stored(session: str) -> list[dict[str, Any]]:
    run = memcli("inspect", session, "--all", "--json")
    assert run.code == 0, run.stderr
    return [r for r in run.records() if r["type"] == "message"]


@pytest.mark.usefixtures("cli_db")  # on SQLite and on PostgreSQL
def test_plain_mode_streams_replies_each_then_an_empty_line_and_stores_both_sides(llm):
    llm.script({"content": "Hello! Nice to meet you, Ana."}, {"content": "You said hi."})
    run = memcli(
        "chat", "--session", "demo", *model_args(llm), input="hi, I'm Ana\nwhat did I say?\n"
    )
    assert run.code == 0, run.stderr
    assert (
        run.stdout == "Hello! Nice to meet you, Ana.\n\nYou said hi.\n\n"
    )  # an empty line after each
    assert "new session demo" in run.stderr
    assert [(m["role"], m["content"]) for m in stored("demo")] == [
        ("user", "hi, I'm Ana"),
        ("assistant", "Hello! Nice to meet you, Ana."),
        ("user", "what did I say?"),
        ("assistant", "You said hi."),
    ]
    assert llm.requests[1]["messages"][-1] == {"role": "user", "content": "what did I say?"}
    assert len(llm.requests[1]["messages"]) == 3


@pytest.mark.usefixtures("cli_db")  # on SQLite and on PostgreSQL
def test_resume_sends_the_stored_window_and_json_lines(llm):
    memcli("chat", "--session", "demo", *model_args(llm), input="first message\n")
    llm.reset()
    llm.script({"content": "I remember."})
    run = memcli("chat", "--json", "--session", "demo", *model_args(llm), input="remember?\n")
    assert run.code == 0, run.stderr
    assert "resumed session demo" in run.stderr
    (record,) = run.records()
    assert record["type"] == "reply" and record["content"] == "I remember."
    assert record["session"] == "demo" and record["stored"] is True
    assert [m["content"] for m in llm.requests[0]["messages"]] == [
        "first message",
        "OK",
        "remember?",
    ]


def test_plain_mode_prepares_the_chat_on_another_thread_before_it_reads_a_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """litellm, the models and the indexes load while the user types: Chat.prepare is running
    on a thread of its own when stdin's first line is read."""
    from memcli.chat import Chat, Commands
    from memcli.cli.chat import run_plain

    started = threading.Event()
    threads: list[str] = []

    def prepare(self: Chat, on_step: Any = None) -> None:
        threads.append(threading.current_thread().name)
        started.set()

    monkeypatch.setattr(Chat, "prepare", prepare)
    was_started: list[bool] = []

    class Stdin:
        buffer = property(lambda self: self)

        lines = [b"/help\n"]

        def readline(self, limit: int = -1) -> bytes:
            if not was_started:
                was_started.append(started.wait(10))
            return self.lines.pop(0) if self.lines else b""

    monkeypatch.setattr(sys, "stdin", Stdin())
    chat = Chat(SQLiteStore(tmp_path / "chat.db"))
    chat.open("s")
    assert run_plain(chat, Commands(chat), True, False) == 0
    assert was_started == [True]
    assert threads == ["memcli-prepare"]


def test_eof_closes_the_store_and_ends_the_process_with_everything_stored(
    llm: Any, isolated: Path
) -> None:
    """The process ends at once after EOF (the interpreter's teardown skipped), its database
    closed first: its last connection took the WAL back into the file."""
    llm.script({"content": "Hello."}, {"content": "Bye."})
    run = memcli("chat", "--session", "s", *model_args(llm), input="hi\nbye\n")
    assert run.code == 0, run.stderr
    assert run.stdout == "Hello.\n\nBye.\n\n"
    (db,) = isolated.glob("*.db")
    assert not list(isolated.glob("*.db-wal"))
    rows = sqlite3.connect(db).execute("SELECT content FROM messages ORDER BY id").fetchall()
    assert [r[0] for r in rows] == ["hi", "Hello.", "bye", "Bye."]


@pytest.mark.usefixtures("cli_db")  # on SQLite and on PostgreSQL
def test_plain_mode_budget_flags_flush(llm):
    text = "".join(f"message number {i} with a few more words in it\n" for i in range(6))
    run = memcli("chat", "--session", "small", "--token-limit", "60", *model_args(llm), input=text)
    assert run.code == 0, run.stderr
    assert "Flushed" in run.stderr
    assert any(m["status"] == "archived" for m in stored("small"))


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("reply", "words"),
    [
        ({"status": 500}, "server error"),
        ({"status": 429}, "rate limiting"),
        ({"status": 401}, "API key"),
        ({"delay": 3, "content": "late"}, "did not answer"),
        (None, "Cannot reach"),
    ],
)
def test_provider_errors_keep_the_message_say_what_to_do_and_exit_1(llm, reply, words):
    api_base = llm.api_base
    if reply is None:
        api_base = f"http://127.0.0.1:{closed_port()}/v1"
    else:
        llm.script(reply)
    run = memcli(
        "chat",
        "--session",
        "err",
        "--model",
        "openai/test",
        "--api-base",
        api_base,
        input="are you there?\n",
        env={"MEMCLI_LLM_TIMEOUT": "1"},
    )
    assert run.code == 1
    assert run.stdout == ""
    stderr = " ".join(run.stderr.split())  # rich wraps long lines
    assert "Error:" in stderr and words in stderr
    assert "/retry" in stderr
    assert [(m["role"], m["content"]) for m in stored("err")] == [("user", "are you there?")]


def test_no_api_key_is_said_as_such_not_as_a_server_error() -> None:
    """No OPENAI_API_KEY (the tests clear provider keys): the OpenAI client refuses before any
    request, and litellm calls that a server error (500); memcli says a key is missing."""
    run = memcli("chat", "--session", "nokey", "--model", "gpt-4o-mini", input="hi\n")
    assert run.code == 1
    stderr = " ".join(run.stderr.split())
    assert "No API key for this provider" in stderr and "OPENAI_API_KEY" in stderr, stderr
    assert "server error" not in stderr and ".." not in stderr
    assert [(m["role"], m["content"]) for m in stored("nokey")] == [("user", "hi")]


def test_retry_in_plain_mode_resends_without_storing_twice(llm):
    llm.script({"status": 500}, {"content": "Back again."})
    run = memcli("chat", "--session", "r", *model_args(llm), input="hello?\n/retry\n")
    assert run.code == 1  # the first call failed
    assert run.stdout == "Back again.\n\n"
    assert [(m["role"], m["content"]) for m in stored("r")] == [
        ("user", "hello?"),
        ("assistant", "Back again."),
    ]
    assert llm.requests[0]["messages"] == llm.requests[1]["messages"]


def test_offline_without_a_model_answers_from_memory(llm):
    run = memcli(
        "chat", "--session", "off", input="I like green tea\nwhat do I like?\n/search tea\n"
    )
    assert run.code == 0, run.stderr
    assert "No model is configured" in run.stderr
    replies = run.stdout.split("\n\n")  # multi-line replies, each ended by an empty line
    assert replies[-1] == "" and len(replies) == 3
    assert all(r.startswith("(Offline") and "\n" in r for r in replies[:2])
    assert "no model is configured" in run.stdout and "--model" in run.stdout
    assert "I like green tea" in replies[1]
    assert "1 hit for 'tea':" in run.stderr and "I like green tea" in run.stderr.split("hit for")[1]
    assert llm.requests == []
    assert [m["role"] for m in stored("off")] == ["user", "user"]


def test_json_mode_writes_an_error_record_for_each_failed_turn(llm):
    llm.script({"status": 500}, {"content": "Back."})
    run = memcli(
        "chat", "--json", "--session", "j", *model_args(llm), input="hello?\n/nope\n/retry\n"
    )
    assert run.code == 1
    failed, unknown, reply = run.records()
    assert failed["type"] == "error" and failed["failed"] == "reply"
    assert failed["user_message_stored"] is True and "server error" in failed["hint"]
    assert unknown["type"] == "error" and unknown["failed"] == "command"
    assert unknown["user_message_stored"] is False and "unknown command" in unknown["error"]
    assert reply["type"] == "reply" and reply["content"] == "Back."
    assert "Error:" in run.stderr  # and the person reads it too


def test_undecodable_input_is_stored_with_replacement_characters_and_the_chat_goes_on():
    run = memcli("chat", "--plain", "--session", "u", input=b"ok\nbad \xff line\nafter\n")
    assert run.code == 0, run.stderr
    assert "Line 2 is not valid UTF-8" in run.stderr
    assert [m["content"] for m in stored("u")] == ["ok", "bad \ufffd line", "after"]


def test_chat_messages_carry_their_time_in_export_and_search(llm):
    llm.script({"content": "Lisbon is lovely."})
    run = memcli("chat", "--session", "t", *model_args(llm), input="I moved to Lisbon\n")
    assert run.code == 0, run.stderr
    exported = memcli("export", "t", "--all").records()
    messages = [r for r in exported if "role" in r]
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert all(m["timestamp"].endswith("Z") for m in messages)
    assert all(m["timestamp"] for m in stored("t"))
    (hit,) = memcli("search", "Lisbon", "--mode", "lexical", "-k", "1", "--json").records()
    assert hit["first_time"] == messages[0]["timestamp"]


def test_chat_help_lists_the_slash_commands_and_keys():
    from memcli.chat.commands import COMMANDS, KEY_LIST

    run = memcli("chat", "--help")
    assert run.code == 0
    lines = run.stdout.splitlines()
    for name in [*COMMANDS, *KEY_LIST]:
        assert any(line.strip().startswith(name) for line in lines), name
    assert "hybrid" in next(line for line in lines if line.strip().startswith("/search"))


def test_unknown_command_in_plain_mode_is_reported(llm):
    run = memcli("chat", *model_args(llm), input="/nope\n/help\n")
    assert run.code == 1
    assert "Error: unknown command '/nope'" in run.stderr
    assert "/context" in run.stderr


def test_two_users_each_chat_in_their_own_session_of_one_name(llm):
    """`--session main --user bob` after ann's `main`: bob's own, new; each resumes their own."""
    assert memcli("chat", "--session", "main", "--user", "ann", input="I am ann\n").code == 0
    run = memcli("chat", "--session", "main", "--user", "bob", input="I am bob\n")
    assert run.code == 0, run.stderr
    assert "new session main (user bob); resume with --session main --user bob" in run.stderr
    run = memcli("chat", "--session", "main", "--user", "ann", input="")
    assert "resumed session main (user ann)" in run.stderr
    for user, said in (("ann", "I am ann"), ("bob", "I am bob")):
        shown = memcli("inspect", "main", "--user", user, "--json")
        assert shown.code == 0, shown.stderr
        records = [json.loads(line) for line in shown.stdout.splitlines()]
        assert [r["content"] for r in records if r.get("type") == "message"][:1] == [said]
    run = memcli("inspect", "main")
    assert run.code == 2 and "2 users have a session 'main': ann, bob" in run.stderr
    run = memcli("inspect", "main", "--user", "carl")
    assert run.code == 1 and "no session 'main' of user 'carl'" in run.stderr
    assert "--user ann" in run.stderr  # (the CLI reads the whole database: it names the owner)


def test_a_new_session_close_to_one_of_the_users_own_gets_did_you_mean(llm):
    assert memcli("chat", "--session", "demo", input="hi\n").code == 0
    assert memcli("chat", "--session", "notes", "--user", "ann", input="hi\n").code == 0
    run = memcli("chat", "--session", "demoo", input="")  # a typo: a new session, said so
    assert run.code == 0, run.stderr
    assert "No session demoo of user default yet: this chat starts it." in run.stderr
    assert "Did you mean demo?" in run.stderr
    run = memcli("chat", "--session", "note")  # ann's 'notes' is not the default user's
    assert run.code == 0 and "Did you mean" not in run.stderr, run.stderr
    run = memcli("chat", "--session", "demo", input="")  # resumed: nothing to guess
    assert run.code == 0 and "Did you mean" not in run.stderr, run.stderr


# -- the full-screen app through prompt-toolkit's pipe input --------------------------------------


class StaticText(MemoryBlock):
    name = "notes"
    priority = 0

    def get(self, messages: Sequence[Message], ctx: BlockContext) -> str:
        return "<fact>The user likes green tea</fact>"


def wait_for(condition: Any, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError("timed out waiting for the chat")
        time.sleep(0.02)


def test_full_screen_app_streams_cancels_and_updates_the_panels(tmp_path, llm):
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from memcli.chat import Chat, Commands
    from memcli.cli.chat.ui import ChatApp
    from memcli.flush import Budget
    from memcli.llm import LLMConfig

    store = SQLiteStore(tmp_path / "ui.db")
    chat = Chat(
        store,
        blocks=[StaticText()],
        budget_for=lambda info: Budget(60, 0.7, 10),
        llm=LLMConfig("openai/test", api_base=llm.api_base, timeout=10),
    )
    chat.open("ui")
    llm.script(
        {"content": "A first reply."},
        {"content": "This reply is long and slow " * 10, "chunk_delay": 0.2},
        {"status": 503},
        {"content": "Retried fine."},
    )
    with create_pipe_input() as pipe:
        ui = ChatApp(chat, Commands(chat), True, tmp_path / "history", pipe, DummyOutput())
        runner = threading.Thread(target=ui.run)
        runner.start()
        try:
            pipe.send_text("hello there, I am Ana\r")
            wait_for(lambda: any(e.text == "A first reply." and not e.mark for e in ui.entries))
            assert ui.panels.long.blocks[0].facts == ["The user likes green tea"]
            pipe.send_text("tell me\x1b\ra long story\r")  # Esc Enter adds a line
            wait_for(lambda: ui.entries[-1].mark == "streaming")
            pipe.send_text("\x03")  # Ctrl-C cancels the reply
            wait_for(lambda: ui.entries[-1].mark == "cancelled" and ui.turn is None)
            pipe.send_text("are you still there?\r")
            wait_for(lambda: any(e.kind == "error" for e in ui.entries) and not ui.pending)
            pipe.send_text("/retry\r")
            wait_for(lambda: ui.entries[-1].text == "Retried fine." and not ui.pending)
            pipe.send_text("/flu")
            wait_for(lambda: ui.app.current_buffer.complete_state is not None)
            pipe.send_text("\x1b[B\r")  # pick the completion, then send it
            wait_for(lambda: ui.app.current_buffer.text == "/flush")
            pipe.send_text("\r")
            wait_for(
                lambda: not ui.pending and ui.entries[-1].text.startswith(("Flushed", "Nothing"))
            )
        finally:
            pipe.send_text("\x04")  # Ctrl-D quits
            runner.join(60)
    assert not runner.is_alive()
    messages = chat.mem.get_all()
    users = [m.content for m in messages if m.role == "user"]
    assert users == ["hello there, I am Ana", "tell me\na long story", "are you still there?"]
    partial = [m for m in messages if m.metadata and m.metadata.get("cancelled")]
    assert len(partial) == 1 and partial[0].content.startswith("This rep")
    assert len(partial[0].content) < len("This reply is long and slow " * 10)
    assert messages[-1].content == "Retried fine." or chat.mem.session().flushes
    assert ui.panels.short.flush_count >= 1  # the small budget flushed
    history = (tmp_path / "history").read_text()
    assert "hello there, I am Ana" in history


class Preparing:
    """An embedder that must be prepared first, as OnnxEmbedder before its export."""

    def __init__(self) -> None:
        self.on_prepare: Any = None

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if self.on_prepare is not None:
            self.on_prepare()
            self.on_prepare = None
        return [[1.0] for _ in texts]


class Embedding(StaticText):
    def __init__(self) -> None:
        super().__init__()
        self.embedder = Preparing()


def test_full_screen_app_keeps_undecodable_input_and_says_when_the_model_is_prepared(tmp_path):
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from memcli.chat import Chat, Commands
    from memcli.cli.chat.ui import ChatApp
    from memcli.cli.common import PREPARING

    chat = Chat(SQLiteStore(tmp_path / "ui.db"), blocks=[Embedding()])
    chat.open("bytes")
    with create_pipe_input() as pipe:
        ui = ChatApp(chat, Commands(chat), True, tmp_path / "history", pipe, DummyOutput())
        runner = threading.Thread(target=ui.run)
        runner.start()
        try:
            wait_for(lambda: any(e.text == PREPARING for e in ui.entries))
            pipe.send_bytes(b"bad \xff line\r")
            pipe.send_text("after\r")
            wait_for(lambda: len(chat.mem.get_all()) == 2 and not ui.pending)
        finally:
            pipe.send_text("\x04")
            runner.join(60)
    assert not runner.is_alive()
    assert [m.content for m in chat.mem.get_all()] == ["bad \ufffd line", "after"]


# -- a real terminal ------------------------------------------------------------------------------


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is not installed (./run installs it)"
)
def test_chat_in_a_real_terminal(tmp_path, llm, isolated):
    """Types messages into `memcli chat` in tmux and reads the screen. The long-term block is a
    static block from a config file's [[blocks]]."""
    root = Path(__file__).resolve().parents[1]
    config = tmp_path / "config.toml"
    config.write_text(
        '[[blocks]]\nkind = "static"\nname = "profile"\npriority = 0\n'
        'content = "The user prefers short answers."\n'
    )
    program = f"-m memcli --config {config}"
    name = f"memcli-test-{tmp_path.name}"
    command = (
        f"cd {root} && env MEMCLI_HOME={isolated} NO_COLOR=1 PYTHONPATH={root} {sys.executable} "
        f"{program} chat --session tty --token-limit 60 --model openai/test --api-base {llm.api_base}"
    )
    tmux("new-session", "-d", "-s", name, "-x", "150", "-y", "40", command)
    try:

        def screen() -> str:
            return tmux("capture-pane", "-p", "-t", name)

        wait_for(lambda: "Short-term" in screen() and "Long-term" in screen())
        for i in range(4):
            tmux(
                "send-keys", "-t", name, f"message {i}: tell me about the sea and the sky", "Enter"
            )
            wait_for(lambda i=i: f"you › message {i}" in screen())
            wait_for(
                lambda: (
                    screen().splitlines()[-1:] != []
                    and screen().splitlines()[-1].startswith(" ready")
                )
            )
        text = screen()
        assert "threshold · limit 60" in text, text  # the budget gauge
        assert "┃" in text or "╋" in text
        assert "⇣ flushed" in text  # the flush mark
        assert "profile" in text and "p0" in text  # the long-term block, with its priority
        assert "model openai/test" in text
        tmux("send-keys", "-t", name, "C-d")
        wait_for(lambda: subprocess.run(["tmux", "has-session", "-t", name]).returncode != 0, 15)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)
    records = [
        json.loads(line)
        for line in memcli("inspect", "tty", "--all", "--json").stdout.splitlines()
        if line.strip()
    ]
    assert sum(1 for r in records if r.get("role") == "user") == 4


def test_ctrl_c_in_plain_mode_keeps_the_partial_reply_marked_and_exits_130(llm):
    import os
    import signal

    llm.script({"content": "word " * 200, "chunk_delay": 0.1})
    proc = subprocess.Popen(
        [sys.executable, "-m", "memcli", "chat", "--session", "cut", *model_args(llm)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=os.environ.copy(),
        # As in a terminal: SIGINT not ignored, even when pytest itself runs in the background.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"talk for a while\n")
    proc.stdin.flush()
    assert proc.stdout.read(10) == b"word word "  # the reply is streaming
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert b"partial reply is kept" in stderr
    last = stored("cut")[-1]
    assert last["role"] == "assistant" and last["metadata"] == {"cancelled": True}
    assert last["content"].startswith("word word") and len(last["content"]) < len("word " * 200)


def test_ctrl_c_in_json_mode_closes_the_connection_and_writes_a_cancelled_reply_record(llm):
    import os
    import signal

    llm.script({"content": "word " * 200, "chunk_delay": 300})
    proc = subprocess.Popen(
        [sys.executable, "-m", "memcli", "chat", "--json", "--session", "cut", *model_args(llm)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=os.environ.copy(),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdin is not None
    proc.stdin.write(b"talk for a while\n")
    proc.stdin.flush()
    wait_for(lambda: len(llm.requests) == 1)
    time.sleep(0.5)  # the first chunk is on its way; the next one is 5 minutes away
    proc.send_signal(signal.SIGINT)
    # Only a closed connection makes the server see it before its next chunk, or before the
    # client's timeout (60 s) would close it.
    assert llm.wait_for_disconnect(timeout=45) is not None
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    (record,) = [json.loads(line) for line in stdout.splitlines() if line.strip()]
    assert record["type"] == "reply" and record["cancelled"] is True
    assert record["pending"] == 0 and record["content"] == stored("cut")[-1]["content"]


def test_full_screen_quit_while_a_reply_streams_keeps_it_and_drops_queued_messages(tmp_path, llm):
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from memcli.chat import Chat, Commands
    from memcli.cli.chat.ui import ChatApp
    from memcli.llm import LLMConfig

    chat = Chat(
        SQLiteStore(tmp_path / "q.db"),
        llm=LLMConfig("openai/test", api_base=llm.api_base, timeout=10),
    )
    chat.open("q")
    llm.script({"content": "slow " * 100, "chunk_delay": 0.1})
    with create_pipe_input() as pipe:
        ui = ChatApp(chat, Commands(chat), True, None, pipe, DummyOutput())
        runner = threading.Thread(target=ui.run)
        runner.start()
        pipe.send_text("first\r")
        wait_for(lambda: ui.entries[-1].mark == "streaming")
        pipe.send_text("second, queued\r")
        wait_for(lambda: len(ui.queued) == 1)
        pipe.send_text("draft")
        wait_for(lambda: ui.app.current_buffer.text == "draft")
        pipe.send_text("\x04")  # Ctrl-D with text deletes; the line is not empty
        pipe.send_text("\x15")  # Ctrl-U empties it
        wait_for(lambda: ui.app.current_buffer.text == "")
        pipe.send_text("\x04")
        runner.join(60)
    assert not runner.is_alive()
    messages = chat.mem.get_all()
    assert [m.content for m in messages if m.role == "user"] == ["first"]
    assert messages[-1].role == "assistant" and messages[-1].metadata == {"cancelled": True}
    assert len(llm.requests) == 1


def test_full_screen_resume_and_switch_show_the_sessions_messages(tmp_path):
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from memcli.chat import Chat, Commands
    from memcli.cli.chat.ui import ChatApp

    store = SQLiteStore(tmp_path / "r.db")
    earlier = Chat(store)
    earlier.open("old")
    earlier.mem.put_messages(
        [Message("user", "an earlier question"), Message("assistant", "an answer")]
    )
    earlier.open("other")
    earlier.mem.put(Message("user", "in the other session"))
    chat = Chat(store)
    chat.open("old")
    with create_pipe_input() as pipe:
        ui = ChatApp(chat, Commands(chat), False, None, pipe, DummyOutput())
        assert [(e.kind, e.text) for e in ui.entries[:2]] == [
            ("user", "an earlier question"),
            ("assistant", "an answer"),
        ]
        assert "Resumed session old" in ui.entries[2].text
        runner = threading.Thread(target=ui.run)
        runner.start()
        pipe.send_text("/session other\r")
        wait_for(lambda: any(e.text == "in the other session" for e in ui.entries))
        wait_for(lambda: ui.panels.short.session_id == "other" and not ui.pending)
        pipe.send_text("a draft")
        wait_for(lambda: ui.app.current_buffer.text == "a draft")
        pipe.send_text("\x03")  # Ctrl-C with no reply running clears the line
        wait_for(lambda: ui.app.current_buffer.text == "")
        pipe.send_text("\x04")
        runner.join(60)
    assert chat.session_id == "other"


# -- memory tools ---------------------------------------------------------------------------------

ADD_FACT = {
    "content": "Noted.",
    "tool_calls": [{"name": "add_fact", "arguments": {"text": "Ana is vegan", "topics": ["food"]}}],
}


def test_memory_tools_from_the_config_file_with_json_records_and_the_fact_history(llm, tmp_path):
    config = tmp_path / "tools.toml"
    config.write_text("blocks = []\n[llm]\nmemory_tools = true\n")
    llm.script(ADD_FACT, {"content": "I will remember that."})
    run = memcli(
        "chat", "--json", "--session", "demo", "--user", "ana", *model_args(llm),
        input="I'm vegan\n", env={"MEMCLI_CONFIG": str(config)},
    )  # fmt: skip
    assert run.code == 0, run.stderr
    call, reply = run.records()
    assert call["type"] == "tool_call" and call["name"] == "add_fact" and call["ok"] is True
    assert call["arguments"] == {"text": "Ana is vegan", "topics": ["food"]}
    assert call["result"]["fact"]["origin"] == "chat-tool" and call["error"] is None
    assert reply["type"] == "reply" and reply["content"] == "I will remember that."
    assert 'add_fact(text="Ana is vegan", topics=["food"]) ✓ fact 1' in run.stderr
    assert "Memory tools are on" in run.stderr

    (fact,) = memcli("facts", "--user", "ana", "--json").records()
    assert (fact["text"], fact["topics"], fact["origin"]) == ("Ana is vegan", ["food"], "chat-tool")
    memcli("facts", "edit", str(fact["id"]), "Ana is vegetarian", "--topic", "diet")
    history = memcli("facts", "history", "--user", "ana", "--json").records()
    assert [(c["action"], c["origin"], c["topics"], c["old_topics"]) for c in history] == [
        ("added", "chat-tool", ["food"], None),
        ("edited", "manual", ["diet"], ["food"]),
    ]
    # The calls are messages of the session: inspect and export show them.
    roles = [(m["role"], m["content"]) for m in stored("demo")]
    assert [r for r, _ in roles] == ["user", "assistant", "tool", "assistant"]
    exported = [r for r in memcli("export", "demo").records() if "role" in r]
    assert exported[1]["tool_calls"][0]["function"]["name"] == "add_fact"
    assert exported[2]["tool_call_id"] == exported[1]["tool_calls"][0]["id"]
    assert json.loads(exported[2]["content"])["fact"]["text"] == "Ana is vegan"


def test_tools_are_offered_only_with_the_flag_or_the_option(llm):
    llm.script({"content": "Hi."}, ADD_FACT, {"content": "Done."})
    run = memcli("chat", "--session", "a", *model_args(llm), input="hi\n")
    assert run.code == 0, run.stderr
    assert "tools" not in llm.requests[0]
    run = memcli("chat", "--memory-tools", "--session", "b", *model_args(llm), input="hi\n")
    assert run.code == 0, run.stderr
    assert run.stdout == "Noted.\nDone.\n\n"  # the text before a call, then the reply
    assert [t["function"]["name"] for t in llm.requests[1]["tools"]] == [
        "search_memory",
        "list_facts",
        "search_facts",
        "add_fact",
        "update_fact",
        "delete_fact",
    ]
    assert "→ add_fact(" in run.stderr


def test_a_server_that_rejects_tools_gets_one_clear_message_and_the_chat_goes_on(llm):
    def server(body: dict[str, Any]) -> dict[str, Any]:
        if "tools" in body:
            return {"status": 400, "message": "model llama2 does not support tools"}
        return {"content": "Plain reply."}

    llm.default = server
    try:
        run = memcli(
            "chat", "--memory-tools", "--session", "t", *model_args(llm), input="hi\nagain\n"
        )
    finally:
        llm.default = {"content": "OK"}
    assert run.code == 0, run.stderr
    assert run.stdout == "Plain reply.\n\nPlain reply.\n\n"
    assert run.stderr.count("Memory tools are off for openai/test") == 1
    assert "(the server said: model llama2 does not support tools)" in run.stderr
    assert "The chat goes on without them." in run.stderr and "Traceback" not in run.stderr


def test_full_screen_app_shows_each_memory_tool_call(tmp_path, llm):
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from memcli.chat import Chat, Commands
    from memcli.cli.chat.ui import ChatApp
    from memcli.config import load_settings
    from memcli.llm import LLMConfig
    from memcli.tool_calls import chat_tools
    from memcli.tools import AgentTools

    store = SQLiteStore(tmp_path / "ui.db")
    settings = load_settings({"MEMCLI_HOME": str(tmp_path)}, {"user": "ana"})
    tools = chat_tools(AgentTools(store, settings, "ana", origin="chat-tool"))
    chat = Chat(
        store,
        user_id="ana",
        llm=LLMConfig("openai/test", api_base=llm.api_base, timeout=10),
        tools=tools,
    )
    chat.open("ui")
    llm.script(ADD_FACT, {"content": "I will remember that."})
    with create_pipe_input() as pipe:
        ui = ChatApp(chat, Commands(chat), True, None, pipe, DummyOutput())
        runner = threading.Thread(target=ui.run)
        runner.start()
        try:
            pipe.send_text("I'm vegan\r")
            wait_for(lambda: not ui.pending and ui.entries[-1].text == "I will remember that.")
        finally:
            pipe.send_text("\x04")
            runner.join(60)
    assert not runner.is_alive()
    kinds = [(e.kind, e.text) for e in ui.entries if e.kind in ("assistant", "tool")]
    assert kinds == [
        ("assistant", "Noted."),
        ("tool", '→ add_fact(text="Ana is vegan", topics=["food"]) ✓ fact 1'),
        ("assistant", "I will remember that."),
    ]
    assert any("Memory tools are on" in e.text for e in ui.entries if e.kind == "note")


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is not installed (./run installs it)"
)
def test_the_edges_in_a_real_terminal(tmp_path, llm, isolated):
    """In tmux, against a slow stream: Ctrl-C closes the provider's connection, /retry sends the
    message again, a fact extracted at /flush shows in the Long-term panel at once, F2 hides and
    shows the panels, and quitting after a resize leaves the terminal clean."""
    root = Path(__file__).resolve().parents[1]
    config = tmp_path / "config.toml"
    config.write_text(
        f'[llm]\nmodel = "openai/test"\napi_base = "{llm.api_base}"\ntimeout = 10\n\n'
        "[memory]\ntoken_limit = 2000\n\n"
        '[[blocks]]\nkind = "facts"\nname = "facts"\n'
    )

    def server(body: dict[str, Any]) -> dict[str, Any]:
        if body.get("stream"):
            return {"content": "Fine."}
        return {"content": "<facts><fact>Ana keeps bees on the roof</fact></facts>"}

    llm.default = server
    llm.script({"content": "word " * 100, "chunk_delay": 300})
    name = f"memcli-edges-{tmp_path.name}"
    command = (
        f"cd {root} && env MEMCLI_HOME={isolated} NO_COLOR=1 PYTHONPATH={root} {sys.executable}"
        f" -m memcli --config {config} chat --session edges; echo CHAT-ENDED; sleep 60"
    )
    tmux("new-session", "-d", "-s", name, "-x", "120", "-y", "40", command)
    try:

        def screen() -> str:
            return tmux("capture-pane", "-p", "-t", name)

        def ready() -> bool:  # (a screen caught blank, mid-resize, is not ready yet)
            lines = screen().rstrip().splitlines()
            return bool(lines) and lines[-1].startswith(" ready")

        wait_for(lambda: "Short-term" in screen() and "Long-term" in screen() and ready())
        tmux("send-keys", "-t", name, "I keep bees", "Enter")
        wait_for(lambda: "word wor" in screen())
        tmux("send-keys", "-t", name, "C-c")
        # The next chunk is 5 minutes away, the client's timeout 60 s: only a closed
        # connection makes the server see it sooner.
        assert llm.wait_for_disconnect(timeout=45) is not None
        wait_for(ready)
        tmux("send-keys", "-t", name, "/retry", "Enter")
        wait_for(lambda: "Fine." in screen() and ready())
        assert llm.requests[1]["messages"][-1] == {"role": "user", "content": "I keep bees"}
        tmux("send-keys", "-t", name, "and honey", "Enter")
        wait_for(lambda: screen().count("Fine.") >= 2 and ready())
        assert "Ana keeps bees" not in screen()
        tmux("send-keys", "-t", name, "/flush", "Enter")
        wait_for(lambda: "Flushed" in screen() and "Ana keeps bees" in screen())
        tmux("send-keys", "-t", name, "F2")
        wait_for(lambda: "Long-term" not in screen())
        tmux("send-keys", "-t", name, "F2")
        wait_for(lambda: "Long-term" in screen())
        tmux("resize-window", "-t", name, "-x", "70", "-y", "24")  # narrow: the panels hide
        wait_for(
            lambda: (
                len(screen().splitlines()[0]) <= 70
                and ready()  # drawn again, not the blank screen of the redraw
                and "Long-term" not in screen()
            )
        )
        tmux("resize-window", "-t", name, "-x", "100", "-y", "30")  # wide again: they show
        wait_for(lambda: "Long-term" in screen())
        tmux("send-keys", "-t", name, "C-d")
        wait_for(lambda: "CHAT-ENDED" in screen())
        left = screen()
        assert "Short-term" not in left and "Long-term" not in left and "Fine." not in left, left
    finally:
        llm.default = {"content": "OK"}
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)
    users = [m["content"] for m in stored("edges") if m["role"] == "user"]
    assert users == ["I keep bees", "and honey"]


def test_full_screen_ctrl_c_cancels_the_streaming_reply_first_and_scrolling_stops_at_the_ends(
    tmp_path, llm
):
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from memcli.chat import Chat, Commands
    from memcli.cli.chat.ui import ChatApp
    from memcli.llm import LLMConfig

    chat = Chat(
        SQLiteStore(tmp_path / "c.db"),
        llm=LLMConfig("openai/test", api_base=llm.api_base, timeout=600),
    )
    chat.open("c")
    llm.script({"content": "slow " * 100, "chunk_delay": 300}, {"content": "Second reply."})
    with create_pipe_input() as pipe:
        ui = ChatApp(chat, Commands(chat), True, None, pipe, DummyOutput())
        runner = threading.Thread(target=ui.run)
        runner.start()
        try:
            pipe.send_text("first\r")
            wait_for(lambda: ui.entries[-1].mark == "streaming")
            pipe.send_text("second, queued\r")
            wait_for(lambda: len(ui.queued) == 1)
            pipe.send_text("\x03")  # Ctrl-C: the streaming reply, not the queued message
            assert llm.wait_for_disconnect(timeout=120) is not None
            wait_for(lambda: any(e.text == "Second reply." for e in ui.entries) and not ui.pending)
            said = [e.text for e in ui.entries if e.kind == "note"]
            assert "Cancelled the reply to “first”." in said, said
            # "1 queued message waits" was true until that message was answered: it is gone
            assert not any("queued" in t for t in said), said
            for i in range(60):
                ui.post(lambda i=i: ui.note(f"line {i}"))
            wait_for(lambda: ui.max_scroll > 40)
            pipe.send_text("\x1b[5~")  # PageUp scrolls at the first press
            wait_for(lambda: ui.scroll_back > 0)
            pipe.send_text("\x1b[H")  # Home: the first line
            wait_for(lambda: ui.scroll_back == ui.max_scroll)
            pipe.send_text("\x1b[5~")  # no further than the first line
            time.sleep(0.2)
            assert ui.scroll_back == ui.max_scroll
            pipe.send_text("\x1b[F")  # End
            wait_for(lambda: ui.scroll_back == 0)
            pipe.send_text("\x1b[6~")  # PageDown at the end stays there
            time.sleep(0.2)
            assert ui.scroll_back == 0
            pipe.send_text("\x1bOQ")  # F2 hides the panels, again shows them
            wait_for(lambda: not ui.show_panels)
            pipe.send_text("\x1bOQ")
            wait_for(lambda: ui.show_panels)
        finally:
            pipe.send_text("\x04")
            runner.join(60)
    assert not runner.is_alive()
    messages = chat.mem.get_all()
    assert [m.content for m in messages if m.role == "user"] == ["first", "second, queued"]
    assert messages[1].metadata == {"cancelled": True} and messages[-1].content == "Second reply."


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is not installed (./run installs it)"
)
def test_panels_start_hidden_on_a_narrow_terminal(tmp_path, isolated):
    root = Path(__file__).resolve().parents[1]
    config = isolated.parent / "no-blocks.toml"  # the no_blocks fixture's
    name = f"memcli-narrow-{tmp_path.name}"
    command = (
        f"cd {root} && env MEMCLI_HOME={isolated} MEMCLI_CONFIG={config} NO_COLOR=1"
        f" PYTHONPATH={root} {sys.executable} -m memcli chat --session narrow"
    )
    tmux("new-session", "-d", "-s", name, "-x", "60", "-y", "24", command)
    try:

        def screen() -> str:
            return tmux("capture-pane", "-p", "-t", name)

        wait_for(lambda: "F2 shows them" in " ".join(screen().split()))
        assert "Short-term" not in screen()
        tmux("send-keys", "-t", name, "F2")
        wait_for(lambda: "Short-term" in screen() and "Long-term" in screen())
        assert all(len(line) <= 60 for line in screen().splitlines())
        tmux("send-keys", "-t", name, "C-d")
        wait_for(lambda: subprocess.run(["tmux", "has-session", "-t", name]).returncode != 0, 15)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)


@pytest.mark.slow
def test_a_new_chat_recalls_a_short_imported_conversation_of_its_user_only(tmp_path, llm, vdb):
    """An imported conversation too short to flush is in the request a new chat of its user
    sends (the default vector block searches every message but the session's own window);
    another user's is not. On every backend: SQLite, PostgreSQL (a FAISS index of its
    vectors), PostgreSQL with pgvector."""
    rows = [
        ("alice", "I have been learning to play the cello for three years."),
        ("alice", "Music is a great hobby."),
        ("bob", "My neighbour plays the bassoon every night in Lyon."),
        ("bob", "That must be loud."),
    ]
    for user in ("alice", "bob"):
        path = tmp_path / f"{user}.jsonl"
        path.write_text(
            "".join(
                json.dumps({"role": role, "content": text}) + "\n"
                for (who, text), role in zip(rows, ["user", "assistant"] * 2, strict=True)
                if who == user
            )
        )
        assert memcli("--db", vdb, "import", str(path), "--user", user, "--no-blocks").code == 0
    config = tmp_path / "vector.toml"
    config.write_text('[[blocks]]\nkind = "vector"\nsimilarity_top_k = 2\n')
    llm.script({"content": "The cello."})
    run = memcli(
        "--db",
        vdb,
        "--config",
        str(config),
        "chat",
        "--user",
        "alice",
        "--session",
        "new",
        *model_args(llm),
        input="Which instrument am I learning to play?\n",
    )
    assert run.code == 0, run.stderr
    sent = json.dumps(llm.requests[0]["messages"])
    assert "cello for three years" in sent
    assert "bassoon" not in sent


def test_full_screen_a_failed_turn_exits_1_a_manual_flush_is_marked_and_ctrl_c_says_how_to_quit(
    tmp_path, llm
):
    """The full-screen chat exits 1 after a failed turn (as plain mode and the README say); a
    /flush shows among the Short-term panel's flush marks with the flushes of the turns; Ctrl-C
    on an empty line says how to quit (once, however often it is pressed)."""
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from memcli.chat import Chat, Commands
    from memcli.cli.chat.ui import QUIT_HINT, ChatApp
    from memcli.flush import Budget
    from memcli.llm import LLMConfig

    chat = Chat(
        SQLiteStore(tmp_path / "f.db"),
        budget_for=lambda info: Budget(60, 0.7, 10),
        llm=LLMConfig("openai/test", api_base=llm.api_base, timeout=10),
    )
    chat.open("f")
    llm.script(
        {"content": "A first reply with a few words in it."},
        {"content": "A second reply with a few more words in it."},
        {"content": "Yes."},
        {"status": 500},
    )
    codes: list[int] = []
    with create_pipe_input() as pipe:
        ui = ChatApp(chat, Commands(chat), True, None, pipe, DummyOutput())
        runner = threading.Thread(target=lambda: codes.append(ui.run()))
        runner.start()
        try:
            pipe.send_text("hello there, I am Ana and I keep bees on the roof\r")
            wait_for(
                lambda: not ui.pending and any(e.text.startswith("A first") for e in ui.entries)
            )
            pipe.send_text("tell me more about the bees and the honey they make\r")
            wait_for(
                lambda: not ui.pending and any(e.text.startswith("A second") for e in ui.entries)
            )
            wait_for(lambda: ui.live_flushes)  # the turns flushed in this run
            pipe.send_text("ok?\r")  # a short turn: two turns to /flush the older of
            wait_for(lambda: not ui.pending and any(e.text == "Yes." for e in ui.entries))
            pipe.send_text("/flush\r")
            wait_for(
                lambda: not ui.pending and any(e.text.startswith("Flushed") for e in ui.entries)
            )
            last = chat.store.list_flushes("f")[-1]
            wait_for(lambda: ui.panels.short.flushes[-1].reason == last.reason)
            assert ui.panels.short.flushes[-1].messages == last.messages
            assert len(ui.live_flushes) == len(chat.store.list_flushes("f"))
            pipe.send_text("\x03\x03")  # Ctrl-C twice on an empty line
            wait_for(lambda: ui.entries[-1].text == QUIT_HINT)
            time.sleep(0.2)
            assert [e.text for e in ui.entries].count(QUIT_HINT) == 1
            pipe.send_text("and now the server fails\r")
            wait_for(lambda: any(e.kind == "error" for e in ui.entries) and not ui.pending)
        finally:
            pipe.send_text("\x04")
            runner.join(60)
    assert not runner.is_alive()
    assert codes == [1]


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is not installed (./run installs it)"
)
def test_a_long_paste_is_previewed_and_the_panels_follow_the_width(tmp_path, isolated):
    """In tmux: a 5,000-character single-line paste gets a line with its length, its start and
    its end above the editor (which shows only part of it); Ctrl-C clears both. Narrowed from
    120 to 60 columns the panels hide (the conversation keeps the width); widened, they show."""
    root = Path(__file__).resolve().parents[1]
    config = isolated.parent / "no-blocks.toml"  # the no_blocks fixture's
    paste = tmp_path / "paste.txt"
    paste.write_text("start of the paste " + "x" * 4970 + " end of it!")
    name = f"memcli-paste-{tmp_path.name}"
    command = (
        f"cd {root} && env MEMCLI_HOME={isolated} MEMCLI_CONFIG={config} NO_COLOR=1"
        f" PYTHONPATH={root} {sys.executable} -m memcli chat --session paste;"
        " echo CHAT-ENDED; sleep 60"
    )
    tmux("new-session", "-d", "-s", name, "-x", "120", "-y", "30", command)
    try:

        def screen() -> str:
            return tmux("capture-pane", "-p", "-t", name)

        wait_for(lambda: "Short-term" in screen() and " ready" in screen())
        tmux("load-buffer", "-b", name, str(paste))
        tmux("paste-buffer", "-b", name, "-t", name)
        wait_for(lambda: "5,000 characters, 1 line" in screen())
        text = screen()
        assert "“start of the" in text and "end of it!”" in text, text
        tmux("send-keys", "-t", name, "C-c")
        wait_for(lambda: "5,000 characters" not in screen() and "xxxxxxxxxx" not in screen())
        tmux("resize-window", "-t", name, "-x", "60", "-y", "20")
        wait_for(
            lambda: (
                len(screen().splitlines()[0]) <= 60
                and " ready" in screen()  # drawn again, not the blank screen of the redraw
                and "Short-term" not in screen()
            )
        )
        assert "│" not in screen()  # no separator: the conversation has the whole width
        tmux("resize-window", "-t", name, "-x", "120", "-y", "30")
        wait_for(lambda: "Short-term" in screen())
        tmux("send-keys", "-t", name, "C-d")
        wait_for(lambda: "CHAT-ENDED" in screen())
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)


# -- imported tool turns --------------------------------------------------------------------------

EXPORTS = Path(__file__).parent / "data" / "exports"
#: The keys OpenAI's Chat Completions API takes on a message, by role (any other is a 400).
OPENAI_MESSAGE_KEYS = {
    "system": {"role", "content", "name"},
    "developer": {"role", "content", "name"},
    "user": {"role", "content", "name"},
    "assistant": {"role", "content", "name", "tool_calls", "refusal", "audio"},
    "tool": {"role", "content", "tool_call_id"},
}


def assert_valid_openai_messages(messages: list[dict[str, Any]]) -> None:
    """What OpenAI's API checks: known keys for each role; each `tool` message in the run of tool
    messages right after an assistant message, answering one of its `tool_calls` by id (once);
    every call answered before the next other message; a call's shape."""
    open_calls: set[str] = set()
    after_calls = False
    for m in messages:
        assert m["role"] in OPENAI_MESSAGE_KEYS, m
        assert set(m) <= OPENAI_MESSAGE_KEYS[m["role"]], m
        if m["role"] == "tool":
            assert after_calls, f"a tool message not after an assistant's tool_calls: {m}"
            assert isinstance(m.get("tool_call_id"), str), m
            assert m["tool_call_id"] in open_calls, m
            open_calls.remove(m["tool_call_id"])
            continue
        assert not open_calls, f"tool calls without results before {m}"
        calls = m.get("tool_calls")
        assert m.get("content") is not None or calls, m
        assert calls is None or (m["role"] == "assistant" and calls), m
        for call in calls or []:
            assert set(call) == {"id", "type", "function"} and call["type"] == "function", call
            assert set(call["function"]) == {"name", "arguments"}, call
            assert isinstance(call["function"]["arguments"], str), call
        open_calls = {c["id"] for c in calls or []}
        assert len(open_calls) == len(calls or []), m
        after_calls = bool(calls)
    assert not open_calls


def test_chat_in_an_imported_session_sends_its_tool_turns_as_valid_openai_messages(llm):
    """Issue 34: ChatGPT's code interpreter, browsing, DALL-E and memory turns, imported and then
    chatted in, reach the API with each tool result answering a call of the assistant message
    before it, and what has no call as text; never an orphan tool message or a foreign key."""
    assert memcli("import", str(EXPORTS / "chatgpt-tools.json"), "--session", "tools").code == 0
    assert any("tool_call_id" in json.dumps(m) for m in stored("tools"))  # tool turns were kept
    llm.script({"content": "Glad to help."})
    run = memcli("chat", "--plain", "--session", "tools", *model_args(llm), input="thanks!\n")
    assert run.code == 0, run.stderr
    (request,) = llm.requests
    sent = request["messages"]
    assert_valid_openai_messages(sent)
    assert sent[-1] == {"role": "user", "content": "thanks!"}
    calls = [c["function"]["name"] for m in sent for c in m.get("tool_calls") or []]
    assert calls == ["bio", "browser", "python", "dalle_text2im"]
    texts = json.dumps(sent, ensure_ascii=False)
    assert "Baeckerei Glatz opens at 6:30." in texts  # the result that answers no call, as text


def test_the_editors_rows_are_counted_only_as_far_as_they_matter() -> None:
    """The editor asks at each redraw how many rows its text takes: counted up to one past the
    most it shows (a 20,000-line paste is not read whole), the same count below that."""
    import random

    from memcli.cli.chat.layout import draft_preview, wrapped_rows

    rng = random.Random(7)
    for _ in range(300):
        text = "\n".join("x" * rng.randrange(0, 200) for _ in range(rng.randrange(1, 12)))
        width = rng.randrange(1, 90)
        every = sum(max(1, -(-len(line) // width)) for line in text.split("\n"))
        assert wrapped_rows(text, width) == every
        assert (
            wrapped_rows(text, width, 8) == every
            if every <= 8
            else wrapped_rows(text, width, 8) > 8
        )
    paste = "first line of it\n" + "middle\n" * 19_998 + "the very end"
    line = draft_preview(paste, 80, 8, 120)
    assert line.startswith(f"{len(paste):,} characters, 20,000 lines: “first line of it”")
    assert "“the very end”" in line and len(line) <= 120
    assert draft_preview("short\nmessage", 80, 8, 120) == ""

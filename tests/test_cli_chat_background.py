"""`memcli chat` never waits for long-term work: a flush's fact extraction runs beside the turns,
a failure is said on stderr (exit 1), and what is left on quitting stays for the next chat."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from helpers import llm_config, memcli, no_blocks  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("no_blocks", "isolated")

LINES = "".join(f"message {i}: I keep bees on the roof of my house\n" for i in range(4))


def test_the_next_turn_is_sent_before_the_slow_fact_call_returns_and_the_batch_waits(
    llm: Any, tmp_path: Any
) -> None:
    """The fact endpoint takes 8 s: every turn's request reaches the server before the fact call
    is answered; quitting says what waits, and `blocks backfill` finishes it."""

    def server(body: dict[str, Any]) -> dict[str, Any]:
        if body.get("stream"):
            return {"content": "Noted."}
        return {"delay": 8, "content": "<facts><fact>The user keeps bees</fact></facts>"}

    config = llm_config(tmp_path, llm, timeout=30)
    llm.default = server
    try:
        run = memcli("--config", config, "chat", "--session", "bees", input=LINES)
    finally:
        llm.default = {"content": "<facts><fact>The user keeps bees</fact></facts>"}
    assert run.code == 0, run.stderr
    assert run.stdout == "Noted.\n\n" * 4
    chats = [i for i, body in enumerate(llm.requests) if body.get("stream")]
    facts = [i for i, body in enumerate(llm.requests) if not body.get("stream")]
    assert len(chats) == 4 and facts, llm.requests
    first = llm.events.index(("request", facts[0]))
    answered = llm.events.index(("reply", facts[0])) if ("reply", facts[0]) in llm.events else None
    last_turn = llm.events.index(("request", chats[-1]))
    assert first < last_turn  # a turn after the flush...
    assert answered is None or last_turn < answered  # ...was sent before the fact call returned
    said = " ".join(run.stderr.split())
    assert "of long-term memory wait" in said and "memcli blocks backfill" in said, said
    assert "--session bees" in said
    # Left unfed, in the store: `check` lists it, a backfill finishes it.
    assert memcli("--config", config, "check").code == 1
    done = memcli("--config", config, "blocks", "backfill")
    assert done.code == 0, done.stderr
    (fact,) = memcli("--config", config, "facts", "--json").records()
    assert fact["text"] == "The user keeps bees"
    llm.default = {"content": "OK"}


def test_a_failed_batch_is_one_line_on_stderr_and_exit_1(llm: Any, tmp_path: Any) -> None:
    """The fact endpoint fails: the turns are answered, stderr says which block failed and why
    (one line per failed job), and the exit code is 1. stdin stays open until the line came."""

    def server(body: dict[str, Any]) -> dict[str, Any]:
        if body.get("stream"):
            return {"content": "Noted."}
        return {"status": 500, "message": "the extractor is down"}

    config = llm_config(tmp_path, llm)
    llm.default = server
    chat = subprocess.Popen(
        [sys.executable, "-m", "memcli", "--config", config, "chat", "--session", "down"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    try:
        assert chat.stdin is not None and chat.stderr is not None
        reader = threading.Thread(target=lambda: lines.extend(chat.stderr or []), daemon=True)
        reader.start()
        chat.stdin.write(LINES)
        chat.stdin.flush()
        end = time.monotonic() + 60
        while not any("failed and" in line for line in lines):
            assert time.monotonic() < end and chat.poll() is None, "".join(lines)
            time.sleep(0.05)
        chat.stdin.close()
        out = chat.stdout.read() if chat.stdout is not None else ""
        code = chat.wait(60)
        reader.join(10)
    finally:
        llm.default = {"content": "OK"}
        if chat.poll() is None:
            chat.kill()
    assert out == "Noted.\n\n" * 4
    assert code == 1, "".join(lines)
    failures = [line for line in lines if "failed and" in line]
    for line in failures:  # one line per failed batch, saying which block and why
        assert line.startswith(
            "Long-term memory: 1 batch failed and stays pending (extracted_info:"
        )
        assert "the extractor is down" in line and line.endswith("retries.\n")

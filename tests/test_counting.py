"""Reading and counting a transcript in two processes gives what one process gives."""

from __future__ import annotations

import json
import os

import pytest

from memcli import InputError, TiktokenTokenizer, counting, forked
from memcli.counting import read_counted


def transcript(n: int = 400) -> bytes:
    """Every kind of line: plain messages, conversations, sessions, metadata, repeats, blanks."""
    out = []
    for i in range(n):
        if i % 7 == 0:
            turn = [
                {"role": "user", "content": f"question {i} about the weather"},
                {"role": "assistant", "content": f"answer {i}:\n\n- sunny  and warm\n- {i % 5}"},
            ]
            out.append(json.dumps({"messages": turn, "session": f"s{i % 3}"}))
        elif i % 11 == 0:
            out.append(json.dumps({"role": "tool", "content": "ok", "metadata": {"n": i}}))
        elif i % 13 == 0:
            out.append("")
        else:
            role = "user" if i % 2 else "assistant"
            out.append(json.dumps({"role": role, "content": f"message {i} <|endoftext|> é 🙂"}))
    return ("\n".join(out) + "\n").encode()


def test_two_processes_give_what_one_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    data = transcript()
    tokenizer = TiktokenTokenizer()
    alone = read_counted(data, "t.jsonl", tokenizer, parallel=False)
    children: list[int] = []

    class Spy(forked.Forked):  # type: ignore[type-arg]
        def __init__(self, *args) -> None:  # type: ignore[no-untyped-def]
            super().__init__(*args)
            children.append(self.pid)

    monkeypatch.setattr(forked, "Forked", Spy)
    shared = read_counted(data, "t.jsonl", tokenizer, parallel=True)
    assert shared == alone
    assert len(children) == 1 and children[0] != os.getpid()  # a child did the second half
    assert len(alone.roles) == len(alone.tokens) == sum(alone.sizes) > 400
    assert alone.sessions == {"s0", "s1", "s2"}


def test_an_error_in_the_second_half_names_its_line() -> None:
    data = transcript()
    lines = data.split(b"\n")
    lines[350] = b'{"role": "user", "content": 5}'
    with pytest.raises(InputError, match=r"^t.jsonl:351: content must be text"):
        read_counted(b"\n".join(lines), "t.jsonl", TiktokenTokenizer(), parallel=True)
    lines[300] = b'{"role": "user", "content": "\xff"}'
    with pytest.raises(InputError, match=r"^t.jsonl:301: invalid UTF-8"):
        read_counted(b"\n".join(lines), "t.jsonl", TiktokenTokenizer(), parallel=True)


def test_the_first_error_in_the_file_wins() -> None:
    lines = transcript().split(b"\n")
    lines[10] = b"not json"
    lines[390] = b"not json either"
    with pytest.raises(InputError, match=r"^t.jsonl:11: invalid JSON"):
        read_counted(b"\n".join(lines), "t.jsonl", TiktokenTokenizer(), parallel=True)


def test_a_failed_child_leaves_its_half_to_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    parent = os.getpid()
    count_columns = counting.count_columns

    def fails_in_the_child(columns, tokenizer):  # type: ignore[no-untyped-def]
        if os.getpid() != parent:
            raise RuntimeError("a bug")
        return count_columns(columns, tokenizer)

    monkeypatch.setattr(counting, "count_columns", fails_in_the_child)
    data = transcript()
    shared = read_counted(data, "t.jsonl", TiktokenTokenizer(), parallel=True)
    assert shared == read_counted(data, "t.jsonl", TiktokenTokenizer(), parallel=False)


def test_a_json_array_or_one_line_is_read_in_one_process() -> None:
    array = json.dumps([{"role": "user", "content": "a b"}] * 50).encode()
    assert counting._middle(array) is None
    assert read_counted(array, "a.json", TiktokenTokenizer(), parallel=True).tokens == [2] * 50
    assert counting._middle(b'{"role": "user", "content": "x"}\n') is None

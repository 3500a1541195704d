"""A function run in a forked child: its result, its errors, and what happens when it fails."""

from __future__ import annotations

import os
import sys
import time

import pytest

from memcli import InputError
from memcli.forked import Forked, can_fork

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="fork is used on Linux only")


def where_and_what(x: int) -> tuple[int, list[int]]:
    return os.getpid(), [x] * 3


def test_the_child_computes_and_sends_back() -> None:
    child_pid, value = Forked(where_and_what, 7).result()
    assert value == [7, 7, 7] and child_pid != os.getpid()


def bad_input(line: int) -> None:
    raise InputError(f"t.jsonl:{line}: invalid JSON", "Each line must be one JSON object")


def test_a_memcli_error_comes_back_whole() -> None:
    with pytest.raises(InputError) as caught:
        Forked(bad_input, 12).result()
    assert caught.value.message == "t.jsonl:12: invalid JSON"
    assert caught.value.hint == "Each line must be one JSON object"


def only_here(parent: int) -> int:
    if os.getpid() != parent:
        os._exit(3)  # the child dies without a word
    return 42


def a_bug() -> None:
    raise RuntimeError("a bug")


def test_a_failed_child_leaves_the_work_to_this_process() -> None:
    assert Forked(only_here, os.getpid()).result() == 42
    with pytest.raises(RuntimeError, match="a bug"):  # the bug's own traceback, from here
        Forked(a_bug).result()


def test_cancel_stops_the_child() -> None:
    child = Forked(time.sleep, 30)
    started = time.perf_counter()
    child.cancel()
    assert time.perf_counter() - started < 5
    with pytest.raises(ChildProcessError):
        os.waitpid(child.pid, os.WNOHANG)  # reaped: no zombie left


def test_no_fork_beside_other_threads() -> None:
    import threading

    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert not can_fork()
    finally:
        stop.set()
        thread.join()


def test_an_error_beside_the_child_stops_it() -> None:
    with pytest.raises(InputError), Forked(time.sleep, 30) as child:
        bad_input(3)
    with pytest.raises(ChildProcessError):
        os.waitpid(child.pid, os.WNOHANG)  # stopped and reaped

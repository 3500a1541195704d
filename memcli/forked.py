"""Work for a second core: a function run in a forked child process, its result sent back pickled.

    with Forked(count_half, data, cut) as half:   # the child starts at once
        mine = count_first_half(data, cut)         # meanwhile, here (an error here stops it)
    theirs = half.result()

Reading JSON, counting tokens and formatting text hold the interpreter's lock, so threads cannot
share them; a child forked from this process can, and needs nothing sent to start. It leaves
through `os._exit` only, never running this process's code after the call. A MemcliError the
function raises comes back and is raised by `result()`; if the child fails any other way (a bug,
a signal, memory), `result()` runs the function here, so the caller gets the same answer, or the
bug's own traceback. Only where forking is safe: Linux, two cores or more, no other threads.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from memcli.errors import MemcliError

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")


def can_fork() -> bool:
    """Forking is safe and useful here: Linux, two cores or more, and no other threads running."""
    import threading

    if sys.platform != "linux" or threading.active_count() != 1:
        return False
    return len(os.sched_getaffinity(0)) >= 2


class Forked(Generic[T]):
    """`function(*args)`, computed in a forked child process."""

    def __init__(self, function: Callable[..., T], *args: Any) -> None:
        self.function, self.args = function, args
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            _child(read_end, write_end, function, args)  # never returns
        os.close(write_end)
        self.pid, self.pipe = pid, read_end

    def __enter__(self) -> Forked[T]:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if kind is not None:  # the work beside it failed: the child's is not wanted
            self.cancel()

    def result(self) -> T:
        """What the function returned (its MemcliError raised), once the child has exited."""
        import pickle

        try:
            with os.fdopen(self.pipe, "rb") as incoming:
                result = pickle.load(incoming)
        except (EOFError, pickle.UnpicklingError):
            result = None
        _, status = os.waitpid(self.pid, 0)
        if status != 0 or result is None:  # the child failed: do its work here
            return self.function(*self.args)
        failed, value = result
        if failed:
            raise value
        return value  # type: ignore[no-any-return]

    def cancel(self) -> None:
        """Stop the child and forget its work."""
        import signal

        os.close(self.pipe)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)


def _child(
    read_end: int, write_end: int, function: Callable[..., Any], args: tuple[Any, ...]
) -> None:
    status = 1
    try:
        import gc
        import pickle

        gc.disable()  # short-lived: no cycles to free, and no pages to copy for the collector
        os.close(read_end)
        try:
            result: tuple[bool, Any] = (False, function(*args))
        except MemcliError as exc:
            result = (True, exc)
        with os.fdopen(write_end, "wb") as out:
            pickle.dump(result, out, protocol=pickle.HIGHEST_PROTOCOL)
        status = 0
    finally:
        os._exit(status)

"""A fork server for the tests' `memcli()` helper: `python -m memcli ARGS` in a new process,
without paying the interpreter's start and the imports for every call.

The server is a Python process that has imported memcli's CLI and its heavy dependencies (Typer,
litellm: about 3 s for litellm alone), and nothing else: no thread, no connection, no file open.
For each call it forks; the child takes the caller's working directory, environment, standard
input and output files, sets `sys.argv` and runs `memcli` as `python -m memcli` does (runpy,
`__main__`), then exits as the interpreter would for what the command left (threads joined,
atexit handlers, SQLite connections closed, files flushed: see `_finish`) with the command's
exit status. So each command still runs in its own process, from the
state a fresh interpreter has after the same imports; the caller gets the exit status, stdout and
stderr as `subprocess.run` gives them, and the child's pid to kill it on a timeout.

A call whose environment differs from the server's in what the interpreter or an already imported
library reads at start (PYTHON*, locale, LITELLM_*) is run as a plain subprocess by the helper
instead. The server starts with the environment the test process had when it imported the helper
(before any test changed it). `MEMCLI_TEST_NO_FORK=1` turns the server off (every call a plain subprocess).

Protocol (one call per connection, over a unix socket): the request as one JSON line; the
answer "PID\n" when the child started, then "STATUS\n" (as `subprocess` gives it: -N for a signal).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys

#: Environment variables read when the interpreter starts or when a preloaded library is imported.
STARTUP_PREFIXES = ("PYTHON", "LC_", "LANG", "LITELLM_")
#: ... except what memcli sets itself before it imports litellm (`memcli.llm.load_litellm`).
SET_BY_MEMCLI = {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def startup_env(env: dict[str, str]) -> dict[str, str]:
    """What of `env` a fork of the server could not take on."""
    return {k: v for k, v in {**SET_BY_MEMCLI, **env}.items() if k.startswith(STARTUP_PREFIXES)}


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _finish(code: int) -> None:
    """End the child as the interpreter ends `python -m memcli`, for what a command leaves:
    threads joined, atexit handlers run, SQLite connections closed (the last one checkpoints and
    removes the WAL file) and files flushed, as the finalisation of their objects does; then exit
    without tearing down the thousands of modules the server imported (a second per call)."""
    import atexit
    import gc
    import io
    import sqlite3
    import threading

    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    gc.collect()
    for obj in gc.get_objects():  # what the child made: the server's objects are frozen
        try:
            if isinstance(obj, sqlite3.Connection):
                obj.close()
            elif isinstance(obj, io.IOBase) and not obj.closed and obj.writable():
                obj.flush()
        except Exception:
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def _run(request: dict) -> None:
    """In the forked child: become `python -m memcli ARGS`; never returns."""
    import random
    import runpy
    import traceback

    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for fd, path, flags in (
            (0, request["stdin"] or os.devnull, os.O_RDONLY),
            (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
            (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        ):
            opened = os.open(path, flags, 0o600)
            os.dup2(opened, fd)
            os.close(opened)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        random.seed()  # a fresh interpreter's random state, not the server's
        sys.argv = [request["main"], *request["args"]]
        try:
            runpy.run_module("memcli", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc)
        except KeyboardInterrupt:
            traceback.print_exc()
            code = 128 + signal.SIGINT
        except BaseException:
            traceback.print_exc()
            code = 1
    except BaseException:  # the child could not be set up
        traceback.print_exc()
    _finish(code)


def _handle(conn: socket.socket) -> None:
    """In a handler process (a fork of the server): start the child, report its pid and status."""
    with conn, conn.makefile("rwb") as stream:
        request = json.loads(stream.readline())
        pid = os.fork()
        if pid == 0:
            conn.close()
            _run(request)
        stream.write(f"{pid}\n".encode())
        stream.flush()
        _, status = os.waitpid(pid, 0)
        stream.write(f"{os.waitstatus_to_exitcode(status)}\n".encode())
        stream.flush()


def serve(path: str) -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import importlib

    import memcli.cli.app as app

    for _, module, _, _ in app.COMMANDS:
        importlib.import_module(module)
    import memcli.llm

    memcli.llm.load_litellm()
    for name in ("openai.resources", "httpcore", "memcli.openai_client"):  # the calls' clients
        importlib.import_module(name)
    # What searches and PostgreSQL stores import. OpenBLAS starts its threads when numpy is
    # imported: one thread here (the children's numpy then multiplies on one core, as the tests
    # need). onnxruntime starts a thread when imported: each child imports it.
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    for name in ("numpy", "psycopg", "faiss", "tiktoken"):
        importlib.import_module(name)
    del os.environ["OPENBLAS_NUM_THREADS"]
    if len(os.listdir("/proc/self/task")) != 1:
        sys.exit("the fork server must have one thread when it forks")

    import gc

    gc.collect()
    gc.freeze()  # the children's collections skip the server's objects (and leave their pages shared)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers are reaped by the kernel
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        if os.fork() == 0:
            server.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            try:
                _handle(conn)
            finally:
                os._exit(0)
        conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])

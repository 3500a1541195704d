"""Helpers for CLI tests: run memcli in-process or as a subprocess, parse JSON Lines."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from forkserver import startup_env


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str

    def records(self) -> list[dict[str, Any]]:
        """Every stdout line parsed as JSON (a test fails if one is not)."""
        return [json.loads(line) for line in self.stdout.splitlines() if line.strip()]


def memcli(
    *args: str,
    input: str | bytes | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> Run:
    """Run `python -m memcli ARGS` in a new process, as a shell would: forked from the fork
    server (tests/forkserver.py), or a plain subprocess when the call's environment needs one."""
    full_env = {**os.environ, **(env or {})}
    data = input.encode() if isinstance(input, str) else input
    server = _FORK_SERVER.get(full_env)
    if server is not None:
        return server.run(list(args), data, full_env, timeout)
    proc = subprocess.run(
        [sys.executable, "-m", "memcli", *args],
        input=data,
        capture_output=True,
        env=full_env,
        timeout=timeout,
    )
    return Run(proc.returncode, proc.stdout.decode(), proc.stderr.decode())


class _ForkServer:
    """This test process's fork server (started on first use, stopped at exit)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str] = {}
        self.dir = ""
        self.calls = itertools.count(1)  # (next() is atomic: tests may call from threads)
        self.failed = False
        self.lock = threading.Lock()

    def get(self, env: dict[str, str]) -> _ForkServer | None:
        if os.environ.get("MEMCLI_TEST_NO_FORK") == "1" or self.failed:
            return None
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self._start()
        if self.failed or startup_env(env) != startup_env(self.env):
            return None
        return self

    def _start(self) -> None:
        import atexit
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="memcli-fork-")
        self.env = _BASELINE_ENV
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("forkserver.py")), self.socket],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            env=self.env,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != b"ready":
            self.failed = True  # (every call then runs as a plain subprocess)
            self.proc.kill()
        atexit.register(self.stop)

    @property
    def socket(self) -> str:
        return os.path.join(self.dir, "socket")

    def stop(self) -> None:
        import shutil

        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def run(self, args: list[str], data: bytes | None, env: dict[str, str], timeout: float) -> Run:
        proc = self.start(args, data, env)
        try:
            out, err = proc.communicate(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(["memcli", *args], timeout, out, err) from None
        assert proc.returncode is not None
        return Run(proc.returncode, out.decode(), err.decode())

    def start(self, args: list[str], data: bytes | None, env: dict[str, str]) -> Forked:
        import socket

        base = os.path.join(self.dir, f"call-{os.getpid()}-{next(self.calls)}")
        stdin = None
        if data is not None:
            stdin = base + ".in"
            Path(stdin).write_bytes(data)
        request = {
            "main": str(Path(__file__).resolve().parents[1] / "memcli" / "__main__.py"),
            "args": args,
            "env": env,
            "cwd": os.getcwd(),
            "stdin": stdin,
            "stdout": base + ".out",
            "stderr": base + ".err",
        }
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.socket)
        conn.sendall(json.dumps(request).encode() + b"\n")
        return Forked(conn, [p for p in (stdin, request["stdout"], request["stderr"]) if p])


class Forked:
    """A command forked by the fork server, as much of `subprocess.Popen` as the tests use."""

    def __init__(self, conn: Any, files: list[str]) -> None:
        self.conn = conn
        self.stream = conn.makefile("rb")
        self.files = files
        self.pid = int(self.stream.readline())
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.wait(0) if self.returncode is None else self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        import select

        if self.returncode is None:
            if timeout is not None and not select.select([self.conn], [], [], timeout)[0]:
                if timeout == 0:
                    return None
                raise subprocess.TimeoutExpired(["memcli"], timeout)
            self.returncode = int(self.stream.readline())
            self.stream.close()
            self.conn.close()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:  # it ended meanwhile
                pass

    def kill(self) -> None:
        import signal

        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[bytes, bytes]:
        """The command's stdout and stderr, once it ended (its files removed)."""
        self.wait(timeout)
        out, err = (_read(p) for p in self.files[-2:])
        for path in self.files:
            if os.path.exists(path):
                os.unlink(path)
        return out, err


def popen_memcli(*args: str, env: dict[str, str] | None = None) -> Forked | subprocess.Popen[bytes]:
    """Start `python -m memcli ARGS` and return at once (stdout and stderr captured): to kill it,
    wait for it or run others meanwhile. Forked from the fork server as `memcli()` is."""
    full_env = {**os.environ, **(env or {})}
    server = _FORK_SERVER.get(full_env)
    if server is not None:
        return server.start(list(args), None, full_env)
    return subprocess.Popen(
        [sys.executable, "-m", "memcli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=full_env,
    )


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        return b""


#: The environment before any test changed it: the fork server's.
_BASELINE_ENV = dict(os.environ)
_FORK_SERVER = _ForkServer()


FACTS_BLOCK = '[[blocks]]\nkind = "facts"\n'


def llm_config(tmp_path: Path, llm: Any, blocks: str = FACTS_BLOCK, timeout: float = 5) -> str:
    """A config file for the loopback LLM server, a small budget (a flush every few turns) and
    `blocks`; its path."""
    path = tmp_path / "config.toml"
    path.write_text(
        f'[llm]\nmodel = "openai/test"\napi_base = "{llm.api_base}"\ntimeout = {timeout}\n\n'
        "[memory]\ntoken_limit = 100\nchat_history_token_ratio = 0.1\ntoken_flush_size = 5\n\n"
        + blocks
    )
    return str(path)


def turns_transcript(tmp_path: Path, turns: int) -> str:
    """A JSONL transcript of `turns` user/assistant turns (chat.jsonl in tmp_path); its path."""
    path = tmp_path / "chat.jsonl"
    lines = []
    for i in range(turns):
        lines.append({"role": "user", "content": f"turn {i}: I say something about myself"})
        lines.append({"role": "assistant", "content": "Noted."})
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return str(path)


@pytest.fixture
def no_blocks(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A config file without long-term blocks (`blocks = []`) for every command the test runs:
    for CLI tests that do not test the blocks, so that no command loads an embedding model.
    Use it with `pytestmark = pytest.mark.usefixtures("no_blocks")`; `--config` still wins."""
    path = isolated.parent / "no-blocks.toml"
    path.write_text("blocks = []\n")
    monkeypatch.setenv("MEMCLI_CONFIG", str(path))
    return path


def import_file(
    store: Any, file: str | Path | bytes, opening: Any, session: str | None = None, **options: Any
) -> Any:
    """A file (or its bytes, as stdin) imported as `memcli import` imports it, through the library:
    `formats.read`, `importing.from_source`, then `import_conversations` with the file's session
    record; `options` as `import_conversations` takes them. Returns its `Imported`."""
    import io

    from memcli.formats import read
    from memcli.importing import from_source, import_conversations

    source = read("-", io.BytesIO(file)) if isinstance(file, bytes) else read(file)
    found = from_source(source, session)
    return import_conversations(store, found, opening, session_record=source.header, **options)


def transcript_lines(*records: dict[str, Any], session: str | None = None) -> bytes:
    """Records as JSON Lines (each naming `session` when given)."""
    extra = {} if session is None else {"session": session}
    return "".join(json.dumps({**r, **extra}) + "\n" for r in records).encode()

"""A fresh chat's first reply against its second, and how long a plain chat takes to exit after EOF.

    PYTHONPATH=. python benchmarks/chat_latency.py [--runs 3] [--think 6]

Against the tests' loopback OpenAI-compatible server (it answers at once), in a fresh `memcli
chat --plain` process per run, with the default blocks (a vector block and a fact block) in a new
home. The first line is written `--think` seconds after the process starts (a user typing a first
message; the chat prepares litellm, the store's indexes, the tokenizer and the blocks' models
meanwhile; 0: at once, everything loaded on the first turn's way). From the moment a line is
written to stdin to the reply's first byte on stdout: the first line and the second (everything
warm). Exit: from closing stdin to the process's end, with long-term work (the fact block's
extraction after a flush) still running: the chat waits for none of it.
"""

from __future__ import annotations

import argparse
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from llm_server import LLMServer  # noqa: E402


def model_folder() -> Path | None:
    """The exported embedding model, when at hand ($MEMCLI_HOME/models or
    ~/.local/share/memcli/models): without it, a command with the default blocks exports one."""
    for home in (os.environ.get("MEMCLI_HOME"), "~/.local/share/memcli"):
        if home and (Path(home).expanduser() / "models").is_dir():
            return Path(home).expanduser() / "models"
    return None


def read_reply(proc: subprocess.Popen[bytes]) -> float:
    """Wait for the next reply's first byte on stdout; when it came, then read the reply to its
    empty line."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    select.select([fd], [], [], 120)
    first = time.perf_counter()
    data = b""
    while not data.endswith(b"\n\n"):
        piece = os.read(fd, 4096)
        if not piece:
            break
        data += piece
    return first


def one_run(server: LLMServer, home: Path, think: float) -> tuple[float, float, float]:
    env = {
        **os.environ,
        "MEMCLI_HOME": str(home),
        "MEMCLI_TOKEN_LIMIT": "60",  # the second turn flushes: the fact call runs at exit
        "PYTHONPATH": str(ROOT),
        "HF_HUB_OFFLINE": "1",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "memcli",
            "chat",
            "--plain",
            "--model",
            "openai/test",
            "--api-base",
            server.api_base,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    assert proc.stdin is not None
    time.sleep(think)
    latencies = []
    for line in ("hello, I keep bees on the roof of my house", "and I sell the honey at a market"):
        sent = time.perf_counter()
        proc.stdin.write(line.encode() + b"\n")
        proc.stdin.flush()
        latencies.append(read_reply(proc) - sent)
    closed = time.perf_counter()
    proc.stdin.close()
    proc.wait(120)
    return latencies[0], latencies[1], time.perf_counter() - closed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--think", type=float, default=6.0, help="seconds from the start to the first line"
    )
    args = parser.parse_args()

    def reply(body: dict) -> dict:
        if body.get("stream"):
            return {"content": "Noted, and remembered."}
        return {"delay": 8, "content": "<facts><fact>The user keeps bees</fact></facts>"}

    server = LLMServer(reply).start()
    firsts, seconds, exits = [], [], []
    try:
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory() as home:
                models = Path(os.environ.get("MEMCLI_HOME", "~/.local/share/memcli")).expanduser()
                if (models / "models").is_dir():  # the exported model, not exported again
                    (Path(home) / "models").symlink_to(models / "models")
                first, second, exit_time = one_run(server, Path(home), args.think)
            firsts.append(first)
            seconds.append(second)
            exits.append(exit_time)
    finally:
        server.stop()
    print(f"first line {args.think:g} s after the start")
    for name, values in (
        ("first reply", firsts),
        ("second reply", seconds),
        ("exit after EOF", exits),
    ):
        ms = [v * 1000 for v in values]
        print(
            f"{name}: median {statistics.median(ms):.0f} ms, min {min(ms):.0f} ms,"
            f" max {max(ms):.0f} ms (n={len(ms)})"
        )


if __name__ == "__main__":
    main()

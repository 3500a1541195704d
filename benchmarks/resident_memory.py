"""Resident memory of the long-running commands: `memcli chat --plain`, `memcli mcp` (stdio) and
`memcli mcp --http` (two users), each in a real process with the default blocks.

    PYTHONPATH=. python benchmarks/resident_memory.py [--calls 100] [--only chat|mcp|http]
        [--turns 12]

Against the tests' loopback OpenAI-compatible server (tests/llm_server.py, in this process),
with `--model openai/test --api-base <server>` (the config's [llm]), on a store with some
imported conversations (30 of `--turns` exchanges: 720 messages by default; made once, copied
for each command). The exported embedding model is taken from $MEMCLI_HOME/models or
~/.local/share/memcli/models (the default blocks need it).

For each command, VmRSS (resident now) and VmHWM (the peak) of the child, from
/proc/<pid>/status: after start (the chat: once its CPU time stops moving; the MCP servers: once
initialised), after the first call, after `--calls` calls. The chat's calls are turns (a line
sent, its reply read); the MCP servers' a mix of put_messages, search_memory, list_facts and
get_context (over HTTP two users take turns). Each child runs under `python -X importtime`: the
heavy packages it imported are listed from that (the child's sys.modules is not visible here).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from chat_latency import model_folder, read_reply  # noqa: E402
from llm_server import LLMServer  # noqa: E402

FACTS = "<facts><fact>The user keeps bees</fact></facts>"
#: Top-level packages worth naming when a process has imported them.
HEAVY = (
    "torch",
    "transformers",
    "sentence_transformers",
    "onnxruntime",
    "faiss",
    "numpy",
    "tokenizers",
    "tiktoken",
    "scipy",
    "sklearn",
    "litellm",
    "openai",
    "mcp",
    "pydantic",
    "uvicorn",
    "starlette",
    "httpx",
    "httpx2",
    "anyio",
    "rich",
    "prompt_toolkit",
    "typer",
)
TOPICS = ("bees", "honey", "the roof garden", "a trip to Porto", "sourdough", "the bike", "chess")


def status(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process, in MB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


def cpu_ticks(pid: int) -> int:
    parts = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(parts[11]) + int(parts[12])


def settle(pid: int, quiet: float = 1.5, limit: float = 300) -> None:
    """Wait until the process has used no CPU for `quiet` seconds (its start-up done)."""
    end = time.monotonic() + limit
    last, since = cpu_ticks(pid), time.monotonic()
    while time.monotonic() < end:
        time.sleep(0.25)
        now = cpu_ticks(pid)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return


def heavy_imports(stderr: Path) -> list[str]:
    """The HEAVY packages an `-X importtime` child imported (from its stderr)."""
    names = set()
    for line in stderr.read_text(errors="replace").splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return [n for n in HEAVY if n in names]


def conversations(sessions: int = 30, turns: int = 12) -> str:
    """A transcript (JSON Lines) of `sessions` conversations of `turns` exchanges each."""
    lines = []
    for s in range(sessions):
        topic = TOPICS[s % len(TOPICS)]
        for t in range(turns):
            lines.append(
                {
                    "session": f"talk-{s}",
                    "role": "user",
                    "content": f"Day {t} of {topic}: what I did (note {s}-{t}), and what went "
                    f"wrong with {topic} this time, in a few more words than a line.",
                }
            )
            lines.append(
                {
                    "session": f"talk-{s}",
                    "role": "assistant",
                    "content": f"That sounds like progress with {topic}; next time try step {t}.",
                }
            )
    return "".join(json.dumps(line) + "\n" for line in lines)


def row(label: str, pid: int) -> None:
    rss, hwm = status(pid)
    print(f"  {label:22} VmRSS {rss:6.0f} MB   VmHWM {hwm:6.0f} MB", flush=True)


def run_chat(env: dict[str, str], db: Path, calls: int, errlog: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "memcli", "--db", str(db), "chat", "--plain"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=errlog.open("wb"),
        env=env,
        cwd=ROOT,
    )
    assert proc.stdin is not None
    try:
        settle(proc.pid)
        row("after start", proc.pid)
        for i in range(calls):
            proc.stdin.write(f"Tell me again about {TOPICS[i % len(TOPICS)]} ({i})\n".encode())
            proc.stdin.flush()
            read_reply(proc)
            if i == 0:
                row("after the first turn", proc.pid)
        settle(proc.pid)
        row(f"after {calls} turns", proc.pid)
    finally:
        proc.stdin.close()
        proc.wait(600)


def tool_call(i: int, user: str = "") -> tuple[str, dict[str, Any]]:
    """The i-th call: put_messages, search_memory, list_facts, get_context in turn (over HTTP,
    `user`'s sessions: a session belongs to one user)."""
    topic = TOPICS[i % len(TOPICS)]
    kind = i % 4
    if kind == 0:
        messages = [
            {"role": "user", "content": f"Something new about {topic} ({i})."},
            {"role": "assistant", "content": f"Noted about {topic}."},
        ]
        return "put_messages", {"messages": messages, "session": f"mcp{user}-{i // 4 % 3}"}
    if kind == 1:
        return "search_memory", {"query": f"what went wrong with {topic}", "k": 5}
    if kind == 2:
        return "list_facts", {}
    session = f"mcp{user}-{i // 4 % 3}" if user else f"talk-{i % 30}"
    return "get_context", {"session": session, "input": f"And {topic}?"}


def check(result: Any, name: str) -> None:
    if getattr(result, "is_error", False) or getattr(result, "isError", False):
        raise SystemExit(f"{name} failed: {result.content}")


def run_mcp(env: dict[str, str], db: Path, calls: int, errlog: Path) -> None:
    import anyio
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(
        command=sys.executable,
        args=["-X", "importtime", "-m", "memcli", "--db", str(db), "mcp"],
        env=env,
        cwd=ROOT,
    )

    async def main() -> None:
        with errlog.open("w") as err:
            async with (
                stdio_client(params, errlog=err) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                pid = server_pid(db)
                settle(pid)
                row("after start", pid)
                for i in range(calls):
                    name, arguments = tool_call(i)
                    check(await session.call_tool(name, arguments), name)
                    if i == 0:
                        row("after the first call", pid)
                settle(pid)
                row(f"after {calls} calls", pid)

    anyio.run(main)


def server_pid(db: Path) -> int:
    """The pid of the memcli process serving `db` (a child of the SDK's stdio client)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(db).encode() in argv and b"memcli" in argv:
            return int(entry.name)
    raise SystemExit(f"no memcli process serves {db}")


def run_http(env: dict[str, str], db: Path, calls: int, errlog: Path) -> None:
    import anyio
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    memcli = [sys.executable, "-m", "memcli", "--db", str(db)]
    tokens = []
    for user in ("ana", "bo"):
        made = subprocess.run(
            [*memcli, "mcp", "token", "add", "--user", user],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            check=True,
        )
        tokens.append(made.stdout.strip())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", *memcli[1:], "mcp", "--http", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=errlog.open("wb"),
        env=env,
        cwd=ROOT,
    )
    url = f"http://127.0.0.1:{port}/mcp"

    async def call(token: str, name: str, arguments: dict[str, Any]) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=600) as http,
            streamable_http_client(url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            check(await session.call_tool(name, arguments), name)

    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"memcli mcp --http ended: see {errlog}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        settle(proc.pid)
        row("after start", proc.pid)
        for i in range(calls):
            user = i // 4 % 2  # four calls each in turn
            name, arguments = tool_call(i, str(user))
            anyio.run(call, tokens[user], name, arguments)
            if i == 0:
                row("after the first call", proc.pid)
        settle(proc.pid)
        row(f"after {calls} calls", proc.pid)
    finally:
        proc.terminate()
        proc.wait(60)



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--only", choices=["chat", "mcp", "http"], action="append")
    parser.add_argument(
        "--turns", type=int, default=12, help="exchanges per imported conversation (30 of them)"
    )
    args = parser.parse_args()
    models = model_folder()
    if models is None:
        raise SystemExit("no exported embedding model: run `memcli setup` first")

    def reply(body: dict[str, Any]) -> dict[str, Any]:
        return {"content": "Noted."} if body.get("stream") else {"content": FACTS}

    server = LLMServer(reply).start()
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("MEMCLI_", "LITELLM_", "LLM_"))
    }
    base |= {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            home = Path(tmp)
            (home / "models").symlink_to(models, target_is_directory=True)
            config = home / "config.toml"
            config.write_text(f'[llm]\nmodel = "openai/test"\napi_base = "{server.api_base}"\n')
            env = base | {"MEMCLI_HOME": str(home), "MEMCLI_CONFIG": str(config)}
            made = home / "made.db"
            transcript = home / "talks.jsonl"
            transcript.write_text(conversations(turns=args.turns))
            done = subprocess.run(
                [sys.executable, "-m", "memcli", "--db", str(made), "import", str(transcript)],
                capture_output=True,
                text=True,
                env=env,
                cwd=ROOT,
            )
            if done.returncode != 0:
                raise SystemExit(f"import failed: {done.stderr[-2000:]}")
            print(f"store: {done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ''}")
            runs = {"chat": run_chat, "mcp": run_mcp, "http": run_http}
            titles = {
                "chat": "memcli chat --plain",
                "mcp": "memcli mcp (stdio)",
                "http": "memcli mcp --http (two users)",
            }
            for name in args.only or list(runs):
                db = home / f"{name}.db"
                shutil.copy(made, db)
                for extra in ("-wal", "-shm"):
                    if Path(f"{made}{extra}").exists():
                        shutil.copy(f"{made}{extra}", f"{db}{extra}")
                print(f"\n{titles[name]} (load {os.getloadavg()[0]:.1f})", flush=True)
                errlog = home / f"{name}.err"
                runs[name](env, db, args.calls, errlog)
                print(f"  imported: {', '.join(heavy_imports(errlog))}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()

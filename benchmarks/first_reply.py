"""What a first reply costs: a one-message `memcli chat --plain` against `llm -m echo hi`, side by
side; a plain chat's first reply against its second; `memcli mcp`'s first `remember`.

    PYTHONPATH=. python benchmarks/first_reply.py [--runs 5] [--no-mcp] [--no-clients]

Against the tests' loopback OpenAI-compatible server (tests/llm_server.py, in this process: its
CPU is not counted), with `--model openai/test --api-base <server>`, each process fresh:

- CPU seconds (user + system, of the child process alone) of `python -m memcli chat --plain`
  sending one message ("hi") and exiting, against `python -m llm -m echo hi` (simonw/llm with the
  llm-echo plugin: a model that answers without any network; its log in a folder of its own),
  runs alternating so both see the same load, after one run of each that makes its database.
  Twice: with no long-term blocks (`blocks = []`) and with the default blocks (the vector block
  and its embedding model) when the exported model is at hand ($MEMCLI_HOME/models or
  ~/.local/share/memcli/models).
- Wall time to a reply's first byte: of the first line, written as soon as the process starts,
  from the start (all of the start-up is in it); of the second and the third, each written once
  the reply before it has ended, from its writing.
- The candidates for calling OpenAI-compatible endpoints: CPU seconds of a fresh process that
  makes one streamed call to the server through httpx alone, through the `openai` SDK, through
  litellm (`--no-clients` skips this).
- `memcli mcp` (stdio, the MCP SDK's client): the time from starting the server to the answer of
  its first `remember` (the fact block asks the loopback server), and of the second.

The medians are printed; the ratio is memcli's CPU over llm's.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from chat_latency import model_folder, read_reply  # noqa: E402 (this folder: the script's own)
from llm_server import LLMServer  # noqa: E402

FACTS = "<facts><fact>The user keeps bees</fact></facts>"


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_cpu(args: list[str], env: dict[str, str], stdin: bytes | None = None) -> float:
    """CPU seconds of one child process (it must succeed)."""
    before = children_cpu()
    proc = subprocess.run(args, input=stdin, capture_output=True, env=env, timeout=600, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"{args} failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}")
    return children_cpu() - before


def first_and_second(chat: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """Milliseconds from the process's start to its first reply's first byte (the first line
    written at once), then from writing a second line, and a third, to theirs."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        chat,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=ROOT,  # `python -m` finds the memcli of the current folder first
    )
    assert proc.stdin is not None
    times = []
    for line in (b"hi\n", b"and again\n", b"once more\n"):
        sent = time.perf_counter() if times else start
        proc.stdin.write(line)
        proc.stdin.flush()
        times.append((read_reply(proc) - sent) * 1000)
    proc.stdin.close()
    proc.wait(600)
    return times[0], times[1], times[2]


def mcp_remember(env: dict[str, str], db: Path) -> tuple[float, float]:
    """Milliseconds from starting `memcli mcp` to its first `remember`'s answer, and the second's."""
    import anyio
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(
        command=sys.executable, args=["-m", "memcli", "--db", str(db), "mcp"], env=env, cwd=ROOT
    )

    async def main() -> tuple[float, float]:
        start = time.perf_counter()
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            times = []
            for text in ("I keep bees on my roof.", "My bees make heather honey."):
                result: Any = await session.call_tool("remember", {"text": text})
                if getattr(result, "is_error", False) or getattr(result, "isError", False):
                    raise SystemExit(f"remember failed: {result}")
                times.append((time.perf_counter() - start) * 1000)
                start = time.perf_counter()
            return times[0], times[1]

    return anyio.run(main)


CLIENTS = {
    "httpx": """
import httpx, json, sys
with httpx.Client(timeout=60) as c:
    with c.stream("POST", sys.argv[1] + "/chat/completions", json={"model": "test",
            "messages": [{"role": "user", "content": "hi"}], "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line[6:] != "[DONE]":
                json.loads(line[6:])
""",
    "openai SDK": """
import openai, sys
c = openai.OpenAI(api_key="x", base_url=sys.argv[1], max_retries=0, timeout=60)
for chunk in c.chat.completions.create(model="test", stream=True,
        messages=[{"role": "user", "content": "hi"}]):
    pass
""",
    "litellm": """
import os, sys
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
import litellm
for chunk in litellm.completion(model="openai/test", api_base=sys.argv[1], api_key="x",
        stream=True, messages=[{"role": "user", "content": "hi"}]):
    pass
""",
}



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-mcp", action="store_true")
    parser.add_argument("--no-clients", action="store_true")
    args = parser.parse_args()

    def reply(body: dict[str, Any]) -> dict[str, Any]:
        return {"content": "Noted."} if body.get("stream") else {"content": FACTS}

    server = LLMServer(reply).start()
    models = model_folder()
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("MEMCLI_", "LITELLM_", "LLM_"))
    }
    base |= {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
    setups = [("no blocks", "blocks = []\n")]
    if models is not None:
        setups.append(("default blocks", ""))
    else:
        print("(no exported embedding model found: the default blocks are left out)")
    try:
        if not args.no_clients:
            print(f"one streamed call in a fresh process ({args.runs} runs, medians)")
            for name, code in CLIENTS.items():
                cpu = [
                    run_cpu([sys.executable, "-c", code, server.api_base], base)
                    for _ in range(args.runs)
                ]
                print(f"  {name:12} {statistics.median(cpu):6.2f} CPU s")
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            for label, blocks in setups:
                home = work / label.replace(" ", "-")
                home.mkdir()
                if models is not None:
                    (home / "models").symlink_to(models, target_is_directory=True)
                config = home / "config.toml"
                config.write_text(
                    blocks + f'[llm]\nmodel = "openai/test"\napi_base = "{server.api_base}"\n'
                )
                env = base | {"MEMCLI_HOME": str(home), "MEMCLI_CONFIG": str(config)}
                chat = [sys.executable, "-m", "memcli", "chat", "--plain"]
                llm_env = base | {"LLM_USER_PATH": str(work / f"llm-{label}")}
                echo = [sys.executable, "-m", "llm", "-m", "echo", "hi"]
                # A first run of each, not counted, makes its database (memcli's store, llm's log).
                run_cpu([*chat, "--session", "setup"], env, b"hi\n")
                run_cpu(echo, llm_env)
                memcli_cpu, llm_cpu, firsts, seconds, thirds = [], [], [], [], []
                for i in range(args.runs):
                    memcli_cpu.append(run_cpu([*chat, "--session", f"cpu{i}"], env, b"hi\n"))
                    llm_cpu.append(run_cpu(echo, llm_env))
                    first, second, third = first_and_second([*chat, "--session", f"t{i}"], env)
                    firsts.append(first)
                    seconds.append(second)
                    thirds.append(third)
                m, l_ = statistics.median(memcli_cpu), statistics.median(llm_cpu)
                print(f"\n{label} ({args.runs} runs, medians; load {os.getloadavg()[0]:.1f})")
                print(f"  memcli chat --plain, one message  {m:6.2f} CPU s")
                print(
                    f"  llm -m echo hi                    {l_:6.2f} CPU s   (memcli/llm {m / l_:.2f}x)"
                )
                f, s = statistics.median(firsts), statistics.median(seconds)
                t = statistics.median(thirds)
                print(f"  from the start to the first reply {f:6.0f} ms")
                print(f"  second reply {s:6.0f} ms, third {t:6.0f} ms")
                if not args.no_mcp and label == "default blocks":  # remember needs a fact block
                    times = [mcp_remember(env, home / f"mcp{i}.db") for i in range(args.runs)]
                    one = statistics.median(t[0] for t in times)
                    two = statistics.median(t[1] for t in times)
                    print(
                        f"  memcli mcp: start to first remember {one:6.0f} ms, second {two:5.0f} ms"
                    )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
